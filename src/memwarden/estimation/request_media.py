"""Audio and video inputs of any transformers config, shaped as the family's own processor shapes them.

- Audio: the family's feature extractor (transformers' auto mapping), built from its defaults with
  the config's mel-bin count, called with the processor class's own default audio kwargs (padding,
  truncation, ``pad_to_multiple_of``) on silence. A processor that splits the features into fixed
  windows (``max_source_positions`` in its defaults: Voxtral's 30 s chunks) is followed: the
  extractor runs on one window and the chunk count is arithmetic, so an hour of audio allocates
  one window. Placeholders are what the model's ``get_audio_features`` makes of it on meta; an
  encoder-decoder speech model (Whisper) is its own audio encoder: its config holds the mel bins,
  its extractor pads or cuts a clip to one 30 s window, and the tokens are its encoder's positions.
- Video: frames of ``W x H`` go through the family's image processor with the video processor's
  size defaults (read from the video processor class, or from its source where its torchvision
  backend is missing: only literal dicts and integer arithmetic are evaluated). Qwen-style
  processors (a temporal patch) give one frame's patch grid, repeated over ``ceil(F / t)``
  temporal patches as the video processor pads the last one; fixed-size processors (LLaVA-NeXT-
  Video, -OneVision) give one frame's pixels, stacked ``F`` times. Placeholders are what the
  model's ``get_video_features`` makes of it on meta.

Only shapes are kept: every float tensor goes to the meta device.
"""

from __future__ import annotations

import ast
import inspect
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

from memwarden.errors import InputError

__all__ = [
    "MAX_AUDIO_SECONDS",
    "MAX_VIDEO_FRAMES",
    "feature_tokens",
    "patch_stream",
    "in_model_dtype",
    "processed",
    "processing_families",
    "processor_class",
    "processor_key",
    "video_media",
]

MAX_AUDIO_SECONDS = 4 * 3600.0  # beyond any model's context at 12.5+ tokens per second
MAX_VIDEO_FRAMES = 4096  # Qwen2-VL's video processor samples at most 768
MAX_WAVEFORM_SAMPLES = 1 << 24  # 64 MiB of float32 silence: 17 min at 16 kHz
_SHAPE_ONLY = {"do_rescale": False, "do_normalize": False}  # elementwise steps: no shape depends on them
_REFERENCE_IMAGE = (224, 224)  # (W, H) of the full run that checks a shape-only run and gives its dtypes
_PROCESSED: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()  # (processor, sizes, copies) -> outputs
_PROCESSED_KEPT = 16
_SECONDS_PER_GRID = ("video_second_per_grid", "second_per_grid_ts")  # Qwen2.5-Omni's and Qwen2.5-VL's names
_DTYPES: dict[tuple[str, str], dict[str, Any] | None] = {}  # processor -> its outputs' dtypes (None: run in full)


def _class(mapping: dict[str, Any], family: str, backend: str | None = None) -> Any:
    import transformers

    name = mapping.get(family)
    if isinstance(name, dict):
        name = name.get(backend) if backend else next(iter(name.values()), None)
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    return cls if isinstance(cls, type) else None


def _folder(module: str) -> str | None:
    """``transformers.models.qwen3_vl.processing_qwen3_vl`` -> ``qwen3_vl``."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["transformers", "models"] else None


def processing_families(config: Any) -> list[str]:
    """The model types whose processors serve ``config``, its own first.

    A sub-model or a variant often has no processor entry of its own in transformers' auto mappings:
    Qwen2.5-Omni's thinker (``qwen2_5_omni_thinker``) is served by the ``qwen2_5_omni`` processors
    (its config class lives in that folder), Qwen3-VL-MoE and GLM-4.5V (``glm4v_moe``) by the
    processor class of ``qwen3_vl`` / ``glm4v`` (the auto mapping names it; it lives in that folder)."""
    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    family = str(config.model_type)
    found = [family]
    config_folder = _folder(type(config).__module__)
    if config_folder:
        found.append(config_folder)
    for name in list(found):
        processor = PROCESSOR_MAPPING_NAMES.get(name)
        cls = getattr(transformers, processor, None) if isinstance(processor, str) else None
        folder = _folder(getattr(cls, "__module__", "") or "")
        if folder:
            found.append(folder)
    return list(dict.fromkeys(found))


def first_class(mapping: dict[str, Any], config: Any, backend: str | None = None) -> Any:
    for family in processing_families(config):
        cls = _class(mapping, family, backend)
        if cls is not None:
            return cls
    return None


def processor_class(config: Any) -> Any:
    """The family's processor class (image processor and tokenizer together; transformers' auto
    mapping), or None where transformers has none."""
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    return first_class(PROCESSOR_MAPPING_NAMES, config)


def processor_defaults(config: Any, kind: str) -> dict[str, Any]:
    """The processor class's own default ``{kind}_kwargs`` (a class attribute; no tokenizer is built)."""
    cls = processor_class(config)
    value = getattr(cls, f"{kind}_kwargs", None) if cls is not None else None
    return dict(value) if isinstance(value, dict) else {}


