"""vision-token-dominance: a request with more media tokens than the model and the task need.

A Qwen2-VL processor at its class default (``max_pixels=16384*28*28``) turns a 12 MP photo into
thousands of vision tokens; the model card's documented range caps an image at 1280. Every
token beyond it costs encoder activations, language-model activations and KV. What is avoidable
is judged against that documented range, never against the share of memory media tokens hold (in
a VLM with a short prompt they always dominate): a fixed-resolution tower at its native size
(LLaVA-1.5 at 336 px, PaliGemma, Gemma 3) makes the same tokens for any image, and nothing is said.

What the trace shows: the prefill the peak belongs to, its vision tokens (``Step.tokens``), the
images it was fed (the rows of its ``image_grid_thw`` input), and the root module's class, which
names the family. The pattern holds when the vision tokens exceed the family's documented most
per image times the images; the fix names the setting (``max_pixels``) at the documented value.

The fix as a change: the request's media blocks (encoder, projector, pixel values) scale with the
media tokens, the language model's blocks with the sequence length (linear: attention that grows
faster than linear makes the real saving larger).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from memwarden.analyze.finding import Context, Finding
from memwarden.analyze.lines import LineBytes, input_rows, led_by, script_input_lines
from memwarden.analyze.patterns.media_size import (
    PATTERN,
    encoder_names,
    fewer_media_tokens,
    too_many_frames,
    upscaled,
)
from memwarden.analyze.timeline import live_blocks_at
from memwarden.analyze.value_origin import argument_line, origin_line, tiling_knob
from memwarden.trace.model import Category, Modality, Trace
from memwarden.trace.sites import parse_line
from memwarden.trace.steps import Step

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


# Media tokens per image above which a family's documented settings cut them, the setting, and the
# pixels per token. Qwen2-VL / Qwen2.5-VL model cards: "min_pixels = 256*28*28, max_pixels =
# 1280*28*28" (the processor's class default, 16384*28*28, is the out-of-memory users report:
# lmms-eval#436, oumi#908). Fixed-resolution towers (CLIP/SigLIP at their native size: LLaVA-1.5,
# PaliGemma, Gemma 3) make the same tokens for every image: nothing to cut, nothing said.
_DOCUMENTED: dict[str, tuple[int, str, int]] = {
    "Qwen2VL": (1280, "max_pixels", 28 * 28),
    "Qwen2_5_VL": (1280, "max_pixels", 28 * 28),
    "Qwen2_5Omni": (1280, "max_pixels", 28 * 28),
    "Qwen3VL": (1280, "max_pixels", 32 * 32),
}


def documented_range(module: str) -> tuple[int, str, int] | None:
    """(most tokens per image, the setting that caps them, pixels per token) for a root module class."""
    for prefix, value in _DOCUMENTED.items():
        if module.startswith(prefix):
            return value
    return None


def _images_fed(trace: Trace, prefill: Step, free: np.ndarray) -> int:
    """Images in a prefill: the rows of its ``image_grid_thw`` (an (n, 3) integer input), else 1."""
    e = trace.events
    rows = np.flatnonzero((e["category"] == Category.INPUT) & (e["action"] == 0) & (e["time_us"] <= prefill.start_us))
    rows = rows[free[rows] > np.searchsorted(e["time_us"], prefill.start_us)]
    best = 1
    for r in rows.tolist():
        k = int(e["shape"][r])
        shape = trace.shapes[k] if k >= 0 else ()
        dt = trace.string(int(e["dtype"][r])) or ""
        if len(shape) == 2 and shape[1] == 3 and dt.startswith("int"):
            best = max(best, int(shape[0]))
    return best


def detect(ctx: Context) -> list[Finding]:
    trace = ctx.trace
    n = trace.num_events
    steps = ctx.analysis.steps
    if n == 0 or not steps:
        return []
    e = trace.events
    live = ctx.analysis.live_bytes
    p = int(np.argmax(live))
    context = _context_at(steps, int(e["time_us"][p]))
    if context is None:
        return []
    documented = documented_range(str(context.get("module") or ""))
    if documented is None:  # a fixed-resolution tower: only frames or tiles the script asked for can be cut
        return too_many_frames(ctx, steps, context, p) or _tiled(ctx, steps, context, p)
    most_per_image, setting, px_per_token = documented
    tokens = context["tokens"]
    prefill = steps[context["step"]]
    media_tokens = int(tokens.get("vision", 0))
    images = _images_fed(trace, prefill, ctx.analysis.free_index)
    target = most_per_image * images
    # images enlarged before encoding: their own pixels, not the documented most, are the target
    enlarged = upscaled(ctx, steps, context, p, px_per_token)
    if enlarged and enlarged[0].evidence["target_media_tokens"] < min(target, media_tokens):
        return enlarged
    if media_tokens <= target:
        return []
    change = fewer_media_tokens(trace, steps, context, target)
    towers = encoder_names(trace)
    where = ", ".join(towers) if towers else str(context.get("module") or "(model)")
    value = most_per_image * px_per_token
    evidence: dict[str, Any] = {
        "tokens": {k2: int(v) for k2, v in tokens.items()},
        "media_tokens": media_tokens,
        "images": images,
        "media_tokens_per_image": media_tokens // images,
        "documented_max_tokens_per_image": most_per_image,
        "recommended": {setting: value},
        "target_media_tokens": target,
        "prefill_step": context["step"],
    }
    fix = (
        f"{media_tokens} vision tokens for {images} image(s), above the model card's range (at most "
        f"{most_per_image} a image): set the processor's {setting}={most_per_image}*{int(px_per_token**0.5)}*"
        f"{int(px_per_token**0.5)} ({value}) -- AutoProcessor.from_pretrained(..., {setting}={value}) -- so each "
        f"image makes at most {most_per_image} tokens ({media_tokens} -> {target}); for a video, sample fewer "
        f"frames (the processor's fps, e.g. fps=1.0, or nframes/max_frames) and cap each frame's max_pixels"
    )
    return [
        Finding(
            pattern=PATTERN,
            severity="high",
            bytes_at_peak=0,
            wasted_bytes=0,
            where=where,
            evidence=evidence,
            fix=fix,
            lines=_lines(trace, ctx, prefill, p, where),
            change=change,
        )
    ]


# Settings that tile one image into several tower-sized crops (InternVL's dynamic tiling, Idefics3 /
# SmolVLM splitting, Gemma 3's pan-and-scan, LLaVA-NeXT's grids): each crop costs a whole image's
# tokens in a fixed-resolution tower. Tiling each of several images (a video's frames) multiplies
# them; InternVL's own video recipe loads every frame with max_num=1.
_ONE_IMAGE_TILES = 13  # InternVL's single-image max_num=12 plus its thumbnail
_TILE_KNOBS = (
    "max_num",
    "max_dynamic_patch",
    "max_tiles",
    "max_crops",
    "max_patches",
    "do_image_splitting",
    "pan_and_scan_max_num_crops",
    "image_grid_pinpoints",
)


def _tiled(ctx: Context, steps: Sequence[Step], context: dict[str, Any], p: int) -> list[Finding]:
    """A fixed-resolution tower fed several images each tiled by the script's own tiling setting
    (``torch.cat([load_image(f, max_num=12) for f in frames])``): one tile per image would do."""
    trace, a = ctx.trace, ctx.analysis
    e = trace.events
    prefill = steps[context["step"]]
    media_tokens = int(context["tokens"].get("vision", 0))
    fed = input_rows(trace, prefill.start_us, a.free_index)
    pixels = [r for r in fed.tolist() if len(trace.shape(int(e["shape"][r])) or ()) == 4]
    if not pixels or media_tokens <= 0:
        return []
    row = max(pixels, key=lambda r: (trace.shape(int(e["shape"][r])) or (0,))[0])
    shape = tuple(trace.shape(int(e["shape"][row])) or ())
    tiles = int(shape[0])
    made = parse_line(trace.strings[int(e["line"][row])])
    knob = tiling_knob(made.file, made.line, _TILE_KNOBS)
    if knob is None:
        return []
    images = _pieces(trace, row, shape, a.free_index)
    # several tiles per image, and more than one image's worth of tiles in all (InternVL's single
    # image budget, max_num=12 plus a thumbnail, with a thumbnail per image on top): a total budget
    # divided between the images (total_max_num // image_num) stays under it
    if images is None or tiles < 2 * images or tiles <= _ONE_IMAGE_TILES + images:
        return []
    target = max(1, media_tokens * images // tiles)
    change = fewer_media_tokens(trace, steps, context, target)
    towers = encoder_names(trace)
    where = ", ".join(towers) if towers else str(context.get("module") or "(model)")
    evidence: dict[str, Any] = {
        "tokens": {k: int(v) for k, v in context["tokens"].items()},
        "media_tokens": media_tokens,
        "images": images,
        "tiles": tiles,
        "tiling_setting": {knob.name: knob.value},  # None: not a constant in the source
        "recommended": {knob.name: 1},
        "target_media_tokens": target,
        "prefill_step": context["step"],
    }
    setting = f"{knob.name}={knob.value}" if knob.value is not None else f"{knob.name}"
    fix = (
        f"{tiles} tiles for {images} images: each image (a video frame, a photo) is tiled by {setting}, and every "
        f"tile costs a whole image's tokens in this fixed-resolution tower ({media_tokens} vision tokens): load each "
        f"frame as one tile ({knob.name}=1, as InternVL's video recipe does; {media_tokens} -> {target} tokens), or "
        f"divide one image's tile budget between the images (max(1, total_max_num // image_num), as lmms-eval does), "
        f"or sample fewer frames; keep tiling for a single dense image"
    )
    # where the setting's value was chosen (tiles_per_image = MAX_NUM in the caller), else the keyword
    chosen = origin_line(made.file, knob.line, _TILE_KNOBS) if knob.value is None else None
    first = [LineBytes(made.file, chosen.line if chosen else knob.line, f"{knob.name}=", 0, 0)]
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
            lines=led_by(first, trace, where, live, PATTERN),
            change=change,
        )
    ]


def _pieces(trace: Trace, row: int, shape: tuple[int, ...], free: np.ndarray) -> int | None:
    """How many per-image blocks of tiles were joined into the pixel values made at ``row``: the
    blocks of shape (k, C, H, W) made before it and still live when it was made, whose k add up to
    its N (None: no such run)."""
    e = trace.events
    need, count = int(shape[0]), 0
    for r in range(row - 1, -1, -1):
        if e["action"][r] != 0 or free[r] <= row:
            continue
        other = tuple(trace.shape(int(e["shape"][r])) or ())
        if len(other) != 4 or other[1:] != shape[1:]:
            continue
        need -= int(other[0])
        count += 1
        if need == 0:
            return count
        if need < 0:
            return None
    return None


# The settings that decide how many media tokens a request carries (processors' and model cards'
# names: Qwen-VL's pixel range and video sampling, Idefics3/SmolVLM's longest edge and splitting,
# InternVL's tile count, Gemma 3's pan-and-scan crops), as a script passes them to a call.
_KNOBS = (
    "max_pixels",
    "min_pixels",
    "total_pixels",
    "resized_height",
    "resized_width",
    "max_frames",
    "nframes",
    "num_frames",
    "fps",
    "video_fps",
    "max_num",
    "max_dynamic_patch",
    "max_tiles",
    "max_patches",
    "longest_edge",
    "max_image_size",
    "do_image_splitting",
    "image_max_tokens",
    "max_image_tokens",
    "pan_and_scan_max_num_crops",
)


def _lines(trace: Trace, ctx: Context, prefill: Step, p: int, where: str) -> list[dict[str, Any]]:
    """The script's line that made the media the prefill was fed first (the pixel values or audio
    features: where the image is resized, the frames sampled, the processor's max_pixels set), then
    the lines holding the towers' bytes at the peak (the call)."""
    a = ctx.analysis
    live = live_blocks_at(trace, p, a.device, a.free_index)
    sites = {prefill.call_site} if prefill.call_site is not None else set()
    fed = script_input_lines(trace, input_rows(trace, prefill.start_us, a.free_index), sites, floating=True)
    if prefill.call_site is not None:  # the script's line that sets a media-size knob comes first
        call = parse_line(prefill.call_site)
        knob = argument_line(call.file, call.line, _KNOBS)
        if knob is not None:  # then where the value it passes was chosen (max_pixels=self.max_pixels)
            knob = origin_line(knob.file, knob.line, _KNOBS) or knob
            fed = [LineBytes(knob.file, knob.line, knob.what, 0, 0), *fed]
    return led_by(fed, trace, where, live, PATTERN)
