"""ORT's CPU allocation plan, replayed over an executed graph: which buffer each value lives in.

ORT's sequential executor on the CPU EP aliases (Reshape, Squeeze, ...: the input's buffer), runs
some kernels in place, hands a freed buffer to the next value of the same planned shape, and frees a
value after its last consumer. ``AllocationPlan`` replays that plan as trace events, so live bytes
equal what ORT holds and each byte is attributed to the value that holds it. ``build`` drives it.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from memwarden.record.modality import ModalityRules
from memwarden.record.onnx.graph import DTYPE_BYTES, GraphInfo, NodeInfo
from memwarden.record.onnx.pattern import pattern_bytes
from memwarden.record.onnx.profile import NodeRun
from memwarden.trace.model import Action, Category, Modality, Phase, TraceBuilder

__all__ = ["ALIAS_OPS", "INPLACE_OPS", "AllocationPlan", "BufferIds", "RunInput", "value_category"]

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


class BufferIds:
    """Fake tensor ids and distinct, aligned addresses for the trace's buffers."""

    def __init__(self) -> None:
        self.next_tensor = 0
        self.next_address = 0x1000

    def new(self, nbytes: int) -> tuple[int, int]:
        tensor, address = self.next_tensor, self.next_address
        self.next_tensor += 1
        self.next_address += max(_ALIGN, (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN)
        return tensor, address


class AllocationPlan:
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
        ids: BufferIds,
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
