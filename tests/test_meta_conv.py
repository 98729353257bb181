"""The meta capture's convolution probe: on the im2col ("slow") path, which a CPU without bf16
instructions takes for bf16, a probe of a few output positions shows the same blocks as a probe of
the real length, at a fraction of its cost."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from memwarden.record.meta import conv

# (input, weight, (stride, padding, dilation, transposed, output_padding, groups))
CASES = [
    ((1, 128, 3000), (256, 128, 3), ((1,), (1,), (1,), False, (0,), 1)),  # Whisper-style conv1
    ((1, 256, 3000), (256, 256, 3), ((2,), (1,), (1,), False, (0,), 1)),  # conv2, stride 2
    ((2, 3, 96, 80), (8, 3, 3, 3), ((1, 1), (1, 1), (1, 1), False, (0, 0), 1)),
    ((1, 16, 64, 64), (16, 4, 3, 3), ((2, 2), (2, 2), (2, 2), False, (0, 0), 4)),  # dilated, grouped
]


def _backend(x: tuple[int, ...], w: tuple[int, ...], g: tuple[Any, ...], dtype: torch.dtype) -> Any:
    def stand_in(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.empty((), dtype=dtype).expand(shape)

    stride, padding, dilation, transposed, output_padding, groups = g
    return torch._C._select_conv_backend(
        stand_in(x),
        stand_in(w),
        None,
        list(stride),
        list(padding),
        list(dilation),
        transposed,
        list(output_padding),
        groups,
        None,
    )


def _shape(pattern: tuple[tuple[bool, int, str], ...]) -> list[tuple[bool, int, str]]:
    """The pattern with block ids renumbered by first appearance (the recorder's ids are global)."""
    order: dict[int, int] = {}
    return [(alloc, order.setdefault(i, len(order)) if i >= 0 else i, kind) for alloc, i, kind in pattern]


@pytest.mark.parametrize(("x", "w", "g"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_short_probe_shows_the_blocks_of_the_full_one(x: tuple, w: tuple, g: tuple, dtype: torch.dtype) -> None:
    chosen = _backend(x, w, g, dtype)
    short = conv._shorter(x, w, g, 2 if dtype == torch.bfloat16 else 4, chosen, lambda xs: _backend(xs, w, g, dtype))
    if "Slow" not in str(chosen):
        assert short is None  # oneDNN's reorders may follow the shape: probed at the real one
        return
    assert short is not None and all(a <= b for a, b in zip(short[2:], x[2:], strict=True)) and short != x
    full = conv._probe_conv(x, w, False, g, dtype)
    small = conv._probe_conv(short, w, False, g, dtype)
    assert full is not None and small is not None
    if not any(kind.startswith("bytes:") for _, _, kind in small):
        assert _shape(small) == _shape(full)  # the short probe stands for the full one
    # otherwise (a block no size names, which may grow with the length) the pattern probes the real length
    assert _shape(conv.conv_pattern(x, w, False, g, dtype, torch.get_num_threads())) == _shape(full)
    assert any(kind == "out" for _, _, kind in full)
