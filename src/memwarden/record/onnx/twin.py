"""The arena-on twin of an arena-off capture, run on an arena that splits every chunk.

With the CPU arena off ORT writes no allocator counters, so the capture runs a twin session with
the arena on and reads them there (``memwarden.record.onnx.session``). ORT's default BFC arena
counts chunks, not requests: it hands out a free chunk whole when the chunk is under twice the
request and the leftover is under ``max_dead_bytes_per_chunk`` (128 MB by default), so a
kernel's scratch read from the high-water mark is rounded up to the chunk it happened to get
(BERT's masked ``Where``: two 4 MiB temporaries, a 10.5 MB rise). A CPU arena registered for the
whole environment with ``max_dead_bytes_per_chunk`` 256 splits every chunk whose leftover is at
least 256 bytes (BFC's granule; 0 would split off empty chunks, which ORT cannot free), so its
counters are the requests rounded to 256 bytes; a session takes it with the config entry
``session.use_env_allocators``.

Such an allocator is shared by every session of the process that asks for it, and its
high-water mark is never reset, so a second twin in the same process would read the first's
mark. The twin therefore runs in a fresh interpreter (``python -m memwarden.record.onnx.session``),
which registers the allocator once and runs one session: the caller's own sessions never see
it. Where the installed onnxruntime lacks the API, or the child fails, the caller runs the twin
in process on the default arena, as before (``None`` here).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ENV_ALLOCATORS", "SPLIT_DEAD_BYTES", "register_splitting_arena", "shadow_profile", "splitting_supported"]

ENV_ALLOCATORS = "session.use_env_allocators"  # session config entry: take the environment's allocators
SPLIT_DEAD_BYTES = 256  # BFC's allocation granule: every leftover of a granule or more is split off
_SAME_AS_REQUESTED = 1  # ArenaExtendStrategy::kSameAsRequested: grow by the request, not a power of two
_registered = False
TWIN_TIMEOUT_S = 600.0  # the twin reruns a run that already ended in process; past this it is given up


def splitting_supported() -> bool:
    """Whether this onnxruntime can register an environment-wide CPU arena from Python."""
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return all(hasattr(ort, name) for name in ("create_and_register_allocator", "OrtArenaCfg", "OrtMemoryInfo"))


def register_splitting_arena() -> bool:
    """Register, once per process, an environment-wide CPU arena that splits every chunk. Only for a
    process that runs nothing but the twin: any session there with ``ENV_ALLOCATORS`` shares it.
    False where the API is missing or refuses the configuration."""
    global _registered
    if _registered:
        return True
    if not splitting_supported():
        return False
    import onnxruntime as ort

    try:
        config = ort.OrtArenaCfg(
            {"max_dead_bytes_per_chunk": SPLIT_DEAD_BYTES, "arena_extend_strategy": _SAME_AS_REQUESTED}
        )
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(info, config)
    except Exception:  # pybind errors (an older signature, a refused key) share no base
        return False
    _registered = True
    return True


def shadow_profile(
    source: str | Path | bytes, feeds: Sequence[Mapping[str, np.ndarray]], settings: Mapping[str, Any], workdir: Path
) -> Path | None:
    """The profile of ``source`` run on ``feeds`` (one run each) in a fresh interpreter, one session
    with ``settings`` (``OrtSettings`` fields, arena on) on the splitting arena; None where that
    cannot be had (the caller then runs the twin in process)."""
    if not splitting_supported():
        return None
    from memwarden.record.onnx.feeds import save_feeds

    child = workdir / "twin"
    child.mkdir(exist_ok=True)
    if isinstance(source, bytes):
        model = child / "model.onnx"
        model.write_bytes(source)
    else:
        model = Path(source).resolve()
    paths = []
    for i, f in enumerate(feeds):
        paths.append(str(child / f"feeds{i}.npz"))
        save_feeds(paths[-1], f)
    config = {"model": str(model), "feeds": paths, "settings": dict(settings), "workdir": str(child)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "memwarden.record.onnx.session", json.dumps(config)],
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
            timeout=TWIN_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return None
    profile = Path(lines[-1])
    return profile if profile.is_file() else None
