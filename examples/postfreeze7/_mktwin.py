"""Make a *_fixed.py twin from a planted case (files starting with ``_`` are not cases).
usage: python _mktwin.py CASE.py 'replacement line for the # MISTAKE line' [old=>new ...]"""

import re, sys

src, fix = sys.argv[1], sys.argv[2]
text = open(src).read()
lines = text.split("\n")
out = []
for ln in lines:
    if ln.rstrip().endswith("# MISTAKE"):
        indent = ln[: len(ln) - len(ln.lstrip())]
        if fix != "<delete>":
            out.extend(indent + f for f in fix.split("\\n"))
        continue
    if ln.startswith("EXPECT = "):
        out.append("EXPECT = None")
        continue
    if ln.startswith("FIX_WORDS = "):
        continue
    out.append(ln)
text = "\n".join(out)
for extra in sys.argv[3:]:
    old, new = extra.split("=>", 1)
    assert old in text, old
    text = text.replace(old, new)
open(src[:-3] + "_fixed.py", "w").write(text)
