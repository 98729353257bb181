"""The demo's deployment under a real memory limit: plain ``generate()`` vs ``GovernedSession``.

For each budget and repeat, :func:`memwarden.demo.run_limited` serves the demo's turns (zoo llava
``small``, fp32 weights on both sides) in fresh child processes whose address space (RLIMIT_AS) is
what they mapped after building the model plus the budget left after the weights: plain
``generate()`` in one, a ``GovernedSession`` in another (and plain without a limit in a third,
where the limit stopped plain, for the tokens the session is compared with). Per run: the turns
each side answered, how plain failed, how many turns the session served degraded (fewer visual
tokens), whether its tokens equal plain's.

    .venv/bin/python benchmarks/bench_demo_limit.py [--budgets 186,196,206,216 --repeats 2 --turns 4]
"""

from __future__ import annotations

import argparse
import time

from memwarden.demo import run_limited
from memwarden.models.chat import DEMO_TURNS, DemoConfig

MiB = 1024**2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", default="186,196,206,216", help="MiB, comma-separated")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--turns", type=int, default=DEMO_TURNS)
    args = ap.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    print("| budget | run | plain answered | plain's failure | session answered | degraded turns | tokens equal | s |")
    print("|--:|--:|--:|---|--:|--:|---|--:|")
    for repeat in range(args.repeats):
        for budget in budgets:  # budgets interleaved across repeats: the machine's load drifts
            start = time.perf_counter()
            r = run_limited(DemoConfig(budget_bytes=budget * MiB, turns=args.turns), arms=("plain", "governed"))
            why = (r.plain_error or "—").split(":")[0] if r.plain_error else "—"
            session = f"{r.governed_answered}" + (f" ({r.governed_error[:60]})" if r.governed_error else "")
            print(
                f"| {budget} MiB | {repeat + 1} | {r.plain_answered}/{r.turns} | {why} | {session}/{r.turns} | "
                f"{r.governed_degraded} | {'yes' if r.outputs_equal else 'no'} | "
                f"{time.perf_counter() - start:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
