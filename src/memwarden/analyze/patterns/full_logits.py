"""full-logits: logits over the whole vocabulary for every prompt position, where one is read.

``model(**inputs).logits[:, -1]`` computes a (batch, seq, vocab) float tensor to read its last row:
for a 2,000-token multimodal prompt and a 150k vocabulary that is 1.2 GB in fp32, more than the KV
cache. ``generate`` asks for the last position only (``logits_to_keep=1``); a hand-written
prefill, a scoring loop or a classification head on a causal LM does not.

What the trace shows: a float block made by a root call with no autograd, shaped ``(..., seq,
vocab)`` with ``seq >= min_positions`` (16) and ``vocab`` the output size of the largest weight
(the LM head), that nothing reads in full: no block of at least half its elements is made while it
lives (a loss, ``log_softmax`` or a full ``.float()`` copy would be), and what the script makes
from it after the call shows one position read (a block without the sequence axis: ``logits[:,
-1].softmax(-1)`` is (B, V)), or none (the logits freed unread before the next call: a policy
that reads a causal LM's ``hidden_states`` pays for the LM head over every position); a block along
every position reads them all, and logits kept past the call with nothing made from them say
nothing. Only blocks made from the logits count: along the vocabulary, or reduced over it. A training step or a perplexity evaluation needs every position and makes such blocks.

The fix as a change: the logits block made for one position (``logits_to_keep=1`` in
``forward``, or ``model.model(...)`` then ``lm_head`` on ``hidden[:, -1:]``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from memwarden.analyze.counterfactual import Change
from memwarden.analyze.finding import Context, Finding
from memwarden.analyze.lines import lines_of_rows, merge_lines
from memwarden.trace.model import Action, Category, Trace
from memwarden.units import format_bytes

PATTERN = "full-logits"
# ops that make a tensor from nothing (the next request's ids): no read of the logits
_FACTORIES = (
    "aten::rand",
    "aten::empty",
    "aten::zeros",
    "aten::ones",
    "aten::full",
    "aten::arange",
    "aten::tensor",
    "aten::lift",
    "aten::scalar_tensor",
    "aten::normal",
    "aten::bernoulli",
)


# ops that assemble a tensor from others (the next request's ids joined, copied or moved): no reduction
_ASSEMBLY = frozenset(
    {
        "aten::cat",
        "aten::stack",
        "aten::concat",
        "aten::concatenate",
        "aten::_to_copy",
        "aten::copy_",
        "aten::clone",
        "aten::pad",
        "aten::constant_pad_nd",
    }
)


def _vocab_sizes(trace: Trace) -> set[int]:
    """Output sizes of the weights a logits row could come from: the largest 2-D weights' rows."""
    e = trace.events
    rows = np.flatnonzero((e["category"] == Category.WEIGHT) & (e["action"] != Action.FREE) & (e["shape"] >= 0))
    sizes: dict[int, int] = {}
    for r in rows.tolist():
        shape = trace.shapes[int(e["shape"][r])]
        if len(shape) == 2:
            sizes[shape[0]] = max(sizes.get(shape[0], 0), int(e["nbytes"][r]))
    if not sizes:
        return set()
    biggest = max(sizes.values())
    return {v for v, nbytes in sizes.items() if nbytes >= 0.5 * biggest and v >= 1000}


