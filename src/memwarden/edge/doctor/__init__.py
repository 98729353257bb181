"""``memwarden doctor``: facts about an edge environment, checked against known issues.

``facts.collect`` gathers facts (one module per source under ``sources/``; a missing tool or
file is the fact "not present", never an error), ``facts.load``/``facts.dump`` move them between
a board and a laptop, and ``checks.diagnose`` compares them with ``known_issues.json``: each entry
names the affected versions, the symptom, the fix and its public source.
"""
