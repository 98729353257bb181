"""Settings of PyTorch's CUDA caching allocator, for the model in ``memwarden.plan.allocator.model``.

Holds the allocator's size constants (``c10/cuda/CUDACachingAllocator.cpp``),
``AllocatorConfig`` (the ``PYTORCH_CUDA_ALLOC_CONF`` settings that change where
blocks go, plus a device limit, and the request rounding they imply),
``parse_alloc_conf`` (``c10/core/AllocatorConfig.cpp`` parsing) and
``SimulatedOOM``, the model's out-of-memory error, ``allocation_size`` (the segment size
for a request) and how the model packs an allocated block (``REQ_BITS``). Constants cite
their source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memwarden.errors import InputError
from memwarden.interop.cuda_blocks import K_SMALL_SIZE, round_block

__all__ = ["AllocatorConfig", "SimulatedOOM", "parse_alloc_conf"]

# -- constants (c10/cuda/CUDACachingAllocator.cpp unless noted) ---------------------
K_SMALL_BUFFER = 2 << 20  # kSmallBuffer: "'small' allocations are packed in 2 MiB blocks"
K_LARGE_BUFFER = 20 << 20  # kLargeBuffer: "'large' allocations may be packed in 20 MiB blocks"
K_MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: "allocations between 1 and 10 MiB may use kLargeBuffer"
K_ROUND_LARGE = 2 << 20  # kRoundLarge: "round up large allocations to 2 MiB"
# ExpandableSegment page sizes: "we use 2MiB pages for our small pool and 20MiB pages
# for our large pool" (Note [Expandable Segments]).
K_SMALL_PAGE = K_SMALL_BUFFER
K_LARGE_PAGE = K_LARGE_BUFFER
# c10/core/AllocatorConfig.cpp: kRoundUpPowerOfTwoIntervals = 16 intervals, the first
# starting at kRoundUpPowerOfTwoStart = 1 MiB (one per power of two, up to 64 GiB).
K_ROUNDUP_INTERVALS = 16
K_ROUNDUP_START_LOG2 = 20
_MB = 1 << 20


class SimulatedOOM(Exception):
    """The model ran out of memory: every retry of PyTorch's malloc failed."""

    def __init__(self, requested_bytes: int, allocated_bytes: int, reserved_bytes: int, limit_bytes: int | None):
        self.requested_bytes = requested_bytes
        self.allocated_bytes = allocated_bytes
        self.reserved_bytes = reserved_bytes
        self.limit_bytes = limit_bytes
        super().__init__(
            f"simulated CUDA out of memory: tried to allocate {requested_bytes} B with {allocated_bytes} B allocated, "
            f"{reserved_bytes} B reserved, limit {limit_bytes} B"
        )


# -- configuration -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AllocatorConfig:
    """The allocator settings that change its behaviour (``PYTORCH_CUDA_ALLOC_CONF``), plus a device limit.

    ``roundup_power2_divisions`` is one value for all sizes or 16 values, one per
    power-of-two interval starting at 1 MiB (PyTorch's list syntax). ``limit_bytes``
    is the memory the allocator may reserve (device capacity, or the
    ``set_per_process_memory_fraction`` cap); ``None`` means unlimited.
    """

    max_split_size_bytes: int | None = None
    max_non_split_rounding_bytes: int = K_LARGE_BUFFER  # AllocatorConfig default: kLargeBuffer
    roundup_power2_divisions: int | tuple[int, ...] = 0
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0
    limit_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_split_size_bytes is not None and self.max_split_size_bytes <= 0:
            raise ValueError("max_split_size_bytes must be positive")
        if self.max_non_split_rounding_bytes <= 0:
            raise ValueError("max_non_split_rounding_bytes must be positive")
        divisions = self.roundup_power2_divisions
        values = (divisions,) if isinstance(divisions, int) else tuple(divisions)
        if not isinstance(divisions, int):
            if len(values) != K_ROUNDUP_INTERVALS:
                raise ValueError(f"roundup_power2_divisions list must have {K_ROUNDUP_INTERVALS} entries")
            object.__setattr__(self, "roundup_power2_divisions", values)
        for value in values:
            if value < 0 or (value and value & (value - 1)):
                raise ValueError("roundup_power2_divisions must be 0 or a power of 2")
        if not 0.0 <= self.garbage_collection_threshold < 1.0:
            raise ValueError("garbage_collection_threshold must be in [0.0, 1.0)")
        if self.limit_bytes is not None and self.limit_bytes < 0:
            raise ValueError("limit_bytes must be >= 0")

    def divisions_for(self, size_bytes: int) -> int:
        """``AllocatorConfig::roundup_power2_divisions(size)``: the interval of floor(log2(size))."""
        divisions = self.roundup_power2_divisions
        if isinstance(divisions, int):
            return divisions
        index = min(max(size_bytes.bit_length() - 1 - K_ROUNDUP_START_LOG2, 0), K_ROUNDUP_INTERVALS - 1)
        return divisions[index]

    def round_size(self, nbytes: int) -> int:
        """``DeviceCachingAllocator::round_size``: the block size a request of ``nbytes`` asks for."""
        return round_block(nbytes, self.divisions_for(nbytes))

    def to_alloc_conf(self) -> str:
        """The ``PYTORCH_CUDA_ALLOC_CONF`` string for these settings (limit not included)."""
        parts = []
        if self.max_split_size_bytes is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size_bytes // _MB}")
        if self.max_non_split_rounding_bytes != K_LARGE_BUFFER:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_bytes // _MB}")
        divisions = self.roundup_power2_divisions
        if isinstance(divisions, int):
            if divisions:
                parts.append(f"roundup_power2_divisions:{divisions}")
        else:
            items = ",".join(f"{1 << i}:{d}" for i, d in enumerate(divisions))
            parts.append(f"roundup_power2_divisions:[{items}]")
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.garbage_collection_threshold:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold}")
        return ",".join(parts)


