"""Turn the native recorder's log plus the Python-side observations into a Trace.

CaptureLog is filled during the run (cheaply: tuples appended to lists);
Attributor runs once at the end and decides, for every block, its category,
modality, phase, module and op.

Rules (in priority order):
  category  weight/buffer (storage of a parameter/buffer) > optimizer_state >
            gradient > kv_cache (in a root call's past_key_values) > input
            (passed into a root call, made outside any module) > temporary
            (freed before the module call that made it returned) > activation
            (made inside a module, outlived its call) > other.
  phase     optimizer (inside optimizer.step) > backward (made by the autograd
            engine) > encode (inside a vision/audio/fusion module) > the phase
            of the root call (step) it falls in or follows (prefill/decode) >
            load (before the first root call).
  modality  from the module path rules; kv_cache is text.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memwarden.trace.model import Action, Category, Modality, Phase, SpanKind, Trace, TraceBuilder, enum_name

_KIND_PRIORITY = {"weight": 6, "buffer": 6, "optimizer_state": 5, "gradient": 4, "kv_cache": 3, "input": 2}
_KIND_CATEGORY = {
    "weight": Category.WEIGHT,
    "buffer": Category.BUFFER,
    "optimizer_state": Category.OPTIMIZER_STATE,
    "gradient": Category.GRADIENT,
    "kv_cache": Category.KV_CACHE,
    "input": Category.INPUT,
}

# c10::toString(ScalarType) -> torch dtype name
_DTYPE_NAMES = {
    "Byte": "uint8", "Char": "int8", "Short": "int16", "Int": "int32", "Long": "int64", "Half": "float16",
    "Float": "float32", "Double": "float64", "ComplexHalf": "complex32", "ComplexFloat": "complex64",
    "ComplexDouble": "complex128", "Bool": "bool", "QInt8": "qint8", "QUInt8": "quint8", "QInt32": "qint32",
    "BFloat16": "bfloat16", "QUInt4x2": "quint4x2", "QUInt2x4": "quint2x4", "Float8_e5m2": "float8_e5m2",
    "Float8_e4m3fn": "float8_e4m3fn", "UInt16": "uint16", "UInt32": "uint32", "UInt64": "uint64",
}  # fmt: skip

_ENTER, _EXIT = 2, 3


def storage_of(tensor: Any) -> tuple[int, int] | None:
    """(data pointer, bytes) of a CPU tensor's storage; None for tensors without one
    (meta, functorch batched, sparse, nested, wrapper subclasses)."""
    try:
        if tensor.device.type != "cpu" or tensor.is_meta:
            return None
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        return (ptr, storage.nbytes()) if ptr else None
    except (NotImplementedError, RuntimeError, TypeError, AttributeError):
        return None


@dataclass
class StorageRecord:
    ptr: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    file: str | None
    t_ns: int
    freed_ns: int | None = None


@dataclass
class CaptureLog:
    """What the Python side saw during the run, in the recorder's clock (ns)."""

    tags: list[tuple[int, int, str, str]] = field(default_factory=list)  # (t_ns, ptr, kind, module path)
    fingerprints: list[str | None] = field(default_factory=list)  # one per ENTER marker, in order
    steps: list[list[Any]] = field(default_factory=list)  # [start_ns, end_ns, ctx, phase, seq_len]
    optimizer_spans: list[list[int]] = field(default_factory=list)  # [start_ns, end_ns]
    preexisting_storages: dict[int, StorageRecord] = field(default_factory=dict)
    mapped_storages: dict[int, StorageRecord] = field(default_factory=dict)
    clock: Callable[[], int] | None = None

    def tag(self, t_ns: int, tensor: Any, kind: str, path: str) -> None:
        found = storage_of(tensor)
        if found is not None:
            self.tags.append((t_ns, found[0], kind, path))

    def enter(self, ctx: int, fingerprint: str | None) -> None:
        self.fingerprints.append(fingerprint)

    def step_start(
        self, t_ns: int, ctx: int, phase: Phase, seq_len: int | None, info: dict[str, Any] | None = None
    ) -> None:
        self.steps.append([t_ns, None, ctx, phase, seq_len, info or {}])

    def fix_step(self, phase: Phase, seq_len: int | None, info: dict[str, Any] | None) -> None:
        if self.steps:
            self.steps[-1][3:6] = [phase, seq_len, info or {}]

    def step_end(self, t_ns: int) -> None:
        if self.steps and self.steps[-1][1] is None:
            self.steps[-1][1] = t_ns

    def optimizer_start(self, t_ns: int) -> None:
        self.optimizer_spans.append([t_ns, -1])

    def optimizer_end(self, t_ns: int) -> None:
        if self.optimizer_spans and self.optimizer_spans[-1][1] < 0:
            self.optimizer_spans[-1][1] = t_ns

    def _record(self, tensor: Any, t_ns: int, file: str | None) -> StorageRecord | None:
        found = storage_of(tensor)
        if found is None or found[1] == 0:
            return None
        storage = tensor.untyped_storage()
        ptr = found[0]
        rec = StorageRecord(ptr, found[1], str(tensor.dtype).replace("torch.", ""), tuple(tensor.shape), file, t_ns)
        if self.clock is not None:
            clock = self.clock

            def _freed(rec: StorageRecord = rec) -> None:
                rec.freed_ns = clock()

            weakref.finalize(storage, _freed)
        return rec

    def preexisting(self, tensor: Any, maps: Any) -> None:
        found = storage_of(tensor)
        if found is None:
            return
        ptr = found[0]
        if ptr in self.preexisting_storages:
            return
        rec = self._record(tensor, 0, maps.file_of(ptr))
        if rec is not None:
            self.preexisting_storages[ptr] = rec

    def file_backed(self, t_ns: int, tensor: Any, maps: Any) -> None:
        """A storage that lies in a mapped file, first seen at ``t_ns``."""
        found = storage_of(tensor)
        if found is None:
            return
        ptr = found[0]
        if ptr in self.preexisting_storages or ptr in self.mapped_storages:
            return
        path = maps.file_of(ptr)
        if path is None:
            return
        rec = self._record(tensor, t_ns, path)
        if rec is not None:
            self.mapped_storages[ptr] = rec


