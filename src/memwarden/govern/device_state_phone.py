"""Phone memory signals: iOS jetsam reports and ``os_proc_available_memory``; Android ``dumpsys
meminfo``, lmkd kill lines and ``onTrimMemory`` levels.

Parsers have the signature of ``device_state_lines``' parsers (a line and the paste's
:class:`~memwarden.govern.device_state_context.ParseContext` in, ``[(field, value), ...]`` or ``None``
out) and never raise on a line.

- **iOS jetsam event reports** (``JetsamEvent-*.ips``, bug_type 298; Apple, "Identifying high-memory
  use with jetsam event reports"): pretty-printed JSON read line by line with a brace depth, so a
  paste of the whole report or of one process entry both work. ``memoryStatus.pageSize`` converts
  pages to bytes (16384 assumed when the paste leaves it out: the page size of every arm64 iPhone
  report we found); ``memoryPages.free`` is the system's free pages; a process entry whose
  ``reason`` is ``per-process-limit`` was killed at its limit, so its ``rpages`` × pageSize *is*
  the app's jetsam limit (Apple Developer Forums thread 98522). ``largestProcess`` is named.
- **os_proc_available_memory()** (iOS 13+): the bytes the app may still allocate before its limit,
  as apps log it (``os_proc_available_memory: N`` with an optional unit).
- **Android ``dumpsys meminfo``** summary: ``Total RAM: N K`` and ``Free RAM: N K (cached pss +
  cached kernel + free)``; Free RAM counts cached processes lmkd would kill first.
- **lmkd** (logcat): ``lowmemorykiller: Kill 'NAME' (PID), uid U, oom_score_adj A to free N kB rss,
  M kB swap; reason: ...``.
- **onTrimMemory**: a logged trim level, by number or by its ``TRIM_MEMORY_*`` name.
"""

from __future__ import annotations

import re

from memwarden.govern.device_state_context import JetsamState, ParseContext

__all__ = ["TRIM_LEVELS", "android_line", "jetsam_line", "os_proc_line"]

_KIB = 1 << 10
_MAX_BYTES = 1 << 62
_IOS_PAGE_BYTES = 16384  # assumed only where the paste has no pageSize
Found = list[tuple[str, int | float | str]]

# android.content.ComponentCallbacks2's constants (the levels are clues, not a linear scale).
TRIM_LEVELS = {
    "TRIM_MEMORY_RUNNING_MODERATE": 5,
    "TRIM_MEMORY_RUNNING_LOW": 10,
    "TRIM_MEMORY_RUNNING_CRITICAL": 15,
    "TRIM_MEMORY_UI_HIDDEN": 20,
    "TRIM_MEMORY_BACKGROUND": 40,
    "TRIM_MEMORY_MODERATE": 60,
    "TRIM_MEMORY_COMPLETE": 80,
}


_JETSAM_START = re.compile(r'"bug_type"\s*:\s*"298"|"memoryStatus"\s*:|"largestProcess"\s*:|"rpages"\s*:')
_TOKEN = re.compile(r'[{}]|"(\w{1,40})"\s*:\s*("[^"\\]{0,200}"|\d{1,15}|\{|\[)')


def jetsam_line(line: str, ctx: ParseContext) -> Found | None:
    st = ctx.jetsam
    if not st.active:
        if _JETSAM_START.search(line) is None:
            return None
        st.active = True
    out: Found = []
    matched = False
    for m in _TOKEN.finditer(line):
        matched = True
        tok, key, value = m.group(0), m.group(1), m.group(2)
        if tok == "{" or value == "{":
            st.depth += 1
            if key == "memoryPages":
                st.pages_depth = st.depth
            continue
        if tok == "}":
            if st.depth == st.pages_depth:
                st.pages_depth = None
            if st.depth == st.entry_depth:
                st.entry_depth, st.entry = None, {}
            st.depth = max(0, st.depth - 1)
            continue
        if key is None:
            continue
        text = value.strip('"')
        number = int(value) if value.isdigit() else None
        if key == "pageSize" and number and number <= 1 << 24:
            st.page_bytes = number
            out.append(("jetsam_page_size", number))
        elif key == "largestProcess" and not number:
            out.append(("jetsam_largest_process", text))
        elif key == "free" and st.pages_depth is not None and st.depth == st.pages_depth and number is not None:
            out.append(("mem_free", min(number * (st.page_bytes or _IOS_PAGE_BYTES), _MAX_BYTES)))
        elif key in ("rpages", "reason", "name"):
            if st.entry_depth is None:
                st.entry_depth = st.depth
            st.entry[key] = number if key == "rpages" else text
            if key == "name" and st.entry.get("done"):  # the name came after the limit was read
                out.append(("jetsam_killed", text))
            out += _limit(st)
    # a structural line of the report (a brace, a key) is recognised even when it carries no figure
    return out if out or (matched and line.lstrip()[:1] in '{}"[]') else None


