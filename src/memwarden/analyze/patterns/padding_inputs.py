"""alignment-padding, part two: padding made outside torch, judged from a step's inputs.

A tokenizer or collator that pads every batch to ``max_length`` builds the padded ids in Python
or numpy, so no torch op wrote a padded block the op-level check could see. The step's attention
mask says it instead (the capture keeps, per step, its ``length`` T, the ``longest`` row's real
tokens, the ``real`` tokens in all and the ``batch``: ``metadata["input_padding"]``). A batch
padded to the longest row is as small as a rectangular batch gets; one whose T is at least
``min_ratio`` x the longest row carries positions no row needs, and every activation of that step
carries them too.

Waste: what the step allocated above the live bytes at its start (its working set), times the
share of positions beyond the longest row, ``1 - longest / T``. Activations grow at least
linearly in T (attention scores quadratically), so this is the smaller of the two readings. When
the run's peak falls inside such a step, that waste is what the fix takes off the peak; otherwise
the finding is a low hint.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.finding import Context, Finding, severity_for
from memwarden.analyze.lines import LineBytes, input_lines, merge_lines
from memwarden.analyze.source_lines import call_lines
from memwarden.analyze.value_origin import argument_line, size_line
from memwarden.trace.model import Category, Trace
from memwarden.trace.sites import parse_line
from memwarden.units import format_bytes

__all__ = ["input_padding_findings"]

_PADDING_KEYWORDS = ("padding", "max_length", "pad_to_multiple_of")

_STAYS = np.array([Category.WEIGHT, Category.BUFFER, Category.GRADIENT, Category.OPTIMIZER_STATE], dtype=np.uint8)
_MIN_PAD_POSITIONS = 8  # positions beyond the longest row: fewer is rounding, not a padding policy


def _steps(trace: Trace, min_ratio: float) -> list[dict[str, int]]:
    out = []
    for item in trace.metadata.get("input_padding", ()) or ():
        try:
            rec = {k: int(item[k]) for k in ("start_us", "end_us", "length", "longest", "real", "batch")}
        except (KeyError, TypeError, ValueError):
            continue
        longest = max(rec["longest"], 1)
        if rec["length"] >= min_ratio * longest and rec["length"] - longest >= _MIN_PAD_POSITIONS:
            out.append(rec)
    return out


def input_padding_findings(trace: Trace, ctx: Context, min_ratio: float) -> list[Finding]:
    steps = _steps(trace, min_ratio)
    if not steps or trace.num_events == 0:
        return []
    live = ctx.analysis.live_bytes
    times = trace.events["time_us"]
    p = int(np.argmax(live))
    peak_bytes = int(live[p])
    per_step: list[dict[str, Any]] = []
    starts_all = np.sort(np.array([s["start_us"] for s in steps], dtype=np.int64))
    scale_rows: list[np.ndarray] = []
    scale: list[np.ndarray] = []
    e = trace.events
    for st in steps:
        lo = int(np.searchsorted(times, st["start_us"], side="left"))
        hi = int(np.searchsorted(times, st["end_us"], side="right"))
        if hi <= lo:
            continue
        base = int(live[lo - 1]) if lo > 0 else 0
        working = max(0, int(live[lo:hi].max()) - base)
        share = 1.0 - st["longest"] / st["length"]
        # The fix as a change: the step and its backward work on the longest row's length, not the
        # padded one: their blocks (weights, gradients and optimizer state aside) scale with it.
        later = starts_all[starts_all > st["start_us"]]
        until = int(np.searchsorted(times, later[0], side="left")) if len(later) else trace.num_events
        rows = np.arange(lo, until)
        rows = rows[(e["action"][rows] == 0) & ~np.isin(e["category"][rows], _STAYS)]
        # Only blocks along the padded positions shrink (a Whisper encoder's activations do not
        # depend on the labels' length); a block whose shape was not recorded is taken to.
        along = np.array([k < 0 or st["length"] in trace.shapes[int(k)] for k in e["shape"][rows].tolist()], dtype=bool)
        rows = rows[along]
        scale_rows.append(rows)
        scale.append(np.full(len(rows), st["longest"] / st["length"]))
        per_step.append(
            {
                **st,
                "working_bytes": working,
                "padded_share": round(share, 3),
                "waste_bytes": int(working * share),
                "has_peak": lo <= p < hi,
            }
        )
    if not per_step:
        return []
    at_peak = [s for s in per_step if s["has_peak"]]
    worst = max(per_step, key=lambda s: s["waste_bytes"])
    if at_peak:
        wasted, severity, peak_added = at_peak[0]["waste_bytes"], None, at_peak[0]["waste_bytes"]
        severity = severity_for(wasted, peak_bytes)
    elif scale_rows:
        # The peak fell outside the padded forward (in its backward, say): the change below carries
        # the shorter sequence through the backward, and diagnose() judges the saving it computes.
        wasted, severity, peak_added = worst["waste_bytes"], "high", 0
    else:
        wasted, severity, peak_added = worst["waste_bytes"], "low", 0
    if wasted <= 0:
        return []
    lengths = sorted({s["length"] for s in per_step})
    longest = max(s["longest"] for s in per_step)
    evidence: dict[str, Any] = {
        "padded_steps": len(per_step),
        "padded_lengths": lengths,
        "longest_row_tokens": longest,
        "real_tokens": sum(s["real"] for s in per_step),
        "positions": sum(s["length"] * s["batch"] for s in per_step),
        "step_working_bytes": worst["working_bytes"],
        "padded_share": worst["padded_share"],
        "peak_in_padded_step": bool(at_peak),
        "min_ratio": min_ratio,
    }
    # The padded ids and mask are the mistake: the lines that built them come first (a tokenizer list
    # turned into a tensor); inputs built outside torch carry no line, and diagnose() then names the
    # call that fed them. The lines holding the most at the peak follow (the call, by its caller).
    shown = at_peak[0] if at_peak else worst
    # the inputs along the padded positions (the ids, the mask), not the heaviest ones (pixels), and
    # where their width was chosen (``target_len = CONFIG["max_length"]`` before ``torch.full``)
    made = input_lines(trace, int(shown["start_us"]), ctx.analysis.free_index, along=int(shown["length"]))
    width = size_line(made[0].file, made[0].line) if made else None
    if width is not None:
        made = [LineBytes(width.file, width.line, width.what, 0, 0), *made]
    # Where the width is chosen comes first: the call that passes padding="max_length" / max_length=.
    begun = [st for st in ctx.analysis.steps if st.start_us <= int(shown["start_us"])]  # the call it fed
    site = max(begun, key=lambda st: st.start_us).call_site if begun else None
    if site:
        call = parse_line(site)
        chosen = argument_line(call.file, call.line, _PADDING_KEYWORDS)
        if chosen is not None:
            made = [LineBytes(chosen.file, chosen.line, chosen.what, 0, 0), *made]
        elif (
            made
            and made[0].function != call.function
            and any(c.line == call.line for c in call_lines(call.file, made[0].function))
        ):  # model(**collate(rows)): the batch is asked for where the model is called
            made = [LineBytes(call.file, call.line, call.function, 0, 0), *made]
    gain = f"saves {format_bytes(wasted)}" + (
        " at the peak" if at_peak else " in each padded forward, its backward too"
    )
    fix = (
        f"The batches are padded to {', '.join(map(str, lengths))} positions outside torch (tokenizer or collator "
        f"padding='max_length'), but their longest row has {longest} tokens: pad each batch to its longest sequence "
        f"(tokenizer(..., padding='longest') / DataCollatorWithPadding), or sort by length into buckets; {gain}."
    )
    return [
        Finding(
            pattern="alignment-padding",
            severity=severity,
            bytes_at_peak=peak_added,
            wasted_bytes=int(wasted),
            where="inputs: attention_mask padding",
            evidence=evidence,
            fix=fix,
            peak_added_bytes=int(peak_added),
            allocated_bytes=int(sum(s["waste_bytes"] for s in per_step)),
            lines=merge_lines(made, ctx.analysis.lines_at(p, 3)) if made else [],
            change=Change(scale_rows=np.concatenate(scale_rows), scale=np.concatenate(scale)),
        )
    ]
