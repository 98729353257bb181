"""``--fit BUDGET|DEVICE --solve ...``: the largest value of one request setting whose peak fits,
found on the same meta estimator, printed as the settings users type.

The peak grows with every solved setting (more pixels, frames, images, tokens or sequences never
free memory) and is close to a straight line in the tokens the setting adds (an image side's grow
with its area), so the search solves that line for the budget: from two fitting estimates while
nothing above is bracketed, then between the bracket's ends (regula falsi, Illinois-weighted, with
a bisection whenever one end stays put three times). The model's context bounds the solved tokens
too: the first estimate tells how many each step adds, so no guess goes past the step the context
is predicted to end at before that step has run, and a budget the context binds before costs four
estimates (the first step, a cheap second one for the slope, the limit, the refused step above). It ends, as a bisection does, with a value that fits
next to one that does not (or is refused), both run on the same estimator: about 4 estimates where the
previous secant crept up from below in 5-22. A budget under the meta model's weights is refused
before any request runs.

"Fits" is the plain estimate's verdict (``MemoryCard.fits_in``), on the card ``estimate`` makes
with the same device: on a CUDA device the peak compared is the allocator's reserved peak
(workspaces and the caching allocator's reserve, replayed from each value's own allocations). That
reserve does not grow smoothly with the setting (a Jetson's 0.5B batch of 374 reserved 0.57 GiB
more than one of 375), so a CUDA search takes more estimates (8-12 for a batch) and its answer is
a value that fits next to one that does not, as the search's bracket ends.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from memwarden.errors import InputError
from memwarden.estimation.card import Device, MemoryCard, Request
from memwarden.estimation.measure import card_for, refusal
from memwarden.estimation.rerun import image_multiple, replace_request
from memwarden.estimation.resolve import ResolvedModel

__all__ = ["SOLVES", "NothingFits", "solve_fit"]

SOLVES = ("image", "images", "frames", "prompt-tokens", "new-tokens", "batch")
_TOKEN_STEP = 64  # prompt/new tokens are solved to a multiple of 64
_DEFAULT_IMAGE = (448, 448)
_DEFAULT_VIDEO_FRAME = (448, 448)  # a video's frame size when the request gives no video
_SLOPE_PROBE = 16  # the second image side tried, in steps
_MAX_STEPS = 1 << 12  # no answer beyond 4096 steps (262144 tokens, 4096 images or sequences)


class NothingFits(InputError):
    """Not even the smallest step of the solved setting fits the budget: a verdict ("does not fit"),
    so the command exits 1 as a plain estimate that does not fit does, not 2 as for bad input."""

    exit_code = 1

    def __init__(self, message: str, *, solve: str, budget_bytes: int, peak_bytes: int, compared: str) -> None:
        super().__init__(message)
        self.solve, self.budget_bytes, self.peak_bytes, self.compared = solve, budget_bytes, peak_bytes, compared

    def to_json(self) -> dict[str, Any]:
        """The ``fit`` block of an answer that found nothing: no value, the smallest one's peak."""
        return {
            "solve": self.solve,
            "value": None,
            "peak_bytes": self.peak_bytes,
            "budget_bytes": self.budget_bytes,
            "compared": self.compared,
            "reason": str(self),
        }


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
    if solve == "frames":
        # Qwen-VL towers take frames in temporal patches (the video processor pads the last one), so
        # only a multiple of temporal_patch_size adds tokens; other towers take every frame
        temporal = getattr(getattr(resolved.config, "vision_config", None), "temporal_patch_size", None)
        step = temporal if isinstance(temporal, int) and 1 <= temporal <= 64 else 1
        return step, step * _MAX_STEPS
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
    if solve == "frames":
        frames = tuple((w, h) for w, h, _ in base.videos) or (_DEFAULT_VIDEO_FRAME,)
        return replace_request(base, videos=tuple((w, h, value) for w, h in frames))
    field = {"prompt-tokens": "prompt_tokens", "new-tokens": "new_tokens", "batch": "batch"}[solve]
    return replace_request(base, **{field: value})