def _limit(st: JetsamState) -> Found:
    """The app's limit, once its entry has both the reason and the pages (in either order)."""
    entry = st.entry
    if entry.get("reason") != "per-process-limit" or not isinstance(entry.get("rpages"), int) or entry.get("done"):
        return []
    entry["done"] = True
    found: Found = [("jetsam_limit", min(entry["rpages"] * (st.page_bytes or _IOS_PAGE_BYTES), _MAX_BYTES))]
    if isinstance(entry.get("name"), str):
        found.append(("jetsam_killed", entry["name"]))
    if st.page_bytes is None:
        found.append(("jetsam_page_size_assumed", _IOS_PAGE_BYTES))
    return found


_OS_PROC = re.compile(
    r"os_proc_available_memory\S{0,4}[^0-9\n]{0,30}?(\d{1,15}(?:\.\d{1,6})?)\s*(bytes|B|KB|KiB|MB|MiB|GB|GiB)?\b"
)
_SCALE = {
    "": 1,
    "bytes": 1,
    "b": 1,
    "kb": _KIB,
    "kib": _KIB,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "gb": 1 << 30,
    "gib": 1 << 30,
}


def os_proc_line(line: str, ctx: ParseContext) -> Found | None:
    m = _OS_PROC.search(line)
    if m is None:
        return None
    value = int(float(m.group(1)) * _SCALE[(m.group(2) or "").lower()])
    return [("os_proc_available", value)] if 0 <= value <= _MAX_BYTES else None


_DUMPSYS = re.compile(r"^\s*(Total|Free|Used|Lost) RAM:\s*(-?[\d,]{1,20})\s?K\b")
_LMKD = re.compile(
    r"lowmemorykiller: Kill '([^']{1,200})' \((\d{1,10})\), uid \d{1,10}, oom_score_adj (-?\d{1,4}) to free "
    r"(\d{1,15})kB rss(?:, (\d{1,15})kB swap)?(?:; reason: ([^\n]{0,200}))?"
)
_TRIM_NUMBER = re.compile(r"onTrimMemory\b[^0-9\n]{0,30}?\b(\d{1,2})\b")
_TRIM_NAME = re.compile(r"\b(TRIM_MEMORY_[A-Z_]{2,20})\b")


def android_line(line: str, ctx: ParseContext) -> Found | None:
    if (m := _DUMPSYS.match(line)) is not None:
        kib = int(m.group(2).replace(",", "") or "0")
        if not 0 <= kib <= _MAX_BYTES // _KIB:
            return None
        key = {"Total": "mem_total", "Free": "android_free_ram"}.get(m.group(1))
        return [(key, kib * _KIB)] if key else []  # Used/Lost RAM: recognised, bound nothing
    if (m := _LMKD.search(line)) is not None:
        what = f"{m.group(1)} (pid {m.group(2)}), oom_score_adj {m.group(3)}"
        if m.group(6):
            what += f"; reason: {m.group(6).strip()}"
        return [("lmkd_kill", what), ("lmkd_killed_adj", int(m.group(3))), ("lmkd_killed_rss", int(m.group(4)) * _KIB)]
    if "onTrimMemory" in line or "TRIM_MEMORY_" in line:
        if (n := _TRIM_NAME.search(line)) is not None and n.group(1) in TRIM_LEVELS:
            return [("trim_level", TRIM_LEVELS[n.group(1)])]
        if (t := _TRIM_NUMBER.search(line)) is not None and int(t.group(1)) in TRIM_LEVELS.values():
            return [("trim_level", int(t.group(1)))]
    return None
