"""Hostile values, canary payloads, and the structured (tree) and byte mutations every kind uses."""

from __future__ import annotations

import copy
import os
import random
import struct
from pathlib import Path
from typing import Any

HUGE_INTS = [-1, 0, 1, -(2**31), 2**31 - 1, 2**32, 2**53 + 1, 2**62, 2**63 - 1, -(2**63), 2**64, 2**64 - 1, 10**30]
FLOATS = [float("nan"), float("inf"), float("-inf"), -0.0, 1e308, -1e308, 5e-324, 0.5, -0.5, 1e20]
TEXTS = [
    "",
    " ",
    "x" * 10_000,
    "\u202e\u0000evil",
    "日本語",
    "<script>alert(1)</script>",
    "${HOME}",
    "%s%n",
    "../../../../etc/passwd",
    "\ud800" * 0 + "\U0001f600" * 50,
    "\n\r\t",
    "None",
    "null",
    "NaN",
    "-1",
]


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


_INTERESTING_BYTES = [
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
