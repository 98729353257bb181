"""Errors a user can cause. The CLI prints them as one line and exits non-zero."""

from __future__ import annotations


class MemwardenError(Exception):
    """A user-facing error: bad input, missing file, unknown name. No traceback is shown."""

    exit_code = 2


class InputError(MemwardenError):
    """A file or argument that memwarden cannot use."""
