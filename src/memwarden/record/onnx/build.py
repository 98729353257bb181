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

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from memwarden.record.modality import ModalityRules
from memwarden.record.onnx.graph import DTYPE_BYTES, GraphInfo, NodeInfo
from memwarden.record.onnx.pattern import pattern_bytes
from memwarden.record.onnx.profile import NodeRun, RunProfile
from memwarden.trace.model import Action, Category, Modality, Phase, SpanKind, TraceBuilder

__all__ = ["ALIAS_OPS", "RunInput", "add_runs", "add_weights", "value_category"]

# CPU kernels registered with ``.Alias(0, 0)``: the output is a view of input 0.
ALIAS_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "ExpandDims"})
# CPU kernels registered with ``.MayInplace(0, 0)`` (elementwise): the planner gives the output the
# input's buffer when this kernel is the input's last reader and the sizes match.
INPLACE_OPS = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Relu",
        "Sigmoid",
        "Tanh",
        "Neg",
        "Abs",
        "Exp",
        "Log",
        "Sqrt",
        "Reciprocal",
        "Erf",
        "LeakyRelu",
        "Clip",
        "HardSigmoid",
        "Softplus",
        "Where",
        "Softmax",
        "Cast",
    }
)
_ALIGN = 64  # ORT's CPU allocator alignment (kAllocAlignment); fake addresses only need to be distinct


def value_category(name: str) -> Category:
    """KV-cache values by their name (``past_key_values.3.key``, ``present.3.value``), else activation."""
    lowered = name.lower()
    if any(key in lowered for key in ("past_key", "present", "key_cache", "value_cache", "past.")):
        return Category.KV_CACHE
    return Category.ACTIVATION


def _input_modality(name: str, rules: ModalityRules) -> Modality:
    lowered = name.lower()
    if "pixel" in lowered or "image" in lowered:
        return Modality.VISION
    if "audio" in lowered or "input_features" in lowered:
        return Modality.AUDIO
    if "input_ids" in lowered or "embeds" in lowered or value_category(name) == Category.KV_CACHE:
        return Modality.TEXT
    return rules.default


@dataclass(frozen=True)
class RunInput:
    """A feed's name and size, and the phase its run is in."""

    phase: Phase
    feeds: dict[str, tuple[str, tuple[int, ...], int]]  # name -> (dtype, shape, bytes)


