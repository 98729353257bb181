"""Model ``config.json`` files mutated field by field, fed to ``memwarden estimate``."""

from __future__ import annotations

import json
import random
from typing import Any

from fuzz_commands.mutate import mutate_bytes, mutate_tree


def seed_configs() -> list[dict[str, Any]]:
    from memwarden.models import zoo

    seeds = [zoo.build_config(name, "tiny").to_dict() for name in zoo.NAMES]
    return [json.loads(json.dumps(s, default=str)) for s in seeds]


_CONFIG_VALUES = [
    "pipeline",
    "Trainer",
    "__spec__",
    "AutoModel",
    "LlavaForConditionalGeneration",
    "gelu_new",
    "nope",
    "llava",
    "qwen2_vl",
    "mllama",
    "bert",
    "float64",
    "int8",
    "auto",
    ["pipeline"],
    ["__spec__"],
    -1000,
    -5,
    0,
    1e-30,
]


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
