"""Turn an executed ONNX graph into a Trace: weights, node outputs and their lifetimes.

The lifetimes follow ORT's sequential executor and allocation planner on the CPU EP:

- initializers of the optimized graph are weights, allocated before the first run (phase
  ``load``), owned by the module of their first consumer;
- a node's outputs are allocated when the kernel starts; each is freed when the last kernel
  that reads it ends (ORT releases a value after its last consumer); a graph output lives until
  the run returns; an output nobody reads is freed when its producer ends;
- ops whose CPU kernel declares ``Alias`` (Reshape, Squeeze, Unsqueeze, Flatten, Identity,
  ...) write no new buffer: their output is the input's buffer, whose lifetime it extends;
- feeds are the caller's arrays (category ``input``): ORT reads them in place.
- with the memory pattern on, a run at shapes the session ran before also holds the unused part of
  ORT's pattern buffer (``hold_pattern``).

Sizes are the shapes ORT reports per kernel in its profile, times the element size.
"""

from __future__ import annotations

from collections.abc import Sequence

from memwarden.record.modality import ModalityRules
from memwarden.record.onnx.alloc_plan import AllocationPlan, BufferIds, RunInput, value_category
from memwarden.record.onnx.graph import GraphInfo, NodeInfo
from memwarden.record.onnx.profile import RunProfile
from memwarden.trace.model import Action, Category, Phase, SpanKind, TraceBuilder

__all__ = ["add_runs", "add_weights"]


def add_weights(
    builder: TraceBuilder, graph: GraphInfo, rules: ModalityRules, ids: BufferIds | None = None
) -> BufferIds:
    """One ``load``-phase ALLOC per initializer at time 0; never freed in the capture."""
    ids = ids or BufferIds()
    owner = graph.producer_module()
    for name, nbytes in graph.initializer_bytes.items():
        module = owner.get(name)
        tensor, address = ids.new(nbytes)
        builder.event(
            0,
            Action.ALLOC,
            tensor,
            address,
            nbytes,
            category=Category.WEIGHT,
            phase=Phase.LOAD,
            modality=rules.modality_of(module or ""),
            module=module,
            op="initializer",
        )
    return ids


def add_runs(
    builder: TraceBuilder,
    graph: GraphInfo,
    runs: Sequence[RunProfile],
    inputs: Sequence[RunInput],
    rules: ModalityRules,
    ids: BufferIds,
    *,
    mem_pattern: bool = False,
) -> list[dict[str, int]]:
    """The events of each run; returns per run its span (``start_us``/``end_us``) on the trace clock.

    With ``mem_pattern`` (the session's ``enable_mem_pattern``) a run at input shapes an earlier run
    of the session had holds ORT's pattern buffer from start to end (``memwarden.record.onnx.pattern``)."""
    by_name = {n.name: n for n in graph.nodes}
    origin = runs[0].start_us - 1 if runs else 0  # weights sit at 0, the first run starts at 1
    spans = []
    clock = 1
    seen: dict[tuple[tuple[str, tuple[int, ...]], ...], int | None] = {}  # shapes -> ORT bytes before that first run
    scratch: dict[tuple[tuple[str, tuple[int, ...]], ...], dict[str, int]] = {}  # shapes -> node -> scratch bytes
    for run, run_input in zip(runs, inputs, strict=True):
        start = max(clock, run.start_us - origin)
        shapes = tuple(sorted((name, shape) for name, (_, shape, _) in run_input.feeds.items()))
        counters = run.arena_peak()
        pattern: int | None = None  # not a pattern run
        if mem_pattern and shapes in seen:
            first = seen[shapes]
            # ORT allocates the pattern buffer before the run's first kernel: its counter's rise since
            # the first run at these shapes began is the buffer's size
            pattern = max(0, counters[0] - first) if counters is not None and first is not None else 0
        known = scratch.get(shapes)
        seen.setdefault(shapes, counters[0] if counters is not None else None)
        clock, taken, held = _one_run(
            builder, graph, by_name, run, run_input, rules, ids, start, origin, pattern, known
        )
        merged = scratch.setdefault(shapes, {})
        for name, nbytes in taken.items():
            merged[name] = max(merged.get(name, 0), nbytes)
        builder.span(start, clock, SpanKind.PHASE, run_input.phase.name.lower(), phase=run_input.phase)
        spans.append({"start_us": start, "end_us": clock, **held})
        clock += 1
    return spans