def settings(solve: str, value: int, req: Request, card: MemoryCard) -> dict[str, str]:
    """The answer as typed: processor keyword arguments and serving flags of transformers and vLLM."""
    context = _context(req, card)
    if solve == "image":
        # Qwen-VL processors take a pixel budget, which transformers 5 keeps as size["longest_edge"]
        pixels = value * value
        return {
            "processor kwargs": f'max_pixels={pixels} (or size={{"longest_edge": {pixels}}}): images up to {value}x{value} px',
            "vllm": f"--mm-processor-kwargs '{json.dumps({'max_pixels': pixels})}' --max-model-len {context}",
        }
    if solve == "images":
        return {
            "vllm": f"--limit-mm-per-prompt '{json.dumps({'image': value})}' --max-model-len {context}",
            "transformers": f"at most {value} images per prompt",
        }
    if solve == "frames":
        videos = max(1, len(req.videos))
        return {
            "transformers": f"video processor num_frames={value} (frames sampled per video)",
            "vllm": f"--media-io-kwargs '{json.dumps({'video': {'num_frames': value}})}' "
            f"--limit-mm-per-prompt '{json.dumps({'video': videos})}' --max-model-len {context}",
        }
    if solve == "prompt-tokens":
        return {
            "transformers": f"tokenizer(..., truncation=True, max_length={value})",
            "vllm": f"--max-model-len {context}",
        }
    if solve == "new-tokens":
        return {
            "transformers": f"generate(..., max_new_tokens={value})",
            "vllm": f"SamplingParams(max_tokens={value}) --max-model-len {context}",
        }
    return {"transformers": f"batch size {value}", "vllm": f"--max-num-seqs {value}"}


