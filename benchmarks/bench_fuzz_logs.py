"""Fuzz the readers of logs and facts someone else wrote; count tracebacks and hangs.

    python benchmarks/bench_fuzz_logs.py [--n 10000] [--seed 0] [--json] [--only doctor,telemetry,aligner]

Targets, each fed ``--n`` mutations of a valid seed file written to disk and read the way the CLI
reads it:

- ``doctor``: a facts file (``tests/fixtures/doctor/clean.json``) through ``facts.load``,
  ``checks.diagnose`` and the text screen (``commands.doctor._summary``, rendered by rich to a
  buffer, with every finding's detail);
- ``telemetry``: a JSON-lines log (``examples/``) or a tegrastats log through ``load_log`` and
  the budget controller's replay;
- ``aligner``: an ``align-check`` log through ``align.replay.replay``.

A mutation is structural (a value replaced by a 400-digit integer, ``1e999``, ``NaN``, a huge or
negative number, a string with escape sequences, rich markup or a lone surrogate, 10,000 levels
of nesting, a key removed, a line duplicated or dropped, a timestamp jump of 10^5-10^6 s) or
byte-level (truncated, flipped, spliced). The one accepted failure is ``MemwardenError`` (the
CLI's one-line error); anything else is a traceback. A case that takes more than
``--hang-s`` (default 10 s) counts as a hang. Peak RSS is the process's ``ru_maxrss``. The screen
text is also checked for an ESC byte or an applied ``[link=`` (terminal or markup injection).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FACTS = ROOT / "tests" / "fixtures" / "doctor" / "clean.json"
TEGRA = (
    "RAM 2298/7620MB (lfb 1x4MB) SWAP 0/3810MB CPU [12%@1190,8%@1190] GR3D_FREQ 0% "
    "cpu@47.5C soc2@46.1C tj@48C VDD_IN 4613mW/4613mW VDD_CPU_GPU_CV 594mW/594mW"
)
HOSTILE_VALUES: list[Any] = [
    10**400,
    -(10**400),
    1e308,
    2**63,
    -1,
    0,
    "\x1b]0;pwned\x07\x1b[2J",
    "[link=file:///etc/passwd]x[/link]",
    "[/bold]",
    "\ud800",
    "",
    [],
    {},
    None,
    True,
    "9" * 5000,
]
SPECIALS = ["1e999", "-1e999", "NaN", "Infinity", "1" + "0" * 400, "[" * 10000 + "]" * 10000]


def seed_telemetry() -> bytes:
    lines = [
        json.dumps(
            {
                "t": i * 0.5,
                "mem_total_bytes": 8 << 30,
                "mem_available_bytes": (6 << 30) - i * (1 << 24),
                "temp_c": 50 + i * 0.3,
                "power_w": 7.5,
                "fps": 30.0,
            }
        )
        for i in range(40)
    ]
    return ("\n".join(lines) + "\n").encode()


def seed_tegrastats() -> bytes:
    return ("\n".join(f"03-05-2024 10:00:{i:02d} {TEGRA}" for i in range(30)) + "\n").encode()


def seed_aligner() -> bytes:
    lines = [json.dumps({"type": "header", "audio_rate": 16000, "video_fps": 25})]
    for i in range(100):
        lines.append(json.dumps({"type": "audio", "t_s": round(i * 0.04 + 0.013, 6), "samples": 640}))
        lines.append(json.dumps({"type": "video", "t_s": round(i * 0.04 + 0.002 * (i % 3), 6)}))
    return ("\n".join(lines) + "\n").encode()


def _structural(rng: random.Random, obj: Any, depth: int = 0) -> Any:
    """``obj`` with one value somewhere replaced, a key dropped, or a list element repeated."""
    if isinstance(obj, dict) and obj:
        key = rng.choice(list(obj))
        out = dict(obj)
        roll = rng.random()
        if roll < 0.15:
            del out[key]
        elif roll < 0.6 or depth > 6:
            out[key] = rng.choice(HOSTILE_VALUES)
        else:
            out[key] = _structural(rng, obj[key], depth + 1)
        return out
    if isinstance(obj, list) and obj:
        i = rng.randrange(len(obj))
        out_list = list(obj)
        out_list[i] = _structural(rng, obj[i], depth + 1) if rng.random() < 0.7 else rng.choice(HOSTILE_VALUES)
        return out_list
    return rng.choice(HOSTILE_VALUES)


def _dumps(obj: Any, rng: random.Random) -> str:
    text = json.dumps(obj, allow_nan=True)
    if rng.random() < 0.3:  # a value JSON can spell but json.dumps never writes
        numbers = [i for i, c in enumerate(text) if c.isdigit() and (i == 0 or not text[i - 1].isalnum())]
        if numbers:
            i = rng.choice(numbers)
            j = i
            while j < len(text) and (text[j].isdigit() or text[j] in ".e-+"):
                j += 1
            text = text[:i] + rng.choice(SPECIALS) + text[j:]
    return text


def _bytes_mutation(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(["cut", "flip", "splice", "insert"])
        pos = rng.randrange(max(len(buf), 1))
        if kind == "cut":
            del buf[pos:]
        elif kind == "flip" and buf:
            buf[pos] = rng.randrange(256)
        elif kind == "splice" and buf:
            other = rng.randrange(len(buf))
            buf[pos:pos] = buf[other : other + rng.randint(1, 200)]
        else:
            buf[pos:pos] = rng.choice([b"\x1b[2J", b"\xff\xfe", b"\n" * 50, b"\x00", b"\xed\xa0\x80", b"[link=x]"])
    return bytes(buf)


def mutate_json_lines(rng: random.Random, data: bytes) -> bytes:
    """A JSON-lines file with a few lines changed structurally, duplicated, dropped or jumped."""
    lines = data.decode().splitlines()
    if rng.random() < 0.2:
        return _bytes_mutation(rng, data)
    for _ in range(rng.randint(1, 3)):
        try:
            _mutate_line(rng, lines)
        except (ValueError, RecursionError, TypeError, OverflowError):  # a line made unparsable earlier
            pass
        if not lines:
            break
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")


def _mutate_line(rng: random.Random, lines: list[str]) -> None:
    if lines:
        i = rng.randrange(len(lines))
        roll = rng.random()
        if roll < 0.1:
            lines.insert(i, lines[i])
        elif roll < 0.2:
            del lines[i]
        elif roll < 0.35:
            record = json.loads(lines[i])
            for key in ("t", "t_s"):
                if isinstance(record, dict) and isinstance(record.get(key), int | float):
                    record[key] = record[key] + rng.choice([1e5, 1e6, -1e6, 59.0, 3600.0])
            lines[i] = json.dumps(record)
        else:
            lines[i] = _dumps(_structural(rng, json.loads(lines[i])), rng)


def mutate_tegrastats(rng: random.Random, data: bytes) -> bytes:
    if rng.random() < 0.3:
        return _bytes_mutation(rng, data)
    lines = data.decode().splitlines()
    i = rng.randrange(len(lines))
    numbers = [tok for tok in lines[i].replace("/", " ").replace("mW", " ").split() if tok.isdigit()]
    if numbers:
        lines[i] = lines[i].replace(
            rng.choice(numbers), rng.choice(["1" + "0" * 400, "9" * 5000, "0", "99999999999"]), 1
        )
    return ("\n".join(lines) + "\n").encode()


def mutate_facts(rng: random.Random, data: bytes) -> bytes:
    if rng.random() < 0.15:
        return _bytes_mutation(rng, data)
    facts = json.loads(data)
    for _ in range(rng.randint(1, 3)):
        facts = _structural(rng, facts)
        if not isinstance(facts, dict):
            break
    return _dumps(facts, rng).encode("utf-8", "surrogatepass")


def check_doctor(path: Path) -> str:
    """What ``memwarden doctor --facts PATH`` does, its screen written to a buffer."""
    import contextlib

    from memwarden.commands.doctor import _print
    from memwarden.edge.doctor import facts as doctor_facts
    from memwarden.edge.doctor.checks import diagnose

    facts = doctor_facts.load(path)
    findings = diagnose(facts)
    screen = io.StringIO()
    with contextlib.redirect_stdout(screen):
        _print(facts, findings)
    out = screen.getvalue()
    if "\x1b]" in out or "\x1b[2J" in out:
        return "escape sequence reached the screen"
    return ""


def check_telemetry(path: Path) -> str:
    from memwarden.govern.budget import BudgetController, make_policy
    from memwarden.govern.telemetry_log import load_log

    controller = BudgetController(make_policy("default", {}))
    for sample in load_log(path):
        controller.decide(sample)
    return ""


def check_aligner(path: Path) -> str:
    from memwarden.align.replay import replay

    replay(path)
    return ""


TARGETS: dict[str, tuple[Callable[[], bytes], Callable[[random.Random, bytes], bytes], Callable[[Path], str]]] = {
    "doctor": (FACTS.read_bytes, mutate_facts, check_doctor),
    "telemetry": (seed_telemetry, mutate_json_lines, check_telemetry),
    "tegrastats": (seed_tegrastats, mutate_tegrastats, check_telemetry),
    "aligner": (seed_aligner, mutate_json_lines, check_aligner),
}


def run(target: str, n: int, seed: int, tmp: Path, hang_s: float = 10.0) -> dict[str, Any]:
    from memwarden.errors import MemwardenError

    make_seed, mutate, check = TARGETS[target]
    rng = random.Random(f"{target}-{seed}")
    base = make_seed()
    path = tmp / f"{target}.input"
    counts = {"cases": n, "clear_errors": 0, "accepted": 0, "tracebacks": 0, "hangs": 0, "injections": 0}
    examples: list[str] = []
    slowest = slowest_cpu = 0.0  # wall and CPU seconds: on a loaded machine a case can wait for a CPU
    started = time.perf_counter()
    for _ in range(n):
        data = mutate(rng, base)
        path.write_bytes(data)
        t0, cpu0 = time.perf_counter(), time.process_time()
        try:
            problem = check(path)
        except MemwardenError as exc:
            counts["clear_errors"] += 1
            if "\n" in str(exc) or "\x1b" in str(exc):
                counts["injections"] += 1
                examples.append(f"multi-line or escaped error: {str(exc)[:120]!r}")
        except BaseException as exc:  # anything else is a traceback the user would see
            counts["tracebacks"] += 1
            if len(examples) < 5:
                examples.append(f"{type(exc).__name__}: {str(exc)[:160]} <- {data[:160]!r}")
        else:
            counts["accepted"] += 1
            if problem:
                counts["injections"] += 1
                examples.append(problem)
        took = time.perf_counter() - t0
        slowest = max(slowest, took)
        slowest_cpu = max(slowest_cpu, time.process_time() - cpu0)
        if took > hang_s:
            counts["hangs"] += 1
            examples.append(f"slow ({took:.1f} s): {data[:200]!r}")
    return {
        "target": target,
        **counts,
        "slowest_case_s": round(slowest, 3),
        "slowest_case_cpu_s": round(slowest_cpu, 3),
        "seconds": round(time.perf_counter() - started, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "examples": examples[:5],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000, help="mutations per target (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=",".join(TARGETS), help="comma-separated targets")
    parser.add_argument("--hang-s", type=float, default=10.0, help="a case slower than this is a hang")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for target in args.only.split(","):
            results.append(run(target, args.n, args.seed, Path(tmp), args.hang_s))
            if not args.json:
                r = results[-1]
                print(
                    f"{target:11s} {r['cases']} cases: {r['tracebacks']} tracebacks, {r['hangs']} hangs, "
                    f"{r['injections']} injections, {r['clear_errors']} clear errors, {r['accepted']} accepted; "
                    f"slowest {r['slowest_case_s']} s ({r['slowest_case_cpu_s']} s CPU), {r['seconds']} s, peak RSS {r['peak_rss_mib']} MiB"
                )
                for example in r["examples"]:
                    print(f"    {example}")
    if args.json:
        print(json.dumps(results, indent=2))
    return 0 if all(r["tracebacks"] == r["hangs"] == r["injections"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
