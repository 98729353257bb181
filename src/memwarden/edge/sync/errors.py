"""The errors of adapter sync, all ``MemwardenError``: the CLI prints one line, a caller catches
``SyncError`` and the device keeps the adapter it holds."""

from __future__ import annotations

from memwarden.errors import MemwardenError

__all__ = ["SignatureError", "SyncError", "UpdateRefused"]


class SyncError(MemwardenError):
    """A pull that could not complete; the device keeps the version it holds."""


class SignatureError(SyncError):
    """A manifest or delta that is unsigned, or not signed by the pinned publisher key. Never
    retried: a body that arrives whole (its digest matches) with a bad signature was forged."""


class UpdateRefused(SyncError):
    """A verified update that must not be applied: a version that goes backwards, another
    adapter's manifest, a tensor whose shape differs from the one the device holds."""