def encoder_of(model: Any, name: str) -> Any:
    encode = getattr(model, name, None) or getattr(getattr(model, "model", None), name, None)
    if encode is None:
        raise InputError(
            f"{type(model).__name__} has no {name}, by which memwarden counts a medium's tokens; "
            "send a request without that medium"
        )
    return encode


def in_model_dtype(model: Any, values: dict[str, Any]) -> dict[str, Any]:
    """Float inputs (pixels, audio features) in the model's dtype, as users send them
    (``processor(...).to(model.dtype)`` casts the floating tensors only): a VQ image encoder
    (Chameleon, Emu3) takes no float32 pixels in a bf16 model, and a tower that would cast them
    itself then holds no float32 copy."""
    import torch

    dtype = model.dtype
    return {
        k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() and dtype.is_floating_point else v
        for k, v in values.items()
    }


def media_tokens(model: Any, encoder: str, media: dict[str, Any]) -> int:
    import torch

    from memwarden.record.meta.capture import placement

    encode = encoder_of(model, encoder)
    params = inspect.signature(encode).parameters
    forwards = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())  # (*args, **kwargs) wrappers
    media = in_model_dtype(model, media)
    with placement(), torch.inference_mode():
        out = encode(**{k: v for k, v in media.items() if forwards or k in params}, return_dict=True)
    return feature_tokens(out)


def _run_processor(processor: Any, images: list[tuple[int, int]], copies: int, **kwargs: Any) -> dict[str, Any]:
    import numpy as np

    blanks = [np.zeros((h, w, 3), dtype=np.uint8) for w, h in images]
    out = processor(images=[list(blanks) for _ in range(copies)], return_tensors="pt", **kwargs)
    return dict(out.items())


def processor_key(processor: Any) -> tuple[str, str]:
    """A processor by value: its class and every setting it serialises (sizes, pixel limits, tiling)."""
    cls = type(processor)
    return f"{cls.__module__}.{cls.__qualname__}", processor.to_json_string()


def _shape_dtypes(processor: Any, key: tuple[str, str]) -> dict[str, Any] | None:
    """The dtype of each output of the full run, when a run without rescaling and normalizing gives
    the same keys, shapes and non-float values at the reference size; None: run it in full."""
    if key in _DTYPES:
        return _DTYPES[key]
    import torch

    dtypes: dict[str, Any] | None = None
    try:
        full = _run_processor(processor, [_REFERENCE_IMAGE], 1)
        fast = _run_processor(processor, [_REFERENCE_IMAGE], 1, **_SHAPE_ONLY)
    except (TypeError, ValueError):
        full = fast = {}
    if full and full.keys() == fast.keys():
        same = all(
            isinstance(a, torch.Tensor)
            and isinstance(fast[k], torch.Tensor)
            and a.shape == fast[k].shape
            and (a.is_floating_point() or (a.dtype == fast[k].dtype and torch.equal(a, fast[k])))
            for k, a in full.items()
        )
        dtypes = {k: a.dtype for k, a in full.items()} if same else None
    if len(_DTYPES) >= _PROCESSED_KEPT:
        _DTYPES.clear()
    _DTYPES[key] = dtypes
    return dtypes


def processed(processor: Any, images: list[tuple[int, int]], copies: int) -> dict[str, Any]:
    """An image processor's outputs for ``copies`` rows of blank uint8 images of the given (W, H):
    float outputs on meta (only their shapes are used), the others real.

    Rescaling and normalizing are elementwise (they change no shape), so they are left out where a
    full run at a reference size shows the outputs' keys, shapes and non-float values unchanged;
    each float output then takes the full run's dtype. The result is kept per (processor settings,
    sizes, copies): an estimate counts an image's tokens and builds its inputs from one run."""
    import torch

    key = processor_key(processor)
    memo_key = (key, tuple(images), copies)
    kept = _PROCESSED.get(memo_key)
    if kept is None:
        dtypes = _shape_dtypes(processor, key)
        out = _run_processor(processor, images, copies, **(_SHAPE_ONLY if dtypes is not None else {}))
        kept = {}
        for k, v in out.items():
            if isinstance(v, torch.Tensor):
                dtype = (dtypes or {}).get(k, v.dtype)
                if v.is_floating_point() or dtype.is_floating_point:  # pixels: only the shape is used
                    v = torch.empty(v.shape, dtype=dtype, device="meta")
                else:  # kept as numpy: a torch tensor held here would be counted by a later live capture
                    v = v.numpy().copy()
            kept[k] = v
        _PROCESSED[memo_key] = kept
        while len(_PROCESSED) > _PROCESSED_KEPT:
            _PROCESSED.popitem(last=False)
    _PROCESSED.move_to_end(memo_key)
    return {
        k: torch.empty_like(v, device="meta") if isinstance(v, torch.Tensor) and v.is_meta else _copy(v)
        for k, v in kept.items()
    }


