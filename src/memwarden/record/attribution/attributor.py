"""The attribution pipeline: the recorder's drained log plus the Python side's ``CaptureLog``
become a Trace, stage by stage (see the package docstring for the rules)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from memwarden.record.attribution.categories import block_categories
from memwarden.record.attribution.emit_events import allocator_columns, intern_labels, merge, side_events
from memwarden.record.attribution.emit_spans import input_padding, module_span_rows, phase_span_rows, step_records
from memwarden.record.attribution.log import CaptureLog
from memwarden.record.attribution.phases import StepTable, backward_ops, block_phases
from memwarden.record.attribution.recorded import Blocks, Clock, RecorderColumns
from memwarden.record.attribution.spans import module_spans
from memwarden.record.attribution.tags import apply_tags, match_tags, saved_for_backward, split_saved
from memwarden.record.modality import ModalityRules
from memwarden.trace.model import Modality, Trace, TraceBuilder
from memwarden.trace.steps import steps_metadata

__all__ = ["Attributor"]


@dataclass
class Attributor:
    """Runs once, when a capture stops, and decides every block's category, modality, phase,
    module and op."""

    log: CaptureLog
    modules: list[tuple[str, str, int]]  # ctx -> (path, label, modality)
    dtype_names: list[str]  # the recorder's dtype index -> c10 scalar type name
    t0_ns: int
    end_ns: int
    metadata: dict[str, Any]
    rules: ModalityRules  # the capture's own (no default: rules built afresh would ignore a user's)

    def build(self, drained: dict[str, Any]) -> Trace:
        cols = RecorderColumns.of(drained)
        clock = Clock(self.t0_ns)
        labels = [m[1] for m in self.modules]
        # index -1 (outside any module) reads the last entry: shared
        module_modality = np.array([m[2] for m in self.modules] + [int(Modality.SHARED)], dtype=np.int64)

        spans = module_spans(cols.action, cols.ids, cols.time_ns, self.end_ns, cols.nbytes)
        steps = StepTable.of(self.log.steps)
        blocks = Blocks.of(cols)
        made_by = module_modality[blocks.ctx]
        is_backward = backward_ops(cols.op_names)[cols.op_outer[blocks.rows].astype(np.int64)]
        phase = block_phases(
            blocks,
            made_by,
            is_backward,
            steps,
            spans.first_start_ns(self.end_ns),
            self.log.optimizer_spans,
            self.end_ns,
        )
        category = block_categories(blocks, spans.row_span[blocks.rows], spans.end_or(self.end_ns), is_backward)
        tags, saved = split_saved(self.log.tags)
        hits = match_tags(tags, blocks)
        side = self.log.side_records()
        tagged = apply_tags(
            tags,
            hits,
            blocks,
            category,
            made_by,
            self.log.preexisting_storages,
            self.rules,
            side,
            self.log.input_modalities,
        )

        counters = {"untracked_frees": cols.untracked_frees, "unwrapped_allocations": cols.unwrapped_allocations}
        builder = TraceBuilder(devices=["cpu"], metadata={**self.metadata, **counters})
        label_ids = intern_labels(builder, labels)
        main = allocator_columns(builder, cols, blocks, tagged, phase, label_ids, self.dtype_names, clock)
        side_events(builder, self.log.preexisting_storages, tagged.preexisting, side, clock, tagged.side, steps)
        module_span_rows(builder, spans, module_modality, label_ids, steps, self.log.fingerprints, clock)
        phase_span_rows(builder, steps, self.log.optimizer_spans, self.end_ns, clock)
        builder.metadata["duration_us"] = clock.us(self.end_ns)
        builder.metadata["steps"] = steps_metadata(step_records(steps, labels, self.end_ns, clock))
        kept = saved_for_backward(saved, blocks, cols.nbytes[blocks.rows], tagged.category)
        if kept is not None:  # activations autograd kept for backward, told apart from the others
            builder.metadata["saved_for_backward"] = kept
        padded = input_padding(spans, self.log.call_padding, clock)
        if padded:  # the evidence alignment-padding judges padding made outside torch by
            builder.metadata["input_padding"] = padded
        return merge(builder.build(), main)
