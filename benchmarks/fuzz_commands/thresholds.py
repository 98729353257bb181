"""``diagnose --config`` threshold files: a valid table mutated, written as TOML."""

from __future__ import annotations

import json
import math
import random
from typing import Any

from fuzz_commands.mutate import mutate_bytes, mutate_tree


def seed_thresholds() -> dict[str, Any]:
    return {
        "thresholds": {
            "all": {"min_waste_fraction": 0.01},
            "fragmentation": {"min_overhead_fraction": 0.3, "min_unused_bytes": 1 << 25},
            "kv-reprefill": {"min_prefix_tokens": 16, "high": 0.5, "medium": 0.05},
            "unbounded-growth": {"bins": 4, "min_bins": 3},
            "load-spike": {"min_ratio": 1.5},
        }
    }


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
