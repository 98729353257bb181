"""A checkpoint folder's own processor settings: ``preprocessor_config.json`` (or the image
processor's part of ``processor_config.json``), read as data.

A user's checkpoint often resizes differently from the processor class's defaults (Florence-2's
768 px, a Qwen2-VL fine-tune's ``max_pixels``, SmolVLM's tile size); ``transformers``'
``from_pretrained`` would read these settings, so the estimate does too. Nothing named in the file
is imported or called: the class is always the family's own (transformers' auto mapping), and the
file only gives it values, bounded so that no value makes the processor allocate without limit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from memwarden.errors import InputError

__all__ = ["MAX_PROCESSOR_INT", "read_json", "read_processor_file", "read_processor_settings"]

_FILES = ("preprocessor_config.json", "processor_config.json")
_MAX_BYTES = 1024**2  # real ones are under 2 KiB
# Every integer a processor setting holds (sides, pixel budgets, tile counts) stays below this: the
# largest real one is a pixel budget (Qwen2-VL's max_pixels, 12,845,056), and an estimate's images
# are at most 64 MPx (memwarden.estimation.request.MAX_IMAGE_PIXELS).
MAX_PROCESSOR_INT = 64 * 1024**2
# Keys that name code or classes: the class is always the family's own, so these are dropped.
_NOT_SETTINGS = ("auto_map", "processor_class", "image_processor_type", "feature_extractor_type")


def read_json(path: Path, limit: int, what: str) -> Any:
    """``path``'s JSON, at most ``limit`` bytes; one InputError naming ``what`` when it is not that."""
    try:
        if path.stat().st_size > limit:
            raise InputError(f"{path}: {path.stat().st_size} bytes is not a {what} (limit {limit})")
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # ValueError: JSON, huge ints
        raise InputError(f"{path}: not a readable {what} ({exc.__class__.__name__}: {str(exc)[:200]})") from None


def read_processor_settings(folder: Path) -> dict[str, Any] | None:
    """The image processor's settings a checkpoint folder ships, or None when it ships none.

    InputError when the file is there but is not one (unreadable, too large, a value out of bounds)."""
    for name in _FILES:
        path = folder / name
        if not path.is_file():
            continue
        settings = read_processor_file(path, parts=name == "processor_config.json")
        if settings is not None:
            return settings
    return None


def read_processor_file(path: Path, *, parts: bool = False) -> dict[str, Any] | None:
    """The image processor's settings in one file: a ``preprocessor_config.json`` (or one of the
    published ones memwarden ships beside its configs, ``models/configs/processors/``); with ``parts``
    a ``processor_config.json``, whose image settings are under ``image_processor`` (None: it has none).
    Keys that name classes or code, and memwarden's own ``_`` notes, are dropped."""
    data = read_json(path, _MAX_BYTES, "processor config")
    if parts and isinstance(data, dict):
        data = data.get("image_processor")  # transformers 5 keeps each part's settings under its name
        if data is None:
            return None
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a processor config (its image settings are not an object)")
    _check(data, path, "", 0)
    return {k: v for k, v in data.items() if k not in _NOT_SETTINGS and not str(k).startswith("_")}


def _check(value: Any, path: Path, where: str, depth: int) -> None:
    if depth > 6:
        raise InputError(f"{path}: nested deeper than any processor config")
    if isinstance(value, dict):
        for key, item in value.items():
            _check(item, path, f"{where}.{key}" if where else str(key), depth + 1)
    elif isinstance(value, list):
        if len(value) > 4096:
            raise InputError(f"{path}: {where} holds {len(value)} values; no processor setting holds that many")
        for i, item in enumerate(value):
            _check(item, path, f"{where}[{i}]", depth + 1)
    elif isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{path}: {where} = {value} is not a finite number")
    elif (
        isinstance(value, int) and not isinstance(value, bool) and not -MAX_PROCESSOR_INT <= value <= MAX_PROCESSOR_INT
    ):
        raise InputError(
            f"{path}: {where} = {str(value)[:40]} is beyond any processor's setting (at most {MAX_PROCESSOR_INT})"
        )
    elif isinstance(value, str) and len(value) > 4096:
        raise InputError(f"{path}: {where} is a string of {len(value)} characters; not a processor setting")
