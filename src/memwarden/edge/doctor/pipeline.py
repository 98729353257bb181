"""What a pipeline config expects: the audio sample rate, the video frame rate, the codec.

A MediaPipe graph (``.pbtxt``, or its JSON form) or any JSON config: the first key that names a
sample rate or a frame rate wins, wherever it sits. Only read, never executed.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from memwarden.edge.doctor import untrusted_json
from memwarden.errors import InputError
from memwarden.untrusted import read_regular, terminal_safe

_RATE_KEYS = ("target_sample_rate", "sample_rate", "sampling_rate", "audio_sample_rate", "audio_rate", "sample_rate_hz")
_FPS_KEYS = ("target_fps", "video_fps", "fps", "frame_rate", "framerate", "max_fps")
_CODEC_KEYS = ("video_codec", "codec")


def _walk(node: Any) -> Any:
    if isinstance(node, dict):
        for key, value in node.items():
            yield str(key).lower(), value
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def _first(pairs: list[tuple[str, Any]], keys: tuple[str, ...], kind: type) -> Any:
    for key in keys:
        for k, v in pairs:
            if k == key and isinstance(v, int | float | str) and not isinstance(v, bool):
                try:
                    return kind(v)
                except (ValueError, OverflowError):
                    continue
    return None


MAX_CONFIG_BYTES = 4 << 20  # a MediaPipe graph is a few KiB
# Far above any real stream (384 kHz audio, 1000 fps cameras): past these a value is a typo.
_RANGES = {"audio_rate_hz": 1e7, "video_fps": 1e4}


def read(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    label = terminal_safe(path)
    try:
        raw = read_regular(p, MAX_CONFIG_BYTES, what="a pipeline config").decode("utf-8")
    except InputError as exc:
        raise InputError(f"cannot read the pipeline config: {terminal_safe(exc)}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{label}: cannot read the pipeline config (not UTF-8 text at byte {exc.start})") from None
    pairs: list[tuple[str, Any]]
    if p.suffix.lower() == ".json" or raw.lstrip().startswith(("{", "[")):
        try:
            pairs = list(_walk(untrusted_json.loads(raw)))
        except InputError as exc:
            raise InputError(f"{label}: not valid JSON ({exc})") from None
    else:  # protobuf text format: `sample_rate: 16000`, `codec: "av1"`
        pairs = [(k.lower(), v.strip("\"'")) for k, v in re.findall(r"\b(\w+)\s*:\s*(\"[^\"]*\"|'[^']*'|[\w.]+)", raw)]
    found = {"audio_rate_hz": _first(pairs, _RATE_KEYS, float), "video_fps": _first(pairs, _FPS_KEYS, float)}
    if found["audio_rate_hz"] is None and found["video_fps"] is None:
        raise InputError(f"{label}: found no sample rate or frame rate (keys like sample_rate, fps, frame_rate)")
    for key, value in found.items():
        if value is not None and not (math.isfinite(value) and 0 < value <= _RANGES[key]):
            raise InputError(f"{label}: {key} {value:g} is out of range (more than 0, at most {_RANGES[key]:g})")
    codec = _first(pairs, _CODEC_KEYS, str)
    return {"path": str(p), **found, "video_codec": codec and terminal_safe(codec.lower())[:64]}
