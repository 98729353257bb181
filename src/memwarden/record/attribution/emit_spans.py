"""Stage 5b: the trace's spans (module calls, encode phases, steps, optimizer steps, load) and
its ``metadata["steps"]`` records."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from memwarden.record.attribution.phases import ENCODER_MODALITIES, StepTable
from memwarden.record.attribution.recorded import Clock
from memwarden.record.attribution.spans import ModuleSpans
from memwarden.trace.model import Modality, Phase, SpanKind, TraceBuilder, enum_name
from memwarden.trace.steps import Step

__all__ = ["input_padding", "module_span_rows", "phase_span_rows", "step_records"]


def module_span_rows(
    builder: TraceBuilder,
    spans: ModuleSpans,
    module_modality: np.ndarray,
    label_ids: np.ndarray,
    steps: StepTable,
    fingerprints: Sequence[str | None],
    clock: Clock,
) -> None:
    """One MODULE span per call, as whole columns in call order (so ``parent`` is a row index),
    then an ``encode`` PHASE span per outermost encoder call (one not inside another encoder)."""
    if not len(spans):
        return
    modality = module_modality[spans.ctx]
    is_encoder = np.isin(modality, ENCODER_MODALITIES)
    phase = np.where(is_encoder, int(Phase.ENCODE), steps.phase_at(spans.start_ns, int(Phase.OTHER)))
    fingerprint_ids = [
        builder.intern(fingerprints[i]) if 0 <= i < len(fingerprints) else -1 for i in spans.slot.tolist()
    ]
    builder.extend_spans(
        {
            "start_us": clock.us_array(spans.start_ns),
            "end_us": clock.us_array(spans.end_ns),
            "kind": np.full(len(spans), int(SpanKind.MODULE)),
            "name": label_ids[spans.ctx],
            "phase": phase,
            "modality": modality,
            "fingerprint": np.array(fingerprint_ids),
            "parent": spans.parent,
            "depth": spans.depth,
        }
    )
    parent_is_encoder = np.where(spans.parent >= 0, is_encoder[np.clip(spans.parent, 0, None)], False)
    for row in np.flatnonzero(is_encoder & ~parent_is_encoder).tolist():
        builder.span(
            clock.us(spans.start_ns[row]),
            clock.us(spans.end_ns[row]),
            SpanKind.PHASE,
            "encode",
            phase=Phase.ENCODE,
            modality=Modality(int(modality[row])),
        )


def phase_span_rows(
    builder: TraceBuilder,
    steps: StepTable,
    optimizer_spans: Sequence[Sequence[int]],
    capture_end_ns: int,
    clock: Clock,
) -> None:
    """A STEP and a PHASE span per step, a PHASE span per optimizer step, and ``load``: from the
    capture's start to the first step. A step or optimizer step still running ends with the capture."""
    for i, step in enumerate(steps.steps):
        start_us = clock.us(step.start_ns)
        end_us = clock.us(step.end_ns if step.end_ns is not None else capture_end_ns)
        name = enum_name(Phase(step.phase))
        builder.span(start_us, end_us, SpanKind.STEP, f"{name} step {i}", phase=Phase(step.phase))
        builder.span(start_us, end_us, SpanKind.PHASE, name, phase=Phase(step.phase))
    for start, end in optimizer_spans:
        end_us = clock.us(end if end >= 0 else capture_end_ns)
        builder.span(clock.us(start), end_us, SpanKind.PHASE, "optimizer", phase=Phase.OPTIMIZER)
    if steps.steps:
        builder.span(0, clock.us(steps.steps[0].start_ns), SpanKind.PHASE, "load", phase=Phase.LOAD)


def step_records(steps: StepTable, labels: Sequence[str], capture_end_ns: int, clock: Clock) -> list[Step]:
    """The ``metadata["steps"]`` records, in start order; ``labels[ctx]`` names each root module."""
    return [
        Step(
            phase=enum_name(Phase(s.phase)),
            start_us=clock.us(s.start_ns),
            end_us=clock.us(s.end_ns if s.end_ns is not None else capture_end_ns),
            module=labels[s.ctx],
            seq_len=s.seq_len,
            batch=s.batch,
            tokens=dict(s.tokens),
            input_ids=s.input_ids,
            grad=s.grad,  # autograd recording during the call: graph-retention's evidence
            media_digests=s.media_digests,
        )
        for s in steps.steps
    ]


def input_padding(
    spans: ModuleSpans, call_padding: Sequence[tuple[int, dict[str, int]]], clock: Clock
) -> list[dict[str, int]]:
    """``metadata["input_padding"]``: per outermost call whose attention mask pads its batch, the
    call's span and what the mask (or the labels' trailing -100) says (``length``, ``longest``, ``real``, ``batch``). The mask is
    read before the call's ENTER marker, so its call is the first outermost span starting after."""
    top = np.flatnonzero(spans.depth == 0)
    starts = spans.start_ns[top]
    per_span: dict[int, dict[str, int]] = {}
    for t_ns, padding in call_padding:
        k = int(np.searchsorted(starts, t_ns, side="left"))
        if k >= len(top):
            continue
        span = int(top[k])
        # a call's mask and its labels may both pad it: the one that pads more says what it carries
        had = per_span.get(span)
        if had is None or padding["longest"] * had["length"] < had["longest"] * padding["length"]:
            per_span[span] = padding
    return [
        {"start_us": clock.us(int(spans.start_ns[span])), "end_us": clock.us(int(spans.end_ns[span])), **padding}
        for span, padding in sorted(per_span.items())
    ]
