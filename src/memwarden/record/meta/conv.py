"""What a CPU convolution allocates around its output, for the meta capture: the backend PyTorch
selects for the shapes (oneDNN or the im2col "slow" path), and the blocks a probe of the real
kernel on this CPU shows (see :func:`conv_pattern`)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from memwarden.record.native import NativeRecord

__all__ = ["conv_out_shape", "conv_pattern", "conv_sizes"]


def conv_out_shape(x: tuple[int, ...], w: tuple[int, ...], geometry: tuple[Any, ...]) -> tuple[int, ...]:
    stride, padding, dilation, transposed, output_padding, groups = geometry
    spatial = []
    for i, n in enumerate(x[2:]):
        k = w[2 + i]
        if transposed:
            spatial.append((n - 1) * stride[i] - 2 * padding[i] + dilation[i] * (k - 1) + output_padding[i] + 1)
        else:
            spatial.append((n + 2 * padding[i] - dilation[i] * (k - 1) - 1) // stride[i] + 1)
    channels = w[1] * groups if transposed else w[0]
    return (x[0], channels, *spatial)


def conv_sizes(
    x: tuple[int, ...], w: tuple[int, ...], out: tuple[int, ...], geometry: tuple[Any, ...], elem: int
) -> dict[str, int]:
    groups = geometry[5]
    columns = x[0] * (x[1] // groups) * int(np.prod(w[2:])) * int(np.prod(out[2:])) * groups  # im2col of the slow path
    return {
        "input": int(np.prod(x)) * elem,
        "weight": int(np.prod(w)) * elem,
        "out": int(np.prod(out)) * elem,
        "output": int(np.prod(out)) * elem,
        "columns": columns * elem,
    }


_PROBE_BYTES = 32 << 20  # a probe larger than this runs on one batch item
_PROBE_OUT_SIDE = 8  # the im2col path's probe: at most this many outputs per spatial dim


def _shorter(
    x: tuple[int, ...], w: tuple[int, ...], geometry: tuple[Any, ...], elem: int, chosen: Any, backend: Any
) -> tuple[int, ...] | None:
    """A probe input with fewer positions, for the im2col ("slow") path only: its blocks are the same
    columns/output at any length, and it is the path a CPU without bf16 instructions takes for bf16,
    about 100x slower than float32 (a full-size audio tower's conv took a minute). None: probe as is."""
    stride, padding, dilation, transposed, _, _ = geometry
    if "Slow" not in str(chosen) or transposed or len(x) < 3:
        return None
    out = conv_out_shape(x, w, geometry)
    spatial = []
    for i, o in enumerate(out[2:]):
        o = min(o, _PROBE_OUT_SIDE)
        n = max((o - 1) * stride[i] + dilation[i] * (w[2 + i] - 1) + 1 - 2 * padding[i], 1)
        spatial.append(min(n, x[2 + i]))
    short = (*x[:2], *spatial)
    if short == x or backend(short) != chosen:
        return None
    return short if _same_relations(x, short, w, geometry, elem) else None


_SLOW_PROBE_BATCH = 4  # the im2col path's probe: at most this many batch items


def _fewer(
    x: tuple[int, ...], w: tuple[int, ...], geometry: tuple[Any, ...], elem: int, chosen: Any, backend: Any
) -> tuple[int, ...] | None:
    """A probe input with fewer batch items, for the im2col ("slow") path only: it allocates the
    columns and the output for the whole batch at once, so each block is the same kind at any batch.
    Qwen2-VL's patch embedding is a conv3d over thousands of patches as its batch; in bf16 on a CPU
    without bf16 instructions the full probe took 19 s, four patches take 0.15 s. None: probe as is."""
    if "Slow" not in str(chosen) or len(x) < 3 or x[0] <= _SLOW_PROBE_BATCH:
        return None
    fewer = (_SLOW_PROBE_BATCH, *x[1:])
    if backend(fewer) != chosen or not _same_relations(x, fewer, w, geometry, elem):
        return None
    return fewer


def _same_relations(
    a: tuple[int, ...], b: tuple[int, ...], w: tuple[int, ...], geometry: tuple[Any, ...], elem: int
) -> bool:
    """Blocks are told apart by size: probe ``b`` must confuse no two that ``a`` tells apart (nor the reverse)."""
    keys = ("input", "weight", "out", "columns")
    full, small = (conv_sizes(s, w, conv_out_shape(s, w, geometry), geometry, elem) for s in (a, b))
    return all((full[i] == full[j]) == (small[i] == small[j]) for i in keys for j in keys)


@functools.lru_cache(maxsize=256)
def conv_pattern(
    x: tuple[int, ...], w: tuple[int, ...], has_bias: bool, geometry: tuple[Any, ...], dtype: torch.dtype, threads: int
) -> tuple[tuple[bool, int, str], ...]:
    """What the CPU convolution allocates, as (alloc?, block, kind) with kind in input/weight/columns/output
    (a same-sized copy of the output), ``bytes:N`` (a block of fixed size) and one "out" (the returned
    tensor).

    The backend (oneDNN or the im2col "slow" path) is the one PyTorch selects for these shapes
    (``torch._C._select_conv_backend`` on zero-stride stand-ins). oneDNN reorders the weight, the
    input (unless its layout suits the kernel) and the output into its blocked layouts; which of them
    it reorders depends on the CPU, so a probe runs the real convolution once on this CPU (on one
    batch item when the real one is large) under the native allocation recorder and classifies each
    block by its size. Without the recorder, oneDNN is assumed to reorder weight and output.
    """
    stride, padding, dilation, transposed, output_padding, groups = geometry
    elem = torch.empty((), dtype=dtype).element_size()

    def stand_in(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.empty((), dtype=dtype).expand(shape)

    def backend(xs: tuple[int, ...]) -> Any:
        bias = stand_in((w[1] * groups if transposed else w[0],)) if has_bias else None
        return torch._C._select_conv_backend(
            stand_in(xs),
            stand_in(w),
            bias,
            list(stride),
            list(padding),
            list(dilation),
            transposed,
            list(output_padding),
            groups,
            None,
        )

    chosen = backend(x)
    probe_x = x
    if int(np.prod(x)) * elem + int(np.prod(conv_out_shape(x, w, geometry))) * elem > _PROBE_BYTES and x[0] > 1:
        for batch in (1, 2):
            if backend((batch, *x[1:])) == chosen:
                probe_x = (batch, *x[1:])
                break
    fewer = _fewer(probe_x, w, geometry, elem, chosen, backend)
    short = _shorter(fewer or probe_x, w, geometry, elem, chosen, backend)
    found = None
    for candidate in (short, fewer):
        if candidate is not None and found is None:
            found = _probe_conv(candidate, w, has_bias, geometry, dtype)
            if found is not None and any(kind.startswith("bytes:") for _, _, kind in found):
                found = None  # a block no size names may grow with the length or batch: probe it larger
    if found is None:
        found = _probe_conv(probe_x, w, has_bias, geometry, dtype)
    if found is None:
        name = str(chosen)
        if "Mkldnn" in name:
            return (
                (True, 0, "weight"),
                (True, 1, "output"),
                (False, 0, "weight"),
                (True, 2, "out"),
                (False, 1, "output"),
            )
        if "Slow" in name:
            return ((True, 0, "columns"), (True, 1, "out"), (False, 0, "columns"))
        return ((True, 0, "out"),)
    return found


def _probe_conv(
    x: tuple[int, ...], w: tuple[int, ...], has_bias: bool, geometry: tuple[Any, ...], dtype: torch.dtype
) -> tuple[tuple[bool, int, str], ...] | None:
    stride, padding, dilation, transposed, output_padding, groups = geometry
    try:
        from memwarden.record import native

        recorder = native.load()
        if recorder.recording():
            return None  # a live capture is running: stay out of its log
    except Exception:  # no compiler, no headers: the formula above
        return None
    elem = torch.empty((), dtype=dtype).element_size()
    out_shape = conv_out_shape(x, w, geometry)
    sizes = conv_sizes(x, w, out_shape, geometry, elem)
    xt, wt = torch.zeros(x, dtype=dtype), torch.zeros(w, dtype=dtype)
    bt = torch.zeros(out_shape[1], dtype=dtype) if has_bias else None
    with torch.inference_mode():
        recorder.start(False)
        try:
            out = torch.ops.aten.convolution.default(
                xt, wt, bt, list(stride), list(padding), list(dilation), transposed, list(output_padding), groups
            )
        finally:
            recorder.stop()
            drained = recorder.drain()
    action, nbytes, ident = (np.asarray(drained[k]) for k in ("action", "nbytes", "id"))
    out_bytes = out.untyped_storage().nbytes()
    del out
    freed = set(ident[action == NativeRecord.FREE].tolist())
    by_size = {sizes["out"]: "output", sizes["input"]: "input", sizes["weight"]: "weight", sizes["columns"]: "columns"}
    pattern: list[tuple[bool, int, str]] = []
    returned = False
    for a, nb, i in zip(action.tolist(), nbytes.tolist(), ident.tolist(), strict=True):
        if a == NativeRecord.ALLOC and i not in freed and nb == out_bytes and not returned:
            pattern.append((True, i, "out"))
            returned = True
        elif a in (NativeRecord.ALLOC, NativeRecord.FREE):
            # a size none of the tensors has (a weight padded to oneDNN's channel blocking) is kept as is
            pattern.append((a == NativeRecord.ALLOC, i, by_size.get(nb, f"bytes:{nb}")))
    if not returned:
        pattern.append((True, -1, "out"))
    return tuple(pattern)
