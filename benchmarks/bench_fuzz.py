"""Fuzz the loaders of untrusted files with generated hostile inputs; count unhandled exceptions.

    python benchmarks/bench_fuzz.py [--cases 10000] [--seed 0] [--json] [--only trace,snapshot,...]

Loaders: the .mwtrace reader (``trace.format.loads`` and ``interop.files.load_any``), the PyTorch
snapshot importer (``trace.snapshot.load_snapshot``, restricted unpickler), the config.json
resolver of ``memwarden estimate MODEL`` (``estimate.resolve_model``), the device-profile
parser (``models.devices.parse_profile``) and the CLI argument parsing (``cli.main``).

Each case is a valid seed input mutated (truncated, bytes flipped, spliced, huge numbers,
deep nesting) or a hand-made adversarial one (pickles with GLOBAL/REDUCE to ``os.system``,
huge declared lengths). The one accepted failure is the loader's clear error
(``MemwardenError`` / ``TraceFormatError``); anything else is counted as unhandled. A
pickle that ran code would create a marker file: its existence is checked after every case.
The target is 0 unhandled and 0 executed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pickle
import random
import resource
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

MARKER = Path(tempfile.gettempdir()) / f"memwarden-fuzz-executed-{os.getpid()}"


# -- seeds ----------------------------------------------------------------------------


def seed_trace() -> bytes:
    from memwarden.trace.format import dumps
    from memwarden.trace.model import Action, TraceBuilder

    b = TraceBuilder(devices=("cpu", "cuda:0"), metadata={"model": "fuzz", "nested": {"a": [1, 2]}})
    for i in range(6):
        b.event(
            time_us=10 * i,
            action=Action.ALLOC,
            tensor=i,
            address=4096 * i,
            nbytes=512 * (i + 1),
            device=i % 2,
            module=f"m.{i}",
            op="aten::mm",
            dtype="float32",
            shape=(2, i + 1),
        )
    for i in range(6):
        b.event(time_us=100 + i, action=Action.FREE, tensor=i, address=4096 * i, nbytes=512 * (i + 1), device=i % 2)
    return dumps(b.build())


def seed_snapshot() -> bytes:
    from memwarden.interop.snapshot import PICKLE_PROTOCOL
    from memwarden.interop.snapshot_export import to_snapshot
    from memwarden.trace.format import loads

    return pickle.dumps(to_snapshot(loads(seed_trace())), protocol=PICKLE_PROTOCOL)


def seed_config() -> bytes:
    return (ROOT / "src/memwarden/models/configs/smolvlm-256m-instruct.json").read_bytes()


def seed_device() -> bytes:
    return (ROOT / "src/memwarden/models/devices/raspberry-pi-5-8gb.toml").read_bytes()


# -- adversarial inputs -------------------------------------------------------------------


class _System:
    def __reduce__(self):  # a pickle that calls os.system when loaded
        return (os.system, (f"touch {MARKER}",))


def hostile_pickles() -> list[bytes]:
    evil = pickle.dumps(_System(), protocol=2)
    nested = {
        "segments": [],
        "device_traces": [[{"action": "alloc", "addr": 1, "size": 1, "frames": [], "x": _System()}]],
    }
    out = [
        evil,
        pickle.dumps(_System(), protocol=0),
        pickle.dumps(_System(), protocol=5),
        pickle.dumps(nested, protocol=4),
        b"\x80\x02cposix\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03.",  # GLOBAL + REDUCE by hand
        b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x93.",  # STACK_GLOBAL
        b"\x80\x02B" + struct.pack("<I", 0xFFFFFFF0) + b"abc",  # BINBYTES declaring 4 GiB
        b"\x80\x04\x8e" + struct.pack("<Q", 1 << 62) + b"x",  # BINBYTES8 declaring 4 EiB
        b"\x80\x02" + b"(" * 100_000 + b"t.",  # deep MARK nesting
        b"\x80\x02" + b"]" * 200_000 + b"e" * 10 + b".",  # many nested lists
        b"\x80\x02}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02X\x0d\x00\x00\x00device_tracesq\x03]q\x04(h\x02h\x02h\x02eu.",
        b"\x80\x02cbuiltins\neval\nX\x0b\x00\x00\x00__import__q\x85R.",
        b"\x80\x02P1\n.",  # persistent id
    ]
    # a list shared by reference a million times: the decompression bomb the importer refuses
    row = [{"action": "alloc", "addr": 1, "size": 1, "stream": 0, "time_us": 1, "frames": []}]
    out.append(pickle.dumps({"segments": [], "device_traces": [row] * 2000}, protocol=4))
    return out


# -- mutation -------------------------------------------------------------------------


_INTERESTING = [
    b"\xff" * 8,
    b"\x00" * 8,
    b"-1",
    b"1e999",
    b"9" * 5000,
    b"NaN",
    b"[" * 2000,
    b"{" * 2000,
    b'"',
    b"\\",
    b"\x80",
    struct.pack("<Q", 1 << 63),
    struct.pack("<I", 0xFFFFFFFF),
]


def mutate(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        if op == 0 and buf:  # truncate
            del buf[rng.randrange(len(buf)) :]
        elif op == 1 and buf:  # flip bytes
            for _ in range(rng.randint(1, 16)):
                buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif op == 2:  # insert something nasty
            pos = rng.randrange(len(buf) + 1)
            buf[pos:pos] = rng.choice(_INTERESTING)
        elif op == 3 and buf:  # duplicate a slice (repeated structure)
            a = rng.randrange(len(buf))
            b = min(len(buf), a + rng.randint(1, 256))
            buf[a:a] = buf[a:b] * rng.randint(2, 64)
        elif op == 4 and len(buf) > 20:  # overwrite an aligned word with a huge length
            pos = rng.randrange(len(buf) - 8)
            buf[pos : pos + 8] = struct.pack("<Q", rng.choice([1 << 62, 2**64 - 1, 1 << 40, 0]))
        elif op == 5 and buf:  # replace a digit run
            pos = rng.randrange(len(buf))
            buf[pos:pos] = str(rng.choice([-(2**70), 2**64, 10**400 if rng.random() < 0.1 else -1])).encode()[:500]
        else:  # random bytes
            buf += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    return bytes(buf)


# -- targets ---------------------------------------------------------------------------


def _accepted() -> tuple[type[BaseException], ...]:
    from memwarden.errors import MemwardenError
    from memwarden.trace.model import TraceFormatError

    return (MemwardenError, TraceFormatError)


def target_trace(data: bytes, tmp: Path) -> None:
    from memwarden.interop.files import load_any
    from memwarden.trace import format as trace_format

    try:
        trace_format.loads(data)
    finally:
        path = tmp / "case.mwtrace"
        path.write_bytes(data)
        with contextlib.suppress(*_accepted()):
            load_any(path)  # InputError only


def target_snapshot(data: bytes, tmp: Path) -> None:
    from memwarden.interop.snapshot import load_snapshot

    load_snapshot(data)


def target_config(data: bytes, tmp: Path) -> None:
    from memwarden.estimation.resolve import resolve_model

    path = tmp / "config.json"
    path.write_bytes(data)
    resolve_model(str(path))


def target_device(data: bytes, tmp: Path) -> None:
    from memwarden.models.devices import parse_profile

    parse_profile(data, label="fuzz.toml")


_CLI_WORDS = [
    "summary",
    "diagnose",
    "estimate",
    "stress",
    "sweep",
    "devices",
    "export",
    "replay",
    "plan",
    "report",
    "--json",
    "--image",
    "--runs",
    "--inject",
    "--a",
    "--b",
    "--device",
    "--prompt-tokens",
    "--batch",
    "-1",
    "0",
    "1e999",
    "9" * 400,
    "x" * 5000,
    "\x00",
    "../../etc/passwd",
    "/dev/zero",
    "jitter:size=1GiB,period=0ms",
    "448x-3",
    "NaN",
    "--",
    "-",
    "''",
    "--executor",
    "ray",
    "--ray-address",
    "--seed",
    "llava:huge",
]


def cli_args(rng: random.Random) -> list[str]:
    return [
        rng.choice(_CLI_WORDS) if rng.random() < 0.8 else rng.choice(_CLI_WORDS)[:3] for _ in range(rng.randint(0, 6))
    ]


def target_cli(argv: list[str], tmp: Path) -> None:
    from memwarden.cli import main

    # never a valid estimate/sweep/stress run: those do real work; a bad argument must stop them first
    if "ray" in argv or "--executor" in argv:
        argv = [a for a in argv if a not in ("ray", "--executor")]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit:  # argparse usage errors and --help
            pass


# -- driver ---------------------------------------------------------------------------


def run(loader: str, cases: int, seed: int, tmp: Path, time_limit_s: float | None = None) -> dict[str, object]:
    rng = random.Random(f"{loader}:{seed}")
    accepted = _accepted()
    seeds: list[bytes] = []
    target: Callable[..., None]
    if loader == "trace":
        seeds, target = [seed_trace()], target_trace
    elif loader == "snapshot":
        seeds, target = [seed_snapshot(), *hostile_pickles()], target_snapshot
    elif loader == "config":
        seeds, target = (
            [seed_config(), b'{"model_type": "llava", "text_config": {"num_hidden_layers": 1e9}}'],
            target_config,
        )
    elif loader == "device":
        seeds, target = [seed_device()], target_device
    elif loader == "cli":
        target = target_cli
    else:
        raise SystemExit(f"unknown loader {loader!r}")
    counts = {"cases": 0, "ok": 0, "clear_error": 0, "unhandled": 0, "executed": 0}
    unhandled: dict[str, str] = {}
    begin = time.perf_counter()
    for i in range(cases):
        if time_limit_s is not None and time.perf_counter() - begin > time_limit_s:
            break
        if loader == "cli":
            case: object = cli_args(rng)
        elif i < len(seeds):
            case = seeds[i]  # each seed and each hand-made input once, unmutated
        else:
            case = mutate(rng.choice(seeds), rng)
        counts["cases"] += 1
        try:
            target(case, tmp)
            counts["ok"] += 1
        except accepted:
            counts["clear_error"] += 1
        except Exception as exc:  # the finding: a loader let something else escape
            counts["unhandled"] += 1
            unhandled.setdefault(f"{type(exc).__name__}: {str(exc)[:120]}", repr(case)[:200])
        if MARKER.exists():
            counts["executed"] += 1
            MARKER.unlink()
    elapsed = time.perf_counter() - begin
    return {"loader": loader, **counts, "seconds": round(elapsed, 2), "unhandled_examples": unhandled}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="trace,snapshot,config,device,cli")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    # bounded memory: a loader that believed a huge declared length would hit this, not the machine
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.RLIM_INFINITY))
    results = []
    with tempfile.TemporaryDirectory(prefix="memwarden-fuzz-") as tmp:
        for loader in args.only.split(","):
            results.append(run(loader, args.cases, args.seed, Path(tmp)))
            if not args.json:
                r = results[-1]
                print(
                    f"{loader:9s} {r['cases']:6d} cases  {r['clear_error']:6d} clear errors  {r['ok']:6d} accepted  "
                    f"{r['unhandled']} unhandled  {r['executed']} executed  {r['seconds']:.1f} s"
                )
                for what, example in r["unhandled_examples"].items():
                    print(f"    {what}\n      e.g. {example}")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.json:
        print(json.dumps({"results": results, "peak_rss_mib": peak_mib}, indent=2))
    else:
        print(f"peak RSS {peak_mib:.0f} MiB")
    return 1 if any(r["unhandled"] or r["executed"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
