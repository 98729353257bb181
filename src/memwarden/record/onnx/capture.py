"""``capture_onnx``: a Trace of an ONNX Runtime run.

One profiled session runs the model once per feed set; each run is one phase (``encode`` for a
vision/audio tower, ``prefill``, ``decode`` for a graph with KV inputs; see ``infer_phase``). The
Trace holds the optimized graph's initializers as weights and every executed node's outputs with
the lifetimes ORT gives them (``memwarden.record.onnx.build``), so ``summary``, ``diagnose``,
``report``, ``replay`` and ``plan`` read it as they read a PyTorch capture.

``metadata["onnxruntime"]`` records the settings and, per run, ORT's own allocator counters
where the profile has them (CPU arena on): bytes in use when the run began and the highest
bytes in use after any kernel. ``memwarden.record.onnx.measure`` checks the capture against
them and against a malloc-level measurement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from memwarden.errors import InputError
from memwarden.record.modality import ModalityRules
from memwarden.record.onnx.alloc_plan import RunInput
from memwarden.record.onnx.bounded import RunLimits
from memwarden.record.onnx.build import add_runs, add_weights
from memwarden.record.onnx.feeds import load_feeds
from memwarden.record.onnx.graph import GraphInfo, load_graph, module_path_of
from memwarden.record.onnx.profile import RunProfile, read_profile
from memwarden.record.onnx.session import OrtSettings, run_profiled, settings_of
from memwarden.trace.model import Phase, Trace, TraceBuilder, parse_enum
from memwarden.trace.steps import Step, steps_metadata

__all__ = ["capture_onnx", "infer_phase"]

Feeds = Mapping[str, np.ndarray]


def infer_phase(graph: GraphInfo) -> Phase:
    """The phase of a run of this graph: the export's ``memwarden.phase`` metadata, else KV inputs
    mean decode, pixel/audio inputs mean encode, anything else prefill."""
    named = graph.metadata.get("memwarden.phase")
    if named:
        try:
            return Phase(parse_enum(Phase, named))
        except ValueError:
            pass
    names = " ".join(graph.inputs).lower()
    if "past" in names or "cache" in names:
        return Phase.DECODE
    if "pixel" in names or "audio" in names or "input_features" in names:
        return Phase.ENCODE
    return Phase.PREFILL


def capture_onnx(
    session_or_path: Any,
    feeds: Feeds | Sequence[Feeds] | str | Path,
    *,
    settings: OrtSettings | None = None,
    phase: str | Phase | None = None,
    rules: ModalityRules | None = None,
    loop_limits: RunLimits | None = None,
) -> Trace:
    """A Trace of running ``session_or_path`` (an ``onnxruntime.InferenceSession``, a model path or
    model bytes) on ``feeds`` (one mapping of input name -> array, or a list of them: one run each;
    or the path of an ``.npz``, whose headers are checked against the model's inputs before any
    array in it is inflated).

    A session's model and memory settings are reused (``settings`` overrides them); the session
    itself is not run, since profiling can only be switched on when a session is created.

    The model is checked first (``memwarden.record.onnx.guard``: declared sizes against this
    machine, tensors folded from constants, external data); one with control flow that has no
    bound runs in a child process under ``loop_limits`` (default ``RunLimits()``).
    """
    if isinstance(session_or_path, str | Path | bytes):
        source: str | Path | bytes = session_or_path
        chosen = settings or OrtSettings()
    else:
        source, found = settings_of(session_or_path)
        chosen = settings or found
    rules = rules or ModalityRules()
    original = load_graph(source)  # a file that is not a model fails here, with one line, before ORT sees it
    if isinstance(feeds, str | Path):
        feeds = load_feeds(feeds, inputs=original.input_specs)
    feed_list = [feeds] if isinstance(feeds, Mapping) else list(feeds)
    if not feed_list:
        raise InputError("no feeds given: pass one mapping of input name -> array per run")
    limits = None
    if original.unbounded:
        base = loop_limits or RunLimits()
        limits = RunLimits(base.seconds, base.memory_bytes, why=", ".join(original.unbounded[:3]))
    profiled = run_profiled(source, feed_list, chosen, limits=limits)
    try:
        # ORT's optimized file keeps the original's external data references (beside the original)
        folder = Path(source).resolve().parent if not isinstance(source, bytes) else None
        graph = load_graph(profiled.optimized_path, external_folder=folder) if profiled.optimized_path else original
        if "memwarden.module_prefix" in original.metadata and "memwarden.module_prefix" not in graph.metadata:
            # ORT dropped the metadata from the optimized file: read its paths with the original's
            prefix = original.metadata["memwarden.module_prefix"]
            roots = frozenset(r for r in original.metadata.get("memwarden.module_roots", "").split(",") if r)
            graph.nodes = [replace(n, module=module_path_of(n.name, prefix, roots)) for n in graph.nodes]
        graph.metadata = {**original.metadata, **graph.metadata}
        # ORT plans on the graph it loaded (fusions keep their last node's output name): the
        # original's inferred shapes, the optimized file's for values only it has
        graph.planned_shapes = {**graph.planned_shapes, **original.planned_shapes}
        runs = read_profile(profiled.profile_path)
        if profiled.shadow_profile_path is not None:
            _borrow_counters(runs, read_profile(profiled.shadow_profile_path))
    finally:
        profiled.workdir.cleanup()
    if len(runs) != len(feed_list):
        raise InputError(f"the ONNX Runtime profile holds {len(runs)} runs for {len(feed_list)} feed sets")
    run_phase = Phase(parse_enum(Phase, phase)) if isinstance(phase, str) else (phase or infer_phase(original))
    inputs = [
        RunInput(run_phase, {n: (str(a.dtype), tuple(a.shape), int(a.nbytes)) for n, a in f.items()})
        for f in profiled.feeds
    ]
    builder = TraceBuilder(devices=[chosen.ep], metadata={"capture": "onnxruntime", "device": chosen.ep})
    ids = add_weights(builder, graph, rules)
    spans = add_runs(builder, graph, runs, inputs, rules, ids, mem_pattern=chosen.mem_pattern)
    import onnxruntime as ort

    builder.metadata["model"] = graph.metadata.get("memwarden.model") or (
        Path(source).name if not isinstance(source, bytes) else "model"
    )
    builder.metadata["onnxruntime"] = {
        "version": ort.__version__,
        "ep": chosen.ep,
        "arena": chosen.arena,
        "mem_pattern": chosen.mem_pattern,
        "optimization": chosen.optimization,
        "nodes": len(graph.nodes),
        "runs": [
            _run_stats(r) | {k: v for k, v in s.items() if k.startswith("mem_pattern")}
            for r, s in zip(runs, spans, strict=True)
        ],
    }
    builder.metadata["steps"] = steps_metadata(
        Step(
            phase=run_phase.name.lower(),
            start_us=s["start_us"],
            end_us=s["end_us"],
            seq_len=_seq_len(f),
            batch=_batch(f),
            module=graph.metadata.get("memwarden.part", "model"),
        )
        for s, f in zip(spans, profiled.feeds, strict=True)
    )
    return builder.build()


def _borrow_counters(runs: list[RunProfile], twins: list[RunProfile]) -> None:
    """Give an arena-off run the allocator counters of its arena-on twin, kernel by kernel; a
    twin whose kernels differ (another order, another count) lends nothing."""
    for run, twin in zip(runs, twins, strict=False):
        if [n.name for n in run.nodes] != [n.name for n in twin.nodes]:
            continue
        run.nodes = [
            replace(
                n,
                in_use_bytes=t.in_use_bytes,
                in_use_peak_bytes=t.in_use_peak_bytes,
                requested_bytes=t.requested_bytes,
                requested_delta_bytes=t.requested_delta_bytes,
            )
            for n, t in zip(run.nodes, twin.nodes, strict=True)
        ]


def _run_stats(run: Any) -> dict[str, Any]:
    arena = run.arena_peak()
    out: dict[str, Any] = {"kernels": len(run.nodes), "duration_us": run.end_us - run.start_us}
    if arena is not None:
        out["arena_in_use_before_bytes"], out["arena_in_use_peak_bytes"] = arena
        out["arena_high_water_bytes"] = run.high_water()
    return out


def _seq_len(feeds: Feeds) -> int | None:
    for name in ("input_ids", "inputs_embeds"):
        if name in feeds and np.ndim(feeds[name]) >= 2:
            return int(np.shape(feeds[name])[1])
    return None


def _batch(feeds: Feeds) -> int | None:
    for name in ("input_ids", "inputs_embeds", "pixel_values"):
        if name in feeds and np.ndim(feeds[name]) >= 1:
            return int(np.shape(feeds[name])[0])
    return None