class _Probes:
    """The estimates a search has run: step count -> peak bytes, or the reason the model refused
    that value (past its context). Pure: ``peak`` is the estimator, called once per step count."""

    def __init__(
        self, peak: Callable[[int], int | None], budget: int, accepts: Callable[[int], bool] | None = None
    ) -> None:
        self._peak, self.budget, self._accepts = peak, budget, accepts
        self.peaks: dict[int, int] = {}
        self.refused: set[int] = set()
        self.checked: set[int] = set()  # step counts only checked for acceptance (nothing ran)

    @property
    def has_checks(self) -> bool:
        return self._accepts is not None

    def accepted(self, k: int) -> bool:
        """Whether the model takes k steps at all, without running it (only with ``accepts``)."""
        assert self._accepts is not None
        if k in self.peaks or k in self.refused:
            return k in self.peaks
        self.checked.add(k)
        if not self._accepts(k):
            self.refused.add(k)
        return k not in self.refused

    def refusal_edge(self, lo: int, hi: int) -> int:
        """The largest k in [lo, hi) the model takes, ``lo`` taken and ``hi`` refused: a bisection
        on acceptance checks, which cost a fraction of an estimate (a limit other than memory, such
        as the prompt's room for media markers, bounds the answer)."""
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.accepted(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def fits(self, k: int) -> bool:
        if k not in self.peaks and k not in self.refused:
            value = self._peak(k)
            if value is None:
                self.refused.add(k)
            else:
                self.peaks[k] = value
        return k in self.peaks and self.peaks[k] <= self.budget


def _search(probes: _Probes, top: int, ctx_cap: int | None, *, quadratic: bool) -> tuple[int, int | None]:
    """(lo, hi): lo the largest step count that fits, hi = lo + 1 (None when lo is ``top``).
    ``probes.fits(1)`` holds; the peak is non-decreasing in k and near-linear in x = k (k*k when
    ``quadratic``: an image side, whose tokens grow with its area). ``ctx_cap``: the largest k the
    model's context is predicted to take (None: no context bound): no guess goes past it until it
    has been tried, since a refused estimate costs as much as one that runs.

    Each guess solves the straight line through two measured peaks for the budget: the two largest
    that fit while nothing above is bracketed, then the bracket's ends (regula falsi, with the
    Illinois halving so a bent curve cannot pin one end). A refused end carries no peak, so guesses
    below it come from the fitting side's slope. When three guesses in a row leave the same end in
    place the bracket is halved instead, so the count stays within a few times log2(top) however the
    curve bends; on the near-linear curves of real models it takes 2-4 estimates."""

    def x(k: int) -> float:
        return float(k * k) if quadratic else float(k)

    def k_of(target: float) -> int:  # the largest k with x(k) <= target (rounding error forgiven)
        return int(max(target, 0.0) ** 0.5 + 1e-9) if quadratic else int(target + 1e-9)

    budget = probes.budget
    lo, hi = 1, None
    undershoots = 0  # extrapolated guesses that still fitted: after two, a guess at least doubles lo
    weight = {"lo": 1.0, "hi": 1.0}  # Illinois: the weight of an end kept twice in a row is halved
    kept_last, kept_run = "", 0  # the end the last guess left in place, and how many guesses in a row
    while hi is None or hi - lo > 1:
        fitting = sorted(k for k in probes.peaks if probes.peaks[k] <= budget)
        if hi is None:
            if lo == top:
                break
            if lo == ctx_cap:
                cand = lo + 1  # the context is predicted to refuse it: confirm
            elif len(fitting) < 2:
                # the slope probe: a side of 16 steps (448 px on Qwen-VL) is still cheap, and far
                # enough above the processor's min_pixels padding for its tokens to follow the area
                cand = _SLOPE_PROBE if quadratic else lo + 1
            else:
                prev = fitting[-2]
                slope = (probes.peaks[lo] - probes.peaks[prev]) / (x(lo) - x(prev))
                guess = k_of(x(lo) + (budget - probes.peaks[lo]) / slope) if slope > 0 else 2 * lo
                cand = max(lo + 1, guess, 2 * lo if undershoots >= 2 else 0)
                undershoots += 1  # taken back below when the guess does not fit
            if ctx_cap is not None and lo < ctx_cap and ctx_cap not in probes.refused:
                cand = min(cand, ctx_cap)  # past the predicted limit the model refuses, at full cost
            cand = min(top, cand)
        elif kept_run >= 3:  # three guesses moved the same end: the curve bends, so halve the bracket
            cand = (lo + hi) // 2
        elif hi in probes.peaks:
            p_lo, p_hi = probes.peaks[lo], probes.peaks[hi]
            w_lo, w_hi = weight["lo"], weight["hi"]
            # the straight line through (x(lo), w_lo*(p_lo-budget)) and (x(hi), w_hi*(p_hi-budget)) crosses zero here
            f_lo, f_hi = w_lo * (p_lo - budget), w_hi * (p_hi - budget)
            frac = f_lo / (f_lo - f_hi) if f_hi != f_lo else 0.5
            cand = k_of(x(lo) + frac * (x(hi) - x(lo)))
        else:  # hi was refused: the fitting side's slope, or halfway when the budget lies beyond hi
            cand = (lo + hi) // 2
            guess = hi
            if len(fitting) >= 2:
                prev = fitting[-2]
                slope = (probes.peaks[lo] - probes.peaks[prev]) / (x(lo) - x(prev))
                guess = k_of(x(lo) + (budget - probes.peaks[lo]) / slope) if slope > 0 else hi
                cand = guess if guess < hi else cand
            if guess >= hi and probes.has_checks:
                # memory would allow more than the model takes: the answer is the refusal's edge,
                # found by acceptance checks; only that edge is estimated
                edge = probes.refusal_edge(lo, hi)
                if edge == lo:
                    hi = lo + 1
                    break
                cand = edge
        cand = max(lo + 1, cand if hi is None else min(hi - 1, cand))
        kept = "hi" if probes.fits(cand) else "lo"
        if kept == "lo":
            undershoots = 0
        if kept == "hi":
            lo = cand
        else:
            hi = cand
        moved = "lo" if kept == "hi" else "hi"
        weight[moved] = 1.0
        if hi is not None and kept == kept_last:
            weight[kept] /= 2
        kept_run = kept_run + 1 if kept == kept_last and hi is not None else 1
        kept_last = kept
    return lo, hi


def _context(req: Request, card: MemoryCard) -> int:
    """Positions one sequence of the request takes: its text, media placeholders and new tokens."""
    return req.prompt_tokens + req.new_tokens + sum(card.tokens.values()) - card.tokens.get("text", 0)


def _context_cap(resolved: ResolvedModel, solve: str, step: int, first: MemoryCard, base: Request) -> int | None:
    """The largest step count whose request the model's context is predicted to take, from the
    first estimate: the solved setting's tokens grow in proportion to x (k, or k*k for an image
    side, whose placeholders grow with its area); None where the context does not bound it."""
    limit = getattr(resolved.config.get_text_config(), "max_position_embeddings", None)
    if not isinstance(limit, int) or solve == "batch":
        return None
    req = first.request or base
    media = sum(first.tokens.values()) - first.tokens.get("text", 0)
    if solve == "image":
        # the step is the tower's patch x merge, so k steps of side make k*k placeholders per image
        # (the processor's min_pixels pads the smallest sizes, so the first estimate's count is no guide)
        used, per_x = req.prompt_tokens + req.new_tokens, max(1, len(req.images))
    elif solve == "images" or (solve == "frames" and not req.images and req.audio_seconds is None):
        used, per_x = req.prompt_tokens + req.new_tokens, media  # every placeholder is the solved media's
    elif solve == "frames":
        return None  # the images' and audio's placeholders are not told apart from the video's
    else:  # prompt-tokens, new-tokens
        used, per_x = _context(req, first) - step, step
    if per_x <= 0 or used + per_x > limit:
        return None
    room_x = (limit - used) / per_x  # x(k) that fills the context
    return max(1, int(room_x**0.5) if solve == "image" else int(room_x))


def _compared(card: MemoryCard) -> str:
    """Which peak the verdict compared: on a CUDA device the allocator's reserved peak, else the tensors'."""
    return "reserved_peak_bytes" if card.runtime else "peak_bytes"


def _weights_bytes(resolved: ResolvedModel, req: Request) -> int:
    """Bytes of the meta model's weights as the request holds them (tied tensors once): a lower
    bound of every peak, known without running a request."""
    from memwarden.estimation.metamodel import model_for

    model = model_for(resolved, req.dtype, req.weights_dtype)
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()] if t.device.type == "meta"}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def solve_fit(
    resolved: ResolvedModel, base: Request, budget_bytes: int, solve: str, device: Device | None = None
) -> tuple[MemoryCard, dict[str, Any]]:
    """(the card of the largest fitting value, the ``fit`` block); InputError when even the
    smallest step does not fit (without running a request when the weights alone do not).

    Every value tried is judged as the plain estimate judges it: its card is the one
    ``estimate(..., device=device)`` makes (``card_for`` with the device: on CUDA the allocator's
    reserved peak, workspaces and reserve included) and it fits when ``card.fits_in(budget)``. So
    the answer, given back to ``estimate`` with the same device, fits, and the next step does not
    (before, the search compared the tensors' peak and a CUDA device's reserve was left out: 3192 px
    "fit" a Jetson Orin Nano that the plain estimate, 2.0 GiB of reserve later, said it did not)."""
    if solve not in SOLVES:
        raise InputError(f"--solve takes one of {', '.join(SOLVES)}; got {solve!r}")
    step, most = _grid(resolved, base, solve)
    top = most // step
    if top < 1:
        raise InputError(f"not even {solve} = {step} fits {resolved.name}'s context")
    weights = _weights_bytes(resolved, base)
    if weights > budget_bytes:
        raise NothingFits(
            f"not even the weights ({weights} bytes) fit {budget_bytes} bytes; no {solve} does",
            solve=solve,
            budget_bytes=int(budget_bytes),
            peak_bytes=weights,
            compared="weights_bytes",
        )
    cards: dict[int, MemoryCard] = {}
    refused: dict[int, str] = {}  # k -> why the model does not accept that value (past its context)

    def peak(k: int) -> int | None:
        """The bytes the verdict compares for k steps (``MemoryCard.fits_in``: the device's peak);
        None: the model refuses that value."""
        try:
            cards[k] = card_for(resolved, _request(base, solve, k * step), device)[0]
        except InputError as exc:
            if k == 1:
                raise
            refused[k] = str(exc)
            return None
        return cards[k].device_peak_bytes

    def accepts(k: int) -> bool:
        why = refusal(resolved, _request(base, solve, k * step))
        if why is not None:
            refused[k] = why
        return why is None

    probes = _Probes(peak, budget_bytes, accepts)
    if not probes.fits(1):
        raise NothingFits(
            f"not even {solve} = {step} fits {budget_bytes} bytes ({_compared(cards[1])} {cards[1].device_peak_bytes} bytes)",
            solve=solve,
            budget_bytes=int(budget_bytes),
            peak_bytes=cards[1].device_peak_bytes,
            compared=_compared(cards[1]),
        )
    cap = _context_cap(resolved, solve, step, cards[1], base)
    lo, hi = _search(probes, top, cap, quadratic=solve == "image")
    card = cards[lo]
    # the search's own comparison is the card's verdict: nothing else decides "fits"
    assert card.fits_in(budget_bytes) and (hi is None or hi not in cards or not cards[hi].fits_in(budget_bytes))
    next_peak = cards[hi].device_peak_bytes if hi is not None and hi in cards else None
    req = card.request or base
    block = {
        "solve": solve,
        "value": lo * step,
        "peak_bytes": card.device_peak_bytes,
        "budget_bytes": int(budget_bytes),
        "next_value": hi * step if hi is not None else None,
        "next_peak_bytes": next_peak,
        "compared": _compared(card),
        "tensor_peak_bytes": card.peak_bytes,
        "settings": settings(solve, lo * step, req, card),
        "estimates_run": len(cards) + len(set(refused) - probes.checked),
        "acceptance_checks": len(probes.checked),
    }
    if hi is not None and hi in refused:
        block["next_refused"] = refused[hi]
    return card, block
