"""The detectors: one module per pattern id of DESIGN.md, each a pure ``detect(ctx) -> findings``.

``DETECTORS`` is the registry ``diagnose`` runs, in this order: written out, so a reader (and a
type checker) can follow a trace from ``diagnose`` into every detector, and a detector that fails
to import fails loudly instead of vanishing from the findings.
"""

from __future__ import annotations

from typing import Protocol

from memwarden.analyze.finding import Context, Finding
from memwarden.analyze.patterns import (
    alignment_padding,
    dequant_temporaries,
    fragmentation,
    full_logits,
    graph_retention,
    kv_concat_growth,
    kv_reprefill,
    load_spike,
    request_multiplier,
    retained_outputs,
    two_models_alive,
    unbounded_growth,
    untracked_host_memory,
    vision_token_dominance,
)

__all__ = ["DETECTORS", "Detector"]


class Detector(Protocol):
    """A pattern's detector: the findings of one pattern in the trace ``ctx.trace``."""

    def __call__(self, ctx: Context) -> list[Finding]: ...


DETECTORS: dict[str, Detector] = {
    alignment_padding.PATTERN: alignment_padding.detect,
    kv_reprefill.PATTERN: kv_reprefill.detect,
    kv_concat_growth.PATTERN: kv_concat_growth.detect,
    graph_retention.PATTERN: graph_retention.detect,
    dequant_temporaries.PATTERN: dequant_temporaries.detect,
    fragmentation.PATTERN: fragmentation.detect,
    load_spike.PATTERN: load_spike.detect,
    vision_token_dominance.PATTERN: vision_token_dominance.detect,
    unbounded_growth.PATTERN: unbounded_growth.detect,
    retained_outputs.PATTERN: retained_outputs.detect,
    two_models_alive.PATTERN: two_models_alive.detect,
    full_logits.PATTERN: full_logits.detect,
    request_multiplier.PATTERN: request_multiplier.detect,
    untracked_host_memory.PATTERN: untracked_host_memory.detect,
}
