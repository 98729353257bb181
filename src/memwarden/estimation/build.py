"""Building a MemoryCard from a meta-device Trace (``memwarden.record.meta.capture``): the peak
per phase, what it is made of, the KV cache at the end, the tokens; with a device, the verdict and
the arithmetic suggestions. Pure: numpy over the Trace, no torch."""

from __future__ import annotations

from typing import Any

import numpy as np

from memwarden.analyze.timeline import breakdown_at, primary_device, summary
from memwarden.estimation.card import PHASES, Device, MemoryCard, ModelFacts, Request
from memwarden.estimation.cuda_runtime import cuda_runtime, is_cuda
from memwarden.estimation.steady import Extrapolated, kv_at_end
from memwarden.estimation.suggest import arithmetic_suggestions, rank_suggestions
from memwarden.trace.model import Category, Phase, SpanKind, Trace, enum_name
from memwarden.trace.steps import steps_of

__all__ = ["apply_device", "card_from_trace"]

_INPUT = -1  # the phase code of the request's inputs (the Trace has no such phase)


def _event_phases(trace: Trace) -> np.ndarray:
    """Phase of every event by when it happened: inside an encoder call -> encode, else the step
    (prefill/decode) it falls in or follows; before all of them, weights and buffers -> load and
    anything else (the request's inputs, generate's preparation) -> input. (The Trace's ``phase``
    column is the phase of the block an event belongs to; a card wants the timeline cut into windows.)"""
    t = trace.events["time_us"]
    phases = np.full(len(t), int(Phase.LOAD), dtype=np.int64)
    kind, start, end = trace.spans["kind"], trace.spans["start_us"], trace.spans["end_us"]
    names = [trace.string(int(i)) for i in trace.spans["name"]]
    steps = sorted((int(start[i]), int(trace.spans["phase"][i])) for i in np.flatnonzero(kind == SpanKind.STEP))
    if steps:
        starts = np.array([s for s, _ in steps], dtype=np.int64)
        step_phase = np.array([p for _, p in steps], dtype=np.int64)
        k = np.searchsorted(starts, t, side="right") - 1
        phases = np.where(k >= 0, step_phase[np.clip(k, 0, None)], phases)
    for i in np.flatnonzero(kind == SpanKind.PHASE):
        if names[i] == "encode":
            phases[(t >= start[i]) & (t <= end[i])] = int(Phase.ENCODE)
    owned = np.isin(trace.events["category"], (int(Category.WEIGHT), int(Category.BUFFER)))
    phases[(phases == int(Phase.LOAD)) & ~owned] = _INPUT
    return phases


def _phase_breakdowns(trace: Trace, device: int) -> dict[str, dict[str, Any]]:
    n = trace.num_events
    if n == 0:
        return {}
    live = trace.live_bytes(device)
    on = trace.events["device"] == device
    phases = _event_phases(trace)
    out: dict[str, dict[str, Any]] = {}
    for p in (Phase.LOAD, _INPUT, *(p for p in Phase if p != Phase.LOAD)):
        sel = np.flatnonzero(on & (phases == p))
        if len(sel) == 0:
            continue
        index = int(sel[np.argmax(live[sel])])
        out["input" if p == _INPUT else enum_name(Phase(p))] = {
            "peak_bytes": int(live[index]),
            "by_category": breakdown_at(trace, index, "category", device),
            "by_modality": breakdown_at(trace, index, "modality", device),
        }
    return {k: out[k] for k in (*PHASES, *(k for k in out if k not in PHASES)) if k in out}


def _tokens(trace: Trace) -> dict[str, int]:
    """Prompt tokens by modality: as the request builder counted them (the placeholders the model
    makes of each medium, also where they are no media token ids: Kosmos-2's position mask, Fuyu's
    row newlines, Whisper's encoder positions), else the prefill call's input_ids, else (an
    encoder-decoder, whose encoder generate() runs outside the model's root call) the ids
    generate() was given."""
    counted = trace.metadata.get("request_tokens")
    fed = trace.metadata.get("input_tokens")
    found = [step.tokens for step in steps_of(trace) if step.phase == "prefill" and step.tokens]
    t = counted if isinstance(counted, dict) else found[0] if found else fed if isinstance(fed, dict) else {}
    return {
        k: int(v) if isinstance(v, int) and not isinstance(v, bool) else 0
        for k, v in ((k, t.get(k, 0)) for k in ("vision", "audio", "text"))
    }


