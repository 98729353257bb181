"""``--fit BUDGET|DEVICE --solve ...``: the largest value of one request setting whose peak fits,
found on the same meta estimator, printed as the settings users type.

The peak grows with every solved setting (more pixels, images, tokens or sequences never free
memory) and nearly linearly in the solved quantity (tokens, images, sequences; pixels for an
image side), so the search is a safeguarded secant on the step grid: two probes give the bytes per
step, each further guess interpolates between the closest value that fits and the closest that
does not, and every third guess bisects so a bend in the curve cannot stall it. It ends, as a
bisection does, with a value that fits next to one that does not, both run on the same estimator
(typically 4-6 estimates instead of 2 log2(answer/step)).
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


def _search(peak: Any, budget: int, top: int, *, quadratic: bool) -> tuple[int, int | None]:
    """(lo, hi): lo the largest step count that fits, hi = lo + 1 (None when lo is ``top``).
    ``peak(1)`` fits; the peak is non-decreasing in k, and near-linear in k (k*k when quadratic)."""

    def x(k: int) -> float:
        return float(k * k) if quadratic else float(k)

    lo, hi, prev, steps = 1, None, None, 0  # prev: the fitting value evaluated before lo
    while hi is None or hi - lo > 1:
        steps += 1
        if hi is None:
            if lo == top:
                break
            if prev is None:
                cand = lo + 1
            else:  # extrapolate the bytes per step of the last two fitting values
                slope = (peak(lo) - peak(prev)) / (x(lo) - x(prev))
                room = budget - peak(lo)
                target = x(lo) + room / slope if slope > 0 else float(2 * lo)
                guess = int(target**0.5) if quadratic else int(target)
                cand = min(top, max(lo + 1, guess, 2 * lo if steps % 3 == 0 else 0))  # doubling every third
        elif steps % 3 == 0:
            cand = (lo + hi) // 2  # a bisection every third guess
        else:  # interpolate between the closest value that fits and the closest that does not
            p_lo, p_hi = peak(lo), peak(hi)
            frac = (budget - p_lo) / (p_hi - p_lo) if p_hi > p_lo else 0.5
            target = x(lo) + frac * (x(hi) - x(lo))
            guess = int(target**0.5) if quadratic else int(target)
            cand = min(hi - 1, max(lo + 1, guess))
        if peak(cand) <= budget:
            prev, lo = lo, cand
        else:
            hi = cand
    return lo, hi


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
    lo, hi = _search(peak, budget_bytes, top, quadratic=solve == "image")
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