class _Ids:
    def __init__(self) -> None:
        self.next_tensor = 0
        self.next_address = 0x1000

    def new(self, nbytes: int) -> tuple[int, int]:
        tensor, address = self.next_tensor, self.next_address
        self.next_tensor += 1
        self.next_address += max(_ALIGN, (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN)
        return tensor, address


def add_weights(builder: TraceBuilder, graph: GraphInfo, rules: ModalityRules, ids: _Ids | None = None) -> _Ids:
    """One ``load``-phase ALLOC per initializer at time 0; never freed in the capture."""
    ids = ids or _Ids()
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
    ids: _Ids,
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
    ids: _Ids,
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
    planner = _Planner(graph, executed, run_input, rules, ids)
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


class _Planner:
    """ORT's CPU allocation plan, replayed: alias, in-place and same-size reuse, frees at last use.

    A buffer the plan hands to a later value of the same size is never given back to the
    allocator in between, so its FREE is deferred to the moment of reuse (and the new value's
    ALLOC follows it at once): live bytes then equal what ORT holds, and each byte is attributed
    to the value that holds it.
    """

    def __init__(
        self,
        graph: GraphInfo,
        executed: list[tuple[NodeRun, NodeInfo | None]],
        run_input: RunInput,
        rules: ModalityRules,
        ids: _Ids,
    ) -> None:
        self.rules, self.ids, self.phase = rules, ids, run_input.phase
        self.outputs = set(graph.outputs)
        self.initializers = set(graph.initializer_bytes)
        self.uses: dict[str, int] = {}
        for _, node in executed:
            for value in node.inputs if node else ():
                if value:
                    self.uses[value] = self.uses.get(value, 0) + 1
        self.buffer_of: dict[str, int] = {}
        self.attrs: dict[int, tuple[int, int, int, Category, str | None, str, str, tuple[int, ...]]] = {}
        self.refs: dict[int, int] = {}
        self.held: set[int] = set()  # feeds: the caller's, freed when the run returns
        self.modality: dict[int, Modality] = {}
        self.planned = graph.planned_shapes
        # (element type, planned dims) -> [(buffer, seq of its FREE)]: ORT reuses only a buffer whose
        # first value had the same planned shape (``GraphInfo.planned_shapes``), not any equal size
        self.free_list: dict[tuple[int, tuple[int | str, ...]], list[tuple[int, int]]] = {}
        self.key_of: dict[int, tuple[int, tuple[int | str, ...]]] = {}  # buffer -> its first value's planned shape
        self.cancelled: set[int] = set()  # seqs of FREEs that did not happen: the buffer was reused
        self.events: list[tuple[int, int, Action, int]] = []  # (time, seq, action, buffer)
        self.next_buffer = 0
        self.seq = 0  # order of events as the plan makes them (FREEs cancelled later keep the others' seqs)
        # (seq before the kernel's allocations, seq after, ORT bytes in use after them, node, time)
        self.marks: list[tuple[int, int, int, NodeInfo | None, int]] = []
        # planned activations (what ORT's memory pattern places) -> the first buffer of their reuse chain
        self.block_of: dict[int, int] = {}

    def _event(self, time_us: int, action: Action, buffer: int) -> None:
        self.events.append((time_us, self.seq, action, buffer))
        self.seq += 1

    def new_buffer(
        self,
        value: str,
        time_us: int,
        nbytes: int,
        category: Category,
        module: str | None,
        op: str,
        dtype: str,
        shape: tuple[int, ...],
        *,
        held: bool = False,
    ) -> int:
        buffer = self.next_buffer
        self.next_buffer += 1
        tensor, address = self.ids.new(nbytes)
        self.attrs[buffer] = (tensor, address, nbytes, category, module, op, dtype, shape)
        self.modality[buffer] = self.rules.modality_of(module) if module else _input_modality(value, self.rules)
        self.buffer_of[value] = buffer
        self.refs[buffer] = 1
        if held:
            self.held.add(buffer)
        self._event(time_us, Action.ALLOC, buffer)
        return buffer

    def produce(
        self, k: int, node: NodeInfo | None, value: str, dtype: str, shape: tuple[int, ...], op: str, time_us: int
    ) -> None:
        count = 1
        for d in shape:
            count *= d
        nbytes = count * DTYPE_BYTES.get(dtype, 4)
        inputs = [v for v in (node.inputs if node else ()) if v]
        if node and node.op_type in ALIAS_OPS and inputs and inputs[0] in self.buffer_of:
            buffer = self.buffer_of[inputs[0]]
            self.buffer_of[value] = buffer
            self.refs[buffer] += 1
            return
        if node and node.op_type in INPLACE_OPS and value not in self.outputs:  # a graph output is its own buffer
            for source in inputs:
                buffer = self.buffer_of.get(source, -1)
                if (
                    buffer >= 0
                    and buffer not in self.held
                    and self.uses.get(source) == 1
                    and self.refs[buffer] == 1
                    and source not in self.outputs
                    and self.attrs[buffer][2] == nbytes
                ):
                    self.buffer_of[value] = buffer
                    self.refs[buffer] += 1
                    self._retag(buffer, node, value, op, dtype, shape, time_us)
                    return
        category = value_category(value) if value in self.outputs else Category.ACTIVATION
        module = node.module if node else None
        key = self.planned.get(value)
        reusable = self.free_list.get(key) if key is not None else None
        old = -1
        if reusable and value not in self.outputs and self.attrs[reusable[-1][0]][2] == nbytes:
            old, seq = reusable.pop()
            self.cancelled.add(seq)
            self._event(time_us, Action.FREE, old)
        buffer = self.new_buffer(value, time_us, nbytes, category, module, op, dtype, shape)
        if key is not None:
            self.key_of[buffer] = key
        if value not in self.outputs:
            self.block_of[buffer] = self.block_of.get(old, buffer)

    def _retag(
        self, buffer: int, node: NodeInfo, value: str, op: str, dtype: str, shape: tuple[int, ...], time_us: int
    ) -> None:
        """An in-place output takes over its input's buffer: close the old record, open the new one
        at the same moment (same bytes, so live bytes do not move)."""
        self._event(time_us, Action.FREE, buffer)
        nbytes = self.attrs[buffer][2]
        tensor, address = self.ids.new(nbytes)
        category = value_category(value) if value in self.outputs else Category.ACTIVATION
        self.attrs[buffer] = (tensor, address, nbytes, category, node.module, op, dtype, shape)
        self.modality[buffer] = self.rules.modality_of(node.module) if node.module else self.rules.default
        self._event(time_us, Action.ALLOC, buffer)

    def mark(self, seq_before: int, ort_bytes: int, node: NodeInfo | None, time_us: int) -> None:
        """ORT's allocator says ``ort_bytes`` (requested, this run's) are in use once this kernel's
        outputs exist; ``reconcile`` makes the trace agree."""
        self.marks.append((seq_before, self.seq, ort_bytes, node, time_us))

    def reconcile(self) -> None:
        """Where ORT's counters hold more than the replayed plan (buffers its planner keeps for a
        reuse this replay does not predict), add a ``planner_hold`` block (category other) for
        the difference, so the trace's run peak is ORT's own. A hold shrinks before a kernel's
        allocations and grows after them, so it never adds a transient ORT did not have. Only
        with the arena on: the arena-off profile has no counters."""
        if not self.marks:
            return
        events = sorted(self.events, key=lambda e: e[1])
        seqs = [e[1] for e in events]
        end = (seqs[-1] + 1) if seqs else 0
        live_before = [0]  # live bytes of the plan before events[i] (held feeds excluded)
        for _, _, action, buffer in events:
            step = 0 if buffer in self.held else self.attrs[buffer][2] * (1 if action == Action.ALLOC else -1)
            live_before.append(live_before[-1] + step)

        def position(seq: int) -> int:  # first surviving event at or after ``seq`` (FREEs may be cancelled)
            return bisect_left(seqs, seq)

        at: dict[int, list[tuple[int, NodeInfo | None, int, bool]]] = {}  # index -> [(gap, node, time, shrink)]
        for before, after, ort, node, t in self.marks:
            gap = max(0, ort - live_before[position(after)])
            at.setdefault(position(before), []).append((gap, node, t, True))
            at.setdefault(position(after), []).append((gap, node, t, False))
        out: list[tuple[int, int, Action, int]] = []
        hold, hold_bytes = -1, 0
        for index, event in enumerate([*events, (events[-1][0] if events else 0, end, Action.FREE, -1)]):
            for gap, node, t, shrink in at.get(index, []):
                if gap == hold_bytes or (shrink and gap > hold_bytes) or (not shrink and gap < hold_bytes):
                    continue
                if hold >= 0:
                    out.append((t, 0, Action.FREE, hold))
                hold, hold_bytes = -1, 0
                if gap > 0:
                    hold = self._buffer(
                        gap, Category.OTHER, node.module if node else None, "planner_hold", "uint8", (gap,)
                    )
                    hold_bytes = gap
                    out.append((t, 0, Action.ALLOC, hold))
            if event[3] >= 0:
                out.append(event)
        if hold >= 0:
            out.append((out[-1][0], 0, Action.FREE, hold))
        self.events = [(t, seq, a, b) for seq, (t, _, a, b) in enumerate(out)]

    def hold_pattern(self, ort_bytes: int) -> int:
        """A run that uses ORT's memory pattern holds the pattern buffer for its whole span: add its
        unused part as a ``mem_pattern`` block (category other) that shrinks as planned activations
        take their place in it and grows as they go, so live bytes are the buffer plus what ORT
        allocates outside it (outputs, scratch). The buffer's size is ORT's planner replayed over
        this plan, or ``ort_bytes`` (ORT's counters, 0 without them) where that is larger: the
        replay misses the buffers ORT's planner keeps for reuses it does not predict (``reconcile``).
        Returns the replayed size."""
        events = sorted(self.events, key=lambda e: e[1])
        steps: dict[int, int] = {}  # event index -> signed bytes of a planned activation
        for i, (_, _, action, buffer) in enumerate(events):
            block = self.block_of.get(buffer)
            if block is None:
                continue
            prev = events[i - 1] if i else None
            after = events[i + 1] if i + 1 < len(events) else None
            if action == Action.FREE and after and after[2] == Action.ALLOC and self.block_of.get(after[3]) == block:
                continue  # the block passes to the next value (reuse, in place): it stays where it is
            if action == Action.ALLOC and prev and prev[2] == Action.FREE and self.block_of.get(prev[3]) == block:
                continue
            steps[i] = self.attrs[buffer][2] * (1 if action == Action.ALLOC else -1)
        replayed = pattern_bytes((n > 0, self.block_of[events[i][3]], abs(n)) for i, n in steps.items())
        total = max(replayed, ort_bytes)
        if not total or not events:
            return replayed
        out: list[tuple[int, int, Action, int]] = []
        hold, live = -1, 0

        def resize(time_us: int) -> None:
            nonlocal hold
            if hold >= 0:
                out.append((time_us, 0, Action.FREE, hold))
                hold = -1
            if total - live > 0:
                hold = self._buffer(total - live, Category.OTHER, None, "mem_pattern", "uint8", (total - live,))
                out.append((time_us, 0, Action.ALLOC, hold))

        resize(events[0][0])
        for i, event in enumerate(events):
            if steps.get(i, 0) > 0:  # the activation takes its place in the buffer
                live += steps[i]
                resize(event[0])
            out.append(event)
            if steps.get(i, 0) < 0:
                live += steps[i]
                resize(event[0])
        live = total
        resize(events[-1][0])
        self.events = [(t, seq, a, b) for seq, (t, _, a, b) in enumerate(out)]
        return replayed

    def _buffer(
        self, nbytes: int, category: Category, module: str | None, op: str, dtype: str, shape: tuple[int, ...]
    ) -> int:
        buffer = self.next_buffer
        self.next_buffer += 1
        tensor, address = self.ids.new(nbytes)
        self.attrs[buffer] = (tensor, address, nbytes, category, module, op, dtype, shape)
        self.modality[buffer] = self.rules.modality_of(module) if module else self.rules.default
        self.refs[buffer] = 0
        return buffer

    def temporary(self, node: NodeInfo | None, op: str, nbytes: int, start_us: int, end_us: int) -> None:
        buffer = self.new_buffer(
            f"\0scratch{self.next_buffer}",
            start_us,
            nbytes,
            Category.TEMPORARY,
            node.module if node else None,
            op,
            "uint8",
            (nbytes,),
        )
        self._event(end_us, Action.FREE, buffer)
        self.refs[buffer] = 0

    def release(self, k: int, node: NodeInfo | None, produced: list[str], time_us: int) -> None:
        """After a kernel: its inputs lose one use; a buffer nobody needs any more goes."""
        for value in [v for v in (node.inputs if node else ()) if v] + [v for v in produced if v not in self.uses]:
            if value in self.uses and value not in produced:
                self.uses[value] -= 1
                if self.uses[value] > 0:
                    continue
            if value in self.outputs or value not in self.buffer_of or value in self.initializers:
                continue
            buffer = self.buffer_of.pop(value)
            self.refs[buffer] -= 1
            if self.refs[buffer] == 0 and buffer not in self.held:
                key = self.key_of.get(buffer)
                if key is not None:
                    self.free_list.setdefault(key, []).append((buffer, self.seq))
                self._event(time_us, Action.FREE, buffer)  # cancelled if a later value reuses the buffer

    def finish(self, time_us: int) -> None:
        """Drop the FREEs that reuse cancelled; free what is still live (outputs, feeds) at run end."""
        self.events = [e for e in self.events if e[1] not in self.cancelled]
        balance: dict[int, int] = {}
        for _, _, action, buffer in self.events:
            balance[buffer] = balance.get(buffer, 0) + (1 if action == Action.ALLOC else -1)
        for buffer, count in sorted(balance.items()):
            if count > 0:
                self._event(time_us, Action.FREE, buffer)

    def emit(self, builder: TraceBuilder) -> None:
        for time_us, _, action, buffer in sorted(self.events, key=lambda e: (e[0], e[1])):
            tensor, address, nbytes, category, module, op, dtype, shape = self.attrs[buffer]
            builder.event(
                time_us,
                action,
                tensor,
                address,
                nbytes,
                category=category,
                modality=self.modality[buffer],
                phase=self.phase,
                module=module,
                op=op,
                dtype=dtype,
                shape=shape,
            )
