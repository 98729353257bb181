"""The chat deployment memwarden demonstrates and stress-tests: a small zoo VLM answering turns
about one image, the whole conversation and the same image sent again each turn, as chat loops
written with transformers do. ``memwarden.demo`` runs it plain and governed; the ``demo-chat``
scenario of ``memwarden stress`` serves it in workers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_BUDGET_BYTES",
    "DEMO_DEVICE_BUDGET_BYTES",
    "DEMO_TURNS",
    "DemoConfig",
    "build_deployment",
    "conversation_inputs",
    "run_chat",
]

# A phone or Jetson-class share of memory for this small model: weights plus a
# few image prefills fit, a careless chat loop does not leave much headroom.
DEFAULT_BUDGET_BYTES = 320 * 1024**2
# The device budget and chat length `memwarden demo` serves the built-in deployment (llava small) with,
# under a real address-space limit. The fp32 weights are 180 MiB; plain generate() needs the process
# to hold 205-207 MiB by its first answer (its tensors ~200 MiB, plus kernel scratch, JIT code and
# the heap's waste) and 218-222 MiB by turn 4, so it fails at turn 1. The GovernedSession, with the
# same fp32 weights, streams what does not fit and reuses the conversation's prefix: it answers all
# four turns with the same tokens (docs/benchmarks.md, "The demo under a real limit").
DEMO_DEVICE_BUDGET_BYTES = 196 * 1024**2
DEMO_TURNS = 4


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    model: str = "llava"
    size: str = "small"
    turns: int = 4
    first_prompt_tokens: int = 24
    tokens_per_turn: int = 16
    new_tokens: int = 24
    budget_bytes: int = DEFAULT_BUDGET_BYTES
    seed: int = 0
    governed: bool = True  # end with the same turns served by a GovernedSession
    thermal: bool = True  # ... and a replayed thermal event that halves its budget mid-conversation
    thermal_turns: int = 6


def conversation_inputs(model: Any, config: DemoConfig, turn: int, seed: int | None = None) -> dict[str, Any]:
    """The request of ``turn``: the whole conversation so far and the same image, as chat loops
    written with transformers send it. Earlier answers appear as the app stored them (fixed
    tokens drawn from ``seed``), so every turn's prompt extends the previous one."""
    import torch

    from memwarden.models import zoo

    seed = config.seed if seed is None else seed
    inputs = zoo.make_inputs(model, prompt_tokens=config.first_prompt_tokens, seed=seed)
    grown = turn * (config.tokens_per_turn + config.new_tokens)
    if grown == 0:
        return inputs
    g = torch.Generator().manual_seed(seed + 1)
    history = torch.randint(zoo.FIRST_TEXT_ID, 200, (1, grown), generator=g, dtype=inputs["input_ids"].dtype)
    ids = inputs["input_ids"]
    for key, value in list(inputs.items()):
        if isinstance(value, torch.Tensor) and tuple(value.shape[:2]) == tuple(ids.shape) and key != "input_ids":
            fill = 1 if key == "attention_mask" else 0
            inputs[key] = torch.cat([value, torch.full((1, grown), fill, dtype=value.dtype)], 1)
    inputs["input_ids"] = torch.cat([ids, history], 1)
    return inputs


def build_deployment(config: DemoConfig) -> tuple[Any, Callable[[int], dict[str, Any]], dict[str, Any]]:
    """The model, a turn -> inputs function, and generate kwargs."""
    from memwarden.models import zoo

    model = zoo.build_model(config.model, size=config.size, seed=config.seed)
    return model, (lambda turn: conversation_inputs(model, config, turn)), zoo.generate_kwargs(config.model)


def run_chat(
    model: Any,
    turn_inputs: Callable[[int], dict[str, Any]],
    gen_kwargs: dict[str, Any],
    config: DemoConfig,
    on_turn: Callable[[int], None] | None = None,
) -> list[list[int]]:
    import torch

    outputs = []
    with torch.inference_mode():
        for turn in range(config.turns):
            inputs = turn_inputs(turn)
            out = model.generate(**inputs, max_new_tokens=config.new_tokens, **gen_kwargs)
            outputs.append(out[0, inputs["input_ids"].shape[1] :].tolist())
            if on_turn is not None:
                on_turn(turn)
    return outputs
