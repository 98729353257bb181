"""``memwarden.capture()``: the entry point of a live capture, importable without torch.

``import memwarden`` must stay cheap (the analyses and the CLI's trace commands never need
torch), so this function imports the recorder when it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memwarden.capture.cuda.capture import CudaCapture
    from memwarden.capture.live.capture import Capture

__all__ = ["capture", "flush"]


def capture(*, device: str = "cpu", **kwargs: Any) -> Capture | CudaCapture:
    """``with memwarden.capture() as cap: ...`` then ``cap.trace``; keywords as ``Capture``'s.

    ``stream_to=PATH`` appends the log to PATH as the run goes (every 100 ms and at every step):
    a process killed mid-run leaves PATH, which ``memwarden.load`` recovers up to the last flush;
    a clean stop replaces it with the complete trace.

    ``device="cuda"`` also records the CUDA caching allocator (PyTorch's memory history, segments
    included) and merges it with the hooks' attribution into one trace with a device column.
    """
    if device == "cpu":
        from memwarden.capture.live.capture import Capture

        return Capture(**kwargs)
    if device == "cuda" or device.startswith("cuda:"):
        from memwarden.capture.cuda.capture import capture_cuda

        return capture_cuda(**kwargs)
    raise ValueError(f"capture(device=...) takes 'cpu' or 'cuda'; got {device!r}")


def flush() -> bool:
    """Make everything the running streamed capture (``stream_to=``) logged so far durable now:
    once this returns, the process may be killed and the stream still holds it. False if no
    running capture streams."""
    from memwarden.capture.live.stream import flush_active

    return flush_active()
