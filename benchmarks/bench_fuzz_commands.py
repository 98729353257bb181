"""Fuzz memwarden's commands (not only its loaders) with structured mutations of valid inputs.

    python benchmarks/bench_fuzz_commands.py [--n 10000] [--kinds trace,snapshot,config,thresholds,cli]
        [--seed 0] [--timeout-s 60] [--mem-cap-gib 6] [--json] [--out results.json]

Kinds (``--n`` cases each):

- ``trace``: a valid ``.mwtrace`` mutated at the structure level (a column value set to an extreme or
  out of range, columns reordered, strings/shapes/devices/metadata of the wrong type, NaN/inf/huge
  numbers and deep nesting written into the header's JSON text, duplicated keys, wrong column
  lengths, dtypes and offsets, with the payload checksum fixed up so the mutation reaches past
  it), sometimes also at the byte level. Every case is fed to every subcommand that reads a trace.
- ``snapshot``: a PyTorch memory snapshot mutated at the object level (field types, values,
  shared references, nesting, a ``__reduce__`` payload planted anywhere) and pickled with any
  protocol, sometimes also mutated as bytes; fed to the same subcommands.
- ``config``: a model ``config.json`` mutated field by field, fed to ``memwarden estimate``.
- ``thresholds``: a ``diagnose --config`` thresholds TOML, mutated, fed to ``memwarden diagnose``.
- ``cli``: argument lists of every subcommand, mutated (values replaced with hostile ones, flags
  dropped, duplicated, moved to another subcommand, abbreviated, bad paths).

Each case runs in a forked child (its own process group, ``RLIMIT_AS`` at ``--mem-cap-gib``, stdin
from /dev/null, stdout/stderr to files) that calls ``memwarden.cli.main`` in-process once per
command, so nothing leaks between cases and imports are paid once, in the parent. Per run it
records the exit status, whether an exception escaped ``main`` or ``Traceback`` reached stderr
(a *traceback*), the seconds taken and the peak resident set (``VmHWM``, reset before each run,
so it includes what the preloaded parent already held). A run past ``--timeout-s`` is killed and
counted. Every hostile pickle tries to create a canary file (``os.system``, ``posix.system``,
``builtins.open``, ``subprocess.Popen``, ``exec``); an *execution* is the canary existing after a
case. JSON printed by a ``--json`` run that exited 0 must parse without NaN/Infinity.

Targets: 0 tracebacks, 0 executions, no run over 60 s or over 2 GiB.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import math
import os
import pickle
import random
import resource
import select
import signal
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

KINDS = ("trace", "snapshot", "config", "thresholds", "cli")
OVER_BYTES = 2 << 30  # a run past this peak resident set is counted

# -- hostile values -----------------------------------------------------------------------

HUGE_INTS = [-1, 0, 1, -(2**31), 2**31 - 1, 2**32, 2**53 + 1, 2**62, 2**63 - 1, -(2**63), 2**64, 2**64 - 1, 10**30]
FLOATS = [float("nan"), float("inf"), float("-inf"), -0.0, 1e308, -1e308, 5e-324, 0.5, -0.5, 1e20]
TEXTS = ["", " ", "x" * 10_000, "\u202e\u0000evil", "日本語", "<script>alert(1)</script>", "${HOME}", "%s%n",
         "../../../../etc/passwd", "\ud800" * 0 + "\U0001f600" * 50, "\n\r\t", "None", "null", "NaN", "-1"]  # fmt: skip


def hostile_scalar(rng: random.Random) -> Any:
    pick = rng.random()
    if pick < 0.35:
        return rng.choice(HUGE_INTS)
    if pick < 0.6:
        return rng.choice(FLOATS)
    if pick < 0.8:
        return rng.choice(TEXTS)
    return rng.choice([None, True, False, [], {}, [[]], {"": None}])


def deep(depth: int) -> Any:
    value: Any = 0
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


def hostile_value(rng: random.Random) -> Any:
    pick = rng.random()
    if pick < 0.85:
        return hostile_scalar(rng)
    if pick < 0.93:
        return deep(rng.choice([50, 200]))  # deeper nesting is written into the raw text instead
    return [hostile_scalar(rng) for _ in range(rng.choice([3, 1000, 50_000]))]


# -- canary payloads ----------------------------------------------------------------------


class Reducer:
    """Pickles to ``func(*args)``: what a hostile snapshot would run when loaded."""

    def __init__(self, func: Any, args: tuple[Any, ...]) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (self.func, self.args)


def canary_payloads(marker: Path) -> list[Any]:
    import builtins
    import posix
    import subprocess

    return [
        Reducer(os.system, (f"touch {marker}",)),
        Reducer(posix.system, (f"touch {marker}",)),
        Reducer(builtins.open, (str(marker), "w")),
        Reducer(subprocess.Popen, (["touch", str(marker)],)),
        Reducer(builtins.exec, (f"open({str(marker)!r}, 'w')",)),
        Reducer(builtins.eval, (f"__import__('os').system('touch {marker}')",)),
    ]


# -- tree mutation (JSON-like and pickle-like objects) ------------------------------------


def _nodes(obj: Any, path: tuple[Any, ...] = (), out: list[tuple[Any, ...]] | None = None, limit: int = 4000):
    out = [] if out is None else out
    if len(out) >= limit or len(path) > 60:
        return out
    out.append(path)
    if isinstance(obj, dict):
        for k, v in obj.items():
            _nodes(v, (*path, k), out, limit)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _nodes(v, (*path, i), out, limit)
    return out


def _get(obj: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def mutate_tree(obj: Any, rng: random.Random, extra_values: list[Any] | None = None) -> Any:
    """``obj`` (dicts/lists/scalars) with one to four structured changes."""
    obj = copy.deepcopy(obj)
    for _ in range(rng.randint(1, 4)):
        paths = _nodes(obj)
        path = rng.choice(paths)
        if not path:
            continue
        parent, key = _get(obj, path[:-1]), path[-1]
        node = parent[key]
        op = rng.random()
        if op < 0.45:
            if extra_values and rng.random() < 0.3:
                parent[key] = rng.choice(extra_values)
            elif isinstance(node, bool | int | float) and rng.random() < 0.5:
                parent[key] = rng.choice([node * -1, node * 1000, node + 1, node - 1, 0, -1, str(node), float(node)])
            else:
                parent[key] = hostile_value(rng)
        elif op < 0.6:  # drop it
            del parent[key]
        elif op < 0.7 and isinstance(parent, list):  # duplicate (the same object, shared)
            parent.insert(key, node if rng.random() < 0.5 else copy.deepcopy(node))
            if rng.random() < 0.2:
                parent.extend([node] * rng.choice([10, 1000]))
        elif op < 0.8 and isinstance(parent, dict):  # a sibling's value, or an unknown key
            others = [k for k in parent if k != key]
            if others and rng.random() < 0.6:
                parent[key] = copy.deepcopy(parent[rng.choice(others)])
            else:
                parent[rng.choice(["__class__", "x" * 300, "", "日本", key + "_"])] = copy.deepcopy(node)
        elif op < 0.9 and isinstance(node, list | dict):  # wrong length: cut or nest
            if isinstance(node, list) and node:
                del node[rng.randrange(len(node)) :]
            else:
                parent[key] = [node]
        else:  # the right value in the wrong container type
            parent[key] = [node] if not isinstance(node, list) else {"0": node}
    return obj


_INTERESTING_BYTES = [b"\xff" * 8, b"\x00" * 8, b"-1", b"1e999", b"9" * 5000, b"NaN", b"[" * 2000, b"{" * 2000,
                      b'"', b"\\", b"\x80", struct.pack("<Q", 1 << 63), struct.pack("<I", 0xFFFFFFFF)]  # fmt: skip


def mutate_bytes(data: bytes, rng: random.Random, start: int = 0) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(5)
        lo = min(start, len(buf))
        if op == 0 and len(buf) > lo:
            del buf[rng.randrange(lo, len(buf)) :]
        elif op == 1 and len(buf) > lo:
            for _ in range(rng.randint(1, 8)):
                buf[rng.randrange(lo, len(buf))] = rng.randrange(256)
        elif op == 2:
            pos = rng.randrange(lo, len(buf) + 1)
            buf[pos:pos] = rng.choice(_INTERESTING_BYTES)
        elif op == 3 and len(buf) > lo:
            a = rng.randrange(lo, len(buf))
            buf[a:a] = buf[a : a + rng.randint(1, 64)] * rng.randint(2, 32)
        elif len(buf) > lo + 8:
            pos = rng.randrange(lo, len(buf) - 8)
            buf[pos : pos + 8] = struct.pack("<Q", rng.choice([1 << 62, 2**64 - 1, 1 << 40, 0]))
    return bytes(buf)


# -- traces -------------------------------------------------------------------------------


def seed_traces() -> list[Any]:
    import bench_fuzz

    from memwarden.trace.format import loads

    seeds = [loads(bench_fuzz.seed_trace()), loads((ROOT / "tests/fixtures/cuda_cpu.mwtrace").read_bytes())]
    return seeds


_COLUMN_VALUES = [0, 1, -1, 2, 3, 7, 200, 255, 2**15 - 1, -(2**15), 2**31 - 1, -(2**31), 2**62, 2**63 - 1, -(2**63)]


def _split(data: bytes) -> tuple[dict[str, Any], bytes]:
    from memwarden.trace.format import FORMAT_MAGIC

    fixed = len(FORMAT_MAGIC) + 12
    _version, length = struct.unpack("<IQ", data[len(FORMAT_MAGIC) : fixed])
    header = json.loads(data[fixed : fixed + length])
    start = fixed + length + (-(fixed + length)) % 64
    return header, data[start:]


def _join(header_text: bytes, payload: bytes, version: int = 1) -> bytes:
    from memwarden.trace.format import FORMAT_MAGIC

    head = FORMAT_MAGIC + struct.pack("<IQ", version, len(header_text)) + header_text
    return head + b"\0" * ((-len(head)) % 64) + payload


def _column_mutation(trace: Any, rng: random.Random) -> Any:
    import numpy as np

    from memwarden.trace.model import Trace

    ev = {k: v.copy() for k, v in trace.events.items()}
    sp = {k: v.copy() for k, v in trace.spans.items()}
    strings, shapes, devices = list(trace.strings), list(trace.shapes), list(trace.devices)
    metadata = json.loads(json.dumps(trace.metadata))
    for _ in range(rng.randint(1, 3)):
        op = rng.random()
        table = ev if (op < 0.5 or not len(sp["start_us"])) else sp
        name = rng.choice(sorted(table))
        column = table[name]
        if op < 0.7 and len(column):
            how = rng.random()
            if how < 0.6:
                value = rng.choice(_COLUMN_VALUES + [len(strings), len(shapes), len(devices), len(column)])
                index = rng.randrange(len(column)) if rng.random() < 0.8 else slice(None)
                info = np.iinfo(column.dtype)
                column[index] = np.array(value).astype(np.int64).clip(info.min, info.max).astype(column.dtype)
            elif how < 0.8:
                table[name] = column[::-1].copy()
            else:
                table[name] = np.random.default_rng(rng.randrange(1 << 30)).permutation(column)
        elif op < 0.8:
            strings = mutate_tree(strings, rng) if strings else [hostile_scalar(rng)]
            strings = [str(s) for s in strings] if isinstance(strings, list) else strings
        elif op < 0.87:
            shapes = [tuple(rng.choice([0, -1, 1, 2**31, 2**62, 2**63 - 1]) for _ in range(rng.randint(0, 8)))
                      for _ in range(max(1, len(shapes)))]  # fmt: skip
        elif op < 0.92:
            devices = rng.choice([[], ["cpu"] * 3, ["x" * 5000], ["cuda:0", "cuda:0"], ["\u202e"], ["cpu", "cuda:99"]])
        else:
            key = rng.choice(["steps", "annotations", "started_at", "device", "model", "exit_signal", "oom_killed",
                              "resident", "ring", "x"])  # fmt: skip
            metadata[key] = (
                hostile_value(rng)
                if key not in metadata or rng.random() < 0.5
                else mutate_tree({"v": metadata[key]}, rng).get("v")
            )
    return Trace(events=ev, spans=sp, strings=strings, shapes=shapes, devices=devices, metadata=metadata)


def _header_mutation(data: bytes, rng: random.Random) -> bytes:
    header, payload = _split(data)
    op = rng.random()
    version = 1
    if op < 0.4:  # a field of the header (columns, counts, tables) changed
        header = mutate_tree(header, rng, extra_values=["<i8", "<f8", ">i8", "|O", "<U10", "u1", "<c16", "V8"])
    elif op < 0.55 and header["columns"]:  # one column's descriptor
        column = rng.choice(header["columns"])
        field = rng.choice(["offset", "length", "dtype", "name"])
        column[field] = rng.choice(
            {
                "offset": [1, 63, 64, -64, 2**40, column["offset"] + 64],
                "length": [0, -1, 2**40, column["length"] + 1],
                "dtype": ["<f8", ">i8", "|O", "<U8", "|b1", "<i2"],
                "name": ["events.x", "spans.start_us", "events.time_us"],
            }[field]  # fmt: skip
        )
    elif op < 0.7 and len(payload) > 8:  # payload bytes (the checksum fixed up below)
        payload = mutate_bytes(payload, rng)
        header["payload_bytes"] = len(payload)
    text = json.dumps(header, separators=(",", ":")).encode()
    if op >= 0.7:  # the header's text: duplicated keys, non-JSON constants, nesting
        literal = rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"9" * 5000, b'"x"', b"[]", b"null",
                              b"[" * 3000 + b"]" * 3000, b'{"a":' * 3000 + b"1" + b"}" * 3000])  # fmt: skip
        key = rng.choice([b'"num_events"', b'"metadata"', b'"strings"', b'"devices"', b'"payload_bytes"', b'"shapes"'])
        pos = text.find(key)
        if pos > 0:
            text = text[:pos] + key + b":" + literal + b"," + text[pos:]  # the key twice: json keeps the last
        if rng.random() < 0.2:
            version = rng.choice([0, 2, 2**32 - 1])
    if b'"payload_crc32"' in text:
        text = text.replace(
            f'"payload_crc32":{header.get("payload_crc32")}'.encode(), f'"payload_crc32":{zlib.crc32(payload)}'.encode()
        )
    return _join(text, payload, version)


def make_trace(seeds: list[Any], rng: random.Random) -> bytes:
    from memwarden.trace.format import dumps

    trace = rng.choice(seeds)
    data = None
    if rng.random() < 0.55:
        try:
            data = dumps(_column_mutation(trace, rng))
        except Exception:  # noqa: BLE001 - a mutation the writer refuses; mutate the file instead
            data = None
    if data is None:
        data = _header_mutation(dumps(trace), rng)
    if rng.random() < 0.1:
        data = mutate_bytes(data, rng)
    return data


# Every subcommand that reads a trace, each case through one of its variants in turn (text and
# JSON output, each allocator model, each export format), so every variant sees every kind of case.
TRACE_COMMANDS = [
    [["summary", "--json", "{f}"], ["summary", "{f}"]],
    [["diagnose", "--json", "{f}"], ["diagnose", "{f}"]],
    [["report", "-o", "out.html", "{f}"]],
    [["replay", "--json", "--limit", "1MiB", "{f}"], ["replay", "{f}"], ["replay", "--allocator", "arena", "--json", "{f}"]],
    [["plan", "--json", "{f}"], ["plan", "{f}"]],
    [["export", "--format", "chrome", "-o", "out.json", "{f}"],
     ["export", "--format", "torch-snapshot", "--allocator", "pytorch", "-o", "out.pickle", "{f}"]],
    [["check", "--max-peak", "1GiB", "--max", "prefill=1MiB", "--json", "{f}"],
     ["check", "--baseline", "{seed}", "--max-growth", "5%", "{f}"]],
    [["compare", "--json", "{seed}", "{f}"], ["compare", "{f}", "{seed}"]],
]  # fmt: skip

# -- snapshots ----------------------------------------------------------------------------


def seed_snapshots() -> list[Any]:
    import bench_fuzz

    from memwarden.interop.snapshot import _restricted_loads

    raw = [bench_fuzz.seed_snapshot(), (ROOT / "tests/fixtures/small_snapshot.pickle").read_bytes()]
    return [_restricted_loads(r) for r in raw]  # plain dicts and lists: no class is ever loaded


def make_snapshot(seeds: list[Any], rng: random.Random, payloads: list[Any]) -> bytes:
    obj = mutate_tree(rng.choice(seeds), rng)
    if rng.random() < 0.15:  # a payload planted somewhere in the tree
        paths = [p for p in _nodes(obj) if p]
        if paths:
            path = rng.choice(paths)
            _get(obj, path[:-1])[path[-1]] = rng.choice(payloads)
        else:
            obj = rng.choice(payloads)
    try:
        data = pickle.dumps(obj, protocol=rng.randint(0, 5))
    except (RecursionError, ValueError):
        data = pickle.dumps(rng.choice(payloads), protocol=2)
    if rng.random() < 0.15:
        data = mutate_bytes(data, rng, start=2)
    return data


# -- config.json --------------------------------------------------------------------------


def seed_configs() -> list[dict[str, Any]]:
    from memwarden.models import zoo

    seeds = [zoo.build_config(name, "tiny").to_dict() for name in zoo.NAMES]
    return [json.loads(json.dumps(s, default=str)) for s in seeds]


_CONFIG_VALUES = ["pipeline", "Trainer", "__spec__", "AutoModel", "LlavaForConditionalGeneration", "gelu_new", "nope",
                  "llava", "qwen2_vl", "mllama", "bert", "float64", "int8", "auto", ["pipeline"], ["__spec__"], -1000,
                  -5, 0, 1e-30]  # fmt: skip


def make_config(seeds: list[dict[str, Any]], rng: random.Random) -> tuple[bytes, list[str]]:
    doc = mutate_tree(rng.choice(seeds), rng, extra_values=_CONFIG_VALUES)
    if isinstance(doc, dict) and rng.random() < 0.25:  # swapped sub-configs
        subs = [k for k, v in doc.items() if isinstance(v, dict)]
        if len(subs) >= 2:
            a, b = rng.sample(subs, 2)
            doc[a], doc[b] = doc[b], doc[a]
    try:
        text = json.dumps(doc).encode()
    except (ValueError, RecursionError):
        text = b"{}"
    if rng.random() < 0.1:
        text = mutate_bytes(text, rng)
    extra = rng.choice([[], ["--image", "64x48"], ["--audio-seconds", "1"], ["--image", "32x32", "--image", "16x64"]])
    return text, [
        "estimate",
        "config.json",
        "--no-suggest",
        "--json",
        "--prompt-tokens",
        "8",
        "--new-tokens",
        "2",
        *extra,
    ]


# -- diagnose thresholds ------------------------------------------------------------------


def seed_thresholds() -> dict[str, Any]:
    return {"thresholds": {"all": {"min_waste_fraction": 0.01},
                           "fragmentation": {"min_overhead_fraction": 0.3, "min_unused_bytes": 1 << 25},
                           "kv-reprefill": {"min_prefix_tokens": 16, "high": 0.5, "medium": 0.05},
                           "unbounded-growth": {"bins": 4, "min_bins": 3},
                           "load-spike": {"min_ratio": 1.5}}}  # fmt: skip


def to_toml(doc: Any) -> str:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return "nan" if v != v else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
        if isinstance(v, int):
            return str(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v[:200]) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(str(k))} = {value(x)}" for k, x in list(v.items())[:50]) + "}"
        return '""'

    lines = []
    if not isinstance(doc, dict):
        return f"x = {value(doc)}\n"
    for key, table in doc.items():
        if isinstance(table, dict) and all(isinstance(t, dict) for t in table.values()):
            for name, inner in table.items():
                lines.append(f"[{json.dumps(str(key))}.{json.dumps(str(name))}]")
                lines += [f"{json.dumps(str(k))} = {value(v)}" for k, v in inner.items()]
        else:
            lines.insert(0, f"{json.dumps(str(key))} = {value(table)}")
    return "\n".join(lines) + "\n"


def make_thresholds(rng: random.Random) -> bytes:
    text = to_toml(mutate_tree(seed_thresholds(), rng, extra_values=["lots", "nan", "inf", -1, 0, 10**30, 1e308]))
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.1:
        data = mutate_bytes(data, rng)
    return data


# -- argv ---------------------------------------------------------------------------------


def _write_fixtures(fix: Path) -> dict[str, str]:
    """Small valid inputs the argument seeds point at."""
    import bench_fuzz

    (fix / "seed.mwtrace").write_bytes(bench_fuzz.seed_trace())
    (fix / "seed.pickle").write_bytes(bench_fuzz.seed_snapshot())
    (fix / "script.py").write_text("x = [bytearray(1024) for _ in range(4)]\n")
    (fix / "align.jsonl").write_text(
        "".join(
            json.dumps({"type": "audio", "t_s": i * 0.04, "samples": 640}) + "\n"
            + json.dumps({"type": "video", "t_s": i * 0.04}) + "\n"
            for i in range(25)
        )
    )  # fmt: skip
    (fix / "grid.toml").write_text('models = ["llava"]\n[[requests]]\nprompt_tokens = 8\nnew_tokens = 2\n')
    (fix / "thresholds.toml").write_text(to_toml(seed_thresholds()))
    (fix / "a dir").mkdir(exist_ok=True)
    fifo = fix / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    link = fix / "link.json"
    if not link.is_symlink():
        link.symlink_to(fix / "target.json")
    try:
        import numpy as np
        from safetensors.numpy import save_file

        save_file({"base_model.model.layers.0.q_proj.lora_A.weight": np.ones((2, 8), np.float32),
                   "base_model.model.layers.0.q_proj.lora_B.weight": np.zeros((8, 2), np.float32)},
                  str(fix / "adapter.safetensors"))  # fmt: skip
    except ImportError:
        (fix / "adapter.safetensors").write_bytes(b"")
    return {k: str(fix / v) for k, v in {"trace": "seed.mwtrace", "pickle": "seed.pickle", "script": "script.py",
            "align": "align.jsonl", "grid": "grid.toml", "thresholds": "thresholds.toml", "dir": "a dir",
            "fifo": "fifo", "link": "link.json", "adapter": "adapter.safetensors"}.items()}  # fmt: skip


def argv_seeds(f: dict[str, str]) -> list[list[str]]:
    stress = str(ROOT / "examples/stress/plain.toml")
    return [
        ["summary", f["trace"]], ["summary", "--json", f["pickle"]], ["diagnose", "--config", f["thresholds"], f["trace"]],
        ["diagnose", "--json", "--pattern", "fragmentation", f["trace"]], ["diagnose", "--html", "d.html", f["trace"]],
        ["check", "--max-peak", "1GiB", "--max", "allocated:prefill.vision=2MiB", f["trace"]],
        ["check", "--baseline", f["trace"], "--max-growth", "5%", "--min-delta", "1KiB", f["trace"]],
        ["report", "-o", "r.html", "--title", "t", f["trace"]], ["export", "--format", "chrome", "-o", "c.json", f["trace"]],
        ["export", "--format", "torch-snapshot", "--allocator", "pytorch-expandable", "-o", "s.pickle", f["trace"]],
        ["replay", "--limit", "4KiB", "--alloc-conf", "max_split_size_mb:128,roundup_power2_divisions:4", f["trace"]],
        ["replay", "--heatmap", "h.png", "--device", "cpu", f["trace"]], ["plan", "--alignment", "512", "--json", f["trace"]],
        ["plan", "--strategy", "greedy-by-size", "--device", "0", f["trace"]],
        ["estimate", "llava", "--no-suggest", "--json", "--image", "64x48", "--prompt-tokens", "8", "--new-tokens", "2"],
        ["estimate", "qwen2-audio", "--no-suggest", "--audio-seconds", "1", "--batch", "2", "--dtype", "float16"],
        ["estimate", "llava", "--no-suggest", "--sweep", "--prompt-tokens", "8,16", "--new-tokens", "2", "--quiet"],
        ["estimate", "llava", "--no-suggest", "--fit", "1GiB", "--solve", "new-tokens", "--quiet", "--json"],
        ["estimate", "llava", "--no-suggest", "--weights-dtype", "int4", "--kv-dtype", "int8", "--max-pixels", "4096",
         "--device-profile", "raspberry-pi-5-8gb", "--format", "md", "--logits", "full"],
        ["devices", "--json"], ["telemetry", "--json", "--count", "1"],
        ["telemetry", "--replay", str(ROOT / "examples/telemetry/cold.jsonl"), "--json", "--set", "hysteresis_s=10"],
        ["telemetry", "--replay", str(ROOT / "examples/telemetry/tegrastats_orin_nano.log"), "--budget", "6GiB"],
        ["top", "127.0.0.1:9", "--once"], ["sweep", f["grid"], "--json", "--jobs", "1", "--quiet"],
        ["doctor", "--no-probe", "--json"], ["doctor", "--collect", "--no-probe", "-o", "facts.json"],
        ["align-check", f["align"], "--json", "--audio-rate", "16000", "--video-fps", "25"],
        ["align-check", f["align"], "--audio-per-frame", "640"],
        ["lora", "manifest", f["adapter"], "--version", "3"], ["lora", "diff", f["adapter"], f["adapter"], "-o", "d.st"],
        ["lora", "apply", f["adapter"], f["adapter"], "-o", "n.st"],
        ["compare", "--json", f["trace"], f["pickle"]], ["compare", "--html", "c.html", "--module-depth", "2", f["trace"], f["trace"]],
        ["partition", "missing.onnx", "--device-profile", "jetson-orin-nano-8gb", "--json", "--time-limit", "1"],
        ["trace", "-o", "t.mwtrace", f["script"]], ["trace", "-o", "t.mwtrace", "--ring", "1", "--stacks", f["script"]],
        ["stress", "--a", stress, "--b", stress, "--runs", "0", "--json", "--quiet"],
        ["demo", "--size", "tiny", "--naive-only", "--turns", "1", "--quiet", "--json", "-o", "demo-out"],
        [], ["--version"], ["summary", "--help"],
    ]  # fmt: skip


def _flags() -> list[str]:
    from memwarden.cli import build_parser

    parser = build_parser()
    out: set[str] = set()
    for action in parser._actions:
        for sub in getattr(action, "choices", None) or {}:
            sp = action.choices[sub]  # type: ignore[index]
            out.update(o for a in sp._actions for o in a.option_strings)
    return sorted(out - {"--executor", "--ray-address"})


def argv_values(f: dict[str, str]) -> list[str]:
    return ["-1", "0", "1e999", "inf", "-inf", "nan", "NaN", "9" * 400, "1e20", "2**63", "18446744073709551616",
            "100000000", "200000000", "x" * 5000, "", " ", "\u202e", "日本語", "-", "--", "=", "1,2,,3", "0x10",
            "1.5", "-0", "1GiB", "1e300GiB", "-5MiB", "448x-3", "0x0", "99999x99999", "a=b", "allocated:=1",
            "/nonexistent/dir/x", "/dev/zero", "/proc/self/status", "/", f["dir"], f["fifo"], f["link"],
            f["trace"], f["pickle"], f["script"], f["align"], "llava:huge", "llava", "qwen2-vl:small",
            "max_split_size_mb:-1", "roundup_power2_divisions:0", "expandable_segments:maybe"]  # fmt: skip


def make_argv(seeds: list[list[str]], flags: list[str], values: list[str], rng: random.Random) -> list[str]:
    argv = list(rng.choice(seeds))
    for _ in range(rng.randint(1, 3)):
        op = rng.random()
        i = rng.randrange(len(argv) + 1)
        if op < 0.4 and argv:  # a value (or any token) replaced
            j = rng.randrange(1, len(argv)) if len(argv) > 1 else 0
            argv[j] = rng.choice(values)
        elif op < 0.55 and argv:
            del argv[rng.randrange(len(argv))]
        elif op < 0.65 and argv:
            j = rng.randrange(len(argv))
            argv[j:j] = argv[j : j + 2]
        elif op < 0.8:  # a flag of any subcommand, with a value
            argv[i:i] = [rng.choice(flags), rng.choice(values)][: rng.randint(1, 2)]
        elif op < 0.87 and argv:  # --flag=value, or an abbreviation
            flagged = [j for j, a in enumerate(argv) if a.startswith("--")]
            if flagged:
                j = rng.choice(flagged)
                argv[j] = argv[j][: rng.randint(min(3, len(argv[j])), len(argv[j]))] + (
                    f"={rng.choice(values)}" if rng.random() < 0.5 else ""
                )
        elif op < 0.93 and argv:  # another subcommand's name
            argv[0] = rng.choice([s[0] for s in seeds if s])
        elif len(argv) > 1:
            j, k = rng.randrange(len(argv)), rng.randrange(len(argv))
            argv[j], argv[k] = argv[k], argv[j]
    # never ask for Ray (a network cluster) or a script module: both are trusted configuration
    return [a for a in argv if a not in ("ray", "--executor", "--ray-address", "-m")]


def asked_to_run_long(argv: list[str]) -> bool:
    """Commands that run as long as they are told to: ``top`` without ``--once``, a live
    ``telemetry`` with many samples, and ``demo`` (a real model captured, diagnosed and served: it
    takes minutes by design). A run over the limit there is counted apart, and listed."""
    if argv[:1] == ["top"] and "--once" not in argv or argv[:1] == ["demo"]:
        return True
    return argv[:1] == ["telemetry"] and "--replay" not in argv and any(a in argv for a in ("--count", "--interval"))


# -- the child ----------------------------------------------------------------------------


def _hwm_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_hwm() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _child(runs: list[list[str]], workdir: Path, wfd: int, mem_cap: int) -> None:
    import traceback

    from memwarden.cli import main

    os.setpgid(0, 0)
    os.chdir(workdir)
    if mem_cap:
        resource.setrlimit(resource.RLIMIT_AS, (mem_cap, mem_cap))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    # the real descriptors, whatever the parent had put in sys.stdout (pytest's capture, say)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    for i, argv in enumerate(runs):
        out = os.open(f"out{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err = os.open(f"err{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        os.write(wfd, f"S {i}\n".encode())
        _reset_hwm()
        rec: dict[str, Any] = {"i": i}
        begin = time.perf_counter()
        try:
            rec["rc"] = main(argv)
        except SystemExit as exc:
            rec["rc"] = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except BaseException as exc:  # noqa: BLE001 - the finding
            rec["exc"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            rec["where"] = traceback.format_exc()[-1200:]
        rec["s"] = round(time.perf_counter() - begin, 3)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        rec["rss"] = _hwm_bytes()
        stderr = Path(f"err{i}").read_bytes()[:200_000]
        if b"Traceback (most recent call last)" in stderr:
            rec["stderr_tb"] = stderr.decode("utf-8", "replace")[-1200:]
        printed = Path(f"out{i}").read_bytes()
        # --json in the list, but usage or the version printed: --json was not in force
        if (
            rec.get("rc") == 0
            and "--json" in argv
            and "exc" not in rec
            and not printed.startswith((b"usage:", b"memwarden "))
        ):
            try:
                json.loads(printed, parse_constant=_bad_constant)
            except (ValueError, UnicodeDecodeError) as exc:
                rec["bad_json"] = str(exc)[:120]
        os.write(wfd, ("R " + json.dumps(rec) + "\n").encode())
    os._exit(0)


def _bad_constant(name: str) -> Any:
    raise ValueError(f"printed {name}")


def run_case(runs: list[list[str]], workdir: Path, timeout_s: float, mem_cap: int) -> list[dict[str, Any]]:
    """Fork, run every argv of ``runs`` in the child, and collect one record per run."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(rfd)
        try:
            _child(runs, workdir, wfd, mem_cap)
        finally:
            os._exit(3)
    os.close(wfd)
    records: dict[int, dict[str, Any]] = {}
    started: dict[int, float] = {}
    current = -1
    buf = b""
    reader = os.fdopen(rfd, "rb", buffering=0)
    killed = False
    while True:
        wait = timeout_s - (time.monotonic() - started[current]) if current >= 0 else timeout_s
        ready, _, _ = select.select([reader], [], [], max(wait, 0.0))
        if not ready:
            if current >= 0 and current not in records:
                records[current] = {"i": current, "timeout": True, "s": timeout_s}
            with _quiet():
                os.killpg(pid, signal.SIGKILL)
            killed = True
            break
        chunk = reader.read(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.startswith(b"S "):
                current = int(line[2:])
                started[current] = time.monotonic()
            elif line.startswith(b"R "):
                rec = json.loads(line[2:])
                records[rec["i"]] = rec
    reader.close()
    _, status = os.waitpid(pid, 0)
    with _quiet():
        os.killpg(pid, signal.SIGKILL)  # anything the run left behind (workers of stress, sweep)
    if not killed and (os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0):
        for i in range(len(runs)):
            if i not in records and i == current:
                records[i] = {"i": i, "crash": f"child ended with status {status}"}
    return [records[i] for i in sorted(records)]


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], ProcessLookupError | PermissionError)  # type: ignore[arg-type]