@dataclass
class Attributor:
    log: CaptureLog
    modules: list[tuple[str, str, int]]  # ctx -> (path, label, modality)
    dtype_names: list[str]
    t0_ns: int
    end_ns: int
    metadata: dict[str, Any]

    def _us(self, t_ns: int) -> int:
        return max(0, (int(t_ns) - self.t0_ns) // 1000)

    def build(self, drained: dict[str, Any]) -> Trace:
        cols = {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in drained.items()}
        action = cols["action"]
        n = len(action)
        t_ns = cols["time_ns"]
        ctx_col = cols["ctx"]
        ops: list[str] = list(cols["op_names"])
        builder = TraceBuilder(devices=["cpu"], metadata=dict(self.metadata))
        builder.metadata.update(
            {
                "untracked_frees": int(cols["untracked_frees"]),
                "unwrapped_allocations": int(cols["unwrapped_allocations"]),
            }
        )

        # 1. module spans from enter/exit markers; each row gets its innermost open span
        span_of_row = np.full(n, -1, dtype=np.int64)
        spans: list[list[int]] = []  # [start_ns, end_ns, ctx, parent, depth, enter_index]
        stack: list[int] = []
        enter_count = 0
        markers = np.flatnonzero((action == _ENTER) | (action == _EXIT))
        marker_set = set(markers.tolist())
        rows = np.arange(n)
        # rows between markers inherit the open span; walk markers only (fast), fill ranges with slices
        prev = 0
        for m in markers.tolist():
            span_of_row[prev:m] = stack[-1] if stack else -1
            if action[m] == _ENTER:
                spans.append(
                    [int(t_ns[m]), self.end_ns, int(cols["id"][m]), stack[-1] if stack else -1, len(stack), enter_count]
                )
                enter_count += 1
                stack.append(len(spans) - 1)
            else:
                ctx = int(cols["id"][m])
                while stack:
                    top = stack.pop()
                    spans[top][1] = int(t_ns[m])
                    if spans[top][2] == ctx:
                        break
            prev = m + 1
        span_of_row[prev:] = stack[-1] if stack else -1
        del rows, marker_set

        span_end = np.array([s[1] for s in spans] + [self.end_ns], dtype=np.int64)  # index -1 -> capture end

        # 2. steps (root calls) and optimizer spans
        steps = sorted((s for s in self.log.steps), key=lambda s: s[0])
        step_starts = np.array([s[0] for s in steps], dtype=np.int64)
        step_phase = np.array([int(s[3]) for s in steps] or [int(Phase.OTHER)], dtype=np.int64)

        # 3. blocks
        alloc_rows = np.flatnonzero(action == 0)
        free_rows = np.flatnonzero(action == 1)
        ids = cols["id"]
        module_modality = np.array([m[2] for m in self.modules] + [int(Modality.SHARED)], dtype=np.int64)
        alloc_ctx = ctx_col[alloc_rows].astype(np.int64)
        alloc_t = t_ns[alloc_rows]
        modality = module_modality[alloc_ctx]  # ctx -1 -> last entry (shared)

        # phase
        si = np.searchsorted(step_starts, alloc_t, side="right") - 1 if len(step_starts) else np.full(len(alloc_t), -1)
        # before the first module call: load; between it and the first step: preparing the first step (prefill)
        first_call_ns = spans[0][0] if spans else self.end_ns
        before = np.where(alloc_t < first_call_ns, int(Phase.LOAD), int(Phase.PREFILL))
        phase = np.where(si >= 0, step_phase[np.clip(si, 0, None)], before)
        is_encoder = np.isin(modality, [int(Modality.VISION), int(Modality.AUDIO), int(Modality.FUSION)]) & (
            alloc_ctx >= 0
        )
        phase = np.where(is_encoder, int(Phase.ENCODE), phase)
        backward_ops = np.array(
            [name.startswith("autograd::engine") or name.endswith("Backward0") for name in ops] + [False]
        )
        is_backward = backward_ops[cols["op_outer"][alloc_rows].astype(np.int64)]
        phase = np.where(is_backward, int(Phase.BACKWARD), phase)
        for start, end in self.log.optimizer_spans:
            end = end if end >= 0 else self.end_ns
            phase = np.where((alloc_t >= start) & (alloc_t <= end), int(Phase.OPTIMIZER), phase)

        # category: temporary vs activation by the lifetime of the module call that made it
        free_t = np.full(len(alloc_rows), np.iinfo(np.int64).max, dtype=np.int64)
        if len(alloc_rows) and len(free_rows):
            pos = np.clip(np.searchsorted(ids[alloc_rows], ids[free_rows]), 0, len(alloc_rows) - 1)
            hit = ids[alloc_rows][pos] == ids[free_rows]
            free_t[pos[hit]] = t_ns[free_rows][hit]
        own_span = span_of_row[alloc_rows]
        made_in_module = own_span >= 0
        temporary = made_in_module & (free_t <= span_end[own_span])
        category = np.where(
            made_in_module, np.where(temporary, int(Category.TEMPORARY), int(Category.ACTIVATION)), int(Category.OTHER)
        )
        category = np.where(is_backward & ~made_in_module, int(Category.TEMPORARY), category)
        np.where(alloc_ctx >= 0, alloc_ctx, -1)
        tag_path: dict[int, str] = {}

        # tags: match (t, ptr) to the block at that address alive at t
        # Blocks sorted by (address, alloc time): a tag's block is the last one at its address
        # allocated at or before the tag's time, if it is still alive then.
        ptrs = cols["ptr"][alloc_rows]
        by_ptr = np.lexsort((alloc_t, ptrs))
        sorted_ptrs, sorted_t = ptrs[by_ptr], alloc_t[by_ptr]
        tag_hits: list[int | None] = []
        if self.log.tags:
            tag_t = np.array([tg[0] for tg in self.log.tags], dtype=np.int64)
            tag_p = np.array([tg[1] for tg in self.log.tags], dtype=np.int64)
            lo = np.searchsorted(sorted_ptrs, tag_p, side="left")
            hi = np.searchsorted(sorted_ptrs, tag_p, side="right")
            for i in range(len(tag_t)):
                if lo[i] == hi[i]:
                    tag_hits.append(None)
                    continue
                j = int(lo[i]) + int(np.searchsorted(sorted_t[lo[i] : hi[i]], tag_t[i], side="right")) - 1
                k = int(by_ptr[j]) if j >= lo[i] else -1
                tag_hits.append(k if k >= 0 and tag_t[i] <= free_t[k] else None)
        tag_rank = np.zeros(len(alloc_rows), dtype=np.int64)
        pre = self.log.preexisting_storages
        pre_kind: dict[int, tuple[int, str, str]] = {}
        for (t, p, kind, path), hit in zip(self.log.tags, tag_hits, strict=True):
            rank = _KIND_PRIORITY[kind]
            if hit is None:
                rec = pre.get(p)
                if rec is not None and (rec.freed_ns is None or t <= rec.freed_ns):
                    if rank > pre_kind.get(p, (0, "", ""))[0]:
                        pre_kind[p] = (rank, kind, path)
                continue
            if kind == "input" and alloc_ctx[hit] >= 0:
                continue
            if rank > tag_rank[hit]:
                tag_rank[hit] = rank
                category[hit] = int(_KIND_CATEGORY[kind])
                if kind in ("weight", "buffer", "gradient", "optimizer_state") and path is not None:
                    tag_path[hit] = path
                if kind == "kv_cache":
                    modality[hit] = int(Modality.TEXT)

        # 4. emit: allocator rows as whole columns (a capture can hold millions)
        from memwarden.capture.modality import ModalityRules

        rules = ModalityRules()
        ctx_label_ids = np.array([builder.intern(m[1]) for m in self.modules] + [-1], dtype=np.int32)
        module_col = ctx_label_ids[alloc_ctx]
        modality_col = modality.astype(np.uint8)
        for k, path in tag_path.items():
            module_col[k] = builder.intern(path) if path else -1
            modality_col[k] = int(rules.modality_of(path))
        op_ids = np.array([builder.intern(o) for o in ops] + [-1], dtype=np.int32)
        op_col = op_ids[cols["op_outer"][alloc_rows].astype(np.int64)]
        dtype_ids = np.array([builder.intern(_DTYPE_NAMES.get(d, d)) for d in self.dtype_names] + [-1], dtype=np.int32)
        dtype_col = dtype_ids[cols["dtype"][alloc_rows].astype(np.int64)]
        shape_col = np.full(len(alloc_rows), -1, dtype=np.int32)
        soff, ndim, pool = cols["shape_off"], cols["ndim"], cols["shapes"].tolist()
        # The recorder stores each distinct shape once: intern per (offset, ndim), not per row.
        has_shape = soff[alloc_rows] >= 0
        keys = soff[alloc_rows].astype(np.int64) * 128 + ndim[alloc_rows].astype(np.int64)
        uniq, inverse = np.unique(keys[has_shape], return_inverse=True)
        ids_of_uniq = np.array(
            [builder.intern_shape(tuple(pool[int(k) // 128 : int(k) // 128 + int(k) % 128])) for k in uniq.tolist()],
            dtype=np.int32,
        )
        shape_col[has_shape] = ids_of_uniq[inverse] if len(uniq) else -1

        alloc_ids = ids[alloc_rows]  # increasing: the recorder numbers blocks in allocation order
        main = np.flatnonzero((action == 0) | (action == 1))
        k_of = np.searchsorted(alloc_ids, ids[main])
        k_of = np.clip(k_of, 0, max(len(alloc_ids) - 1, 0))
        keep = (alloc_ids[k_of] == ids[main]) if len(alloc_ids) else np.zeros(len(main), bool)
        main, k_of = main[keep], k_of[keep]  # drops frees of blocks allocated before this capture
        main_cols = {
            "time_us": np.maximum(0, (t_ns[main] - self.t0_ns) // 1000),
            "action": action[main],
            "tensor": ids[main],
            "address": cols["ptr"][main].astype(np.uint64),
            "nbytes": cols["nbytes"][main],
            "device": np.zeros(len(main), np.int16),
            "category": category[k_of].astype(np.uint8),
            "modality": modality_col[k_of],
            "phase": phase[k_of].astype(np.uint8),
            "module": module_col[k_of],
            "op": op_col[k_of],
            "dtype": dtype_col[k_of],
            "shape": shape_col[k_of],
            "written_bytes": cols["written"][alloc_rows][k_of],
        }
        attrs: dict[int, tuple[int, int, int, str | None, str | None, str | None, tuple[int, ...] | None]] = {}
        next_pre_id = -1

        # preexisting storages first, at t = 0; their frees (seen by weakref finalizers) come later
        pending: list[tuple[int, int, tuple[Action, int, int]]] = []
        for p, rec in sorted(pre.items()):
            _, kind, path = pre_kind.get(p, (0, "other", ""))
            cat = _KIND_CATEGORY.get(kind, Category.OTHER)
            mod_modality = rules.modality_of(path) if kind in ("weight", "buffer") else Modality.SHARED
            kw = dict(
                category=cat,
                modality=mod_modality,
                phase=Phase.LOAD,
                module=(path or None) if kind in ("weight", "buffer") else None,
                dtype=rec.dtype,
                shape=rec.shape,
            )
            builder.event(
                0, Action.MAP if rec.file else Action.PREEXISTING, next_pre_id, p, rec.nbytes, op=rec.file, **kw
            )
            if rec.freed_ns is not None:
                attrs[next_pre_id] = (
                    int(cat),
                    int(mod_modality),
                    int(Phase.LOAD),
                    kw["module"],
                    rec.file,
                    rec.dtype,
                    rec.shape,
                )
                pending.append(
                    (int(rec.freed_ns), next_pre_id, (Action.UNMAP if rec.file else Action.FREE, p, rec.nbytes))
                )
            next_pre_id -= 1

        for p, rec in sorted(self.log.mapped_storages.items()):
            bid = next_pre_id
            next_pre_id -= 1
            builder.event(
                self._us(rec.t_ns),
                Action.MAP,
                bid,
                p,
                rec.nbytes,
                category=Category.WEIGHT,
                phase=Phase.LOAD,
                op=rec.file,
                dtype=rec.dtype,
                shape=rec.shape,
            )
            if rec.freed_ns is not None:
                builder.event(
                    self._us(rec.freed_ns),
                    Action.UNMAP,
                    bid,
                    p,
                    rec.nbytes,
                    category=Category.WEIGHT,
                    phase=Phase.LOAD,
                    op=rec.file,
                )

        for t, bid, (act, p, nb) in pending:
            cat, mod, ph, module, op, dtype, shape = attrs[bid]
            builder.event(
                self._us(t),
                act,
                bid,
                p,
                nb,
                category=Category(cat),
                modality=Modality(mod),
                phase=Phase(ph),
                module=module,
                op=op,
                dtype=dtype,
                shape=shape,
            )

        # spans: modules, steps, phases
        # Module spans as whole columns, rows in `spans` order (so `parent` is a row index).
        encoders = [int(Modality.VISION), int(Modality.AUDIO), int(Modality.FUSION)]
        if spans:
            sp = np.array([s[:6] for s in spans], dtype=np.int64)  # start, end, ctx, parent, depth, enter_index
            mods = module_modality[sp[:, 2]]
            k = np.searchsorted(step_starts, sp[:, 0], side="right") - 1
            from_step = np.where(k >= 0, step_phase[np.clip(k, 0, None)], int(Phase.OTHER))
            is_enc = np.isin(mods, encoders)
            fps = self.log.fingerprints
            fp_ids = [builder.intern(fps[i]) if i < len(fps) and fps[i] is not None else -1 for i in sp[:, 5].tolist()]
            to_us = lambda a: np.maximum(0, (a - self.t0_ns) // 1000)  # noqa: E731
            builder.extend_spans({
                "start_us": to_us(sp[:, 0]), "end_us": to_us(sp[:, 1]), "kind": np.full(len(sp), int(SpanKind.MODULE)),
                "name": ctx_label_ids[sp[:, 2]], "phase": np.where(is_enc, int(Phase.ENCODE), from_step),
                "modality": mods, "fingerprint": np.array(fp_ids), "parent": sp[:, 3], "depth": sp[:, 4],
            })  # fmt: skip
            parent_enc = np.where(sp[:, 3] >= 0, is_enc[np.clip(sp[:, 3], 0, None)], False)
            for row in np.flatnonzero(is_enc & ~parent_enc).tolist():  # an encoder call: an encode phase span
                builder.span(self._us(sp[row, 0]), self._us(sp[row, 1]), SpanKind.PHASE, "encode", phase=Phase.ENCODE,
                             modality=Modality(int(mods[row])))  # fmt: skip
        for i, (start, end, _ctx, ph, _seq, _info) in enumerate(steps):
            end = end if end is not None else self.end_ns
            name = enum_name(Phase(ph))
            builder.span(self._us(start), self._us(end), SpanKind.STEP, f"{name} step {i}", phase=Phase(ph))
            builder.span(self._us(start), self._us(end), SpanKind.PHASE, name, phase=Phase(ph))
        for start, end in self.log.optimizer_spans:
            builder.span(
                self._us(start),
                self._us(end if end >= 0 else self.end_ns),
                SpanKind.PHASE,
                "optimizer",
                phase=Phase.OPTIMIZER,
            )
        if steps:
            builder.span(0, self._us(steps[0][0]), SpanKind.PHASE, "load", phase=Phase.LOAD)
        builder.metadata["duration_us"] = self._us(self.end_ns)
        builder.metadata["steps"] = [
            {
                "phase": enum_name(Phase(s[3])),
                "start_us": self._us(s[0]),
                "end_us": self._us(s[1] if s[1] is not None else self.end_ns),
                "seq_len": s[4],
                "module": self.modules[s[2]][1],
                **s[5],
            }
            for s in steps
        ]
        return _merge(builder.build(), main_cols)


def _merge(side: Trace, main_cols: dict[str, np.ndarray]) -> Trace:
    """The builder's rows (preexisting, mapped) plus the allocator's columns, in time order."""
    events = {k: np.concatenate([side.events[k], main_cols[k].astype(side.events[k].dtype)]) for k in side.events}
    order = np.argsort(events["time_us"], kind="stable")
    events = {k: v[order] for k, v in events.items()}
    return Trace(events=events, spans=side.spans, strings=side.strings, shapes=side.shapes, devices=side.devices,
                 metadata=side.metadata)  # fmt: skip


__all__ = ["Attributor", "CaptureLog", "StorageRecord"]
