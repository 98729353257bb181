"""``memwarden.capture()``: the entry point of a live capture, importable without torch.

``import memwarden`` must stay cheap (the analyses and the CLI's trace commands never need
torch), so this function imports the recorder when it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memwarden.capture.live.capture import Capture

__all__ = ["capture"]


def capture(**kwargs: Any) -> Capture:
    """``with memwarden.capture() as cap: ...`` then ``cap.trace``; keywords as ``Capture``'s."""
    from memwarden.capture.live.capture import Capture

    return Capture(**kwargs)
