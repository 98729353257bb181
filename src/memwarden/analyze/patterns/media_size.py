"""The size of a request's media against what the model needs: vision-token-dominance's rules
that read how the script made its media (the documented-range rule and tiles live in
``vision_token_dominance``).

- **Upscaled images.** A ``min_pixels`` copied from a document or high-resolution config enlarges
  every small crop to a megapixel before a dynamic-resolution tower: ~1,300 tokens where its own
  pixels make a few dozen. The trace shows the resize (an upsampling op) made while a request's
  inputs were prepared, from a smaller image of the same channels alive then.
- **Frames beyond the documented count.** A video sampled at one frame a second of a two-minute
  clip sends 120 frames where the family's processor samples at most 64 (SmolVLM2's published
  ``video_sampling``: ``fps`` 1, ``max_frames`` 64; Video-LLaVA's 8; LLaVA-OneVision and
  LLaVA-NeXT-Video evaluate 32), each frame a whole image's tokens in a fixed-resolution tower.

The fix as a change (shared with the documented-range rule): the request's media blocks (encoder,
projector, pixel values) scale with the media tokens, the language model's with the sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.finding import Context, Finding
from memwarden.analyze.lines import LineBytes, input_rows, led_by, script_input_lines
from memwarden.analyze.timeline import live_blocks_at
from memwarden.analyze.value_origin import argument_line, origin_line
from memwarden.trace.model import Category, Modality, SpanKind, Trace
from memwarden.trace.sites import parse_line
from memwarden.trace.steps import Step

PATTERN = "vision-token-dominance"
_MEDIA = (int(Modality.VISION), int(Modality.AUDIO))
_ENCODER = (int(Modality.VISION), int(Modality.AUDIO), int(Modality.FUSION))


def encoder_names(trace: Trace) -> list[str]:
    """Names of the outermost vision/audio module spans (the towers)."""
    s = trace.spans
    if trace.num_spans == 0:
        return []
    modality = s["modality"].astype(np.int64)
    parent = s["parent"].astype(np.int64)
    parent_modality = np.where(parent >= 0, modality[np.clip(parent, 0, None)], -1)
    rows = np.flatnonzero((s["kind"] == SpanKind.MODULE) & np.isin(modality, _MEDIA) & (parent_modality != modality))
    return sorted({trace.string(int(n)) or "" for n in s["name"][rows]} - {""})


def fewer_media_tokens(trace: Trace, steps: Sequence[Step], context: dict[str, Any], target: int) -> Change:
    """The fix as a change: the request's media blocks (encoder, projector, pixel values) scale with
    the media tokens (to ``target``), the language model's with the sequence it works on."""
    e = trace.events
    tokens = context["tokens"]
    media_tokens = int(tokens.get("vision", 0))
    seq_tokens = media_tokens + int(tokens.get("text", 0))
    group_end = next((st.start_us for st in steps[context["step"] + 1 :] if st.phase != "decode"), None)
    prev_end = steps[context["step"] - 1].end_us if context["step"] > 0 else -1
    t = e["time_us"]
    lo = int(np.searchsorted(t, prev_end, side="right"))
    hi = trace.num_events if group_end is None else int(np.searchsorted(t, group_end, side="left"))
    rows = np.arange(lo, hi)
    rows = rows[(e["action"][rows] == 0) & ~np.isin(e["category"][rows], (Category.WEIGHT, Category.BUFFER))]
    media = np.isin(e["modality"][rows], _ENCODER)
    float_dtypes = np.array([(name or "").startswith(("float", "bfloat")) for name in trace.strings] + [False])
    media |= (e["category"][rows] == Category.INPUT) & float_dtypes[e["dtype"][rows]]
    text_scale = (seq_tokens - media_tokens + target) / seq_tokens
    return Change(scale_rows=rows, scale=np.where(media, target / media_tokens, text_scale))


_UPSAMPLE = (
    "aten::upsample_bilinear2d",
    "aten::upsample_bicubic2d",
    "aten::_upsample_bilinear2d_aa",
    "aten::_upsample_bicubic2d_aa",
    "aten::upsample_nearest2d",
    "aten::_upsample_nearest_exact2d",
)
_MIN_UPSCALE = 2.0  # area ratio of an image resized before encoding that counts as upscaled
_MIN_EXTRA_TOKENS = 256  # media tokens the upscaling adds to the request, in all


