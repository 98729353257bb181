"""What the flight recorder (``ring``) and the streamer (``stream``) read of a running capture.

``Capture`` owns both and hands itself to them; they depend on this shape, not on ``Capture``, so
the capture module imports them and nothing imports it back (not even for types).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Protocol

from memwarden.record.attribution.log import CaptureLog

__all__ = ["ModuleInfo", "RunningCapture", "StreamerLike"]


@dataclass
class ModuleInfo:
    """A module the capture registered: its path in its model, its modality, and a weak reference."""

    path: str
    label: str  # path, or the class name for a root
    modality: int
    is_boundary: bool  # root, or modality differs from the parent's: its inputs get fingerprinted
    ref: weakref.ReferenceType[Any]  # the torch.nn.Module


class StreamerLike(Protocol):
    """The streamer as the flight recorder drives it (``stream.Streamer``)."""

    path: str

    def rebase(self, compact: Any) -> None: ...

    def flush(self, reason: str) -> None: ...


class RunningCapture(Protocol):
    """The state of a live capture its helpers read: the recorder, the log, the clock's origin."""

    metadata: dict[str, Any]
    _t0: int  # the recorder's clock at start (ns)
    _wall0: float  # time.time() at start
    _native: Any  # the native recorder module (record/native.cpp)
    _log: CaptureLog
    _fp_base: int  # input fingerprints the flight recorder dropped from the log's front
    _call_sites: dict[int, str]  # step start (ns) -> the user's line that called the model

    @property
    def _modules(self) -> list[ModuleInfo]: ...

    @property
    def _streamer(self) -> StreamerLike | None: ...
