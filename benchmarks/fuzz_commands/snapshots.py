"""PyTorch memory snapshots: mutated as objects (payloads planted anywhere), pickled with any protocol."""

from __future__ import annotations

import pickle
import random
from typing import Any

from fuzz_commands import ROOT
from fuzz_commands.mutate import _get, _nodes, mutate_bytes, mutate_tree


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
