"""kv-reprefill: the same image/audio encoded again, the same token prefix prefilled again.

A chat loop that resends the whole conversation (image included) each turn, or a
loop that asks several questions about one image with a fresh ``generate()`` each,
re-runs the vision/audio encoder on identical pixels and recomputes the KV of a
prefix the previous request had already computed.

Evidence from the trace:

- encodes: the outermost vision/audio MODULE spans (and outermost projector spans)
  carry a content fingerprint of their inputs; equal (module, fingerprint) twice or
  more is a repeated encode. Bytes per encode = ALLOC bytes inside the span.
- prefixes: the trace's steps (``Analysis.steps``) hold each root call's input ids. A request's
  sequence is its prefill ids plus the ids its decode steps fed. A later prefill
  whose ids share a prefix of at least ``min_prefix_tokens`` with an earlier
  request's sequence re-prefilled that prefix. Placeholder (image/audio) tokens
  only count as shared when the two requests encoded media of equal fingerprints
  (vLLM keys its prefix blocks on the media content hash the same way).

Waste: bytes allocated by the repeated encodes plus the KV bytes recomputed for
re-prefilled prefixes (tokens x KV bytes per token, measured on the prefill).
It is repeated work, so severity is judged against the peak with a higher bar
(``high`` 0.5, ``medium`` 0.05 of the peak by default).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.finding import Context, Finding, severity_for
from memwarden.analyze.value_origin import origin_line
from memwarden.trace.model import Action, Category, Modality, SpanKind, Trace
from memwarden.trace.sites import parse_line
from memwarden.units import format_bytes, format_us

PATTERN = "kv-reprefill"
_MEDIA = (int(Modality.VISION), int(Modality.AUDIO))
_ENCODERS = (int(Modality.VISION), int(Modality.AUDIO), int(Modality.FUSION))


def _alloc_bytes_between(
    trace: Trace, dev: int, start_us: np.ndarray, end_us: np.ndarray, mask: np.ndarray | None = None
) -> np.ndarray:
    """ALLOC bytes (optionally only rows in ``mask``) with start <= time <= end, per interval."""
    e = trace.events
    sel = (e["action"] == Action.ALLOC) & (e["device"] == dev)
    if mask is not None:
        sel &= mask
    csum = np.concatenate([[0], np.cumsum(np.where(sel, e["nbytes"], 0))])
    lo = np.searchsorted(e["time_us"], start_us, side="left")
    hi = np.searchsorted(e["time_us"], end_us, side="right")
    return (csum[hi] - csum[lo]).astype(np.int64)


def _encoder_spans(trace: Trace) -> np.ndarray:
    """Rows of the outermost vision/audio spans and outermost projector spans that have a fingerprint."""
    s = trace.spans
    if trace.num_spans == 0:
        return np.zeros(0, dtype=np.int64)
    modality = s["modality"].astype(np.int64)
    parent = s["parent"].astype(np.int64)
    parent_modality = np.where(parent >= 0, modality[np.clip(parent, 0, None)], -1)
    media = np.isin(modality, _MEDIA) & (parent_modality != modality)
    projector = (modality == int(Modality.FUSION)) & ~np.isin(parent_modality, _ENCODERS)
    return np.flatnonzero((s["kind"] == SpanKind.MODULE) & (s["fingerprint"] >= 0) & (media | projector))


def _media_ids(ids: list[int], media_tokens: int) -> set[int]:
    """The placeholder ids of a prefill: the most frequent ids whose counts add up to its media tokens."""
    if media_tokens <= 0:
        return set()
    found: set[int] = set()
    total = 0
    for tok, count in Counter(ids).most_common():
        if total + count > media_tokens:
            break
        found.add(tok)
        total += count
        if total == media_tokens:
            return found
    return set()  # could not tell which ids are media: treat none as shareable


def _shared_prefix(
    x: np.ndarray, y: np.ndarray, media: set[int], fps_a: tuple[Any, ...], fps_b: tuple[Any, ...]
) -> int:
    """Common prefix of two id arrays. A run of media placeholders is shared only when both requests
    encoded the same media for it: the k-th encode of each has the same fingerprint (or both made
    the same encodes in all)."""
    n = min(len(x), len(y))
    diff = np.flatnonzero(x[:n] != y[:n])
    lcp = int(diff[0]) if len(diff) else n
    if not media:
        # media sent but no placeholder ids to place it (Kosmos-2 marks its image positions with a
        # mask, not an id): both requests encoded other media, and where in the prefix it sits is
        # unknown, so nothing is known to be shared
        return 0 if fps_a and fps_b and fps_a != fps_b else lcp
    if fps_a and fps_a == fps_b:
        return lcp
    is_media = np.isin(x[:lcp], list(media))
    run_starts = np.flatnonzero(is_media & ~np.concatenate([[False], is_media[:-1]]))
    for r, start in enumerate(run_starts.tolist()):
        if r >= len(fps_a) or r >= len(fps_b) or fps_a[r] != fps_b[r]:
            return int(start)
    return lcp


def _runs(x: np.ndarray, media: set[int]) -> int:
    """How many runs of media placeholders ``x`` holds."""
    if not media or not len(x):
        return 0
    is_media = np.isin(x, list(media))
    return int((is_media & ~np.concatenate([[False], is_media[:-1]])).sum())


def _rows_between(trace: Trace, dev: int, start_us: int, end_us: int) -> np.ndarray:
    e = trace.events
    lo = np.searchsorted(e["time_us"], start_us, side="left")
    hi = np.searchsorted(e["time_us"], end_us, side="right")
    rows = np.arange(lo, hi)
    return rows[(e["action"][rows] == Action.ALLOC) & (e["device"][rows] == dev)]


def _split_at_reloads(trace: Trace, dev: int, times: list[int]) -> list[list[int]]:
    """Indices of ``times`` (encode starts, in order) grouped so that no weights were loaded between
    two of a group: the same image sent to a model loaded since is another model's first encode."""
    e = trace.events
    w = (e["action"] == Action.ALLOC) & (e["category"] == Category.WEIGHT) & (e["device"] == dev)
    wt = np.sort(e["time_us"][w])
    out: list[list[int]] = []
    last_loads = -1
    for k, t in enumerate(times):
        loads = int(np.searchsorted(wt, t, side="left"))
        if not out or loads != last_loads:
            out.append([k])
        else:
            out[-1].append(k)
        last_loads = loads
    return out