def detect(ctx: Context) -> list[Finding]:
    trace = ctx.trace
    min_positions = int(ctx.threshold(PATTERN, "min_positions", 16))
    # A prefill that decode steps follow is a generation: its logits are the library's to slice
    # (transformers' generate asks for one position where the model supports logits_to_keep), not a
    # line of the user's; the pattern is about a forward the user calls and reads one row of.
    all_steps = ctx.analysis.steps
    generating = {i for i, s in enumerate(all_steps[:-1]) if all_steps[i + 1].phase == "decode"}
    steps = [s for i, s in enumerate(all_steps) if s.grad is False and s.phase != "decode" and i not in generating]
    n = trace.num_events
    if not steps or not n:
        return []
    vocab = _vocab_sizes(trace)
    if not vocab:
        return []
    e = trace.events
    times = e["time_us"]
    free = ctx.analysis.free_index
    is_float = np.array([s.startswith(("float", "bfloat")) for s in trace.strings] + [False])
    logits_shape = np.array([len(s) >= 3 and s[-1] in vocab and s[-2] >= min_positions for s in trace.shapes] + [False])
    numel = np.array([math.prod(s) if s else 0 for s in trace.shapes] + [0], dtype=np.int64)[e["shape"]]
    cand = np.flatnonzero((e["action"] == Action.ALLOC) & logits_shape[e["shape"]] & is_float[e["dtype"]])
    starts = np.array([s.start_us for s in steps], dtype=np.int64)
    ends = np.array([s.end_us for s in steps], dtype=np.int64)
    k = np.searchsorted(starts, times[cand], side="right") - 1
    cand = cand[(k >= 0) & (times[cand] <= ends[np.maximum(k, 0)])]  # made by a no-grad prefill/forward
    found: list[int] = []  # the logits blocks and the copies made from them
    positions: list[int] = []
    heads: list[int] = []  # the logits blocks alone (the calls that made them)
    all_starts = np.array(sorted(st.start_us for st in ctx.analysis.steps), dtype=np.int64)
    all_ends = np.array(sorted(st.end_us for st in ctx.analysis.steps), dtype=np.int64)

    def end_of_step(row: int) -> int:
        """Rows after the call that made ``row`` has returned start here (the script's own reads)."""
        k = int(np.searchsorted(all_ends, times[row], side="left"))
        return n if k >= len(all_ends) else int(np.searchsorted(times, all_ends[k], side="right"))

    for r in cand.tolist():
        # read in full? a block of half its elements or more made after it, while it lives and before
        # the next call (a loss, a log_softmax, a full .float() copy)
        nxt = all_starts[all_starts > times[r]]
        until = int(np.searchsorted(times, nxt[0], side="left")) if len(nxt) else n
        later = np.arange(r + 1, min(int(free[r]), until))
        later = later[e["action"][later] == Action.ALLOC]
        # Same-shaped float copies made from them (``log_softmax``, ``softmax``, ``.float()`` of the
        # whole tensor) carry every position on: what is made from the copies decides, and they go
        # with the logits when one position is asked for.
        copies = later[(e["shape"][later] == e["shape"][r]) & is_float[e["dtype"][later]]]
        if np.any(numel[np.setdiff1d(later, copies)] >= numel[r] // 2):
            continue
        if len(copies):
            later = np.arange(r + 1, min(max(int(free[r]), int(free[copies].max())), until))
            later = later[(e["action"][later] == Action.ALLOC) & ~np.isin(later, copies)]
        later = later[later >= end_of_step(r)]
        # ... or one position? What the script makes from the logits must show it: a block without
        # the sequence axis (``logits[:, -1].softmax(-1)``: (B, V); ``.argmax(-1)`` of it: (B,)).
        # A block along every position (``logits.argmax(-1)``: (B, T)) reads them all; nothing made
        # at all (only a shape printed, the logits kept) says nothing, and nothing is said.
        shape = trace.shapes[int(e["shape"][r])]
        made_after = [
            (trace.shapes[int(k)], trace.string(int(op)) or "")
            for k, op in zip(e["shape"][later].tolist(), e["op"][later].tolist(), strict=True)
            if k >= 0 and not (trace.string(int(op)) or "").startswith(_FACTORIES)
        ]
        # Only blocks that come from the logits tell how they were read: along the vocabulary
        # (last axis the vocab) or reduced over it (the logits' shape less the vocab axis: (B, T) of
        # every position, (B,) of one: ``logits[:, -1].argmax(-1)``). Hidden
        # states pooled over every position, (B, T, hidden), say nothing about the logits, and
        # neither does the next batch's ids joined or copied to the same (B, T).
        read = [
            m
            for m, op in made_after
            if (m and m[-1] == shape[-1])
            or (tuple(m) in (tuple(shape[:-1]), tuple(shape[:-2])) and op not in _ASSEMBLY)
            # a few entries of every position (``logp.gather(-1, targets[..., None])``, a top-k)
            or (len(m) == len(shape) and tuple(m[:-1]) == tuple(shape[:-1]) and m[-1] <= 16 and op not in _ASSEMBLY)
        ]
        if any(shape[-2] in m for m in read):
            continue
        if not read and int(free[r]) >= until:
            continue  # nothing made from them and kept past the call: read later, or returned; nothing said
        # one position read, or none at all (computed and dropped unread: a policy that reads the
        # hidden states of a causal LM's forward pays for its LM head over every position)
        heads.append(r)
        for row in [r, *copies.tolist()]:
            found.append(row)
            positions.append(int(shape[-2]))
    if not found:
        return []
    rows = np.array(found, dtype=np.int64)
    pos = np.array(positions, dtype=np.float64)
    change = Change(scale_rows=rows, scale=1.0 / pos)
    nbytes = int(e["nbytes"][rows].sum())
    # the user's innermost line that ran the LM head (a policy's ``self.vlm(...)`` inside its forward)
    # first, then the script's call of the root model
    calls = len(heads)
    head_rows = np.array(heads, dtype=np.int64)
    made = lines_of_rows(trace, head_rows, limit=2, callers=False) + lines_of_rows(trace, head_rows, limit=2)
    evidence: dict[str, Any] = {
        "logits_blocks": calls,
        "full_copies": len(rows) - calls,
        "logits_bytes": nbytes,
        "positions": sorted(set(positions))[:8],
        "vocab": sorted(vocab)[:4],
        "largest_shape": list(trace.shapes[int(e["shape"][rows[np.argmax(e["nbytes"][rows])]])]),
    }
    fix = (
        f"ask for the logits of the positions you read: model(**inputs, logits_to_keep=1) (num_logits_to_keep in "
        f"older transformers), or run model.model(...) and apply lm_head to hidden[:, -1:]: {calls} calls made "
        f"{format_bytes(nbytes)} of (batch, {max(positions)}, {max(vocab)}) logits"
        + (
            f" and full copies of them ({len(rows) - calls}: softmax, log_softmax, .float())"
            if len(rows) > calls
            else ""
        )
        + " to read one position"
    )
    return [
        Finding(
            pattern=PATTERN,
            severity="high",
            bytes_at_peak=0,
            wasted_bytes=nbytes,
            where=steps[0].module,
            evidence=evidence,
            fix=fix,
            lines=merge_lines(made),
            change=change,
        )
    ]
