"""``memwarden estimate MODEL.gguf --fit BUDGET`` held against the real ``llama-mtmd-cli`` (issue 42).

For each tiny converted VLM that ``bench_llamacpp_vs_estimate.py`` left in ``--out`` and two budgets
between its smallest and its whole context, the fit's printed command is run as printed (plus the
image, a prompt and one token), and again one llama.cpp step (256) up. The table gives the exit
status, the buffers llama.cpp itself logs (model, KV, compute, projector weights and compute,
summed) against the budget, and the resident peak less the binary's own baseline. The buffers are
reserved for the worst case and mostly untouched on these tiny models, so the resident peak does
not separate the two runs; the logged buffers do.

    nice -n 10 .venv/bin/python benchmarks/bench_llamacpp_fit.py \\
        --bin .cache/llama.cpp-build/bin/llama-mtmd-cli --out .cache/llamacpp-acc

Without the binary or the converted files the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_llamacpp_vs_estimate import baseline_rss, run_mtmd  # noqa: E402

MiB = 1024 * 1024
FAMILIES = ("qwen2vl", "qwen25vl", "gemma3", "smolvlm")
LOGGED = (
    "model_buffer_bytes",
    "kv_buffer_bytes",
    "compute_buffer_bytes",
    "mmproj_buffer_bytes",
    "mmproj_compute_bytes",
)


def _fit(model: Path, mmproj: Path, budget: int) -> dict:
    cmd = [sys.executable, "-m", "memwarden", "estimate", str(model), "--mmproj", str(mmproj)]
    cmd += ["--image", "640x480", "--fit", str(budget), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return json.loads(out.stdout)["fit"]


def _peak(model: Path, mmproj: Path, ctx: int) -> int:
    from memwarden.estimation.gguf.estimate import estimate_gguf

    return estimate_gguf(str(model), mmproj_path=str(mmproj), images=((640, 480),), n_ctx=ctx).peak_bytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, default=os.environ.get("LLAMA_MTMD_CLI"), help="llama-mtmd-cli")
    ap.add_argument("--out", type=Path, default=Path(".cache/llamacpp-acc"), help="the converted models' folder")
    args = ap.parse_args()
    if args.bin is None or not args.bin.exists():
        print(f"llama-mtmd-cli not found ({args.bin}); give --bin or $LLAMA_MTMD_CLI. Nothing run.")
        return 0
    base = baseline_rss(args.bin)
    print("| model | budget | -c (fit) | exit | llama.cpp's buffers | RSS - baseline | -c +256 | exit | buffers |")
    print("|---|---|---|---|---|---|---|---|---|")
    for fam in FAMILIES:
        model, mmproj = args.out / f"{fam}-f16.gguf", args.out / f"{fam}-mmproj-f16.gguf"
        image = args.out / "img-640x480.png"
        if not (model.exists() and mmproj.exists() and image.exists()):
            print(f"| {fam} | (not converted in {args.out}) |")
            continue
        low, high = _peak(model, mmproj, 1024), _peak(model, mmproj, 0)
        for budget in (low + (high - low) // 3, low + 2 * (high - low) // 3):
            fit = _fit(model, mmproj, budget)
            if fit["value"] is None or not fit["flags"]:
                print(f"| {fam} | {budget / MiB:.1f} MiB | none fits | | | | | | |")
                continue
            flags = [str(args.bin), *fit["flags"][1:]]
            extra = ["--image", str(image), "-p", "hi", "-n", "1", "-t", "2", "--temp", "0"]
            extra += ["--chat-template", "chatml", "-v"]
            cells = []
            for ctx in (fit["value"], fit["value"] + 256):
                cmd = [*flags, *extra]
                cmd[cmd.index("-c") + 1] = str(ctx)
                try:
                    got, rss, _log = run_mtmd(cmd)
                    total = sum(got.get(k, 0) for k in LOGGED)
                    mark = "within" if total <= budget else "over"
                    cells.append(("0", f"{total / MiB:.2f} MiB ({mark})", f"{(rss - base) / MiB:.1f} MiB"))
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    cells.append(("failed", str(exc).splitlines()[0][:60], ""))
            (r0, b0, m0), (r1, b1, _m1) = cells
            print(
                f"| {fam} | {budget / MiB:.2f} MiB | {fit['value']} | {r0} | {b0} | {m0} | {fit['value'] + 256} | {r1} | {b1} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
