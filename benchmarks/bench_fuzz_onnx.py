"""Fuzz the ONNX, feeds and checkpoint readers with structured mutations of valid inputs.

    python benchmarks/bench_fuzz_onnx.py [--n 10000] [--kinds onnx,feeds,checkpoint] [--seed 0]
        [--timeout-s 20] [--mem-cap-gib 2] [--json]

Kinds (``--n`` cases in all, split evenly):

- ``onnx``: a small valid model (MatMul, Add, a dynamic batch axis) mutated at the protobuf level:
  dims of an initializer, input or value set to extremes (negative, 2^40, 0), a ``ConstantOfShape``,
  ``Expand``, ``Tile`` or ``Range`` of a huge constant, a ``Loop`` with a huge or input trip count,
  external data pointing outside the folder, past its file or at a FIFO, node and value names full of
  escape sequences, raw data of the wrong length, then sometimes bytes flipped or cut. Fed to
  ``memwarden partition`` and, one case in four, to ``memwarden trace --onnx``.
- ``feeds``: the model's ``.npz`` mutated: npy headers (shape, dtype, object arrays), the zip's
  stated sizes, deflate bombs, member names (``file``, escapes), a lone ``.npy``, truncation. Fed to
  ``partition --inputs`` and ``trace --onnx --inputs``.
- ``checkpoint``: a safetensors header mutated (offsets overlapping, negative, past the end; shapes
  huge; dtypes unknown; duplicate keys; many tensors; a FIFO shard). Read with
  ``estimate.checkpoint.read_checkpoint`` (what ``memwarden estimate ./folder`` does first).

Each case runs in a forked child (its own session, ``RLIMIT_AS`` at ``--mem-cap-gib``, stdout/stderr
to files). A *traceback* is an exception escaping the command or ``Traceback`` on stderr; a *hang*
is a case past ``--timeout-s`` (killed); a non-zero exit must come with exactly one stderr line.
Peak RSS is the child's ``VmHWM`` (reset after the fork, so it includes what the parent preloaded).
Targets: 0 tracebacks, 0 hangs, 0 multi-line errors, every temporary folder removed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import resource
import signal
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_onnx_seeds import (  # noqa: E402
    ESC,
    constant_of_shape_model,
    external_model,
    loop_model,
    named_model,
    npy_bytes,
    npz_bomb,
    npz_bytes,
    safetensors_bytes,
    seed_header,
    tiny_feeds,
    tiny_model,
)

__all__ = [
    "ESC",
    "constant_of_shape_model",
    "external_model",
    "fuzz",
    "loop_model",
    "named_model",
    "npy_bytes",
    "npz_bomb",
    "npz_bytes",
    "safetensors_bytes",
    "seed_header",
    "tiny_feeds",
    "tiny_model",
]
_BOMBS: dict[int, bytes] = {}  # made once in the parent (a 1 GiB deflate takes seconds)
HUGE = [-1, 0, 1 << 20, 1 << 27, 1 << 31, 1 << 40, 1 << 62, -(1 << 40)]


# -- mutations -----------------------------------------------------------------------------------


def _mutate_onnx(rng: random.Random, folder: Path) -> tuple[bytes, bool]:
    """A mutated model's bytes, and whether it is worth running (trace --onnx) as well."""
    from onnx import TensorProto, helper, numpy_helper

    choice = rng.randrange(10)
    if choice == 0:
        model = constant_of_shape_model(rng.choice(HUGE[2:]))
    elif choice == 1:
        model = loop_model(rng.choice([None, 3, 1 << 62, -1]))
    elif choice == 2:
        loc = rng.choice(["w.bin", "../w.bin", "/etc/passwd", "fifo", "missing.bin"])
        if loc == "fifo" and not (folder / "fifo").exists():
            os.mkfifo(folder / "fifo")
        dims = [rng.choice([4, -1, 0, 1 << 40, 10**9]), rng.choice([3, -1, 10**9])]
        path = external_model(folder, dims, location=loc, data=bytes(rng.choice([0, 48, 64])))
        return path.read_bytes(), False
    else:
        model = tiny_model(name=rng.choice(["mm", ESC, "[red]x[/red]", "a" * 300]))
    graph = model.graph
    for _ in range(rng.randint(1, 3)):
        what = rng.randrange(8)
        if what == 0 and graph.initializer:
            t = rng.choice(list(graph.initializer))
            if t.dims:
                t.dims[rng.randrange(len(t.dims))] = rng.choice(HUGE)
        elif what == 1 and graph.input:
            dims = graph.input[0].type.tensor_type.shape.dim
            if dims:
                dims[rng.randrange(len(dims))].dim_value = rng.choice(HUGE[:6])
        elif what == 2:
            shape = numpy_helper.from_array(np.array([rng.choice(HUGE[2:6])] * rng.randint(1, 2), dtype=np.int64),
                                            f"s{rng.randrange(99)}")  # fmt: skip
            op = rng.choice(["ConstantOfShape", "Expand", "Tile"])
            ins = [shape.name] if op == "ConstantOfShape" else ["b", shape.name]
            graph.initializer.append(shape)
            graph.node.append(helper.make_node(op, ins, [f"z{rng.randrange(99)}"], name=ESC + op))
        elif what == 3:
            graph.node.append(helper.make_node("Range", ["r0", "r1", "r2"], ["rr"], name="range"))
            for name, v in zip(["r0", "r1", "r2"], [0, rng.choice(HUGE[2:6]), rng.choice([1, 0, -1])], strict=True):
                graph.initializer.append(numpy_helper.from_array(np.array(v, dtype=np.int64), name))
        elif what == 4 and graph.initializer:
            graph.initializer[0].raw_data = bytes(rng.choice([0, 1, 7, 4096]))
        elif what == 5:
            graph.value_info.append(helper.make_tensor_value_info(ESC, TensorProto.FLOAT, [rng.choice(HUGE)] * 3))
        elif what == 6 and graph.node:
            rng.choice(list(graph.node)).op_type = rng.choice(["Loop", "Scan", "If", "NoSuchOp", "Identity"])
        elif graph.node:
            rng.choice(list(graph.node)).name = rng.choice([ESC, "\x00", "\u202e", "[link=file:///x]y"])
    data = model.SerializeToString()
    if rng.random() < 0.15:
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        data = bytes(b[: rng.randint(0, len(b))] if rng.random() < 0.3 else b)
    return data, rng.random() < 0.25


