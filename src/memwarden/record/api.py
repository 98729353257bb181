"""``memwarden.capture()``: the entry point of a live capture, importable without torch.

``import memwarden`` must stay cheap (the analyses and the CLI's trace commands never need
torch), so this function imports the recorder when it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memwarden.record.cuda.capture import CudaCapture
    from memwarden.record.live.capture import Capture

__all__ = ["capture", "flush", "ring_stats"]


def capture(*, device: str = "cpu", **kwargs: Any) -> Capture | CudaCapture:
    """``with memwarden.capture() as cap: ...`` then ``cap.trace``; keywords as ``Capture``'s.

    ``stream_to=PATH`` appends the log to PATH as the run goes (every 100 ms and at every step):
    a process killed mid-run leaves PATH, which ``memwarden.load`` recovers up to the last flush;
    a clean stop replaces it with the complete trace.

    ``ring_s=SECONDS`` makes it a flight recorder (record/live/ring.py): bounded memory however
    long the process runs, keeping the live state at the start of the last window plus every
    event in it; ``ring_rss_bytes=N`` also writes the window when resident memory crosses N.

    ``lines`` (default on) gives each allocation the innermost line of the user's code;
    ``stacks=True`` the whole Python stack; ``user_code``/``library_code`` are path prefixes that
    widen or narrow what counts as the user's code.

    ``device="cuda"`` also records the CUDA caching allocator (PyTorch's memory history, segments
    included) and merges it with the hooks' attribution into one trace with a device column.
    """
    if device == "cpu":
        from memwarden.record.live.capture import Capture

        return Capture(**kwargs)
    if device == "cuda" or device.startswith("cuda:"):
        from memwarden.record.cuda.capture import capture_cuda

        return capture_cuda(**kwargs)
    raise ValueError(f"capture(device=...) takes 'cpu' or 'cuda'; got {device!r}")


def flush() -> bool:
    """Make everything the running streamed capture (``stream_to=``) logged so far durable now:
    once this returns, the process may be killed and the stream still holds it. False if no
    running capture streams."""
    from memwarden.record.live.stream import flush_active

    return flush_active()


def ring_stats() -> dict[str, Any] | None:
    """The running flight recorder's figures (window, cuts, the log's bytes now and at most, the
    windows written), or None when no running capture has ``ring_s``."""
    from memwarden.record.live.capture import ring_stats as stats

    return stats()
