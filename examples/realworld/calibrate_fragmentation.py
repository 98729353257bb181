"""Calibration data for the fragmentation detector: the allocator model replayed on varied runs.

For each run: peak reserved and peak allocated of the whole run replayed through the PyTorch
caching-allocator model (default settings), and what its neediest window (before the first model
call, a call, a gap between calls) reserves when replayed alone with what was live at its start
(``memwarden.analyze.patterns.fragmentation_steps``). The excess of the first over the second is
what changing shapes strand in cached blocks; docs/diagnose-accuracy.md shows the table and the
thresholds chosen from it.

Runs: every case of this corpus (planted and clean), and a batch sweep of a tiny Llama fed
variable lengths, the same lengths padded to buckets of 128, and one fixed length, at two batch
sizes and two run lengths.

Run: ``python examples/realworld/calibrate_fragmentation.py`` (``--sweep-only`` / ``--corpus-only``).
"""

from __future__ import annotations

import random
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_MIB = 1 << 20


def _row(name: str, trace: object) -> str:
    from memwarden.analyze.analysis import Analysis
    from memwarden.analyze.patterns.fragmentation_steps import step_need

    analysis = Analysis(trace)  # type: ignore[arg-type]
    base = analysis.replay()
    reserved, allocated = base.peak_reserved_bytes, base.peak_allocated_bytes
    need = step_need(analysis)
    ratio = reserved / allocated if allocated else 0.0
    if need is None:
        return f"| {name} | {reserved / _MIB:.0f} | {allocated / _MIB:.1f} | {ratio:.2f} | (under 2 steps) | - | - |"
    excess = reserved - need.need_bytes
    share = excess / need.need_bytes if need.need_bytes else 0.0
    return (
        f"| {name} | {reserved / _MIB:.0f} | {allocated / _MIB:.1f} | {ratio:.2f} | {need.need_bytes / _MIB:.0f} | "
        f"{excess / _MIB:.0f} | {share:.2f} |"
    )


def corpus_rows() -> list[str]:
    import memwarden

    sys.path.insert(0, str(HERE))
    import accuracy

    rows = []
    for case in accuracy.cases():
        with accuracy._as_main(case.path), memwarden.capture() as cap:
            runpy.run_path(str(case.path), run_name="__main__")
        rows.append(_row(f"{case.name} ({case.expect or 'clean'})", cap.trace))
    return rows


def sweep_rows() -> list[str]:
    import torch

    import memwarden

    sys.path.insert(0, str(HERE))
    from _tiny import prompt, tiny_llama

    torch.set_num_threads(1)
    rows = []
    for batches, batch in ((48, 4), (24, 8)):
        rng = random.Random(0)
        lengths = [rng.randrange(32, 512) for _ in range(batches)]
        shapes = {
            "variable": lengths,
            "buckets of 128": [-(-n // 128) * 128 for n in lengths],
            "fixed 512": [512] * batches,
        }
        for kind, used in shapes.items():
            model = tiny_llama(layers=2)
            with memwarden.capture() as cap, torch.no_grad():
                for i, n in enumerate(used):
                    model(prompt(n, batch=batch, seed=i))
            rows.append(_row(f"sweep: {batches} batches of {batch}, {kind}", cap.trace))
    return rows


def main(argv: list[str]) -> None:
    print(
        "| run | peak reserved MiB | peak allocated MiB | reserved/allocated | neediest window MiB | excess MiB | excess/need |"
    )
    print("|---|---|---|---|---|---|---|")
    if "--corpus-only" not in argv:
        for row in sweep_rows():
            print(row, flush=True)
    if "--sweep-only" not in argv:
        for row in corpus_rows():
            print(row, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
