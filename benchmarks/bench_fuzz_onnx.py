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

With ``--full-every K`` (K > 1) every case is first made and read by the readers the commands
start with, in a long-lived forked *reader worker* that takes case after case (its own
``RLIMIT_AS``; a case past ``--timeout-s`` or one that kills it is that case's hang or crash, and a
fresh worker goes on from the next case): for a model, the guard (``load_checked``), the shape
inference ``partition`` runs under its memory limit, the partition problem's costing and
``load_graph`` (what ``trace --onnx`` reads first); for feeds, ``feed_headers`` and
``load_feeds(inputs=...)`` against the model's inputs, and the shape inference bound by them. An
``InputError`` must be one terminal-safe line. Only every K-th case of each kind also runs
the whole commands in a forked child as above (the solver and ORT are what cost ~0.5 s a case).
Per kind, the summary gives the commands' figures and, under ``read``, the readers'.
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
            shape = numpy_helper.from_array(
                np.array([rng.choice(HUGE[2:6])] * rng.randint(1, 2), dtype=np.int64), f"s{rng.randrange(99)}"
            )
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


def _make_onnx_case(kind: str, rng: random.Random, folder: Path) -> bool:
    """Write case ``kind`` (onnx or feeds) as ``folder/model.onnx`` and ``folder/feeds.npz``;
    whether ``trace --onnx`` is worth running on it."""
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
    return runs


def _read_case(kind: str, seed: int, folder: Path) -> list[str]:
    """Case ``seed`` of ``kind`` made in ``folder`` and given to the readers the commands start with
    (see the module's docstring), in this process; each ``InputError`` text, in order."""
    from memwarden.errors import InputError

    rng = random.Random(f"{kind}-{seed}")
    errors: list[str] = []
    if kind == "checkpoint":
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
        except InputError as exc:
            errors.append(str(exc))
        return errors
    from memwarden.models.compute_units import load_compute_units
    from memwarden.plan.partition_onnx import problem_of
    from memwarden.plan.partition_shapes import load_shaped
    from memwarden.record.onnx.feeds import feed_headers, load_feeds
    from memwarden.record.onnx.graph import load_graph
    from memwarden.record.onnx.guard import INFERENCE_MEMORY_BYTES, load_checked, memory_limited

    _make_onnx_case(kind, rng, folder)
    model, feeds = folder / "model.onnx", folder / "feeds.npz"
    try:  # partition's path: the guard, inference under its limit, the costing (not the solver)
        load_checked(model)
        shapes = None
        if kind == "feeds":
            shapes = {name: shape for name, (_, shape) in feed_headers(feeds).items()}
        with memory_limited(INFERENCE_MEMORY_BYTES, "shape inference of the graph"):
            shaped = load_shaped(model, input_shapes=shapes)
        problem_of(shaped.model, load_compute_units("iphone-15-pro"))
    except InputError as exc:
        errors.append(str(exc))
    try:  # trace --onnx's path up to ORT: the graph, then the feeds checked against its inputs
        load_feeds(feeds, inputs=load_graph(model).input_specs)
    except InputError as exc:
        errors.append(str(exc))
    return errors


def _reader_worker(jobs: list[tuple[int, str, int]], root: Path, mem_cap: int, out_fd: int) -> None:
    """In a forked child: read case after case (``_read_case``), one JSON line per case on
    ``out_fd``, preceded by a ``start`` line so the parent knows which case a hang or crash is."""
    import shutil
    import traceback

    resource.setrlimit(resource.RLIMIT_AS, (mem_cap, mem_cap))
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    out = os.fdopen(out_fd, "w", buffering=1)
    for index, kind, seed in jobs:
        folder = root / f"case{index}"
        folder.mkdir()
        tmpdir = folder / "tmp"
        tmpdir.mkdir()
        os.environ["TMPDIR"] = tempfile.tempdir = str(tmpdir)
        out.write(json.dumps({"start": index}) + "\n")
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass
        start = time.monotonic()
        escaped = ""
        errors: list[str] = []
        try:
            errors = _read_case(kind, seed, folder)
        except BaseException:  # noqa: BLE001 - the point: anything escaping is a finding
            escaped = traceback.format_exc()[-600:]
        leftovers = [p.name for p in tmpdir.iterdir() if p.name != ".ses"]
        result = {
            "index": index,
            "kind": kind,
            "seed": seed,
            "seconds": round(time.monotonic() - start, 3),
            "errors": [e[:300] for e in errors],
            "multiline": any("\n" in e or "\r" in e for e in errors),
            "escape_leak": any("\x1b" in e for e in errors),
            "traceback": bool(escaped),
            "stderr": escaped,
            "rss": _vm_hwm(),
            "leftover_tmp": leftovers,
            "hang": False,
            "crash": False,
        }
        shutil.rmtree(folder, ignore_errors=True)
        out.write(json.dumps(result) + "\n")
    out.close()
    os._exit(0)


