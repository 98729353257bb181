"""Traces: a valid ``.mwtrace`` mutated at the column, header and byte level; every subcommand that reads one."""

from __future__ import annotations

import json
import random
import struct
import zlib
from typing import Any

from fuzz_commands import ROOT
from fuzz_commands.mutate import hostile_scalar, hostile_value, mutate_bytes, mutate_tree


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
            shapes = [
                tuple(rng.choice([0, -1, 1, 2**31, 2**62, 2**63 - 1]) for _ in range(rng.randint(0, 8)))
                for _ in range(max(1, len(shapes)))
            ]
        elif op < 0.92:
            devices = rng.choice([[], ["cpu"] * 3, ["x" * 5000], ["cuda:0", "cuda:0"], ["\u202e"], ["cpu", "cuda:99"]])
        else:
            key = rng.choice(
                [
                    "steps",
                    "annotations",
                    "started_at",
                    "device",
                    "model",
                    "exit_signal",
                    "oom_killed",
                    "resident",
                    "ring",
                    "x",
                ]
            )
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
            }[field]
        )
    elif op < 0.7 and len(payload) > 8:  # payload bytes (the checksum fixed up below)
        payload = mutate_bytes(payload, rng)
        header["payload_bytes"] = len(payload)
    text = json.dumps(header, separators=(",", ":")).encode()
    if op >= 0.7:  # the header's text: duplicated keys, non-JSON constants, nesting
        literal = rng.choice(
            [
                b"NaN",
                b"Infinity",
                b"-Infinity",
                b"1e999",
                b"9" * 5000,
                b'"x"',
                b"[]",
                b"null",
                b"[" * 3000 + b"]" * 3000,
                b'{"a":' * 3000 + b"1" + b"}" * 3000,
            ]
        )
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
    [
        ["replay", "--json", "--limit", "1MiB", "{f}"],
        ["replay", "{f}"],
        ["replay", "--allocator", "arena", "--json", "{f}"],
    ],
    [["plan", "--json", "{f}"], ["plan", "{f}"]],
    [
        ["export", "--format", "chrome", "-o", "out.json", "{f}"],
        ["export", "--format", "torch-snapshot", "--allocator", "pytorch", "-o", "out.pickle", "{f}"],
    ],
    [
        ["check", "--max-peak", "1GiB", "--max", "prefill=1MiB", "--json", "{f}"],
        ["check", "--baseline", "{seed}", "--max-growth", "5%", "{f}"],
    ],
    [["compare", "--json", "{seed}", "{f}"], ["compare", "{f}", "{seed}"]],
]