def _mutate_feeds(rng: random.Random) -> bytes:
    choice = rng.randrange(8)
    if choice == 0:
        size = rng.choice([1 << 20, 1 << 26, 1 << 28])
        return _BOMBS[size] if size in _BOMBS else npz_bomb(size)
    if choice == 1:
        return npy_bytes(np.ones((2, 4), dtype=np.float32))
    if choice == 2:
        head = io.BytesIO()
        shape = tuple(rng.choice(HUGE[1:]) for _ in range(rng.randint(1, 3)))
        descr = rng.choice(["<f4", "|O", "<U3", "V8", "<f4", "|b1"])
        try:
            np.lib.format.write_array_header_1_0(head, {"descr": descr, "fortran_order": False, "shape": shape})
        except ValueError:
            pass
        return npz_bytes({"x.npy": head.getvalue() + bytes(rng.choice([0, 32]))})
    name = rng.choice(["x", "file", "allow_pickle", ESC, "../x", "x"])
    array = np.ones((rng.choice([2, 0, 1]), rng.choice([4, 3])), dtype=rng.choice([np.float32, np.int64, np.float16]))
    members = {f"{name}.npy": npy_bytes(array)}
    if rng.random() < 0.3:
        members["extra.npy"] = npy_bytes(np.zeros(3))
    if rng.random() < 0.2:
        members["notes.txt"] = b"hi"
    data = npz_bytes(members, compress=rng.random() < 0.5)
    if rng.random() < 0.3:
        b = bytearray(data)
        for _ in range(rng.randint(1, 6)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        data = bytes(b[: rng.randint(0, len(b))] if rng.random() < 0.3 else b)
    return data


def _mutate_header(rng: random.Random) -> tuple[bytes, bool]:
    """A safetensors file's bytes, and whether it should be replaced by a FIFO."""
    header: Any = seed_header()
    data_len = 64
    for _ in range(rng.randint(1, 3)):
        if (
            not isinstance(header, dict)
            or not {"a", "b"} <= set(header)
            or not all(isinstance(header[k], dict) for k in "ab")
        ):
            break
        what = rng.randrange(9)
        key = rng.choice(["a", "b"])
        if what == 0:
            header[key]["data_offsets"] = [rng.choice([-8, 0, 16, 32, 1 << 62]), rng.choice([32, 64, 48, 1 << 63])]
        elif what == 1:
            header[key]["shape"] = [rng.choice([1 << 39, -1, 896, 0, 2**70, True, "4"]) for _ in range(2)]
        elif what == 2:
            header[key]["dtype"] = rng.choice(["F17", None, 3, "I64", "BOOL"])
        elif what == 3:
            data_len = rng.choice([0, 10, 63, 1000])
        elif what == 4:
            for i in range(rng.choice([10, 1000, 120_000])):
                header[f"t{i}"] = {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}
        elif what == 5:
            header[ESC] = header.pop(key)
        elif what == 6:
            header[key] = rng.choice([[], "x", None, {"dtype": "F16"}])
        elif what == 7:
            header["b"]["data_offsets"] = [16, 48]
            header["b"]["shape"] = [8]
        else:
            header = rng.choice([[], 1, "x", {}])
    raw = json.dumps(header).encode()
    if rng.random() < 0.1:
        raw = raw.replace(b'"a"', b'"b"', 1)  # a duplicate key
    if rng.random() < 0.05:
        return struct.pack("<Q", rng.choice([1 << 40, 200 * 1024**2, 0])) + raw, False
    return struct.pack("<Q", len(raw)) + raw + bytes(data_len), rng.random() < 0.02


# -- running one case ----------------------------------------------------------------------------


def _vm_hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _child(kind: str, seed: int, folder: Path, mem_cap: int) -> None:
    """In the forked child: make case ``seed`` of ``kind`` in ``folder`` and run it; writes result.json."""
    import traceback

    resource.setrlimit(resource.RLIMIT_AS, (mem_cap, mem_cap))
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    rng = random.Random(f"{kind}-{seed}")
    err = open(folder / "stderr.txt", "w")  # noqa: SIM115
    os.dup2(err.fileno(), 2)
    out = open(folder / "stdout.txt", "w")  # noqa: SIM115
    os.dup2(out.fileno(), 1)
    sys.stderr, sys.stdout = err, out
    statuses: list[int] = []
    escaped = False
    try:
        from memwarden.cli import main

        if kind == "checkpoint":
            from memwarden.errors import InputError
            from memwarden.estimation.checkpoint import read_checkpoint

            data, fifo = _mutate_header(rng)
            shard = folder / "ckpt" / "model.safetensors"
            shard.parent.mkdir()
            if fifo:
                os.mkfifo(shard)
            else:
                shard.write_bytes(data)
            try:
                read_checkpoint(shard.parent)
                statuses.append(0)
            except InputError as exc:
                print(f"error: {exc}", file=sys.stderr)
                statuses.append(2)
        else:
            model = folder / "model.onnx"
            runs = True
            if kind == "onnx":
                data, runs = _mutate_onnx(rng, folder)
                model.write_bytes(data)
                from memwarden.record.onnx.feeds import save_feeds

                save_feeds(folder / "feeds.npz", tiny_feeds())
            else:
                model.write_bytes(tiny_model().SerializeToString())
                (folder / "feeds.npz").write_bytes(_mutate_feeds(rng))
            argvs = [["partition", str(model), "--device-profile", "iphone-15-pro", "--time-limit", "2"]]
            if kind == "feeds":
                argvs[0] += ["--inputs", str(folder / "feeds.npz")]
            if runs:
                argvs.append(["trace", "--onnx", str(model), "--inputs", str(folder / "feeds.npz"),
                              "-o", str(folder / "out.mwtrace"), "--arena", rng.choice(["on", "off"])])  # fmt: skip
            for argv in argvs:
                try:
                    statuses.append(int(main(argv)))
                except SystemExit as exc:
                    statuses.append(int(exc.code or 0) if isinstance(exc.code, int) else 2)
                sys.stdout.flush()
                sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - the point: anything escaping is a finding
        escaped = True
        traceback.print_exc()
    sys.stderr.flush()
    result = {"statuses": statuses, "escaped": escaped, "rss": _vm_hwm()}
    (folder / "result.json").write_text(json.dumps(result))
    os._exit(0)


def run_case(kind: str, seed: int, *, timeout_s: float, mem_cap: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mw-fuzz-onnx-") as tmp:
        folder = Path(tmp)
        tmpdir = folder / "tmp"
        tmpdir.mkdir()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.setsid()
            os.environ["TMPDIR"] = str(tmpdir)
            tempfile.tempdir = str(tmpdir)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            try:
                _child(kind, seed, folder, mem_cap)
            finally:
                os._exit(70)
        hung = True
        while time.monotonic() - start < timeout_s:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                hung = False
                break
            time.sleep(0.02)
        if hung:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
        seconds = time.monotonic() - start
        stderr = (folder / "stderr.txt").read_text(errors="replace") if (folder / "stderr.txt").exists() else ""
        result = json.loads((folder / "result.json").read_text()) if (folder / "result.json").exists() else None
        leftovers = [p.name for p in tmpdir.iterdir() if p.name != ".ses"]  # onnxruntime's own, at import
        lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("memwarden: ")]
        failed = result is not None and any(s != 0 for s in result["statuses"])
        return {
            "kind": kind, "seed": seed, "seconds": round(seconds, 3), "hang": hung,
            "crash": result is None and not hung,
            "traceback": bool(result and result["escaped"]) or "Traceback" in stderr,
            "multiline": failed and len(lines) > len(result["statuses"]) if result else False,
            "rss": result["rss"] if result else 0, "leftover_tmp": leftovers,
            "escape_leak": "\x1b" in stderr, "stderr": stderr[-600:] if (hung or not result or result["escaped"]) else "",
        }  # fmt: skip


def fuzz(n: int, kinds: list[str], *, timeout_s: float = 20.0, mem_cap_gib: float = 2.0, seed: int = 0,
         progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:  # fmt: skip
    import onnx  # noqa: F401 - preloaded in the parent: every fork starts with it
    import onnxruntime  # noqa: F401

    import memwarden.cli
    import memwarden.commands.partition  # noqa: F401
    import memwarden.estimation.checkpoint  # noqa: F401
    import memwarden.plan.partition_onnx  # noqa: F401
    import memwarden.plan.partition_report  # noqa: F401
    import memwarden.record.onnx.capture  # noqa: F401

    # The CLI's parser imports every command (torch, sympy: ~2.5 s) on its first build; built here
    # once, each fork starts with them instead of paying it per case.
    memwarden.cli.build_parser()

    mem_cap = int(mem_cap_gib * 1024**3)
    if "feeds" in kinds:
        _BOMBS.update({size: npz_bomb(size) for size in (1 << 20, 1 << 26, 1 << 28)})
    cases = []
    for i in range(n):
        case = run_case(kinds[i % len(kinds)], seed + i, timeout_s=timeout_s, mem_cap=mem_cap)
        cases.append(case)
        if progress:
            progress(case)
    summary: dict[str, Any] = {"cases": len(cases)}
    for kind in kinds:
        mine = [c for c in cases if c["kind"] == kind]
        summary[kind] = {
            "cases": len(mine),
            "tracebacks": sum(c["traceback"] for c in mine),
            "hangs": sum(c["hang"] for c in mine),
            "crashes": sum(c["crash"] for c in mine),
            "multi_line_errors": sum(bool(c["multiline"]) for c in mine),
            "escape_leaks": sum(c["escape_leak"] for c in mine),
            "leftover_tmp": sum(bool(c["leftover_tmp"]) for c in mine),
            "peak_rss_mib": round(max((c["rss"] for c in mine), default=0) / 1024**2, 1),
            "max_seconds": max((c["seconds"] for c in mine), default=0.0),
            "slowest_seed": max(mine, key=lambda c: c["seconds"])["seed"] if mine else None,
            "over_10s": sum(c["seconds"] > 10 for c in mine),
        }
    bad = [c for c in cases if c["traceback"] or c["hang"] or c["crash"] or c["multiline"] or c["escape_leak"]
           or c["leftover_tmp"]]  # fmt: skip
    summary["findings"] = bad[:20]
    summary["ok"] = not bad
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--kinds", default="onnx,feeds,checkpoint")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=20.0)
    p.add_argument("--mem-cap-gib", type=float, default=2.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    import torch

    torch.set_num_threads(1)  # a child forked after a parent ran an OpenMP region can hang (docs/benchmarks.md)
    counter = {"n": 0}

    def tick(case: dict[str, Any]) -> None:
        counter["n"] += 1
        if counter["n"] % 200 == 0 and not args.json:
            print(f"{counter['n']}/{args.n}", file=sys.stderr)

    start = time.monotonic()
    summary = fuzz(args.n, kinds, timeout_s=args.timeout_s, mem_cap_gib=args.mem_cap_gib, seed=args.seed,
                   progress=tick)  # fmt: skip
    summary["seconds"] = round(time.monotonic() - start, 1)
    print(json.dumps(summary, indent=2, default=str))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
