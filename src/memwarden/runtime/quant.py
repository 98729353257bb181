"""Group-wise int4 weight-only linear layers that never dequantise a whole weight.

``memwarden.quantize(model, bits=4, group_size=128)`` replaces ``nn.Linear`` layers by
``Int4Linear``: 4-bit codes with one (scale, zero) pair per ``group_size`` input features
(asymmetric, w ≈ (q − 8)·scale + zero, as gpt-fast / torchao pack it). The forward uses
PyTorch's fused CPU kernel ``aten._weight_int4pack_mm_for_cpu`` where it exists; otherwise it
dequantises ``tile_rows`` output rows at a time, so the float temporary is bounded by one
tile, never the whole weight — the mistake the ``dequant-temporaries`` detector flags.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

_INNER_K_TILES = 2  # packing parameter of the CPU int4 kernel (K must be a multiple of 16 * tiles)
# The fused CPU kernel is a matrix-vector kernel: measured (benchmarks/bench_int4.py) 3.4x faster than
# dequantising at 1 token but 4-21x slower at 16-128 tokens, so prefill goes through the tiled path.
FUSED_MAX_TOKENS = 4


def _fused_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"
    )


# Output rows per block of the CPU int4 pack (aten/src/ATen/native/cpu/int4mm_kernel.cpp): its BLOCK_N
# follows the vector ISA the kernel was dispatched to (64 with AVX-512, 32 with AVX2), so it is read
# off the kernel itself (pack_block_rows).
_PACK_BLOCK_CANDIDATES = (64, 32)
_CHUNK_FLOATS = 1 << 20  # rows are quantized and packed this many weights at a time (4 MiB of float temporaries)


@functools.lru_cache(maxsize=1)
def pack_block_rows() -> int | None:
    """The rows per block of ``_convert_weight_to_int4pack_for_cpu``'s layout on this machine (see
    ``unpack_cpu_int4``), found by packing known codes; None if no layout it knows matches."""
    if not _fused_available():
        return None
    k = 16 * _INNER_K_TILES * 4
    codes = (torch.arange(64 * k, dtype=torch.int32).reshape(64, k) * 7 + 3) % 16
    try:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, _INNER_K_TILES)
    except RuntimeError:
        return None
    for block in _PACK_BLOCK_CANDIDATES:
        if torch.equal(_unpack(packed, 0, 64, k, block), codes.to(torch.uint8)):
            return block
    return None


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 (N, K) in 0..15, scales (N, K/g), zeros (N, K/g)) of a float weight (N, K).

    Rows go a chunk at a time, so the float temporaries are bounded by ``_CHUNK_FLOATS`` whatever
    the layer's size (a whole-layer expression holds several float copies of the weight at once).
    """
    n, k = weight.shape
    codes = torch.empty((n, k), dtype=torch.uint8)
    scales = torch.empty((n, k // group_size), dtype=torch.float32)
    zeros = torch.empty_like(scales)
    step = max(1, _CHUNK_FLOATS // k)
    for r0 in range(0, n, step):
        groups = weight.detach()[r0 : r0 + step].float().reshape(-1, group_size)  # (rows*K/g, g)
        lo, hi = groups.amin(1, keepdim=True), groups.amax(1, keepdim=True)
        sc = (hi - lo).clamp(min=1e-6) / 15
        rows = groups.shape[0] * group_size // k
        scales[r0 : r0 + rows] = sc.reshape(rows, -1)
        zeros[r0 : r0 + rows] = (lo + sc * 8).reshape(rows, -1)
        codes[r0 : r0 + rows] = groups.sub(lo).div_(sc).round_().clamp_(0, 15).reshape(rows, k)  # not sub_: a view
    return codes, scales, zeros


def _pack_cpu_int4(codes: torch.Tensor, block: int) -> torch.Tensor:
    """``_convert_weight_to_int4pack_for_cpu`` of uint8 codes (N, K), N a multiple of ``block``, by
    whole blocks of rows (the layout is block-major, see ``unpack_cpu_int4``): the kernel's int32
    input is a chunk."""
    n, k = codes.shape
    step = max(block, _CHUNK_FLOATS // k // block * block)
    out = torch.empty(n * k // 2, dtype=torch.uint8)
    for r0 in range(0, n, step):
        part = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes[r0 : r0 + step].to(torch.int32), _INNER_K_TILES)
        out[r0 * k // 2 : r0 * k // 2 + part.numel()] = part.reshape(-1)
    return out.reshape(n, k // 2)


def unpack_cpu_int4(packed: torch.Tensor, rows: slice, n: int, k: int) -> torch.Tensor:
    """Codes (r, K) uint8 of output ``rows`` from ``_convert_weight_to_int4pack_for_cpu``'s layout.

    That layout is blocked by B output rows (``pack_block_rows()``: 64 with AVX-512, 32 with AVX2):
    block ``b`` holds K·B/2 bytes, byte ``k·B/2 + d`` = row ``Bb + d`` (low nibble) | row
    ``Bb + B/2 + d`` (high nibble) at column ``k``. It is an internal format: ``Int4Linear`` checks
    this inverse against the codes it packed and keeps its own copy of the codes where it does not
    hold (or N is not a multiple of B). ``rows`` must start on a block.
    """
    block = pack_block_rows()
    if block is None:
        raise RuntimeError("this machine's int4 pack layout is not one unpack_cpu_int4 reads")
    r0, r1 = rows.start or 0, min(rows.stop if rows.stop is not None else n, n)
    return _unpack(packed, r0, r1, k, block)


def _unpack(packed: torch.Tensor, r0: int, r1: int, k: int, block: int) -> torch.Tensor:
    half = block // 2
    flat = packed.reshape(-1)
    b0, b1 = r0 // block, -(-r1 // block)
    blocks = flat[b0 * k * half : b1 * k * half].reshape(b1 - b0, k, half)  # (B, K, half)
    out = torch.empty((b1 - b0, 2, half, k), dtype=torch.uint8)
    torch.bitwise_and(blocks, 15, out=out[:, 0].transpose(1, 2))
    torch.bitwise_right_shift(blocks, 4, out=out[:, 1].transpose(1, 2))
    return out.reshape(-1, k)[r0 - b0 * block : r1 - b0 * block]


def dequantize_int4(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    n, k = codes.shape
    g = codes.reshape(n, k // group_size, group_size).float()  # (N, K/g, g): the one float temporary
    return g.sub_(8).mul_(scales.unsqueeze(-1)).add_(zeros.unsqueeze(-1)).reshape(n, k)


def _pack_pairs(codes: torch.Tensor) -> torch.Tensor:
    """Codes two per byte: (N, K/2) uint8, high nibble = even column."""
    return (codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8)


class Int4Linear(nn.Module):
    """y = x · dequant(W)ᵀ + b with W stored as int4 codes; see the module docstring."""

    # Buffers registered in __init__, declared so that type checkers see tensors (nn.Module's
    # __getattr__ is typed Tensor | Module).
    codes: torch.Tensor | None
    packed: torch.Tensor
    scales_and_zeros: torch.Tensor
    _scales: torch.Tensor
    _zeros: torch.Tensor

    def __init__(self, linear: nn.Linear, group_size: int = 128, tile_rows: int = 256, fused: bool | None = None):
        super().__init__()
        n, k = linear.weight.shape
        if k % group_size:
            raise ValueError(f"in_features {k} is not a multiple of group_size {group_size}")
        self.in_features, self.out_features = k, n
        self.group_size, self.tile_rows = group_size, tile_rows
        self.fused = _fused_available() and k % (16 * _INNER_K_TILES) == 0 and n % 16 == 0 if fused is None else fused
        codes, scales, zeros = quantize_int4(linear.weight, group_size)
        self.register_buffer("codes", None)  # (N, K/2) uint8 unless the kernel's packed weight is unpackable
        if self.fused:
            # (K/g, N, 2): the kernel's scales-and-zeros layout; scales and zeros are views of it
            self.register_buffer("scales_and_zeros", torch.stack([scales, zeros], -1).transpose(0, 1).contiguous())
            # The weight is stored once: the tiled path unpacks the kernel's layout where the inverse
            # is verified, instead of keeping a second copy of the codes (2x the int4 bytes).
            block = pack_block_rows()
            if block is not None:
                self.tile_rows = -(-tile_rows // block) * block
            packed = _pack_cpu_int4(codes, block) if block is not None and n % block == 0 else None
            if packed is None or not torch.equal(unpack_cpu_int4(packed, slice(0, n), n, k), codes):
                # Not the layout unpack reads (so packing by blocks may be wrong too): the kernel packs
                # the whole weight, and the layer keeps its own codes for the tiled path.
                packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), _INNER_K_TILES)
                self.register_buffer("codes", _pack_pairs(codes))
            self.register_buffer("packed", packed)
        else:
            self.register_buffer("codes", _pack_pairs(codes))
            self.register_buffer("_scales", scales.contiguous())
            self.register_buffer("_zeros", zeros.contiguous())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    @property
    def scales(self) -> torch.Tensor:  # (N, K/g)
        return self.scales_and_zeros[..., 0].t() if self.fused else self._scales

    @property
    def zeros(self) -> torch.Tensor:  # (N, K/g)
        return self.scales_and_zeros[..., 1].t() if self.fused else self._zeros

    def unpacked_codes(self, rows: slice = slice(None)) -> torch.Tensor:
        if self.codes is None:
            return unpack_cpu_int4(self.packed, rows, self.out_features, self.in_features)
        packed = self.codes[rows]  # (r, K/2) uint8
        out = torch.empty((packed.shape[0], self.in_features), dtype=torch.uint8, device=packed.device)
        torch.bitwise_right_shift(packed, 4, out=out[:, ::2])
        torch.bitwise_and(packed, 15, out=out[:, 1::2])
        return out  # (r, K) uint8 codes: one byte per weight, a quarter of a float tile

    def dequantized_weight(self) -> torch.Tensor:
        """The full float weight (for references and tests only: this is what forward avoids)."""
        return dequantize_int4(self.unpacked_codes(), self.scales, self.zeros, self.group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)  # (M, K)
        if self.fused and x2.device.type == "cpu" and x2.shape[0] <= FUSED_MAX_TOKENS:
            sz = self.scales_and_zeros.to(x2.dtype)
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2.contiguous(), self.packed, self.group_size, sz)
        else:
            outs = []
            for r0 in range(0, self.out_features, self.tile_rows):  # one (tile_rows, K) float temporary at a time
                rows = slice(r0, min(r0 + self.tile_rows, self.out_features))
                w = dequantize_int4(self.unpacked_codes(rows), self.scales[rows], self.zeros[rows], self.group_size)
                outs.append(torch.nn.functional.linear(x2, w.to(x2.dtype)))  # no transposed copy of the tile
                del w  # else the next tile is made while this one is still referenced: two tiles live
            y = torch.cat(outs, -1)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        kernel = "fused int4 kernel" if self.fused else f"tiled dequant ({self.tile_rows} rows)"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, {kernel}"
        )


def quantize(
    model: nn.Module, bits: int = 4, group_size: int = 128, skip: tuple[str, ...] = (), **kwargs: Any
) -> nn.Module:
    """Replace every eligible ``nn.Linear`` (in_features divisible by ``group_size``, path not in
    ``skip``) by an ``Int4Linear``, in place; returns the model."""
    if bits != 4:
        raise ValueError(f"bits={bits}: only 4-bit weight-only quantization is implemented")
    if group_size < 1:
        raise ValueError("group_size must be positive")
    # Names, not modules: a list of the modules would keep every float weight alive until the end,
    # so the model would briefly hold its float and its int4 weights at once.
    targets = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and module.in_features % group_size == 0 and not any(s in name for s in skip)
    ]
    for name in targets:
        path, _, attr = name.rpartition(".")
        parent = model.get_submodule(path) if path else model
        setattr(parent, attr, Int4Linear(getattr(parent, attr), group_size, **kwargs))
    return model