def read_cases(
    jobs: list[tuple[int, str, int]],
    *,
    timeout_s: float,
    mem_cap: int,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every job (index, kind, seed) through the reader worker; a fresh worker after a hang or crash."""
    import select

    results: list[dict[str, Any]] = []
    todo = list(jobs)
    with tempfile.TemporaryDirectory(prefix="mw-fuzz-onnx-read-") as tmp:
        while todo:
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                os.setsid()
                try:
                    _reader_worker(todo, Path(tmp), mem_cap, write_fd)
                finally:
                    os._exit(70)
            os.close(write_fd)
            buffer = b""
            current: int | None = None
            started = time.monotonic()
            by_index = {j[0]: j for j in todo}
            done_here: set[int] = set()
            fate = ""
            while True:
                ready, _, _ = select.select([read_fd], [], [], 0.5)
                if ready:
                    chunk = os.read(read_fd, 1 << 16)
                    if not chunk:
                        fate = "crash" if current is not None else ""
                        break
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        record = json.loads(line)
                        if "start" in record:
                            current, started = record["start"], time.monotonic()
                        else:
                            results.append(record)
                            done_here.add(record["index"])
                            current = None
                            if progress:
                                progress(record)
                if current is not None and time.monotonic() - started > timeout_s:
                    fate = "hang"
                    break
            if fate == "hang":
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os.waitpid(pid, 0)
            os.close(read_fd)
            if current is not None:
                index, kind, seed = by_index[current]
                record = {
                    "index": index,
                    "kind": kind,
                    "seed": seed,
                    "seconds": round(time.monotonic() - started, 3),
                    "errors": [],
                    "multiline": False,
                    "escape_leak": False,
                    "traceback": False,
                    "hang": fate == "hang",
                    "crash": fate == "crash",
                    "stderr": "",
                    "rss": 0,
                    "leftover_tmp": [],
                }
                results.append(record)
                done_here.add(index)
                if progress:
                    progress(record)
                for leftover in Path(tmp).iterdir():  # what the killed worker was reading
                    import shutil

                    shutil.rmtree(leftover, ignore_errors=True)
            if not done_here:
                raise RuntimeError("the reader worker died before its first case")
            todo = [j for j in todo if j[0] not in done_here]
    return sorted(results, key=lambda r: r["index"])


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
            runs = _make_onnx_case(kind, rng, folder)
            argvs = [["partition", str(model), "--device-profile", "iphone-15-pro", "--time-limit", "2"]]
            if kind == "feeds":
                argvs[0] += ["--inputs", str(folder / "feeds.npz")]
            if runs:
                argvs.append(
                    [
                        "trace",
                        "--onnx",
                        str(model),
                        "--inputs",
                        str(folder / "feeds.npz"),
                        "-o",
                        str(folder / "out.mwtrace"),
                        "--arena",
                        rng.choice(["on", "off"]),
                    ]
                )
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
            "kind": kind,
            "seed": seed,
            "seconds": round(seconds, 3),
            "hang": hung,
            "crash": result is None and not hung,
            "traceback": bool(result and result["escaped"]) or "Traceback" in stderr,
            "multiline": failed and len(lines) > len(result["statuses"]) if result else False,
            "rss": result["rss"] if result else 0,
            "leftover_tmp": leftovers,
            "escape_leak": "\x1b" in stderr,
            "stderr": stderr[-600:] if (hung or not result or result["escaped"]) else "",
        }


def _summary(cases: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "cases": len(cases),
        "tracebacks": sum(c["traceback"] for c in cases),
        "hangs": sum(c["hang"] for c in cases),
        "crashes": sum(c["crash"] for c in cases),
        "multi_line_errors": sum(bool(c["multiline"]) for c in cases),
        "escape_leaks": sum(c["escape_leak"] for c in cases),
        "leftover_tmp": sum(bool(c["leftover_tmp"]) for c in cases),
        "peak_rss_mib": round(max((c["rss"] for c in cases), default=0) / 1024**2, 1),
        "max_seconds": max((c["seconds"] for c in cases), default=0.0),
        "slowest_seed": max(cases, key=lambda c: c["seconds"])["seed"] if cases else None,
        "over_10s": sum(c["seconds"] > 10 for c in cases),
    }


def _bad(case: dict[str, Any]) -> bool:
    return bool(
        case["traceback"]
        or case["hang"]
        or case["crash"]
        or case["multiline"]
        or case["escape_leak"]
        or case["leftover_tmp"]
    )


def fuzz(
    n: int,
    kinds: list[str],
    *,
    timeout_s: float = 20.0,
    mem_cap_gib: float = 2.0,
    seed: int = 0,
    full_every: int = 1,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """``n`` cases, kinds in turn. ``full_every`` 1: each through the commands in a forked child;
    K > 1: each through the readers (``read_cases``), and every K-th also through the commands."""
    import onnx  # noqa: F401 - preloaded in the parent: every fork starts with it
    import onnxruntime  # noqa: F401

    import memwarden.cli
    import memwarden.commands.partition  # noqa: F401
    import memwarden.estimation.checkpoint  # noqa: F401
    import memwarden.plan.partition_onnx  # noqa: F401
    import memwarden.plan.partition_report  # noqa: F401
    import memwarden.plan.partition_shapes  # noqa: F401
    import memwarden.record.onnx.capture  # noqa: F401

    # The CLI's parser imports every command (torch, sympy: ~2.5 s) on its first build; built here
    # once, each fork starts with them instead of paying it per case.
    memwarden.cli.build_parser()

    mem_cap = int(mem_cap_gib * 1024**3)
    if "feeds" in kinds:
        _BOMBS.update({size: npz_bomb(size) for size in (1 << 20, 1 << 26, 1 << 28)})
    jobs = [(i, kinds[i % len(kinds)], seed + i) for i in range(n)]
    read: list[dict[str, Any]] = []
    if full_every > 1:
        read = read_cases(jobs, timeout_s=timeout_s, mem_cap=mem_cap, progress=progress)
    full = []
    for i, kind, case_seed in jobs:
        if (i // len(kinds)) % full_every:  # every K-th case of each kind (i % K would pick one kind for even K)
            continue
        case = run_case(kind, case_seed, timeout_s=timeout_s, mem_cap=mem_cap)
        full.append(case)
        if progress:
            progress(case)
    summary: dict[str, Any] = {"cases": n, "full_every": full_every, "full_cases": len(full)}
    for kind in kinds:
        summary[kind] = _summary([c for c in full if c["kind"] == kind])  # the commands run
        if read:
            summary[kind]["read"] = _summary([c for c in read if c["kind"] == kind])
    bad = [c for c in read + full if _bad(c)]
    summary["findings"] = bad[:20]
    summary["findings_total"] = len(bad)
    summary["ok"] = not bad
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--kinds", default="onnx,feeds,checkpoint")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=20.0)
    p.add_argument("--mem-cap-gib", type=float, default=2.0)
    p.add_argument(
        "--full-every",
        type=int,
        default=1,
        help="K > 1: every case through the readers in-process, every K-th also through the commands",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--cases-out", metavar="FILE.jsonl", help="append every case's record here as it completes")
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    import torch

    torch.set_num_threads(1)  # a child forked after a parent ran an OpenMP region can hang (docs/benchmarks.md)
    counter = {"n": 0}

    log = open(args.cases_out, "a") if args.cases_out else None  # noqa: SIM115 - open for the whole run

    def tick(case: dict[str, Any]) -> None:
        counter["n"] += 1
        if log is not None:
            log.write(json.dumps({**case, "full": "index" not in case}) + "\n")
            log.flush()
        if _bad(case):
            print(f"finding: {json.dumps(case)[:800]}", file=sys.stderr, flush=True)
        if counter["n"] % 200 == 0 and not args.json:
            print(f"{counter['n']} cases done ({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)

    start = time.monotonic()
    summary = fuzz(
        args.n,
        kinds,
        timeout_s=args.timeout_s,
        mem_cap_gib=args.mem_cap_gib,
        seed=args.seed,
        full_every=max(1, args.full_every),
        progress=tick,
    )
    summary["seconds"] = round(time.monotonic() - start, 1)
    print(json.dumps(summary, indent=2, default=str))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