def detect(ctx: Context) -> list[Finding]:
    trace = ctx.trace
    if trace.num_events == 0:
        return []
    min_prefix = int(ctx.threshold(PATTERN, "min_prefix_tokens", 16))
    high = float(ctx.threshold(PATTERN, "high", 0.5))
    medium = float(ctx.threshold(PATTERN, "medium", 0.05))
    e, s = trace.events, trace.spans
    dev = ctx.analysis.device
    peak_bytes = ctx.summary.peak_bytes

    # -- repeated encodes ------------------------------------------------------------------------
    enc = _encoder_spans(trace)
    enc_bytes = _alloc_bytes_between(trace, dev, s["start_us"][enc], s["end_us"][enc])
    enc_us = (s["end_us"][enc] - s["start_us"][enc]).astype(np.int64)
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for k, row in enumerate(enc.tolist()):
        groups[(int(s["name"][row]), int(s["fingerprint"][row]))].append(k)
    repeats: list[dict[str, Any]] = []
    drop_rows: list[np.ndarray] = []
    for (name, fp), all_ks in groups.items():
        for part in _split_at_reloads(trace, dev, [int(s["start_us"][enc[k]]) for k in all_ks]):
            ks = [all_ks[j] for j in part]
            if len(ks) < 2:
                continue
            later = ks[1:]
            drop_rows += [
                _rows_between(trace, dev, int(s["start_us"][enc[k]]), int(s["end_us"][enc[k]])) for k in later
            ]
            repeats.append(
                {
                    "module": trace.string(name),
                    "fingerprint": trace.string(fp),
                    "modality": Modality(int(s["modality"][enc[ks[0]]])).name.lower(),
                    "encodes": len(ks),
                    "bytes_per_encode": int(enc_bytes[ks].mean()),
                    "ms_per_encode": round(float(enc_us[ks].mean()) / 1000, 2),
                    "repeated_bytes": int(enc_bytes[later].sum()),
                    "repeated_us": int(enc_us[later].sum()),
                }
            )

    # -- re-prefilled prefixes ---------------------------------------------------------------------
    steps = ctx.analysis.steps
    prefills = [i for i, st in enumerate(steps) if st.phase == "prefill" and st.input_ids]
    enc_start = s["start_us"][enc]
    enc_fp = s["fingerprint"][enc]
    enc_media = np.isin(s["modality"][enc], _MEDIA)
    requests: list[dict[str, Any]] = []  # earlier requests: fed ids, media fingerprints, placeholder ids
    by_head: dict[tuple[int, ...], list[int]] = defaultdict(list)  # first min_prefix ids -> requests
    reprefills: list[dict[str, Any]] = []
    scale_rows: list[np.ndarray] = []  # the re-prefills' blocks, made smaller by the prefix they re-fed
    scale: list[np.ndarray] = []
    kv_alloc = _alloc_bytes_between(
        trace,
        dev,
        np.array([steps[i].start_us for i in prefills], dtype=np.int64),
        np.array([steps[i].end_us for i in prefills], dtype=np.int64),
        e["category"] == Category.KV_CACHE,
    )
    step_alloc = _alloc_bytes_between(  # everything a prefill allocates: a cache-less loop's recomputed work
        trace,
        dev,
        np.array([steps[i].start_us for i in prefills], dtype=np.int64),
        np.array([steps[i].end_us for i in prefills], dtype=np.int64),
    )
    bounds = [*prefills[1:], len(steps)]
    for n_req, i in enumerate(prefills):
        st = steps[i]
        prev_end = steps[i - 1].end_us if i > 0 else -1
        in_window = enc_media & (enc_start > prev_end) & (enc_start <= st.end_us)
        ids = list(st.input_ids)
        media = _media_ids(ids, st.tokens.get("vision", 0) + st.tokens.get("audio", 0))
        x = np.asarray(ids, dtype=np.int64)
        # what each run of placeholders holds: the request's media items one by one where the capture
        # saw one item per run (a chat re-sending its photos matches them turn over turn), else the
        # encodes made for it (one fingerprint per encode call)
        fps: tuple[Any, ...] = tuple(int(f) for f in enc_fp[in_window])
        if st.media_digests and len(st.media_digests) == _runs(x, media):
            fps = tuple(st.media_digests)
        best, best_req = 0, -1
        # a shared prefix of min_prefix tokens or more starts with the same min_prefix ids
        for r in by_head.get(tuple(ids[:min_prefix]), []) if len(ids) >= min_prefix else []:
            req = requests[r]
            shared = _shared_prefix(x, req["ids"], media | req["media"], fps, req["fps"])
            if shared > best:
                best, best_req = shared, r
        seq_len = st.seq_len or len(ids)
        kv_per_token = int(kv_alloc[n_req]) // seq_len if seq_len else 0
        if best >= min_prefix:
            reprefills.append(
                {
                    "step": i,
                    "shared_prefix_tokens": best,
                    "seq_len": seq_len,
                    "with_request": best_req,
                    "kv_bytes_per_token": kv_per_token,
                    "bytes_per_token": int(step_alloc[n_req]) // seq_len if seq_len else 0,
                    "prefill_us": st.end_us - st.start_us,
                }
            )
            step_rows = _rows_between(trace, dev, st.start_us, st.end_us)
            scale_rows.append(step_rows)
            scale.append(np.full(len(step_rows), 1.0 - best / max(seq_len, 1)))
        # what this request's KV covers: the prefill ids, then one id per decode step
        fed = ids + [(st2.input_ids or (0,))[0] for st2 in steps[i + 1 : bounds[n_req]] if st2.phase == "decode"]
        if len(fed) >= min_prefix:
            by_head[tuple(fed[:min_prefix])].append(len(requests))
        requests.append({"ids": np.asarray(fed, dtype=np.int64), "fps": fps, "media": media})

    if not repeats and not reprefills:
        return []
    repeated_encode_bytes = sum(r["repeated_bytes"] for r in repeats)
    repeated_encodes = sum(r["encodes"] - 1 for r in repeats if r["modality"] != "fusion")  # projectors: bytes only
    repeated_us = sum(r["repeated_us"] for r in repeats)
    reprefilled_tokens = sum(r["shared_prefix_tokens"] for r in reprefills)
    kv_per_token = max((r["kv_bytes_per_token"] for r in reprefills), default=0)
    recomputed_kv = sum(r["shared_prefix_tokens"] * r["kv_bytes_per_token"] for r in reprefills)
    # A loop that keeps no cache at all recomputes every activation of the re-fed prefix: count those.
    cacheless = bool(reprefills) and recomputed_kv == 0
    recomputed_bytes = sum(r["shared_prefix_tokens"] * r["bytes_per_token"] for r in reprefills)
    reprefill_us = sum(r["prefill_us"] * r["shared_prefix_tokens"] // max(r["seq_len"], 1) for r in reprefills)
    wasted = repeated_encode_bytes + (recomputed_bytes if cacheless else recomputed_kv)

    encoders = sorted({r["module"] for r in repeats if r["modality"] in ("vision", "audio")})
    root = next((steps[i].module for i in prefills), None) or "(model)"
    where = ", ".join(encoders) if encoders else str(root)
    evidence: dict[str, Any] = {
        "repeated_encodes": repeated_encodes,
        "repeated_encode_bytes": repeated_encode_bytes,
        "repeated_encode_ms": round(repeated_us / 1000, 2),
        "encodes": repeats[:8],
        "reprefilled_tokens": reprefilled_tokens,
        "recomputed_kv_bytes": recomputed_kv,
        "recomputed_bytes": recomputed_bytes,
        "cacheless": cacheless,
        "kv_bytes_per_token": kv_per_token,
        "reprefill_ms": round(reprefill_us / 1000, 2),
        "prefills": len(prefills),
        "reprefills": reprefills[:16],
        "min_prefix_tokens": min_prefix,
    }
    saves = []
    if repeated_encodes:
        saves.append(
            f"{repeated_encodes} encodes ({format_us(repeated_us)}, {format_bytes(repeated_encode_bytes)} allocated)"
        )
    if reprefilled_tokens:
        saves.append(
            f"{reprefilled_tokens} re-prefilled tokens ({format_us(reprefill_us)}, {format_bytes(recomputed_kv)} of KV recomputed)"
        )
    if cacheless:
        fix = (
            f"Each call re-feeds the whole sequence to {root} with no KV cache ({len(reprefills)} re-prefills of a "
            "prefix already computed): feed only the new token(s) and pass the cache back -- "
            "out = model(input_ids=new_ids, past_key_values=past, use_cache=True); past = out.past_key_values -- "
            "or make one model.generate(max_new_tokens=N) call (a TextStreamer prints as it goes): saves "
            f"{reprefilled_tokens} re-fed tokens ({format_us(reprefill_us)}, {format_bytes(recomputed_bytes)} allocated)."
        )
    else:
        fix = _fix_keep_cache(saves)
    # The line to change: where the cache the call passes was made anew for the turn (``cache =
    # DynamicCache(...)`` before each generate), else the call (diagnose names it).
    lines: list[dict[str, Any]] = []
    site = next((steps[r["step"]].call_site for r in reprefills if steps[r["step"]].call_site), None)
    if site is not None and not cacheless:
        call = parse_line(site)
        made = origin_line(call.file, call.line, ("past_key_values", "cache"))
        if made is not None:
            lines = [{"file": made.file, "line": made.line, "nbytes": int(recomputed_kv)}]
    return [
        Finding(
            pattern=PATTERN,
            severity=severity_for(wasted, peak_bytes, high=high, medium=medium),
            bytes_at_peak=0,
            wasted_bytes=int(wasted),
            where=where,
            evidence=evidence,
            fix=fix,
            lines=lines,
            change=Change(
                drop=np.concatenate(drop_rows) if drop_rows else np.zeros(0, np.int64),
                scale_rows=np.concatenate(scale_rows) if scale_rows else np.zeros(0, np.int64),
                scale=np.concatenate(scale) if scale else np.zeros(0),
            ),
        )
    ]


def _fix_keep_cache(saves: list[str]) -> str:
    return (
        "Keep the KV cache between turns: pass the previous generate()'s cache back (return_dict_in_generate=True, "
        "then generate(..., cache=out.cache) -- past_key_values in transformers 4 -- with the full ids and without "
        "resending pixel_values/input_features for media already in the cache; for several questions on one "
        "image, prefill the shared prefix once and copy.deepcopy its cache per question), or serve with memwarden "
        "GovernedSession (paged KV with content-hash prefix reuse and an encoder cache keyed by image "
        f"fingerprint): saves {' and '.join(saves)}."
    )