def _copy(value: Any) -> Any:
    import numpy as np
    import torch

    return torch.from_numpy(value).clone() if isinstance(value, np.ndarray) else value


def feature_tokens(output: Any) -> int:
    """Tokens in a ``get_*_features`` output: rows of its pooled features, over every part; where it
    pools nothing, of its last hidden state (Fuyu's patch embeddings, an encoder's positions)."""
    import torch

    features = getattr(output, "pooler_output", None)
    if features is None:
        features = getattr(output, "last_hidden_state", None)
    if features is None:
        features = (
            output[0] if isinstance(output, (tuple, list)) and not isinstance(output[0], torch.Tensor) else output
        )
    parts = [features] if isinstance(features, torch.Tensor) else list(features)
    return sum(int(p.numel() // max(p.shape[-1], 1)) for p in parts)


# -- patches straight into the decoder ------------------------------------------------------------


def patch_stream(processor: Any, images: list[tuple[int, int]]) -> tuple[Any, list[tuple[int, int]]] | None:
    """(the patches of every image, ``(1, patches, C x ph x pw)`` on meta; each image's (rows, columns)
    of patches), for an image processor that cuts images into patches the decoder takes as tokens
    (Fuyu: no vision tower, one linear layer); None for any other processor.

    As the family's processor does: each image is resized to fit the processor's size (never up) and
    padded, then cut to the patches that cover its unpadded part (``ceil(h / ph)`` rows of
    ``ceil(w / pw)``); the processor ends each row with a newline token, which the caller places."""
    import torch

    if not (
        callable(getattr(processor, "patchify_image", None)) and callable(getattr(processor, "get_num_patches", None))
    ):
        return None
    sides = _size_dict(getattr(processor, "patch_size", None))
    ph, pw = sides.get("height"), sides.get("width")
    if not (isinstance(ph, int) and isinstance(pw, int) and ph > 0 and pw > 0):
        return None
    grids: list[tuple[int, int]] = []
    channels = 3
    for wh in images:
        out = processed(processor, [wh], 1)
        padded = out["images"]  # (1, 1, C, H, W): the image padded to the processor's size
        channels, height, width = (int(v) for v in padded.shape[-3:])
        h = int(out["image_unpadded_heights"].reshape(-1)[0])
        w = int(out["image_unpadded_widths"].reshape(-1)[0])
        rows = min(height, math.ceil(h / ph) * ph) // ph
        cols = min(width, math.ceil(w / pw) * pw) // pw
        grids.append((rows, cols))
    total = sum(r * c for r, c in grids)
    return torch.empty((1, total, channels * ph * pw), device="meta"), grids


def _size_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return dict(value)
    fields = getattr(value, "__dataclass_fields__", None)
    return {k: getattr(value, k) for k in fields} if fields else {}


# -- video ----------------------------------------------------------------------------------------


def _literal(node: ast.AST) -> Any:
    """A literal dict/number/string with integer arithmetic (``128 * 28 * 28``); anything else: ValueError."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add, ast.Sub, ast.FloorDiv)):
        a, b = _literal(node.left), _literal(node.right)
        if not (isinstance(a, int) and isinstance(b, int)):
            raise ValueError("not integer arithmetic")
        ops = {ast.Mult: a * b, ast.Add: a + b, ast.Sub: a - b}
        return ops.get(type(node.op), a // b if b else 0)
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    return ast.literal_eval(node)


def _video_defaults(family: str) -> dict[str, Any]:
    """size / crop_size / temporal_patch_size of the family's video processor class."""
    import transformers
    from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING_NAMES

    names = VIDEO_PROCESSOR_MAPPING_NAMES.get(family) or {}
    name = next(iter(names.values()), None) if isinstance(names, dict) else names
    keys = ("size", "crop_size", "temporal_patch_size", "do_center_crop")
    found: dict[str, Any] = {}
    try:
        cls = getattr(transformers, name, None) if isinstance(name, str) else None
        found = {k: getattr(cls, k) for k in keys if isinstance(getattr(cls, k, None), (dict, int))}
    except ImportError:  # its backend (torchvision) is missing: the class is a placeholder
        pass
    if found:
        return found
    # Without torchvision the mapping holds no name and the class is a placeholder: read the class
    # attributes of the family's video processor (``video_processing_<family>.py``) from its source.
    module = getattr(transformers.models, family, None)
    folder = Path(module.__file__).parent if module is not None and module.__file__ else None
    for path in sorted(folder.glob("video_processing_*.py")) if folder else []:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("VideoProcessor") and not found:
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                        target = stmt.targets[0]
                        if isinstance(target, ast.Name) and target.id in keys:
                            try:
                                found[target.id] = _literal(stmt.value)
                            except (ValueError, SyntaxError, TypeError):
                                pass
    return found


def _timestamped(family: str) -> bool:
    """Whether the family's processor writes timestamps between a video's frames (its source says so)."""
    import transformers

    module = getattr(transformers.models, family, None)
    folder = Path(module.__file__).parent if module is not None and module.__file__ else None
    return any("timestamp" in path.read_text() for path in (folder.glob("processing_*.py") if folder else ()))


def video_media(
    model: Any,
    config: Any,
    videos: tuple[tuple[int, int, int], ...],
    batch: int,
    max_pixels: int | None,
    processor: Any,
) -> tuple[dict[str, Any], list[int]]:
    """(the model's video inputs on meta for ``batch`` rows, placeholder tokens of each video);
    ``processor``: the family's image processor, which frames go through."""
    import torch

    family = config.model_type
    for _w, _h, frames in videos:
        if not 1 <= frames <= MAX_VIDEO_FRAMES:
            raise InputError(f"a video has 1 to {MAX_VIDEO_FRAMES} frames; got {frames}")
    families = processing_families(config)
    if any(_timestamped(f) for f in families):
        # GLM-4V and Qwen3-VL frame each temporal patch with its own markers and timestamp text: not built yet
        raise InputError(f"video requests for model_type {family!r} are not supported yet; send its frames as images")
    # A family served by another family's image processor (Qwen2.5-Omni by Qwen2-VL's) is served by
    # that family's video processor too: transformers' video mapping names it only with torchvision.
    served = [f for f in (_folder(type(processor).__module__),) if f and f not in families]
    defaults = next((d for d in map(_video_defaults, families + served) if d), {})
    if not defaults:
        raise InputError(f"transformers has no video processor for model_type {family!r}; send images instead")
    temporal = getattr(processor, "temporal_patch_size", None)
    if isinstance(temporal, int):  # Qwen-style: the video processor's own pixel limits, one frame's grid
        size = dict(defaults.get("size") or {})
        if max_pixels is not None:
            size["longest_edge"] = max_pixels
        if size:
            processor.size = size if isinstance(processor.size, dict) else type(processor.size)(**size)
    vc = getattr(config, "vision_config", None)
    side = getattr(vc, "image_size", None)
    fps = processor_defaults(config, "videos").get("fps") or 2.0
    rows: list[dict[str, Any]] = []
    counts: list[int] = []
    for w, h, frames in videos:
        if isinstance(temporal, int):
            one = processed(processor, [(w, h)], 1)
            t = math.ceil(frames / temporal)  # the last temporal patch padded with the last frame
            _, gh, gw = (int(v) for v in one["image_grid_thw"][0])
            pixels = one["pixel_values"]  # (gh * gw, C * t * p * p): one temporal patch
            media = {
                "pixel_values_videos": torch.empty((t * pixels.shape[0], pixels.shape[1]), device="meta"),
                "video_grid_thw": torch.tensor([[t, gh, gw]]),
                # seconds per temporal patch for the rope index (Qwen2.5-VL optional, -Omni required):
                # the processors' temporal_patch_size / fps, fps 2 where the checkpoint states none
                **dict.fromkeys(_SECONDS_PER_GRID, torch.tensor([temporal / fps])),
            }
        elif isinstance(side, int):  # every frame resized and cropped to the tower's side
            channels = getattr(vc, "num_channels", 3)
            media = {"pixel_values_videos": torch.empty((1, frames, channels, side, side), device="meta")}
        else:
            raise InputError(f"model_type {family!r}: no frame size in its vision config; send images instead")
        counts.append(media_tokens(model, "get_video_features", media))
        rows.append(media)
    out: dict[str, Any] = {}
    for key in rows[0]:
        parts = [r[key] for r in rows] * batch
        out[key] = torch.cat(parts) if parts[0].device.type != "meta" else _meta_cat(parts)
    return out, counts


def _meta_cat(parts: list[Any]) -> Any:
    import torch

    first = parts[0]
    rows = sum(int(p.shape[0]) for p in parts)
    return torch.empty((rows, *first.shape[1:]), dtype=first.dtype, device="meta")
