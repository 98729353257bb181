"""vision-token-dominance: images / frames / audio make more tokens than the budget tolerates.

A 1232 px image gives Qwen2-VL ~1900 visual tokens; 32 video frames give 1024;
every one of them costs encoder activations, language-model activations and KV.
At the peak, the bytes that belong to media tokens are:

- the encoder's and projector's activations and temporaries (vision/audio/fusion
  modality) live at the peak, all of them media;
- the language model's activations, temporaries and KV cache (text/shared
  modality) live at the peak, times the media share of the sequence being
  processed (the token counts of the step, ``Analysis.steps``, of the prefill that the peak
  belongs to; an encode that runs before its prefill belongs to that prefill).

The pattern holds when that is at least ``min_share`` (0.5) of the activation +
KV + temporary bytes at the peak and the request has at least
``min_media_tokens`` (256) media tokens. The predicted saving assumes media
bytes scale linearly with media tokens (encoder attention scales faster, so the
real saving is larger): cutting media tokens from m to m* saves
``(media_bytes + media_input_bytes) * (1 - m*/m)``, where m* is the token count
at which the media share would fall to ``min_share``, and never below
``min_media_tokens``. Media inputs are the floating-point model inputs live at
the peak (pixel values, audio features: token ids and masks are integers);
they scale with the pixels too, but are not counted in the share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from memwarden.analyze.diagnose import Context, Finding, severity_for
from memwarden.analyze.lines import input_rows, led_by, script_input_lines
from memwarden.analyze.timeline import live_blocks_at
from memwarden.trace.model import Category, Modality, SpanKind, Trace
from memwarden.trace.steps import Step
from memwarden.units import format_bytes

PATTERN = "vision-token-dominance"
_WORKING = (int(Category.ACTIVATION), int(Category.KV_CACHE), int(Category.TEMPORARY))
_ENCODER = (int(Modality.VISION), int(Modality.AUDIO), int(Modality.FUSION))
_MEDIA = (int(Modality.VISION), int(Modality.AUDIO))
_QWEN_PX_PER_TOKEN = 28 * 28  # Qwen2-VL: 14 px patches merged 2x2 -> one token per 28x28 px


def _context_at(steps: Sequence[Step], t_us: int) -> dict[str, Any] | None:
    """Token counts of the sequence the model works on at ``t_us``: the prefill of the request the
    moment belongs to, plus the tokens its decode steps have fed so far."""
    if not steps:
        return None
    k = next((i for i, st in enumerate(steps) if st.start_us <= t_us <= st.end_us), None)
    if k is None:  # between calls: an encode feeds the next prefill; otherwise the request so far
        nxt = next((i for i, st in enumerate(steps) if st.start_us > t_us), None)
        if nxt is not None and steps[nxt].phase == "prefill":
            k = nxt
        else:
            k = max((i for i, st in enumerate(steps) if st.start_us <= t_us), default=None)
    if k is None:
        return None
    prefill = next((i for i in range(k, -1, -1) if steps[i].phase == "prefill"), None)
    if prefill is None:
        return None
    tokens = dict(steps[prefill].tokens)
    if not tokens:
        return None
    decoded = sum(1 for st in steps[prefill + 1 : k + 1] if st.phase == "decode")
    tokens["text"] = tokens.get("text", 0) + decoded
    return {
        "step": prefill,
        "tokens": tokens,
        "batch": steps[prefill].batch,
        "module": steps[prefill].module,
    }


def _encoder_names(trace: Trace) -> list[str]:
    """Names of the outermost vision/audio module spans (the towers)."""
    s = trace.spans
    if trace.num_spans == 0:
        return []
    modality = s["modality"].astype(np.int64)
    parent = s["parent"].astype(np.int64)
    parent_modality = np.where(parent >= 0, modality[np.clip(parent, 0, None)], -1)
    rows = np.flatnonzero((s["kind"] == SpanKind.MODULE) & np.isin(modality, _MEDIA) & (parent_modality != modality))
    return sorted({trace.string(int(n)) or "" for n in s["name"][rows]} - {""})


def detect(trace: Trace, ctx: Context) -> list[Finding]:
    n = trace.num_events
    steps = ctx.analysis.steps
    if n == 0 or not steps:
        return []
    min_share = float(ctx.threshold(PATTERN, "min_share", 0.5))
    min_tokens = int(ctx.threshold(PATTERN, "min_media_tokens", 256))
    e = trace.events
    signed = ctx.analysis.signed_bytes
    live = ctx.analysis.live_bytes
    p = int(np.argmax(live))
    peak_bytes = int(live[p])

    context = _context_at(steps, int(e["time_us"][p]))
    if context is None:
        return []
    tokens = context["tokens"]
    media_tokens = int(tokens.get("vision", 0)) + int(tokens.get("audio", 0))
    seq_tokens = media_tokens + int(tokens.get("text", 0))
    if media_tokens < min_tokens or seq_tokens == 0:
        return []

    cat, mod = e["category"][: p + 1], e["modality"][: p + 1]
    working = np.isin(cat, _WORKING)
    s = signed[: p + 1]
    encoder_bytes = int(s[working & np.isin(mod, _ENCODER)].sum())
    text_side_bytes = int(s[working & ~np.isin(mod, _ENCODER)].sum())
    kv_bytes = int(s[(cat == Category.KV_CACHE)].sum())
    float_dtypes = np.array([(name or "").startswith(("float", "bfloat")) for name in trace.strings] + [False])
    is_float = float_dtypes[e["dtype"][: p + 1]]
    media_input_bytes = int(s[(cat == Category.INPUT) & is_float].sum())
    token_share = media_tokens / seq_tokens
    media_bytes = encoder_bytes + int(text_side_bytes * token_share)
    total = encoder_bytes + text_side_bytes
    share = media_bytes / total if total > 0 else 0.0
    if share < min_share:
        return []

    other_bytes = total - media_bytes
    k = min_share / (1 - min_share) * other_bytes / media_bytes if min_share < 1 else 1.0
    target = min(media_tokens, max(min_tokens, math.ceil(media_tokens * k)))
    if target >= media_tokens:
        return []  # already at the token floor: nothing to cut
    saving = int((media_bytes + media_input_bytes) * (1 - target / media_tokens))
    prune_ratio = 1 - target / media_tokens
    towers = _encoder_names(trace)
    where = ", ".join(towers) if towers else str(context.get("module") or "(model)")
    modality = "vision" if int(tokens.get("vision", 0)) >= int(tokens.get("audio", 0)) else "audio"
    evidence: dict[str, Any] = {
        "tokens": {k2: int(v) for k2, v in tokens.items()},
        "media_tokens": media_tokens,
        "seq_len": seq_tokens,
        "batch": context.get("batch"),
        "media_token_share": round(token_share, 3),
        "media_bytes_at_peak": media_bytes,
        "encoder_bytes_at_peak": encoder_bytes,
        "language_model_bytes_at_peak": text_side_bytes,
        "kv_cache_bytes_at_peak": kv_bytes,
        "media_input_bytes_at_peak": media_input_bytes,
        "media_share_of_working_bytes": round(share, 3),
        "target_media_tokens": target,
        "predicted_saving_bytes": saving,
        "prefill_step": context["step"],
        "min_share": min_share,
        "min_media_tokens": min_tokens,
    }
    if modality == "vision":
        cap = (
            f"cap the image size (Qwen2-VL/Qwen2.5-VL processor max_pixels={target * _QWEN_PX_PER_TOKEN} for "
            f"{target} tokens; fewer tiles or a lower resolution for fixed-size towers; fewer video frames)"
        )
    else:
        cap = f"cap the audio length to what {target} tokens cover (shorter chunks, lower frame rate)"
    fix = (
        f"{media_tokens} {modality} tokens hold {share:.0%} of the working memory at peak: {cap}, or prune "
        f"{modality} tokens (memwarden's degradation ladder / FastV-style pruning at ratio r={prune_ratio:.2f}): "
        f"predicted saving {format_bytes(saving)} at peak ({media_tokens} -> {target} tokens)."
    )
    return [
        Finding(
            pattern=PATTERN,
            severity=severity_for(saving, peak_bytes),
            bytes_at_peak=media_bytes,
            wasted_bytes=saving,
            where=where,
            evidence=evidence,
            fix=fix,
            lines=_lines(trace, ctx, steps[context["step"]], p, where),
        )
    ]


def _lines(trace: Trace, ctx: Context, prefill: Step, p: int, where: str) -> list[dict[str, Any]]:
    """The script's line that made the media the prefill was fed first (the pixel values or audio
    features: where the image is resized, the frames sampled, the processor's max_pixels set), then
    the lines holding the towers' bytes at the peak (the call)."""
    a = ctx.analysis
    live = live_blocks_at(trace, p, a.device, a.free_index)
    sites = {prefill.call_site} if prefill.call_site is not None else set()
    fed = script_input_lines(trace, input_rows(trace, prefill.start_us, a.free_index), sites, floating=True)
    return led_by(fed, trace, where, live, PATTERN)
