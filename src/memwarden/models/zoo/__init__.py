"""Built-in model zoo: small multimodal models from transformers configs, with random weights.

Each name is a real transformers architecture (the model class a checkpoint of that family
loads into), shrunk so that tests and demos run on a laptop CPU with nothing downloaded:

- ``tiny``: a few hundred thousand parameters, a 4-token ``generate`` in well under a second.
  Most tests use it.
- ``small``: 20-60M parameters at the family's native-like resolution (256 image tokens for
  the LLaVA-style models), so that real compute outweighs Python overhead. The demo and the
  overhead benchmarks use it.

Requests are built without processors or tokenizers (those need downloads): :func:`make_inputs`
writes the tensors a family's processor would return, with the placeholder counts, marker
tokens and extra tensors (``image_grid_thw``, ``mm_token_type_ids``, ``pixel_attention_mask``,
``token_type_ids``, ``feature_attention_mask``) computed from the config the way the model code
under ``transformers/models/<family>/`` expects them.

Conventions:

- Attention is ``sdpa`` everywhere: it is transformers' default and what a deployment runs, and
  every family here supports it for its text, vision and audio parts.
- Token ids: 0 pad, 1 BOS, 2 EOS; the family's special tokens (image/audio placeholder, image
  start/end markers) sit at the top of the text vocabulary; prompt text is drawn uniformly from
  the ids in between.
- Weights are random but deterministic for a (name, size, seed, dtype): the model is
  constructed once, directly in the target dtype, under a forked RNG seeded with ``seed``.
  A bf16 build is therefore not the cast of the fp32 build of the same seed.
- ``image_size`` is ``(W, H)`` in pixels of an image already resized for the model (no tiling,
  no image splitting). ``audio_seconds`` count log-mel frames at 100 per second.

Layout: conventions, shared shapes, ``ZooSpec`` and the family base class in
``memwarden.models.zoo.base``; the families, the name registry, ``spec`` and ``build_config`` in
``memwarden.models.zoo.archs``; requests (``make_inputs``, ``placeholder_tokens``,
``generate_kwargs``) in ``memwarden.models.zoo.inputs``. This package builds models and gathers
the public names of its modules in ``__all__``: ``memwarden.models.zoo`` is the one import users
need.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

from memwarden.models.zoo.archs import NAMES, UnknownModelError, build_config, family_arch, spec
from memwarden.models.zoo.base import (
    ATTN_IMPLEMENTATION,
    BOS_ID,
    EOS_ID,
    FIRST_TEXT_ID,
    MEL_FRAMES_PER_SECOND,
    PAD_ID,
    SIZES,
    ZooSpec,
)
from memwarden.models.zoo.inputs import generate_kwargs, make_inputs, placeholder_tokens

# The zoo's public surface (held-out code uses zoo.build_model, zoo.make_inputs, zoo.EOS_ID, ...):
# the names this package defines and the ones it gathers from its modules. Inside memwarden,
# code imports each name from the module that defines it.
__all__ = [
    "ATTN_IMPLEMENTATION",
    "BOS_ID",
    "DEFAULT_DEPLOYMENT",
    "EOS_ID",
    "FIRST_TEXT_ID",
    "MEL_FRAMES_PER_SECOND",
    "PAD_ID",
    "NAMES",
    "SIZES",
    "UnknownModelError",
    "ZooSpec",
    "build_config",
    "build_model",
    "generate_kwargs",
    "make_inputs",
    "parameter_count",
    "placeholder_tokens",
    "spec",
]

DEFAULT_DEPLOYMENT = "llava"


def build_model(name: str, size: str = "tiny", dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """Construct zoo model ``name`` on CPU with random weights, once, directly in ``dtype``; eval mode.

    The caller's RNG state is left alone: weights come from a forked generator seeded with ``seed``.
    """
    return build_from_config(name, build_config(name, size), dtype=dtype, seed=seed)


def build_from_config(name: str, cfg: Any, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """Like :func:`build_model`, from a zoo config the caller changed (more layers, a larger image)."""
    arch = family_arch(name)
    model_cls = getattr(transformers, arch.model_class)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls._from_config(cfg, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
        arch.finish_init(model)
    model.generation_config.pad_token_id = PAD_ID
    return model.eval()


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