_IGNORED_KEYS = {
    # Accepted by PyTorch, no effect on where device blocks go.
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
}
_KNOWN_KEYS = [
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "expandable_segments",
    "garbage_collection_threshold",
    "backend",
    *sorted(_IGNORED_KEYS),
]


def parse_alloc_conf(text: str, *, limit_bytes: int | None = None) -> AllocatorConfig:
    """Parse ``PYTORCH_CUDA_ALLOC_CONF`` syntax, e.g. ``"max_split_size_mb:128,expandable_segments:True"``.

    Follows ``AllocatorConfig::parseArgs``: the same keys, the same value checks
    (max_split_size_mb >= 20, divisions powers of two, gc threshold in (0, 1)),
    and the list form ``roundup_power2_divisions:[256:1,512:2,>:4]`` (keys in MiB;
    the first entry also covers every smaller interval, ``>`` every larger one).
    Raises ``ValueError`` with the offending part named.
    """
    source = text.strip()
    for prefix in ("PYTORCH_CUDA_ALLOC_CONF=", "PYTORCH_ALLOC_CONF="):
        if source.startswith(prefix):
            source = source[len(prefix) :]
    tokens = _lex_alloc_conf(source)
    values: dict[str, Any] = {"limit_bytes": limit_bytes}
    i = 0

    def fail(message: str) -> ValueError:
        return ValueError(f"bad allocator config {text!r}: {message}")

    def value_after(key: str) -> str:
        nonlocal i
        if i + 2 >= len(tokens) or tokens[i + 1] != ":" or tokens[i + 2] in ",:[]":
            raise fail(f"expected '{key}:VALUE'")
        i += 2
        return tokens[i]

    def as_int(key: str, raw: str) -> int:
        try:
            return int(raw)
        except ValueError:
            raise fail(f"{key} needs an integer, got {raw!r}") from None

    while i < len(tokens):
        key = tokens[i]
        if key == "max_split_size_mb":
            mb = as_int(key, value_after(key))
            if mb < K_LARGE_BUFFER // _MB:
                raise fail(f"max_split_size_mb too small, must be >= {K_LARGE_BUFFER // _MB}")
            values["max_split_size_bytes"] = mb * _MB
        elif key == "max_non_split_rounding_mb":
            mb = as_int(key, value_after(key))
            if mb < K_LARGE_BUFFER // _MB:
                raise fail(f"max_non_split_rounding_mb too small, must be >= {K_LARGE_BUFFER // _MB}")
            values["max_non_split_rounding_bytes"] = mb * _MB
        elif key == "garbage_collection_threshold":
            raw = value_after(key)
            try:
                threshold = float(raw)
            except ValueError:
                raise fail(f"garbage_collection_threshold needs a number, got {raw!r}") from None
            if not 0.0 < threshold < 1.0:
                raise fail("garbage_collection_threshold must be in (0.0, 1.0)")
            values["garbage_collection_threshold"] = threshold
        elif key == "expandable_segments":
            raw = value_after(key)
            if raw not in ("True", "False"):
                raise fail(f"expandable_segments needs True or False, got {raw!r}")
            values["expandable_segments"] = raw == "True"
        elif key == "roundup_power2_divisions":
            i, divisions = _parse_divisions(tokens, i, fail)
            values["roundup_power2_divisions"] = divisions
        elif key == "backend":
            raw = value_after(key)
            if raw != "native":
                raise fail(f"backend {raw!r} is not modelled (only the native caching allocator is)")
        elif key in _IGNORED_KEYS:
            value_after(key)
        else:
            raise fail(f"unknown option {key!r} (valid: {', '.join(_KNOWN_KEYS)})")
        i += 1
        if i < len(tokens):
            if tokens[i] != ",":
                raise fail(f"expected ',' before {tokens[i]!r}")
            i += 1
    try:
        return AllocatorConfig(**values)
    except ValueError as exc:
        raise fail(str(exc)) from None