def _one_run(
    builder: TraceBuilder,
    graph: GraphInfo,
    by_name: dict[str, NodeInfo],
    run: RunProfile,
    run_input: RunInput,
    rules: ModalityRules,
    ids: BufferIds,
    start: int,
    origin: int,
    pattern: int | None = None,
    known_scratch: dict[str, int] | None = None,
) -> tuple[int, dict[str, int], dict[str, int]]:
    """The events of one run; returns the clock at its end, the scratch each kernel took and, for
    a run on ORT's memory pattern, the pattern buffer's size (replayed, and from ORT's counters).

    Scratch is seen where ORT's high-water mark rises, which it only does in the first run at
    given shapes: a later run at those shapes (``known_scratch``) gives each kernel the first's."""
    executed = [(r, by_name.get(r.name)) for r in run.nodes]
    planner = AllocationPlan(graph, executed, run_input, rules, ids)
    clock = start
    for name, (dtype, shape, nbytes) in run_input.feeds.items():
        category = Category.KV_CACHE if value_category(name) == Category.KV_CACHE else Category.INPUT
        planner.new_buffer(name, clock, nbytes, category, None, "feed", dtype, shape, held=True)
    previous_peak = None
    taken: dict[str, int] = {}
    first = run.nodes[0] if run.nodes else None
    before = (
        first.requested_bytes - first.requested_delta_bytes
        if first and first.requested_bytes is not None and first.requested_delta_bytes is not None
        else None
    )
    for k, (record, node) in enumerate(executed):
        clock = max(clock, record.start_us - origin)
        produced = [v for v in (node.outputs if node else ()) if v]
        seq_before = planner.seq
        for value, (dtype, shape) in zip(produced, record.outputs, strict=False):
            planner.produce(k, node, value, dtype, shape, record.op_type, clock)
        if record.requested_bytes is not None and before is not None:
            planner.mark(seq_before, record.requested_bytes - before, node, clock)
        end = max(clock, record.start_us + record.dur_us - origin)
        # Scratch a kernel took and gave back: ORT's high-water mark rose above what stayed in use.
        # A later run at the same shapes takes what the first took (its mark does not rise again),
        # but never more than fits under the mark, which it would have lifted; where it does lift
        # the mark (the memory pattern's buffer is held from the start), that rise is the measure.
        peak, in_use = record.in_use_peak_bytes, record.in_use_bytes
        room: int | None = None  # scratch that would not have lifted the mark
        scratch = 0
        if peak is not None and in_use is not None and previous_peak is not None:
            if peak > max(previous_peak, in_use):
                scratch = peak - in_use
            else:
                room = max(0, previous_peak - in_use)
        if known_scratch is not None and not scratch:
            scratch = known_scratch.get(record.name, 0)
            scratch = min(scratch, room) if room is not None else scratch
        if scratch > 0:
            taken[record.name] = scratch
            planner.temporary(node, record.op_type, scratch, clock, end)
        previous_peak = peak if peak is not None else previous_peak
        clock = end
        planner.release(k, node, produced, clock)
    clock = max(clock, run.end_us - origin)
    planner.finish(clock)
    planner.reconcile()
    held: dict[str, int] = {}
    if pattern is not None:
        replayed = planner.hold_pattern(pattern)
        held = {
            "mem_pattern_bytes": max(replayed, pattern),
            "mem_pattern_replayed_bytes": replayed,
            "mem_pattern_ort_bytes": pattern,
        }
    planner.emit(builder)
    return clock, taken, held
