"""What a pipeline config expects: the audio sample rate, the video frame rate, the codec.

A MediaPipe graph (``.pbtxt``, or its JSON form) or any JSON config: the first key that names a
sample rate or a frame rate wins, wherever it sits. Only read, never executed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from memwarden.errors import InputError

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
                except ValueError:
                    continue
    return None


def read(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the pipeline config ({getattr(exc, 'strerror', None) or exc})") from None
    pairs: list[tuple[str, Any]]
    if p.suffix.lower() == ".json" or raw.lstrip().startswith(("{", "[")):
        try:
            pairs = list(_walk(json.loads(raw)))
        except (ValueError, RecursionError) as exc:
            raise InputError(f"{path}: not valid JSON ({exc})") from None
    else:  # protobuf text format: `sample_rate: 16000`, `codec: "av1"`
        pairs = [(k.lower(), v.strip("\"'")) for k, v in re.findall(r"\b(\w+)\s*:\s*(\"[^\"]*\"|'[^']*'|[\w.]+)", raw)]
    audio_rate = _first(pairs, _RATE_KEYS, float)
    video_fps = _first(pairs, _FPS_KEYS, float)
    codec = _first(pairs, _CODEC_KEYS, str)
    if audio_rate is None and video_fps is None:
        raise InputError(f"{path}: found no sample rate or frame rate (keys like sample_rate, fps, frame_rate)")
    return {"path": str(p), "audio_rate_hz": audio_rate, "video_fps": video_fps, "video_codec": codec and codec.lower()}