def _lex_alloc_conf(text: str) -> list[str]:
    """``AllocatorConfig::lexArgs``: ``, : [ ]`` are tokens of their own, spaces vanish."""
    tokens: list[str] = []
    buf: list[str] = []
    for ch in text:
        if ch in ",:[]":
            if buf:
                tokens.append("".join(buf))
                buf.clear()
            tokens.append(ch)
        elif ch != " ":
            buf.append(ch)
    if buf:
        tokens.append("".join(buf))
    return tokens


def _parse_divisions(tokens: list[str], i: int, fail: Any) -> tuple[int, int | tuple[int, ...]]:
    """Parse ``roundup_power2_divisions:N`` or ``:[MiB:N,...,>:N]`` starting at the key."""

    def power_of_two_or_zero(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise fail(f"roundup_power2_divisions needs integers, got {raw!r}") from None
        if value < 0 or (value and value & (value - 1)):
            raise fail(f"roundup_power2_divisions values must be 0 or a power of 2, got {value}")
        return value

    if i + 2 >= len(tokens) or tokens[i + 1] != ":":
        raise fail("expected 'roundup_power2_divisions:VALUE'")
    i += 2
    if tokens[i] != "[":
        return i, power_of_two_or_zero(tokens[i])
    table = [0] * K_ROUNDUP_INTERVALS
    first = True
    last_index = 0
    i += 1
    while True:
        if i >= len(tokens):
            raise fail("roundup_power2_divisions list is not closed with ']'")
        if tokens[i] == "]":
            return i, tuple(table)
        interval = tokens[i]
        if i + 2 >= len(tokens) or tokens[i + 1] != ":":
            raise fail("roundup_power2_divisions list entries look like 'MiB:N' or '>:N'")
        divisions = power_of_two_or_zero(tokens[i + 2])
        i += 3
        if interval == ">":
            # fills every interval after the last one named (AllocatorConfig test: 1024:4,>:1 keeps 1024 at 4)
            for j in range(last_index + 1 if not first else 0, K_ROUNDUP_INTERVALS):
                table[j] = divisions
        else:
            try:
                mib = int(interval)
            except ValueError:
                raise fail(f"roundup_power2_divisions interval must be MiB or '>', got {interval!r}") from None
            if mib <= 0 or mib & (mib - 1):
                raise fail(f"roundup_power2_divisions intervals must be powers of 2, got {mib}")
            index = min(mib.bit_length() - 1, K_ROUNDUP_INTERVALS - 1)
            if first:
                for j in range(index):
                    table[j] = divisions
            table[index] = divisions
            last_index = index
        first = False
        if i < len(tokens) and tokens[i] == ",":
            i += 1


# How the model packs an allocated block: one int per address, block size << REQ_BITS | requested bytes.
REQ_BITS = 48
REQ_MASK = (1 << REQ_BITS) - 1


class SizeLimitError(InputError, ValueError):
    """A size past what the allocator model and the arena planner pack (48 bits: 256 TiB). It comes
    from the input (a trace may hold one 2**48-byte event, a device's tensors may add up past it), so
    it is an ``InputError`` the CLI prints as one line; a ``ValueError`` for callers that caught one."""


def allocation_size(size: int) -> int:
    """get_allocation_size: the segment cudaMalloc'd for a request of ``size`` rounded bytes."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE
