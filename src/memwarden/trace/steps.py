"""Steps: one record per root call of the model (a prefill, a decode step, a training step).

A capture writes them into the trace's metadata as ``metadata["steps"]`` (plain JSON, so the
``.mwtrace`` format keeps them without a new column); every reader gets them back through
``steps_of``, which validates each field once, so analyses never parse untrusted dicts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from memwarden.trace.model import Trace

__all__ = ["Step", "steps_metadata", "steps_of"]


@dataclass(frozen=True, kw_only=True)
class Step:
    """One root call: its phase name, time span, sequence length and what its input held."""

    phase: str  # an enum_name(Phase): "prefill", "decode", "backward", ...
    start_us: int
    end_us: int
    module: str = "model"  # the root module's path
    seq_len: int | None = None  # tokens fed in this call
    batch: int | None = None
    tokens: dict[str, int] = field(default_factory=dict)  # tokens fed, by modality: {"vision": n, "text": m}
    input_ids: tuple[int, ...] = ()  # the first ids of the first row (a prefix, for re-prefill detection)
    grad: bool | None = None  # autograd recording when the call began (None: the trace does not say)
    # The user's line that made the call ("file:line:function", memwarden.trace.sites): a model's
    # forward is often the user's code too, and a block it allocates is then kept by this line.
    call_site: str | None = None
    # short digests of the media items it was sent, in order (each image, frame or audio row)
    media_digests: tuple[str, ...] = ()

    @property
    def media_repeat(self) -> int:
        """How many times the most repeated media item was sent (one chart with six questions: 6)."""
        counts: dict[str, int] = {}
        for item in self.media_digests:
            counts[item] = counts.get(item, 0) + 1
        return max(counts.values(), default=1)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.phase,
            "start_us": self.start_us,
            "end_us": self.end_us,
            "seq_len": self.seq_len,
            "module": self.module,
        }
        if self.tokens:
            out["tokens"] = dict(self.tokens)
        if self.batch is not None:
            out["batch"] = self.batch
        if self.input_ids:
            out["input_ids"] = list(self.input_ids)
        if self.grad is not None:
            out["grad"] = self.grad
        if self.call_site is not None:
            out["call_site"] = self.call_site
        if self.media_digests:
            out["media_digests"] = list(self.media_digests)
        return out


def steps_metadata(steps: Iterable[Step]) -> list[dict[str, Any]]:
    """The JSON form stored as ``metadata["steps"]``."""
    return [s.to_json() for s in steps]


def steps_of(trace: Trace) -> list[Step]:
    """The trace's steps in start order; an entry that is not a well-formed step is skipped (a
    hand-edited or hostile file must not crash an analysis)."""
    raw = trace.metadata.get("steps")
    if not isinstance(raw, list):
        return []
    out = [step for step in (_parse(item) for item in raw) if step is not None]
    return sorted(out, key=lambda s: s.start_us)


def _int(value: Any) -> int | None:
    """An integer that fits int64 (what the detectors' arrays hold), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = int(value)
    except (OverflowError, ValueError):  # inf, nan
        return None
    return number if -(2**63) <= number < 2**63 else None


def _parse(item: Any) -> Step | None:
    if not isinstance(item, dict):
        return None
    start, end = _int(item.get("start_us")), _int(item.get("end_us"))
    phase = item.get("phase")
    if start is None or end is None or not isinstance(phase, str):
        return None
    tokens_raw = item.get("tokens")
    tokens = {}
    if isinstance(tokens_raw, dict):
        tokens = {str(k): v for k, v in ((k, _int(v)) for k, v in tokens_raw.items()) if v is not None}
    ids_raw = item.get("input_ids")
    ids: tuple[int, ...] = ()
    if isinstance(ids_raw, list):
        parsed = [_int(x) for x in ids_raw]
        ids = tuple(x for x in parsed if x is not None)
    module = item.get("module")
    grad = item.get("grad")
    items_raw = item.get("media_digests")
    call_site = item.get("call_site")
    return Step(
        phase=phase,
        start_us=start,
        end_us=end,
        module=module if isinstance(module, str) else "model",
        seq_len=_int(item.get("seq_len")),
        batch=_int(item.get("batch")),
        tokens=tokens,
        input_ids=ids,
        grad=grad if isinstance(grad, bool) else None,
        call_site=call_site if isinstance(call_site, str) and call_site.count(":") >= 2 else None,
        media_digests=tuple(x for x in items_raw if isinstance(x, str)) if isinstance(items_raw, list) else (),
    )
