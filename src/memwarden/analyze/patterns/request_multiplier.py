"""request-multiplier: one request run k times over: beams, returned sequences, duplicated rows.

``generate(num_beams=8)`` expands the prompt (and its pixel values) to eight rows before the
prefill: eight times the prefill activations, the media features and the KV cache, for one answer.
``num_return_sequences=4`` does the same for four answers, and a batch built by repeating one image
for each prompt does it by hand. On a small device the multiplier, not the model, is what runs out.

What the trace shows: a prefill whose integer inputs are ``(B, T)``, made by an expanding op
(``repeat_interleave``, ``repeat``, ``index_select``, ``tile``) from the same ids as ``(b, T)``,
still alive, with ``B = k * b`` and ``k >= 2``: the request was expanded ``k`` times between the
user's tensors and the model. The multiplier is ``k``.

The fix as a change: the request's blocks (weights aside) at ``1/k`` of their size, what
``num_beams=1`` (greedy or sampling), ``num_return_sequences=1`` or one row per distinct image
make. The line to change is the call that passes the multiplier (``num_beams=``,
``num_return_sequences=``, ``expand``/``repeat`` of the batch), read from the script's source.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.finding import Context, Finding
from memwarden.analyze.lines import LineBytes, merge_lines
from memwarden.analyze.value_origin import argument_line, origin_line, unpacked_line
from memwarden.trace.model import Action, Category, Trace
from memwarden.trace.sites import parse_line
from memwarden.units import format_bytes

PATTERN = "request-multiplier"
_KEYWORDS = ("num_beams", "num_return_sequences", "num_beam_groups")
_EXPANDING = frozenset(
    {"aten::repeat_interleave", "aten::repeat", "aten::index_select", "aten::expand_copy", "aten::tile"}
)
_STAY = np.array([Category.WEIGHT, Category.BUFFER, Category.GRADIENT, Category.OPTIMIZER_STATE], dtype=np.uint8)


def _multiplier(trace: Trace, lo: int, hi: int, batch: int, free: np.ndarray) -> int:
    """k when the prefill's (batch, T) integer input was made from a (batch / k, T) one alive then."""
    e = trace.events
    is_int = np.array([s.startswith(("int", "uint")) for s in trace.strings] + [False])
    shape_of = trace.shapes
    rows = np.arange(lo, hi)
    rows = rows[
        (e["action"][rows] == Action.ALLOC) & (e["category"][rows] == Category.INPUT) & is_int[e["dtype"][rows]]
    ]
    # the expansion itself: generate's _expand_inputs_for_generation (repeat_interleave), a batch
    # repeated or expanded by hand; a (b, T) tensor that merely divides the batch proves nothing
    window = np.arange(lo, hi)
    expanded = {
        int(e["shape"][r])
        for r in window.tolist()
        if e["action"][r] == Action.ALLOC and trace.string(int(e["op"][r])) in _EXPANDING
    }
    best = 1
    for r in rows.tolist():
        k_shape = int(e["shape"][r])
        shape = shape_of[k_shape] if k_shape >= 0 else ()
        if len(shape) != 2 or shape[0] != batch or shape[1] < 2 or k_shape not in expanded:
            continue
        before = np.arange(0, r)
        before = before[(e["action"][before] == Action.ALLOC) & is_int[e["dtype"][before]] & (free[before] > r)]
        for b in before.tolist():
            ks = int(e["shape"][b])
            small = shape_of[ks] if ks >= 0 else ()
            if len(small) == 2 and small[1] == shape[1] and 0 < small[0] < batch and batch % small[0] == 0:
                best = max(best, batch // small[0])
    return best


def detect(ctx: Context) -> list[Finding]:
    trace = ctx.trace
    steps = ctx.analysis.steps
    n = trace.num_events
    if not steps or not n:
        return []
    e = trace.events
    times = e["time_us"]
    free = ctx.analysis.free_index
    scale_rows: list[np.ndarray] = []
    scale: list[np.ndarray] = []
    seen: list[dict[str, Any]] = []
    for i, st in enumerate(steps):
        if st.phase != "prefill" or not st.batch or st.batch < 2:
            continue
        lo = int(np.searchsorted(times, steps[i - 1].end_us, side="right")) if i else 0
        hi = int(np.searchsorted(times, st.start_us, side="right"))
        k = _multiplier(trace, lo, hi, st.batch, free)
        # rows built by hand, each with the same image, then generated from: every copy's KV lives
        # through the decode. One scoring forward over options that share an image (a multiple-choice
        # batch) is the usual evaluation, and is left alone.
        generated = i + 1 < len(steps) and steps[i + 1].phase == "decode"
        duplicated = k < 2 and st.media_repeat >= 2 and generated
        k = max(k, st.media_repeat if duplicated else 1)
        # beams and returned sequences exist only where tokens are generated: one forward over text
        # rows repeated per image is the documented input of a detector or a retrieval model (OWLv2's
        # queries for each image), scored once
        if k < 2 or not generated:
            continue
        nxt = next((s.start_us for s in steps[i + 1 :] if s.phase != "decode"), None)
        until = n if nxt is None else int(np.searchsorted(times, nxt, side="left"))
        # from the expansion on: what the request computed before it (a vision tower run once per
        # image before generate expands its features for the beams) is not multiplied
        ops = e["op"][lo:hi]
        grown = [i for i, s in enumerate(trace.strings) if s in _EXPANDING]
        first = np.flatnonzero(np.isin(ops, grown) & (e["action"][lo:hi] == Action.ALLOC)) if k > 1 else ops[:0]
        start = lo + int(first[0]) if len(first) and not duplicated else lo
        rows = np.arange(start, until)
        rows = rows[(e["action"][rows] == Action.ALLOC) & ~np.isin(e["category"][rows], _STAY)]
        scale_rows.append(rows)
        scale.append(np.full(len(rows), 1.0 / k))
        seen.append(
            {
                "step": i,
                "batch": st.batch,
                "multiplier": k,
                "call_site": st.call_site,
                "request_bytes": int(e["nbytes"][rows].sum()),
                "duplicated_media_rows": duplicated,
            }
        )
    if not seen:
        return []
    worst = max(seen, key=lambda s: s["request_bytes"])
    lines: list[LineBytes] = []
    if worst["call_site"]:
        src = parse_line(worst["call_site"])
        # where the multiplier was chosen: the value the call passes followed back to its
        # assignment (``per_call = N_SAMPLES``), else a line passing the keyword nearby
        passed = origin_line(src.file, src.line, _KEYWORDS) or argument_line(src.file, src.line, _KEYWORDS)
        if worst["duplicated_media_rows"]:  # the batch the call unpacks, built with one image per row
            passed = unpacked_line(src.file, src.line) or passed
        at = passed.line if passed is not None else src.line
        lines.append(LineBytes(src.file, at, src.function, worst["request_bytes"], 0))
    evidence: dict[str, Any] = {"requests": seen[:16], "multiplier": worst["multiplier"], "batch": worst["batch"]}
    fix = (
        f"the batch carries the same image in {worst['multiplier']} of its {worst['batch']} rows: it is encoded, "
        f"prefilled and cached {worst['multiplier']} times. Encode the image once: prefill the shared prefix "
        f"(image and instruction) once, then copy the prefix cache for each question (copy.deepcopy of the "
        f"cache, or generate with past_key_values=a copy) or ask the questions in one turn; the duplicated "
        f"request allocated {format_bytes(worst['request_bytes'])}"
        if worst["duplicated_media_rows"]
        else f"each request runs {worst['multiplier']} times over (prefill batch {worst['batch']} from "
        f"{worst['batch'] // worst['multiplier']} row(s)): use num_beams=1 (greedy or do_sample=True) and "
        f"num_return_sequences=1, or generate the alternatives one after another, and send one row per distinct "
        f"image; the multiplied request allocated {format_bytes(worst['request_bytes'])}"
    )
    return [
        Finding(
            pattern=PATTERN,
            severity="high",
            bytes_at_peak=0,
            wasted_bytes=0,
            where=steps[worst["step"]].module,
            evidence=evidence,
            fix=fix,
            lines=merge_lines(lines),
            change=Change(scale_rows=np.concatenate(scale_rows), scale=np.concatenate(scale)),
        )
    ]
