"""Known platform facts that change what an allocation can get, each with its public source.

An entry without a source is ``verified=False`` and never turns a verdict on its own (it only adds
a note). Kept as code, not a data file, so that ``govern`` reads it without importing ``models``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FACTS", "PlatformFact", "facts_for"]


@dataclass(frozen=True, kw_only=True)
class PlatformFact:
    id: str
    l4t: tuple[str, ...]  # the L4T releases it applies to ("36.4.7")
    kinds: tuple[str, ...]  # the allocation kinds it affects
    effect: str  # what happens, in one line a user reads
    fix: str
    sources: tuple[str, ...]

    @property
    def verified(self) -> bool:
        return bool(self.sources)


FACTS: tuple[PlatformFact, ...] = (
    PlatformFact(
        id="l4t-36.4.7-nvmap",
        l4t=("36.4.7",),
        kinds=("cuda",),
        effect=(
            "L4T R36.4.7 (the NvMap fix for CVE-2025-33177) makes cudaMalloc of model buffers fail with "
            "'NvMapMemAllocInternalTagged: 1075072515 error 12' while several GB are reported free"
        ),
        fix=(
            "upgrade to L4T R36.5 (reported to fix it), or allocate through CUDA VMM "
            "(llama.cpp GGML_CUDA_VMM_BUFFERS=1, PyTorch expandable_segments:True)"
        ),
        sources=(
            "https://github.com/ggml-org/llama.cpp/pull/23732",
            "https://github.com/ggml-org/llama.cpp/discussions/16706",
            "https://forums.developer.nvidia.com/t/unable-to-allocate-cuda0-buffer-after-updating-ubuntu-packages/347862",
            "https://github.com/meteorboyF/Argus (research request: fails on R36.4.7, loads on R36.5.2)",
        ),
    ),
)


def facts_for(l4t: str | None, kind: str) -> list[PlatformFact]:
    """The facts that apply to this L4T release and allocation kind."""
    if l4t is None:
        return []
    return [f for f in FACTS if l4t in f.l4t and kind in f.kinds]