# -- driver -------------------------------------------------------------------------------


def _preload(kinds: list[str], fix: dict[str, str], work: Path) -> None:
    """Import and warm what the commands use, once, in the parent (children inherit it)."""
    import memwarden.cli
    from memwarden.cli import main

    # Building the parser imports every command and takes ~20 ms: build it once here. Each case's
    # child gets its own copy with the fork, so nothing a run does to it reaches another case.
    parser = memwarden.cli.build_parser()
    memwarden.cli.build_parser = lambda: parser  # type: ignore[assignment]
    warm = [["summary", fix["trace"]], ["diagnose", "--json", fix["trace"]], ["report", "-o", "w.html", fix["trace"]],
            ["replay", "--heatmap", "w.png", fix["trace"]], ["plan", fix["trace"]], ["compare", fix["trace"], fix["pickle"]],
            ["export", "--format", "torch-snapshot", "-o", "w.pickle", fix["trace"]]]  # fmt: skip
    if "config" in kinds or "cli" in kinds:
        warm.append(["estimate", "llava", "--no-suggest", "--json", "--quiet"])
    cwd = os.getcwd()
    os.chdir(work)
    try:
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = io.StringIO()
        try:
            for argv in warm:
                main(argv)
        finally:
            sys.stdout, sys.stderr = saved
    finally:
        os.chdir(cwd)


def _case_maker(kind: str, rng: random.Random, fix: dict[str, str], marker: Path) -> Callable[[Path], list[list[str]]]:
    if kind in ("trace", "snapshot"):
        trace_seeds = seed_traces() if kind == "trace" else []
        snap_seeds = seed_snapshots() if kind == "snapshot" else []
        payloads = canary_payloads(marker)
        name = "case.mwtrace" if kind == "trace" else "case.pickle"

        count = iter(range(1 << 62))

        def make(work: Path) -> list[list[str]]:
            data = make_trace(trace_seeds, rng) if kind == "trace" else make_snapshot(snap_seeds, rng, payloads)
            (work / name).write_bytes(data)
            i = next(count)
            return [[a.format(f=name, seed=fix["trace"]) for a in group[i % len(group)]] for group in TRACE_COMMANDS]

        return make
    if kind == "config":
        configs = seed_configs()

        def make_c(work: Path) -> list[list[str]]:
            data, argv = make_config(configs, rng)
            (work / "config.json").write_bytes(data)
            return [argv]

        return make_c
    if kind == "thresholds":

        def make_t(work: Path) -> list[list[str]]:
            (work / "t.toml").write_bytes(make_thresholds(rng))
            return [
                ["diagnose", "--config", "t.toml", "--json", fix["trace"]],
                ["diagnose", "--config", "t.toml", fix["trace"]],
            ]

        return make_t
    seeds, flags, values = argv_seeds(fix), _flags(), argv_values(fix)

    def make_a(work: Path) -> list[list[str]]:
        return [make_argv(seeds, flags, values, rng)]

    return make_a