def card_from_trace(
    trace: Trace,
    *,
    model: str = "",
    request: Request | None = None,
    facts: ModelFacts | None = None,
    device: Device | None = None,
    decode: Extrapolated | None = None,
    versions: dict[str, str] | None = None,
) -> MemoryCard:
    """The card of a meta trace; with a device, its verdict and arithmetic suggestions (ranked).
    ``decode``: the decode phase of a longer generation than the trace's, extrapolated from it."""
    s = summary(trace, top=0)
    dev = primary_device(trace)
    card = MemoryCard(
        peak_bytes=s.peak_bytes,
        weights_bytes=s.weights_bytes,
        kv_cache_bytes=kv_at_end(trace, dev),
        phases=_phase_breakdowns(trace, dev),
        tokens=_tokens(trace),
        model=model,
        request=request,
        by_category_at_peak=dict(s.by_category_at_peak),
        by_modality_at_peak=dict(s.by_modality_at_peak),
        versions=dict(versions or {}),
    )
    steps = sum(1 for step in steps_of(trace) if step.phase in ("prefill", "decode"))
    card.generation = {"new_tokens": steps, "steps_run": steps, "extrapolated": False}
    if decode is not None:
        _extend(card, decode)
    if device is not None:
        if is_cuda(device):
            card.runtime = cuda_runtime(trace, device, card.peak_bytes)
        apply_device(card, device)
        if facts is not None and not card.fits:
            card.suggestions = rank_suggestions(
                arithmetic_suggestions(card, facts, device.usable_bytes, bool(getattr(device, "unified_memory", False)))
            )
    return card


def _extend(card: MemoryCard, decode: Extrapolated) -> None:
    """The card of the longer generation: its decode phase, KV cache at the end and peak."""
    card.phases["decode"] = decode.decode
    card.kv_cache_bytes = decode.kv_cache_bytes
    card.generation = {"new_tokens": decode.new_tokens, "steps_run": decode.measured_new_tokens, "extrapolated": True}
    if decode.decode["peak_bytes"] > card.peak_bytes:
        card.peak_bytes = int(decode.decode["peak_bytes"])
        card.by_category_at_peak = dict(decode.decode["by_category"])
        card.by_modality_at_peak = dict(decode.decode["by_modality"])


def apply_device(card: MemoryCard, device: Device) -> None:
    card.device = device.name
    card.device_id = device.id
    card.usable_bytes = int(device.usable_bytes)
    card.headroom_bytes = card.usable_bytes - card.device_peak_bytes
    card.fits = card.headroom_bytes >= 0
    card.limit = limit_verdict(card.device_peak_bytes, device)


def limit_verdict(peak_bytes: int, device: Device) -> dict[str, Any] | None:
    """Which limit the verdict compared the peak with: the OS's per-app kill limit when the profile
    has one below the memory the OS leaves, else that memory; and whether the peak fits the RAM
    but not the limit (the app is killed although the memory is there)."""
    limit = getattr(device, "limit", None)
    ram = int(getattr(device, "ram_bytes", device.usable_bytes))
    if limit is None:
        return {
            "kind": "memory the OS leaves",
            "bytes": ram,
            "source": "device profile",
            "ram_bytes": ram,
            "binding": True,
            "killed_below_ram": False,
        }
    binding = limit.bytes <= ram
    killed = binding and limit.bytes < peak_bytes <= ram
    kind = limit.describe() if binding else "memory the OS leaves (below the kill limit)"
    return {
        "kind": kind,
        "bytes": int(min(limit.bytes, ram)),
        "source": limit.source,
        "ram_bytes": ram,
        "binding": binding,
        "killed_below_ram": killed,
    }
