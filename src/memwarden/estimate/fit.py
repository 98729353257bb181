"""``--fit BUDGET|DEVICE --solve ...``: the largest value of one request setting whose peak fits,
found on the same meta estimator, printed as the settings users type.

The peak grows with every solved setting (more pixels, images, tokens or sequences never free
memory), so the search doubles from the smallest step until a value does not fit and then
bisects on the step grid: about 2 log2(answer/step) estimates, each reusing the cached meta model.
"""

from __future__ import annotations

import json
from typing import Any

from memwarden.errors import InputError
from memwarden.estimate.card import MemoryCard, Request
from memwarden.estimate.measure import card_for
from memwarden.estimate.rerun import image_multiple, replace_request
from memwarden.estimate.resolve import ResolvedModel

__all__ = ["SOLVES", "solve_fit"]

SOLVES = ("image", "images", "prompt-tokens", "new-tokens", "batch")
_TOKEN_STEP = 64  # prompt/new tokens are solved to a multiple of 64
_DEFAULT_IMAGE = (448, 448)
_MAX_STEPS = 1 << 12  # no answer beyond 4096 steps (262144 tokens, 4096 images or sequences)


def _grid(resolved: ResolvedModel, base: Request, solve: str) -> tuple[int, int]:
    """(step, the largest value the model accepts) of the solved setting."""
    text = resolved.config.get_text_config()
    context = getattr(text, "max_position_embeddings", None)
    context = context if isinstance(context, int) else _TOKEN_STEP * _MAX_STEPS
    if solve == "image":
        multiple = image_multiple(resolved)
        if multiple is None:
            raise InputError(f"{resolved.name} takes images at a fixed size; solve 'images' (how many) instead")
        return multiple, multiple * 512
    if solve == "prompt-tokens":
        return _TOKEN_STEP, context - base.new_tokens
    if solve == "new-tokens":
        return _TOKEN_STEP, context - base.prompt_tokens
    return 1, _MAX_STEPS  # images, batch


def _request(base: Request, solve: str, value: int) -> Request:
    if solve == "image":
        return replace_request(base, images=((value, value),) * max(1, len(base.images)), max_pixels=value * value)
    if solve == "images":
        return replace_request(base, images=(base.images[0] if base.images else _DEFAULT_IMAGE,) * value)
    field = {"prompt-tokens": "prompt_tokens", "new-tokens": "new_tokens", "batch": "batch"}[solve]
    return replace_request(base, **{field: value})


def settings(solve: str, value: int, req: Request, card: MemoryCard) -> dict[str, str]:
    """The answer as typed: processor keyword arguments and serving flags of transformers and vLLM."""
    context = req.prompt_tokens + req.new_tokens + sum(card.tokens.values()) - card.tokens.get("text", 0)
    if solve == "image":
        pixels = value * value
        return {
            "processor kwargs": f'max_pixels={pixels} (Qwen-VL), size={{"longest_edge": {value}}}',
            "vllm": f"--mm-processor-kwargs '{json.dumps({'max_pixels': pixels})}' --max-model-len {context}",
        }
    if solve == "images":
        return {"vllm": f"--limit-mm-per-prompt '{json.dumps({'image': value})}' --max-model-len {context}",
                "transformers": f"at most {value} images per prompt"}  # fmt: skip
    if solve == "prompt-tokens":
        return {"transformers": f"tokenizer(..., truncation=True, max_length={value})",
                "vllm": f"--max-model-len {context}"}  # fmt: skip
    if solve == "new-tokens":
        return {"transformers": f"generate(..., max_new_tokens={value})",
                "vllm": f"SamplingParams(max_tokens={value}) --max-model-len {context}"}  # fmt: skip
    return {"transformers": f"batch size {value}", "vllm": f"--max-num-seqs {value}"}


def solve_fit(
    resolved: ResolvedModel, base: Request, budget_bytes: int, solve: str
) -> tuple[MemoryCard, dict[str, Any]]:
    """(the card of the largest fitting value, the ``fit`` block); InputError when even the
    smallest step does not fit."""
    if solve not in SOLVES:
        raise InputError(f"--solve takes one of {', '.join(SOLVES)}; got {solve!r}")
    step, most = _grid(resolved, base, solve)
    cards: dict[int, MemoryCard] = {}
    refused: dict[int, str] = {}  # k -> why the model does not accept that value (past its context)

    def peak(k: int) -> int:  # k steps; a value the model refuses never fits
        if k not in cards and k not in refused:
            try:
                cards[k] = card_for(resolved, _request(base, solve, k * step))[0]
            except InputError as exc:
                if k == 1:
                    raise
                refused[k] = str(exc)
        return cards[k].peak_bytes if k in cards else budget_bytes + 1

    top = most // step
    if top < 1 or peak(1) > budget_bytes:
        first = cards.get(1)
        raise InputError(
            f"not even {solve} = {step} fits {budget_bytes} bytes"
            + (f" (peak {first.peak_bytes} bytes)" if first is not None else "")
        )
    lo, hi = 1, None  # lo fits; hi does not (None: not found yet)
    while hi is None:
        k = min(lo * 2, top)
        if k == lo:
            break  # the largest value the model accepts fits
        if peak(k) <= budget_bytes:
            lo = k
        else:
            hi = k
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak(mid) <= budget_bytes else (lo, mid)
    card = cards[lo]
    nxt = hi if hi is not None else None
    if nxt is not None and nxt != lo + 1:
        nxt = lo + 1
    next_peak = cards[nxt].peak_bytes if nxt is not None and peak(nxt) and nxt in cards else None
    req = card.request or base
    block = {
        "solve": solve, "value": lo * step, "peak_bytes": card.peak_bytes, "budget_bytes": int(budget_bytes),
        "next_value": nxt * step if nxt is not None else None, "next_peak_bytes": next_peak,
        "settings": settings(solve, lo * step, req, card), "estimates_run": len(cards) + len(refused),
    }  # fmt: skip
    if nxt is not None and nxt in refused:
        block["next_refused"] = refused[nxt]
    return card, block
