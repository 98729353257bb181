"""The attribution stages, each on its own: spans, blocks, phases, categories, tags, emit.

Logs come from the real recorders: the meta recorder (the pure-Python stand-in for the native
one, which logs the same columns and codes) where a test needs exact, noise-free rows, and the
native allocator recorder where the point is a real allocation.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from memwarden.record import native
from memwarden.record.attribution.categories import block_categories
from memwarden.record.attribution.emit_events import allocator_columns, intern_labels, side_events
from memwarden.record.attribution.emit_spans import phase_span_rows, step_records
from memwarden.record.attribution.log import StepRecord, StorageRecord
from memwarden.record.attribution.phases import StepTable, backward_ops, block_phases
from memwarden.record.attribution.recorded import NEVER_NS, Blocks, Clock, RecorderColumns
from memwarden.record.attribution.spans import module_spans
from memwarden.record.attribution.tags import PreexistingTag, apply_tags, match_tags
from memwarden.record.meta.ops import Block
from memwarden.record.meta.recorder import Recorder
from memwarden.record.modality import ModalityRules
from memwarden.record.native import NativeRecord
from memwarden.trace.model import Action, Category, Modality, Phase, SpanKind, TraceBuilder
from memwarden.trace.steps import steps_metadata

PROJECTOR = "model.multi_modal_projector.linear_1"


def _alloc(rec: Recorder, nbytes: int, op: str | None = None) -> Block:
    return rec.alloc(nbytes, op=op, dtype=torch.float32, shape=(nbytes // 4,))


def _blocks_by_size(cols: RecorderColumns, blocks: Blocks) -> dict[int, int]:
    """Block index by its size (the tests give every block a distinct size)."""
    return {int(cols.nbytes[row]): k for k, row in enumerate(blocks.rows.tolist())}


def test_native_record_codes_are_the_recorders() -> None:
    source = (Path(native.__file__).with_name("native.cpp")).read_text()
    found = re.search(r"enum : uint8_t \{([^}]*)\}", source)
    assert found is not None
    codes = {name.strip()[1:].upper(): int(value) for name, value in re.findall(r"(k\w+) = (\d+)", found.group(1))}
    assert codes == {member.name: member.value for member in NativeRecord}


def test_a_real_allocation_inside_a_call_is_that_calls_activation() -> None:
    recorder = native.load()
    recorder.start(False)
    try:
        recorder.enter(7)
        x = torch.empty(4096, dtype=torch.uint8)
        recorder.exit(7)
        ptr = x.data_ptr()
        del x
    finally:
        recorder.stop()
        drained = recorder.drain()
    end_ns = int(recorder.now_ns())
    cols = RecorderColumns.of(drained)
    markers = cols.action[np.isin(cols.action, [NativeRecord.ENTER, NativeRecord.EXIT])].tolist()
    assert markers == [NativeRecord.ENTER, NativeRecord.EXIT]
    spans = module_spans(cols.action, cols.ids, cols.time_ns, end_ns)
    blocks = Blocks.of(cols)
    assert spans.ctx.tolist() == [7] and spans.parent.tolist() == [-1]
    (k,) = np.flatnonzero((blocks.ptr == ptr) & (cols.nbytes[blocks.rows] == 4096)).tolist()
    assert spans.row_span[blocks.rows[k]] == 0 and blocks.ctx[k] == 7
    assert spans.end_ns[0] < blocks.free_ns[k] < NEVER_NS  # freed after its call returned
    category = block_categories(blocks, spans.row_span[blocks.rows], spans.end_or(end_ns), np.zeros(len(blocks), bool))
    assert category[k] == Category.ACTIVATION


def test_allocator_rows_repeat_their_blocks_attribution_and_drop_unknown_frees() -> None:
    rec = Recorder()
    rec.start()
    rec.enter(0)
    a = _alloc(rec, 64, op="aten::empty")
    rec.exit(0)
    rec.free(a)
    rec.free(Block(999, 0x99, 32, 0))  # a block this log never allocated
    cols = RecorderColumns.of(rec.drain())
    blocks = Blocks.of(cols)
    tagged = apply_tags(
        [], [], blocks, np.array([int(Category.ACTIVATION)]), np.array([int(Modality.FUSION)]), {}, ModalityRules()
    )
    builder = TraceBuilder()
    labels = intern_labels(builder, [PROJECTOR])
    phase = np.array([int(Phase.ENCODE)])
    out = allocator_columns(builder, cols, blocks, tagged, phase, labels, rec.scalar_type_names(), Clock(0))
    t = builder.build()
    assert out["action"].tolist() == [Action.ALLOC, Action.FREE]
    assert out["tensor"].tolist() == [a.id, a.id] and out["nbytes"].tolist() == [64, 64]
    for column, value in [("category", Category.ACTIVATION), ("modality", Modality.FUSION), ("phase", Phase.ENCODE)]:
        assert out[column].tolist() == [value, value]
    assert [t.strings[i] for i in out["module"].tolist() + out["op"].tolist() + out["dtype"].tolist()] == [
        PROJECTOR,
        PROJECTOR,
        "aten::empty",
        "aten::empty",
        "float32",
        "float32",
    ]
    assert [t.shapes[i] for i in out["shape"].tolist()] == [(16,), (16,)]


def test_spans_pair_markers_and_close_calls_cut_short() -> None:
    rec = Recorder()
    rec.start()
    _alloc(rec, 4)  # outside any call
    rec.enter(0)
    _alloc(rec, 100)
    rec.enter(1)
    _alloc(rec, 200)
    rec.enter(2)  # never exits (an exception): the exit of its caller closes it
    _alloc(rec, 300)
    rec.exit(1)
    _alloc(rec, 400)
    rec.exit(0)
    _alloc(rec, 500)
    rec.enter(3)  # still running when the capture ends
    end_ns = rec.now_ns()
    cols = RecorderColumns.of(rec.drain())
    spans = module_spans(cols.action, cols.ids, cols.time_ns, end_ns)
    assert spans.ctx.tolist() == [0, 1, 2, 3]
    assert spans.parent.tolist() == [-1, 0, 1, -1]
    assert spans.depth.tolist() == [0, 1, 2, 0]
    exits = cols.time_ns[cols.action == NativeRecord.EXIT].tolist()
    assert spans.end_ns.tolist() == [exits[1], exits[0], exits[0], end_ns]
    blocks = Blocks.of(cols)
    by_size = _blocks_by_size(cols, blocks)
    own = spans.row_span[blocks.rows]
    assert [int(own[by_size[n]]) for n in (4, 100, 200, 300, 400, 500)] == [-1, 0, 1, 2, 0, -1]
    assert spans.first_start_ns(-1) == cols.time_ns[cols.action == NativeRecord.ENTER][0]
    assert spans.end_or(end_ns)[own[by_size[4]]] == end_ns  # outside any call reads the capture's end


def test_blocks_pair_each_free_with_its_allocation() -> None:
    rec = Recorder()
    rec.start()
    a = _alloc(rec, 64)
    _alloc(rec, 128)
    rec.free(a)
    cols = RecorderColumns.of(rec.drain())
    blocks = Blocks.of(cols)
    by_size = _blocks_by_size(cols, blocks)
    assert blocks.free_ns[by_size[64]] == cols.time_ns[cols.action == NativeRecord.FREE][0]
    assert blocks.free_ns[by_size[128]] == NEVER_NS
    assert blocks.alloc_ns[by_size[64]] < blocks.alloc_ns[by_size[128]]


def test_phases_follow_steps_encoders_backward_and_the_optimizer() -> None:
    rec = Recorder()
    rec.start()
    _alloc(rec, 4)  # before any module call: load
    rec.enter(1)  # the vision tower, called on its own
    _alloc(rec, 8)  # encode
    rec.exit(1)
    _alloc(rec, 12)  # after a call, before the first step: preparing it (prefill)
    steps = [StepRecord(start_ns=rec.now_ns(), ctx=0, phase=Phase.PREFILL, seq_len=5)]
    rec.enter(0)
    _alloc(rec, 16)  # prefill
    rec.exit(0)
    steps.append(StepRecord(start_ns=rec.now_ns(), ctx=0, phase=Phase.DECODE, seq_len=1))
    rec.enter(0)
    _alloc(rec, 20)  # decode
    _alloc(rec, 24, op="MmBackward0")  # made by autograd: backward
    rec.exit(0)
    optimizer = [[rec.now_ns(), -1]]  # still running at the end
    _alloc(rec, 28)
    end_ns = rec.now_ns()
    cols = RecorderColumns.of(rec.drain())
    blocks = Blocks.of(cols)
    spans = module_spans(cols.action, cols.ids, cols.time_ns, end_ns)
    made_by = np.array([int(Modality.TEXT), int(Modality.VISION), int(Modality.SHARED)])[blocks.ctx]
    is_backward = backward_ops(cols.op_names)[cols.op_outer[blocks.rows].astype(np.int64)]
    table = StepTable.of(reversed(steps))  # logged out of order: the table sorts them
    assert [s.phase for s in table.steps] == [Phase.PREFILL, Phase.DECODE]
    phase = block_phases(blocks, made_by, is_backward, table, spans.first_start_ns(end_ns), optimizer, end_ns)
    by_size = _blocks_by_size(cols, blocks)
    expected = {
        4: Phase.LOAD,
        8: Phase.ENCODE,
        12: Phase.PREFILL,
        16: Phase.PREFILL,
        20: Phase.DECODE,
        24: Phase.BACKWARD,
        28: Phase.OPTIMIZER,
    }
    assert {n: Phase(int(phase[k])) for n, k in by_size.items()} == expected
    assert StepTable.of([]).phase_at(np.array([1, 2]), int(Phase.OTHER)).tolist() == [Phase.OTHER] * 2


def test_categories_by_the_lifetime_of_the_call_that_made_a_block() -> None:
    rec = Recorder()
    rec.start()
    outside = _alloc(rec, 4)
    rec.enter(0)
    temporary = _alloc(rec, 8)
    _alloc(rec, 12)  # outlives the call
    rec.free(temporary)
    rec.exit(0)
    _alloc(rec, 16, op="autograd::engine::evaluate_function: MulBackward0")  # backward, outside any call
    rec.enter(1)
    _alloc(rec, 20)  # its call never returns: alive at the end, an activation
    rec.free(outside)
    end_ns = rec.now_ns()
    cols = RecorderColumns.of(rec.drain())
    blocks = Blocks.of(cols)
    spans = module_spans(cols.action, cols.ids, cols.time_ns, end_ns)
    is_backward = backward_ops(cols.op_names)[cols.op_outer[blocks.rows].astype(np.int64)]
    category = block_categories(blocks, spans.row_span[blocks.rows], spans.end_or(end_ns), is_backward)
    by_size = _blocks_by_size(cols, blocks)
    expected = {
        4: Category.OTHER,
        8: Category.TEMPORARY,
        12: Category.ACTIVATION,
        16: Category.TEMPORARY,
        20: Category.ACTIVATION,
    }
    assert {n: Category(int(category[k])) for n, k in by_size.items()} == expected


def _blocks(alloc_ns: list[int], free_ns: list[int], ptr: list[int], ctx: list[int]) -> Blocks:
    n = len(alloc_ns)
    return Blocks(
        rows=np.arange(n),
        ids=np.arange(1, n + 1),
        alloc_ns=np.array(alloc_ns, np.int64),
        free_ns=np.array(free_ns, np.int64),
        ctx=np.array(ctx, np.int64),
        ptr=np.array(ptr, np.int64),
    )


def test_a_tag_names_the_block_at_its_address_alive_at_its_time() -> None:
    # One address used twice (freed at 20, reused at 30), another block elsewhere.
    blocks = _blocks(alloc_ns=[10, 30, 12], free_ns=[20, NEVER_NS, 40], ptr=[0x1000, 0x1000, 0x2000], ctx=[-1] * 3)
    tags = [
        (t, p, "input", "")
        for t, p in [(15, 0x1000), (25, 0x1000), (35, 0x1000), (5, 0x1000), (41, 0x2000), (12, 0x2000), (15, 0x3000)]
    ]
    assert match_tags(tags, blocks) == [0, None, 1, None, None, 2, None]
    assert match_tags([], blocks) == []


def test_the_strongest_tag_decides_and_the_captures_rules_place_owned_blocks() -> None:
    rules = ModalityRules().with_rules({"multi_modal_projector": "audio"})
    blocks = _blocks(alloc_ns=[1, 2, 3, 4, 5], free_ns=[NEVER_NS] * 5, ptr=[10, 20, 30, 40, 50], ctx=[2, -1, 0, -1, -1])
    category = np.full(5, int(Category.ACTIVATION), np.int64)
    modality = np.full(5, int(Modality.VISION), np.int64)
    pre = {
        90: StorageRecord(90, 256, "float32", (64,), None, 0),
        91: StorageRecord(91, 256, "float32", (64,), None, 0, freed_ns=50),
        92: StorageRecord(92, 256, "float32", (64,), None, 0),
    }
    tags = [
        (9, 10, "input", "model"),  # made inside a module: the model made it, not the program
        (9, 20, "input", "model"),
        (9, 30, "kv_cache", ""),
        (9, 40, "gradient", "model.vision_tower.proj"),
        (9, 40, "weight", PROJECTOR),  # stronger than the gradient tag before it
        (9, 50, "weight", "model.language_model.layers.0"),
        (9, 50, "input", "model"),  # weaker: ignored
        (9, 90, "input", "model"),
        (9, 90, "weight", PROJECTOR),
        (60, 91, "weight", PROJECTOR),  # after the storage died
    ]
    tagged = apply_tags(tags, match_tags(tags, blocks), blocks, category, modality, pre, rules)
    assert [Category(int(c)) for c in tagged.category] == [
        Category.ACTIVATION,
        Category.INPUT,
        Category.KV_CACHE,
        Category.WEIGHT,
        Category.WEIGHT,
    ]
    assert [Modality(int(m)) for m in tagged.modality] == [
        Modality.VISION,
        Modality.VISION,
        Modality.TEXT,
        Modality.AUDIO,
        Modality.TEXT,
    ]
    assert tagged.module_paths == {3: PROJECTOR, 4: "model.language_model.layers.0"}
    assert tagged.preexisting == {
        90: PreexistingTag(category=Category.WEIGHT, modality=Modality.AUDIO, module=PROJECTOR)
    }
    assert (category == Category.ACTIVATION).all() and (modality == Modality.VISION).all()  # inputs untouched


def test_storages_the_allocator_never_saw_become_rows_with_their_release() -> None:
    clock = Clock(t0_ns=1_000_000)
    pre = {
        0x20: StorageRecord(0x20, 512, "float32", (128,), None, 0, freed_ns=4_000_000),
        0x10: StorageRecord(0x10, 256, "float16", (128,), "/ckpt/w.safetensors", 0),
    }
    mapped = {0x30: StorageRecord(0x30, 1024, "bfloat16", (512,), "/ckpt/w.safetensors", 2_000_000, freed_ns=3_000_000)}
    tags = {0x20: PreexistingTag(category=Category.WEIGHT, modality=Modality.AUDIO, module=PROJECTOR)}
    builder = TraceBuilder()
    side_events(builder, pre, tags, list(mapped.values()), clock)
    e = builder.build().events
    rows = list(
        zip(
            e["time_us"].tolist(),
            e["action"].tolist(),
            e["tensor"].tolist(),
            e["address"].tolist(),
            e["category"].tolist(),
            e["modality"].tolist(),
            strict=True,
        )
    )
    assert rows == [
        (0, Action.MAP, -1, 0x10, Category.OTHER, Modality.SHARED),  # untagged, in a file
        (0, Action.PREEXISTING, -2, 0x20, Category.WEIGHT, Modality.AUDIO),
        (1000, Action.MAP, -3, 0x30, Category.WEIGHT, Modality.SHARED),
        (2000, Action.UNMAP, -3, 0x30, Category.WEIGHT, Modality.SHARED),
        (3000, Action.FREE, -2, 0x20, Category.WEIGHT, Modality.AUDIO),  # its release repeats its attribution
    ]
    assert set(e["phase"].tolist()) == {Phase.LOAD}


def test_steps_keep_their_json_layout_and_spans() -> None:
    clock = Clock(t0_ns=0)
    steps = StepTable.of(
        [
            StepRecord(
                start_ns=5_000,
                ctx=0,
                phase=Phase.PREFILL,
                seq_len=7,
                end_ns=9_000,
                tokens={"vision": 4, "audio": 0, "text": 3},
                batch=1,
                input_ids=(1, 5, 5),
            ),
            StepRecord(start_ns=10_000, ctx=1, phase=Phase.DECODE, seq_len=None),  # no input_ids; still running
        ]
    )
    records = steps_metadata(step_records(steps, ["LlavaForConditionalGeneration", "Net"], 20_000, clock))
    assert records == [
        {
            "phase": "prefill",
            "start_us": 5,
            "end_us": 9,
            "seq_len": 7,
            "module": "LlavaForConditionalGeneration",
            "tokens": {"vision": 4, "audio": 0, "text": 3},
            "batch": 1,
            "input_ids": [1, 5, 5],
        },
        {"phase": "decode", "start_us": 10, "end_us": 20, "seq_len": None, "module": "Net"},
    ]
    assert [list(r) for r in records][0] == [
        "phase",
        "start_us",
        "end_us",
        "seq_len",
        "module",
        "tokens",
        "batch",
        "input_ids",
    ]
    builder = TraceBuilder()
    phase_span_rows(builder, steps, [[12_000, -1]], 20_000, clock)
    t = builder.build()
    s = t.spans
    spans = [
        (SpanKind(int(s["kind"][i])), t.string(int(s["name"][i])), int(s["start_us"][i]), int(s["end_us"][i]))
        for i in range(t.num_spans)
    ]
    assert spans == [
        (SpanKind.STEP, "prefill step 0", 5, 9),
        (SpanKind.PHASE, "prefill", 5, 9),
        (SpanKind.STEP, "decode step 1", 10, 20),
        (SpanKind.PHASE, "decode", 10, 20),
        (SpanKind.PHASE, "optimizer", 12, 20),
        (SpanKind.PHASE, "load", 0, 5),
    ]


def test_foreign_storages_take_their_strongest_tag_and_inputs_their_argument_modality() -> None:
    rules = ModalityRules()
    blocks = _blocks(alloc_ns=[1, 2], free_ns=[NEVER_NS, NEVER_NS], ptr=[10, 20], ctx=[-1, -1])
    category = np.full(2, int(Category.OTHER), np.int64)
    modality = np.full(2, int(Modality.SHARED), np.int64)
    side = [
        StorageRecord(70, 4096, "float32", (1, 3, 16, 16), None, 5, freed_ns=40, kind="input"),  # numpy pixels
        StorageRecord(70, 4096, "float32", (1024,), None, 50, kind="input"),  # the same address, later
        StorageRecord(80, 1024, "float32", (256,), None, 5, kind="weight"),  # registered, never tagged
        StorageRecord(20, 64, "int64", (8,), None, 5, kind="input"),  # from_numpy(t.numpy()) of block 1
        StorageRecord(90, 2048, "float32", (512,), "/ckpt.safetensors", 3, kind="weight"),
    ]
    tags = [(9, 70, "input", ""), (9, 20, "input", ""), (9, 10, "input", ""), (9, 90, "weight", PROJECTOR)]
    inputs = [(9, 70, int(Modality.VISION)), (9, 10, int(Modality.TEXT)), (60, 70, int(Modality.AUDIO))]
    tagged = apply_tags(tags, match_tags(tags, blocks), blocks, category, modality, {}, rules, side, inputs)
    assert tagged.side == [
        PreexistingTag(category=Category.INPUT, modality=Modality.VISION, module=None),
        PreexistingTag(category=Category.INPUT, modality=Modality.AUDIO, module=None),  # by its own tag time
        PreexistingTag(category=Category.WEIGHT, modality=Modality.SHARED, module=None),
        None,  # the allocator block at that address counts those bytes
        PreexistingTag(category=Category.WEIGHT, modality=Modality.FUSION, module=PROJECTOR),
    ]
    assert Category(int(tagged.category[0])) == Category.INPUT and Modality(int(tagged.modality[0])) == Modality.TEXT


def test_foreign_storages_become_external_rows_in_their_steps_phase() -> None:
    clock = Clock(t0_ns=0)
    side = [
        StorageRecord(0x70, 4096, "float32", (1, 3, 16, 16), None, 6_000, freed_ns=9_000, kind="input"),
        StorageRecord(0x90, 2048, "float32", (512,), "/ckpt.safetensors", 2_000, freed_ns=3_000),
        StorageRecord(0x20, 64, "int64", (8,), None, 6_000, kind="input"),
    ]
    tags = [
        PreexistingTag(category=Category.INPUT, modality=Modality.VISION, module=None),
        PreexistingTag(category=Category.WEIGHT, modality=Modality.TEXT, module="model.layers.0"),
        None,
    ]
    steps = StepTable.of([StepRecord(start_ns=5_000, ctx=0, phase=Phase.PREFILL, seq_len=4, end_ns=8_000)])
    builder = TraceBuilder()
    side_events(builder, {}, {}, side, clock, tags, steps)
    trace = builder.build()
    e = trace.events
    rows = list(
        zip(
            e["time_us"].tolist(),
            e["action"].tolist(),
            e["tensor"].tolist(),
            e["category"].tolist(),
            e["modality"].tolist(),
            e["phase"].tolist(),
            [trace.string(o) for o in e["op"].tolist()],
            strict=True,
        )
    )
    assert sorted(rows) == [  # the wrapped allocator block (no tag) leaves no row
        (2, Action.MAP, -2, Category.WEIGHT, Modality.TEXT, Phase.LOAD, "/ckpt.safetensors"),
        (3, Action.UNMAP, -2, Category.WEIGHT, Modality.TEXT, Phase.LOAD, "/ckpt.safetensors"),
        (6, Action.ALLOC, -1, Category.INPUT, Modality.VISION, Phase.PREFILL, "(external storage)"),
        (9, Action.FREE, -1, Category.INPUT, Modality.VISION, Phase.PREFILL, "(external storage)"),
    ]


def test_spans_of_balanced_markers_match_the_loop_on_random_call_trees() -> None:
    """module_spans pairs bracket-like markers with whole arrays; on any call tree it must give
    what pairing them one at a time gives (and fall back to that for calls cut short)."""
    from memwarden.record.attribution.spans import _balanced_spans, _spans_by_loop
    from memwarden.record.native import NativeRecord

    rng = np.random.default_rng(7)
    enter, exit_ = int(NativeRecord.ENTER), int(NativeRecord.EXIT)
    taken = 0
    for case in range(300):
        kinds: list[int] = []
        ctxs: list[int] = []
        stack: list[int] = []
        for _ in range(int(rng.integers(1, 120))):
            if stack and (rng.random() < 0.5 or len(stack) > 6):
                kinds.append(exit_)
                ctxs.append(stack.pop())
            else:
                stack.append(int(rng.integers(0, 9)))
                kinds.append(enter)
                ctxs.append(stack[-1])
        cut_short = case % 3 == 0 and len(stack) > 1  # an exception: an inner call never exits
        if cut_short:
            stack.pop()
        while stack:
            kinds.append(exit_)
            ctxs.append(stack.pop())
        k, c = np.array(kinds), np.array(ctxs)
        t = np.arange(len(k), dtype=np.int64) * 10
        table, open_after = _spans_by_loop(k, c, t, 10**9)
        fast = _balanced_spans(k == enter, c, t)
        if fast is None:
            assert cut_short, case  # only a call cut short needs the loop
            continue
        taken += 1
        assert np.array_equal(fast[0], table), case
        assert fast[1].tolist() == open_after[1:], case
    assert taken > 150


def test_match_tags_finds_the_block_allocated_last_at_the_address_before_the_tag() -> None:
    """The vectorised search against its definition, on random blocks reusing few addresses."""
    import types

    from memwarden.record.attribution.tags import match_tags

    rng = np.random.default_rng(3)
    for case in range(400):
        n = int(rng.integers(0, 40))
        alloc = rng.integers(0, 100, n).astype(np.int64)
        blocks = types.SimpleNamespace(
            ptr=(rng.integers(0, 6, n) * 64).astype(np.int64),
            alloc_ns=alloc,
            free_ns=(alloc + rng.integers(0, 60, n)).astype(np.int64),
        )
        tags = [(int(rng.integers(0, 170)), int(rng.integers(0, 8)) * 64, "weight", "") for _ in range(20)]
        expected = []
        for t, p, _, _ in tags:
            before = [k for k in range(n) if blocks.ptr[k] == p and blocks.alloc_ns[k] <= t]
            last = max(before, key=lambda k: (blocks.alloc_ns[k], k)) if before else None
            expected.append(last if last is not None and t <= blocks.free_ns[last] else None)
        assert match_tags(tags, blocks) == expected, case  # type: ignore[arg-type]