def upscaled(ctx: Context, steps: Sequence[Step], context: dict[str, Any], p: int, px_per_token: int) -> list[Finding]:
    """Images enlarged before a dynamic-resolution tower (a ``min_pixels`` copied from a document
    config upscales every small crop to a megapixel): the tokens their own pixels would make are
    the target. What the trace shows: a resize (an upsampling op) made while a request's inputs
    were prepared, from a smaller image of the same channels still alive then. Every request that
    enlarged its images is changed (the peak's alone would leave the others' peaks standing).
    Limit: a resize done outside torch (PIL, numpy in a processor) is not seen."""
    trace = ctx.trace
    per_request: list[tuple[int, int, int, int]] = []  # (step, source px, resized px, first resize row)
    for k, st in enumerate(steps):
        if st.phase == "prefill" and int(st.tokens.get("vision", 0)) > 0:
            found = _resized(trace, steps, k, ctx.analysis.free_index, px_per_token)
            if found is not None:
                per_request.append((k, *found))
    mine = [r for r in per_request if r[0] == context["step"]]
    if not mine:
        return []
    _, source_px, resized_px, site = mine[0]
    media_tokens = int(context["tokens"].get("vision", 0))
    target = max(1, media_tokens * source_px // resized_px)
    if media_tokens - target < _MIN_EXTRA_TOKENS:
        return []
    changes = []
    for k, src, big, _row in per_request:
        tokens = int(steps[k].tokens.get("vision", 0))
        changes.append(
            fewer_media_tokens(trace, steps, {"step": k, "tokens": steps[k].tokens}, max(1, tokens * src // big))
        )
    change = Change(
        scale_rows=np.concatenate([c.scale_rows for c in changes]),
        scale=np.concatenate([np.asarray(c.scale, dtype=np.float64) for c in changes]),
    )
    towers = encoder_names(trace)
    where = ", ".join(towers) if towers else str(context.get("module") or "(model)")
    evidence: dict[str, Any] = {
        "tokens": {k2: int(v) for k2, v in context["tokens"].items()},
        "media_tokens": media_tokens,
        "source_pixels": source_px,
        "resized_pixels": resized_px,
        "upscale": round(resized_px / source_px, 2),
        "target_media_tokens": target,
        "requests_upscaled": len(per_request),
        "prefill_step": context["step"],
    }
    fix = (
        f"the images are upscaled before encoding ({resized_px / source_px:.1f}x their pixels: "
        f"{media_tokens} vision tokens where their own size makes about {target}): lower min_pixels to the "
        f"processor's default (min_pixels=4*28*28, 3136) or to the images' own size, so small images are not "
        f"enlarged to a large minimum (a min_pixels copied from a document or high-resolution config does that)"
    )
    e = trace.events
    made = parse_line(trace.strings[int(e["line"][site])]) if e["line"][site] >= 0 else None
    prefill = steps[context["step"]]
    first: list[LineBytes] = []
    spots = ([parse_line(prefill.call_site)] if prefill.call_site is not None else []) + ([made] if made else [])
    for spot in spots:
        knob = argument_line(spot.file, spot.line, ("min_pixels",))
        if knob is not None:  # then where the value it passes was chosen
            knob = origin_line(knob.file, knob.line, ("min_pixels",)) or knob
            first = [LineBytes(knob.file, knob.line, knob.what, 0, 0)]
            break
    live = live_blocks_at(trace, p, ctx.analysis.device, ctx.analysis.free_index)
    return [
        Finding(
            pattern=PATTERN,
            severity="high",
            bytes_at_peak=0,
            wasted_bytes=0,
            where=where,
            evidence=evidence,
            fix=fix,
            lines=led_by(first, trace, where, live, PATTERN),
            change=change,
        )
    ]


def _resized(
    trace: Trace, steps: Sequence[Step], k: int, free: np.ndarray, px_per_token: int
) -> tuple[int, int, int] | None:
    """(source pixels, resized pixels, the first resize's row) of the images enlarged while the
    inputs of prefill ``k`` were prepared (after the call before it), or None."""
    e = trace.events
    lo = int(np.searchsorted(e["time_us"], steps[k - 1].end_us, side="right")) if k else 0
    hi = int(np.searchsorted(e["time_us"], steps[k].start_us, side="right"))
    source_px = resized_px = 0
    site = -1
    for r in range(lo, hi):
        if e["action"][r] != 0 or (trace.string(int(e["op"][r])) or "") not in _UPSAMPLE:
            continue
        big = tuple(trace.shape(int(e["shape"][r])) or ())
        small = _source_of(trace, r, big, free, lo)
        if small is None or big[-1] * big[-2] < _MIN_UPSCALE * small[-1] * small[-2]:
            continue
        count = int(np.prod(big[:-3])) if len(big) > 3 else 1
        source_px += count * max(small[-1] * small[-2], 4 * px_per_token)  # the processors' least: 4 tokens
        resized_px += count * big[-1] * big[-2]
        site = r if site < 0 else site
    return (source_px, resized_px, site) if resized_px else None


def _source_of(trace: Trace, row: int, big: tuple[int, ...], free: np.ndarray, lo: int) -> tuple[int, ...] | None:
    """The image a resize made at ``row`` (shape ``big``, (..., C, H, W)) was made from: the latest
    float block before it, from ``lo`` on, still alive then, with the same channels and a smaller
    area (None: none)."""
    if len(big) < 3:
        return None
    e = trace.events
    for r in range(row - 1, lo - 1, -1):
        if e["action"][r] != 0 or free[r] <= row:
            continue
        shape = tuple(trace.shape(int(e["shape"][r])) or ())
        if len(shape) >= 3 and shape[-3] == big[-3] and shape[-1] * shape[-2] < big[-1] * big[-2]:
            if (trace.string(int(e["dtype"][r])) or "").startswith(("float", "bfloat", "uint8")):
                return shape
    return None


# Most frames a family's processor or recipe sends for one video (class-name prefix of the root
# module: the fixed-resolution towers, where every frame costs a whole image's tokens).
_MOST_FRAMES: dict[str, int] = {
    "Idefics3": 64,  # SmolVLM2's published video_sampling: fps 1, max_frames 64
    "SmolVLM": 64,
    "VideoLlava": 8,  # trained and served on 8 frames
    "LlavaOnevision": 32,  # the model card's video evaluation
    "LlavaNextVideo": 32,
}


def too_many_frames(ctx: Context, steps: Sequence[Step], context: dict[str, Any], p: int) -> list[Finding]:
    """A prefill fed more frames (images of one request, ``pixel_values`` (B, N, C, H, W) or
    ``pixel_values_videos``) than the family's documented most: sample fewer frames."""
    trace, a = ctx.trace, ctx.analysis
    module = str(context.get("module") or "")
    most = next((v for k, v in _MOST_FRAMES.items() if module.startswith(k)), None)
    media_tokens = int(context["tokens"].get("vision", 0))
    if most is None or media_tokens <= 0:
        return []
    e = trace.events
    prefill = steps[context["step"]]
    fed = input_rows(trace, prefill.start_us, a.free_index)
    floats = [r for r in fed.tolist() if (trace.string(int(e["dtype"][r])) or "").startswith(("float", "bfloat"))]
    frames = max((_frames_in(tuple(trace.shape(int(e["shape"][r])) or ())) for r in floats), default=0)
    frames = max(frames, len(prefill.media_digests))  # generate may pass the encoded frames instead
    if frames <= most:
        return []
    target = max(1, media_tokens * most // frames)
    where = ", ".join(encoder_names(trace)) or module
    evidence: dict[str, Any] = {
        "tokens": {k: int(v) for k, v in context["tokens"].items()},
        "media_tokens": media_tokens,
        "frames": frames,
        "documented_max_frames": most,
        "recommended": {"max_frames": most},
        "target_media_tokens": target,
        "prefill_step": context["step"],
    }
    fix = (
        f"{frames} frames in one request, above the {most} the model's video recipe samples at most: sample "
        f"fewer frames, spread over the clip (max_frames={most} or fewer, e.g. np.linspace over the clip, or "
        f"the processor's num_frames/fps), instead of a fixed rate over the whole video ({media_tokens} -> "
        f"{target} vision tokens)"
    )
    lines = script_input_lines(trace, fed, {prefill.call_site} if prefill.call_site else set(), floating=True)
    live = live_blocks_at(trace, p, a.device, a.free_index)
    return [
        Finding(
            pattern=PATTERN,
            severity="high",
            bytes_at_peak=0,
            wasted_bytes=0,
            where=where,
            evidence=evidence,
            fix=fix,
            lines=led_by(lines, trace, where, live, PATTERN),
            change=fewer_media_tokens(trace, steps, context, target),
        )
    ]


def _frames_in(shape: tuple[int, ...]) -> int:
    """Images a pixel tensor holds: (B, N, C, H, W) -> B*N, (N, C, H, W) -> N (3 or 1 channels)."""
    if len(shape) >= 4 and shape[-3] in (1, 3):
        return int(np.prod(shape[:-3]))
    return 0