class KindRun:
    """The cases of one kind so far: counts, the slowest run, the largest resident set, and the
    first input of each distinct finding (kept under ``keep``)."""

    def __init__(self, kind: str, seed: int, base: Path, fix: dict[str, str], keep: Path) -> None:
        self.kind, self.keep = kind, keep
        self.marker = base / f"canary-{kind}"
        self.work = base / f"{kind}-work"
        self.make = _case_maker(kind, random.Random(f"{kind}:{seed}"), fix, self.marker)
        self.counts = {"cases": 0, "runs": 0, "exit_0": 0, "clear_errors": 0, "tracebacks": 0, "executions": 0,
                       "over_time": 0, "asked_long": 0, "over_memory": 0, "crashes": 0, "bad_json": 0}  # fmt: skip
        self.findings: dict[str, Any] = {}
        self.max_s, self.max_rss, self.seconds = 0.0, 0, 0.0

    def step(self, timeout_s: float, mem_cap: int) -> None:
        begin = time.perf_counter()
        self.work.mkdir(exist_ok=True)
        for p in self.work.iterdir():
            if p.is_dir() and not p.is_symlink():
                _rmtree(p)
            else:
                p.unlink()
        runs = self.make(self.work)
        self.counts["cases"] += 1
        for rec in run_case(runs, self.work, timeout_s, mem_cap):
            self._record(runs[rec["i"]], rec)
        if self.marker.exists():
            self.counts["executions"] += 1
            self._keep("execution", {"i": 0}, runs[0])
            self.marker.unlink()
        self.seconds += time.perf_counter() - begin

    def _record(self, argv: list[str], rec: dict[str, Any]) -> None:
        counts = self.counts
        counts["runs"] += 1
        self.max_s = max(self.max_s, float(rec.get("s", 0)))
        self.max_rss = max(self.max_rss, int(rec.get("rss", 0)))
        problem = None
        if rec.get("timeout"):
            key = "asked_long" if asked_to_run_long(argv) else "over_time"
            counts[key] += 1
            problem = key
        elif rec.get("crash"):
            counts["crashes"] += 1
            problem = "crash"
        elif "exc" in rec or "stderr_tb" in rec:
            counts["tracebacks"] += 1
            problem = "traceback"
        elif rec.get("rc") == 0:
            counts["exit_0"] += 1
        else:
            counts["clear_errors"] += 1
        if rec.get("bad_json"):
            counts["bad_json"] += 1
            problem = problem or "bad json: " + rec["bad_json"]
        if int(rec.get("rss", 0)) > OVER_BYTES:
            counts["over_memory"] += 1
            problem = problem or "over memory"
        if problem:
            self._keep(problem, rec, argv)

    def _keep(self, problem: str, rec: dict[str, Any], argv: list[str]) -> None:
        sig = f"{problem}: {_where(rec)}"
        if sig in self.findings:
            return
        kept = self.keep / f"{self.kind}-{len(self.findings)}"
        kept.mkdir(parents=True, exist_ok=True)
        for p in self.work.iterdir():
            if p.is_file() and p.stat().st_size < 50 << 20 and not p.name.startswith(("out", "err")):
                (kept / p.name).write_bytes(p.read_bytes())
        (kept / "argv.json").write_text(json.dumps(argv))
        self.findings[sig] = {"argv": argv[:12], "detail": (rec.get("where") or rec.get("stderr_tb") or "")[-600:],
                              "exc": rec.get("exc"), "kept": str(kept)}  # fmt: skip

    def result(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.counts, "max_run_s": round(self.max_s, 2),
                "max_rss_mib": round(self.max_rss / 2**20), "seconds": round(self.seconds, 1),
                "findings": self.findings}  # fmt: skip


