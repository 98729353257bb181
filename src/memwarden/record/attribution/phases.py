"""Stage 2: the steps (root calls) in time order, and the phase of every block.

A block's phase, strongest rule first: optimizer (made inside ``optimizer.step``) > backward
(made by the autograd engine) > encode (made inside a vision/audio/fusion module) > the phase of
the step it falls in or follows > load (before the first module call) or prefill (after it:
preparing the first step).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from memwarden.record.attribution.log import StepRecord
from memwarden.record.attribution.recorded import Blocks
from memwarden.trace.model import Modality, Phase

__all__ = ["ENCODER_MODALITIES", "StepTable", "backward_ops", "block_phases"]

# Modules of these modalities encode media: what they make belongs to the encode phase.
ENCODER_MODALITIES = (int(Modality.VISION), int(Modality.AUDIO), int(Modality.FUSION))


@dataclass(frozen=True)
class StepTable:
    """The steps sorted by start (stable: equal starts keep their logging order)."""

    steps: tuple[StepRecord, ...]
    start_ns: np.ndarray  # int64
    phase: np.ndarray  # int64 Phase of each step; [OTHER] when there is none, so a clipped index reads OTHER

    @classmethod
    def of(cls, steps: Iterable[StepRecord]) -> StepTable:
        ordered = tuple(sorted(steps, key=lambda s: s.start_ns))
        return cls(
            steps=ordered,
            start_ns=np.array([s.start_ns for s in ordered], dtype=np.int64),
            phase=np.array([int(s.phase) for s in ordered] or [int(Phase.OTHER)], dtype=np.int64),
        )

    def phase_at(self, t_ns: np.ndarray, default: np.ndarray | int) -> np.ndarray:
        """The phase of the last step started at or before each time; ``default`` before the first."""
        k = np.searchsorted(self.start_ns, t_ns, side="right") - 1
        return np.where(k >= 0, self.phase[np.clip(k, 0, None)], default)


def backward_ops(op_names: Sequence[str]) -> np.ndarray:
    """Per op index, whether the autograd engine runs it; one more entry (False) for op -1."""
    return np.array([name.startswith("autograd::engine") or name.endswith("Backward0") for name in op_names] + [False])


def block_phases(
    blocks: Blocks,
    module_modality: np.ndarray,
    is_backward: np.ndarray,
    steps: StepTable,
    first_call_ns: int,
    optimizer_spans: Sequence[Sequence[int]],
    capture_end_ns: int,
) -> np.ndarray:
    """int64 Phase per block. ``module_modality``: the modality of the module that made each
    block; ``optimizer_spans``: [start_ns, end_ns] pairs, end -1 for a step still running."""
    before = np.where(blocks.alloc_ns < first_call_ns, int(Phase.LOAD), int(Phase.PREFILL))
    phase = steps.phase_at(blocks.alloc_ns, before)
    is_encoder = np.isin(module_modality, ENCODER_MODALITIES) & (blocks.ctx >= 0)
    phase = np.where(is_encoder, int(Phase.ENCODE), phase)
    phase = np.where(is_backward, int(Phase.BACKWARD), phase)
    for start, end in optimizer_spans:
        end = end if end >= 0 else capture_end_ns
        phase = np.where((blocks.alloc_ns >= start) & (blocks.alloc_ns <= end), int(Phase.OPTIMIZER), phase)
    return phase
