"""Fractional-position reads from a sample buffer: windowed-sinc (default) or linear.

The aligner's rate changes are tiny (a clock drift of at most a few thousand ppm plus slow offset
corrections), so no anti-aliasing cutoff is needed: a 16-tap Kaiser-windowed sinc, tabulated at
256 sub-sample phases, reconstructs the band-limited signal between samples. Positions are
absolute sample indices; the caller hands over the buffer and the index of its first sample.
"""

from __future__ import annotations

import numpy as np

HALF_TAPS = 8  # samples each side of the read position the sinc kernel touches
PHASES = 256  # sub-sample phases tabulated: quantising the phase costs at most 1/512 sample


def _sinc_table() -> np.ndarray:
    # (PHASES + 1, 2 * HALF_TAPS): row p weights buffer[i0 - HALF_TAPS + 1 ... i0 + HALF_TAPS]
    # for a read at i0 + p / PHASES. Rows sum to 1 so a constant signal passes unchanged.
    frac = np.arange(PHASES + 1)[:, None] / PHASES
    offsets = np.arange(-HALF_TAPS + 1, HALF_TAPS + 1)[None, :]
    distance = offsets - frac
    window = np.kaiser(2 * HALF_TAPS + 2, 8.0)[1:-1]
    weights = np.sinc(distance) * np.interp(distance, np.linspace(-HALF_TAPS, HALF_TAPS, window.size), window)
    return weights / weights.sum(axis=1, keepdims=True)


_TABLE = _sinc_table()


def read_at(buffer: np.ndarray, first_index: int, positions: np.ndarray, *, quality: str = "sinc") -> np.ndarray:
    """Values of ``buffer`` (samples along axis 0) at absolute fractional ``positions``.

    Samples outside the buffer read as zero (silence before the stream starts).
    """
    local = positions - first_index
    base = np.floor(local).astype(np.int64)
    frac = local - base
    n = buffer.shape[0]
    if quality == "linear":
        idx = np.stack([base, base + 1], axis=1)
        weights = np.stack([1.0 - frac, frac], axis=1)
    else:
        idx = base[:, None] + np.arange(-HALF_TAPS + 1, HALF_TAPS + 1)[None, :]
        weights = _TABLE[np.rint(frac * PHASES).astype(np.int64)]
    inside = (idx >= 0) & (idx < n)
    gathered = buffer[np.clip(idx, 0, max(n - 1, 0))] if n else np.zeros(idx.shape + buffer.shape[1:], buffer.dtype)
    if not inside.all():
        gathered = np.where(inside.reshape(inside.shape + (1,) * (gathered.ndim - 2)), gathered, 0)
    if gathered.ndim == 2:  # mono: (k, taps)
        return np.einsum("kt,kt->k", gathered, weights).astype(buffer.dtype, copy=False)
    return np.einsum("kt...,kt->k...", gathered, weights).astype(buffer.dtype, copy=False)