def fuzz(kinds: list[str], n: int, seed: int, timeout_s: float, mem_cap: int, base: Path, fix: dict[str, str],
         keep: Path, progress: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """``n`` cases of each kind, taken in turn (one of each, then the next of each), so a run
    stopped early has covered every kind alike."""
    states = [KindRun(kind, seed, base, fix, keep) for kind in kinds]
    for case in range(n):
        for state in states:
            state.step(timeout_s, mem_cap)
        if progress and (case + 1) % 50 == 0:
            progress([s.result() for s in states])
    return [s.result() for s in states]


def _where(rec: dict[str, Any]) -> str:
    text = rec.get("where") or rec.get("stderr_tb") or ""
    frames = [line.strip() for line in text.splitlines() if line.strip().startswith('File "')]
    last = frames[-1] if frames else ""
    return f"{rec.get('exc', '')[:60]} @ {last[-120:]}"


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="cases per kind")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--mem-cap-gib", type=float, default=6.0, help="RLIMIT_AS of each case's process")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", help="also write the results (updated as they come) to this JSON file")
    parser.add_argument("--keep", default=str(Path(tempfile.gettempdir()) / "memwarden-fuzzcmd-findings"),
                        help="folder that keeps the inputs of each distinct finding")  # fmt: skip
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown kinds {sorted(unknown)}")
    with tempfile.TemporaryDirectory(prefix="memwarden-fuzzcmd-") as tmp:
        base = Path(tmp)
        (base / "fixtures").mkdir()
        fix = _write_fixtures(base / "fixtures")
        _preload(kinds, fix, base)

        def save(partial: list[dict[str, Any]]) -> None:
            if args.out:
                Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "results": partial}, indent=1))

        results = fuzz(kinds, args.n, args.seed, args.timeout_s, int(args.mem_cap_gib * 2**30), base, fix,
                       Path(args.keep), save)  # fmt: skip
        save(results)
        for result in [] if args.json else results:
            print(f"{result['kind']:10s} {result['cases']:6d} cases {result['runs']:7d} runs  {result['clear_errors']:6d} "
                  f"clear errors  {result['exit_0']:6d} ok  {result['tracebacks']} tracebacks  {result['executions']} "
                  f"executions  {result['over_time']} over {args.timeout_s:g} s  {result['over_memory']} over 2 GiB  "
                  f"{result['crashes']} crashes  {result['bad_json']} bad JSON  max {result['max_run_s']} s "
                  f"{result['max_rss_mib']} MiB  {result['seconds']} s", flush=True)  # fmt: skip
            for sig, ex in result["findings"].items():
                print(f"    {sig}\n      argv {ex['argv']}\n      kept {ex['kept']}")
        if args.json:
            print(json.dumps({"results": results}, indent=1))
    bad = ("tracebacks", "executions", "over_time", "over_memory", "crashes", "bad_json")
    return 1 if any(r[k] for r in results for k in bad) else 0


if __name__ == "__main__":
    sys.exit(main())
