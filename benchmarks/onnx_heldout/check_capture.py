"""Capture peak (run 2) vs the malloc-level counter, arena off, pattern off/on, per held-out model."""

import json
import sys
from pathlib import Path

from memwarden.record.onnx.capture import capture_onnx
from memwarden.record.onnx.feeds import load_feeds
from memwarden.record.onnx.measure import measure_run, run_peaks
from memwarden.record.onnx.session import OrtSettings

rows = []
for name in sys.argv[1:]:
    path = Path(f"/tmp/onnx_heldout/models/{name}.onnx")
    feeds = load_feeds(f"/tmp/onnx_heldout/models/{name}.npz")
    for pattern in (False, True):
        s = OrtSettings(arena=False, mem_pattern=pattern)
        ours = run_peaks(capture_onnx(path, [feeds, feeds], settings=s))[1]
        m = measure_run(path, feeds, s, runs=2)
        diff = (ours - m.malloc_peak_bytes) / m.malloc_peak_bytes * 100
        row = dict(
            model=name,
            pattern=pattern,
            capture=ours,
            malloc=m.malloc_peak_bytes,
            rss=m.rss_peak_bytes,
            diff_pct=round(diff, 2),
        )
        print(json.dumps(row), flush=True)
        rows.append(row)
