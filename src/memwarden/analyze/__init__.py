"""Pure analyses over a Trace: timelines and breakdowns, the pattern detectors (``patterns/``,
one file each) and ``diagnose``, the budget check of a governed run. No torch.
"""
