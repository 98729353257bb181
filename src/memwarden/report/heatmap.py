"""Fragmentation heatmap: simulated device memory as time (x) by address (y).

Each pixel is coloured by what most of its bytes were at that moment:
allocated to a tensor, cached free (reserved by the allocator but holding no
tensor) or unmapped (not reserved). Input is the downsampled layout history a
replay records (``replay(..., history_columns=400)``). Addresses are
compressed: only ranges that were ever reserved are drawn, stacked in address
order, so gaps the model leaves between segments take no space.

``heatmap_matrix`` is the pure part; matplotlib is imported inside the
renderers only, with the Agg canvas (no pyplot, no global backend change).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from memwarden.plan.records import LayoutHistory, ReplayResult

__all__ = ["UNMAPPED", "CACHED_FREE", "ALLOCATED", "COLOURS", "heatmap_matrix", "heatmap_png_bytes", "render_heatmap"]

UNMAPPED, CACHED_FREE, ALLOCATED = 0, 1, 2
COLOURS = {UNMAPPED: "#f2f2f2", CACHED_FREE: "#f0a030", ALLOCATED: "#2b5c8a"}
LABELS = {UNMAPPED: "unmapped", CACHED_FREE: "cached free (reserved, unallocated)", ALLOCATED: "allocated"}


def _history(source: ReplayResult | LayoutHistory) -> LayoutHistory:
    if isinstance(source, LayoutHistory):
        return source
    if source.history is None:
        raise ValueError("this replay recorded no layout history; replay with history_columns > 0")
    return source.history


def heatmap_matrix(source: ReplayResult | LayoutHistory, rows: int = 400) -> tuple[np.ndarray, int]:
    """(rows, columns) array of UNMAPPED / CACHED_FREE / ALLOCATED, and the bytes the y axis spans.

    Row 0 is the lowest address. A pixel takes the state that covers most of its bytes.
    """
    history = _history(source)
    columns = len(history.blocks)
    if columns == 0:
        return np.zeros((rows, 0), dtype=np.uint8), 0
    starts, prefix, total = _compress([s for s in history.segments])
    if total == 0:
        return np.zeros((rows, columns), dtype=np.uint8), 0
    edges = np.linspace(0, total, rows + 1)
    image = np.zeros((rows, columns), dtype=np.uint8)
    pixel = np.diff(edges)
    for c, (segments, blocks) in enumerate(zip(history.segments, history.blocks, strict=True)):
        reserved_b = np.diff(_coverage(_to_compressed(segments[:, 0], starts, prefix), segments[:, 1], edges))
        alloc = blocks[blocks[:, 2] == 1]
        alloc_b = np.diff(_coverage(_to_compressed(alloc[:, 0], starts, prefix), alloc[:, 1], edges))
        free_b = reserved_b - alloc_b  # reserved but holding no tensor
        unmapped_b = pixel - reserved_b
        image[:, c] = np.argmax(np.stack([unmapped_b, free_b, alloc_b]), axis=0)
    return image, total


def _compress(segments: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
    """Union of every reserved range ever seen -> piece starts, their offsets on the y axis, total bytes."""
    ranges = np.concatenate([s for s in segments if len(s)]) if any(len(s) for s in segments) else np.zeros((0, 2))
    if len(ranges) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    order = np.argsort(ranges[:, 0], kind="stable")
    lo, hi = ranges[order, 0], ranges[order, 0] + ranges[order, 1]
    reach = np.maximum.accumulate(hi)
    new_piece = np.ones(len(lo), dtype=bool)
    new_piece[1:] = lo[1:] > reach[:-1]
    piece_lo = lo[new_piece]
    piece_hi = np.append(reach[np.flatnonzero(new_piece)[1:] - 1], reach[-1])
    lengths = piece_hi - piece_lo
    prefix = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return piece_lo.astype(np.int64), prefix.astype(np.int64), int(lengths.sum())


def _to_compressed(addresses: np.ndarray, starts: np.ndarray, prefix: np.ndarray) -> np.ndarray:
    piece = np.searchsorted(starts, addresses, side="right") - 1
    return prefix[piece] + (addresses - starts[piece])


def _coverage(starts: np.ndarray, sizes: np.ndarray, points: np.ndarray) -> np.ndarray:
    """For disjoint intervals, bytes covered below each point: F(x) = sum(clip(x - start, 0, size))."""
    if len(starts) == 0:
        return np.zeros(len(points))
    order = np.argsort(starts, kind="stable")
    starts, sizes = starts[order].astype(np.float64), sizes[order].astype(np.float64)
    before = np.concatenate([[0.0], np.cumsum(sizes)[:-1]])
    i = np.searchsorted(starts, points, side="right") - 1
    inside = i >= 0
    out = np.zeros(len(points))
    j = i[inside]
    out[inside] = before[j] + np.clip(points[inside] - starts[j], 0.0, sizes[j])
    return out


def _figure(source: ReplayResult | LayoutHistory, title: str | None, rows: int, times_s: Any = None) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    history = _history(source)
    image, total = heatmap_matrix(history, rows)
    fig = Figure(figsize=(10, 4.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    cmap = ListedColormap([COLOURS[UNMAPPED], COLOURS[CACHED_FREE], COLOURS[ALLOCATED]])
    columns = image.shape[1]
    mib = total / 2**20
    if times_s is not None and columns:
        # The timeline's axis: column c holds from its event's time to the next column's.
        at = np.asarray(times_s, dtype=np.float64)
        edges = np.append(at[np.asarray(history.event_index, dtype=np.int64)], max(float(at[-1]), 1e-9))
        edges = np.maximum.accumulate(edges)
        heights = np.linspace(0, mib if mib else 1, image.shape[0] + 1)
        ax.pcolormesh(edges, heights, image, cmap=cmap, vmin=0, vmax=2, shading="flat")
        ax.set_xlim(0, edges[-1])
        ax.set_xlabel("time (s from the first event, as on the timeline)")
    else:
        ax.imshow(
            image,
            origin="lower",
            aspect="auto",
            interpolation="nearest",
            cmap=cmap,
            vmin=0,
            vmax=2,
            extent=(0, max(columns, 1), 0, mib if mib else 1),
        )
        if columns:
            ticks = np.linspace(0, columns - 1, min(columns, 6)).round().astype(int)
            ax.set_xticks(ticks + 0.5)
            ax.set_xticklabels([str(int(history.event_index[t])) for t in ticks])
        ax.set_xlabel("trace event")
    ax.set_ylabel("reserved address space (MiB, gaps removed)")
    if title is None:
        title = f"Device memory over time ({history.allocator} allocator model)"
        if isinstance(source, ReplayResult):
            title += f": peak reserved {source.peak_reserved_bytes / 2**20:.1f} MiB, fragmentation {source.fragmentation:.0%}"
    ax.set_title(title, fontsize=10)
    handles = [Patch(color=COLOURS[k], label=LABELS[k]) for k in (ALLOCATED, CACHED_FREE, UNMAPPED)]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def heatmap_png_bytes(
    source: ReplayResult | LayoutHistory, *, title: str | None = None, rows: int = 400, times_s: Any = None
) -> bytes:
    """The heatmap as PNG bytes (for embedding as base64 in the HTML report). ``times_s``: the
    time of every trace row in seconds from the first event; the x-axis is then time, as on the
    report's timeline, instead of event numbers."""
    fig = _figure(source, title, rows, times_s)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def render_heatmap(
    source: ReplayResult | LayoutHistory,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    rows: int = 400,
    times_s: Any = None,
) -> Path:
    """Write the heatmap to ``path`` as PNG (written to a temporary name, then renamed)."""
    from memwarden.trace.io import atomic_write

    return atomic_write(path, heatmap_png_bytes(source, title=title, rows=rows, times_s=times_s))
