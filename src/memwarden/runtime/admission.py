"""Admission control: predict a request's peak before it runs, decide whether it may.

The prediction comes from the estimate machinery: the session's own forward (its paged
cache included) runs on a meta-device twin of the model under ``MetaCapture``, which records
every allocation a real run would make without touching memory. A meta forward costs tens of
milliseconds, too much to pay per chat turn, so the predictor calibrates a line per media
signature and interpolates:

- text prefill of ``n`` new tokens over ``total`` tokens:
  ``act(n, total) = a + b·n + d·total + c·n·total``, a least-squares fit to five meta prefills
  made once per session (``d``: per cached token — the gathered K/V and what attention makes of
  them; ``c``: attention scores, where the kernel materialises them);
- a prefill that carries media is measured once per media signature (shapes and dtypes of
  the media tensors, the count of new tokens) and extended by ``b`` per extra text token;
- a decode step is a prefill of one token over the full length.

Bytes already held (resident weights, the KV pool, cached encoder outputs) are counted by
the session; the predictor returns only the transient bytes above them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from memwarden.errors import MemwardenError
from memwarden.runtime.kvcache import KVPool, KVSpec, PagedCache, Sequence, cache_keyword

# (new tokens, total tokens) of the calibration prefills: short and long prompts, short turns over long histories
_CALIBRATION_POINTS = ((16, 16), (80, 80), (16, 160), (48, 304), (128, 128))
_MARGIN = 1.10  # meta runs are exact for the ops they see; the margin covers the fit and allocator rounding


@dataclass
class Decision:
    """What admission control decided for one request, and why (reported in stats and traces)."""

    action: str  # "admit" | "wait" | "degrade" | "reject"
    predicted_peak_bytes: int
    budget_bytes: int
    reason: str
    changes: list[str] = field(default_factory=list)
    waited_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "budget_bytes": self.budget_bytes,
            "reason": self.reason,
            "changes": list(self.changes),
            "waited_s": round(self.waited_s, 4),
        }


class AdmissionError(MemwardenError, RuntimeError):
    """A request that cannot run within the budget even after every allowed change."""


def _least_squares(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least-squares coefficients of ``rows @ x ≈ ys`` (a few rows, four columns), in plain Python.

    Not numpy's lstsq: its BLAS (OpenBLAS) maps per-thread buffers on first use and, under an
    address-space limit (``RLIMIT_AS``) it cannot map them in, aborts the process instead of raising —
    admission must be able to refuse there. Columns are scaled to 1 before the normal equations are
    solved (Gaussian elimination with partial pivoting) to keep them well conditioned."""
    cols = len(rows[0])
    scale = [max(abs(r[j]) for r in rows) or 1.0 for j in range(cols)]
    x_rows = [[r[j] / scale[j] for j in range(cols)] for r in rows]
    # (AᵀA | Aᵀy)
    m = [
        [sum(r[i] * r[j] for r in x_rows) for j in range(cols)]
        + [sum(r[i] * y for r, y in zip(x_rows, ys, strict=True))]
        for i in range(cols)
    ]
    for i in range(cols):
        pivot = max(range(i, cols), key=lambda k: abs(m[k][i]))
        m[i], m[pivot] = m[pivot], m[i]
        if abs(m[i][i]) < 1e-12:  # a column the points do not determine: leave its coefficient at 0
            m[i] = [0.0] * i + [1.0] + [0.0] * (cols - i - 1) + [0.0]
            continue
        for k in range(cols):
            if k != i and m[k][i] != 0.0:
                f = m[k][i] / m[i][i]
                m[k] = [a - f * b for a, b in zip(m[k], m[i], strict=True)]
    return [m[i][cols] / m[i][i] / scale[i] for i in range(cols)]


class PeakPredictor:
    """Transient (activation) bytes of the session's prefill and decode steps."""

    def __init__(self, model: torch.nn.Module, spec: KVSpec) -> None:
        self.model = model
        self.spec = spec
        self._meta: torch.nn.Module | None = None
        self._line: tuple[float, float, float, float] | None = None  # (a, b, d, c) of text prefill
        self._media: dict[tuple[Any, ...], tuple[int, int]] = {}  # signature -> (bytes, new tokens)
        self.meta_runs = 0

    @property
    def gather_bytes_per_token(self) -> int:
        """One layer's K and V gathered out of the pool, per token (the paged cache's temporary)."""
        return self.spec.bytes_per_token // self.spec.num_layers

    def _meta_model(self) -> torch.nn.Module:
        if self._meta is None:
            from memwarden.record.meta.capture import build_meta_model

            dtype = next((p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.float32)
            self._meta = build_meta_model(self.model.config, dtype=dtype, model_class=type(self.model).__name__)
        return self._meta

    def _measure(self, input_ids: torch.Tensor, media: dict[str, Any], cached_tokens: int) -> int:
        """Transient bytes of one meta forward of ``input_ids`` after ``cached_tokens`` of cache."""
        from memwarden.analyze.timeline import summary
        from memwarden.record.meta.capture import MetaCapture, meta_inputs

        model: Any = self._meta_model()  # a transformers model: generate() is not nn.Module's
        total = cached_tokens + input_ids.shape[1]
        pool = KVPool(self.spec, num_blocks=max(1, math.ceil(total / self.spec.block_size)), device="meta")
        blocks = pool.blocks.allocate("calibration", [0] * total, register=False)
        seq = Sequence(pool, "calibration", blocks.block_ids, num_cached_tokens=cached_tokens)
        inputs = meta_inputs({"input_ids": input_ids, **media})
        kwargs: dict[str, Any] = {"do_sample": False, "num_beams": 1, "eos_token_id": None, "pad_token_id": 0}
        full_ids = torch.zeros((1, total), dtype=input_ids.dtype)
        full_ids[:, cached_tokens:] = input_ids
        inputs["input_ids"] = full_ids
        inputs["attention_mask"] = torch.ones_like(full_ids)
        with MetaCapture(model, inputs) as cap, torch.inference_mode():
            model.generate(**inputs, **{cache_keyword(model): PagedCache(seq)}, max_new_tokens=1, **kwargs)
        self.meta_runs += 1
        assert cap.trace is not None  # set when the capture exits
        s = summary(cap.trace)
        held = s.by_category_at_peak.get("weight", 0) + s.by_category_at_peak.get("buffer", 0)
        held += s.by_category_at_peak.get("input", 0)
        return max(0, s.peak_bytes - held)

    def _text_line(self) -> tuple[float, float, float, float]:
        """(a, b, d, c) of ``act(n, total) = a + b·n + d·total + c·n·total`` (n new tokens over total),
        a least-squares fit to meta prefills at a few (n, total) points, made once per session."""
        if self._line is None:
            rows, ys = [], []
            for n, total in _CALIBRATION_POINTS:
                ids = torch.full((1, n), 5, dtype=torch.long)
                ys.append(float(self._measure(ids, {}, total - n)))
                rows.append([1.0, float(n), float(total), float(n * total)])
            a, b, d, c = (max(0.0, x) for x in _least_squares(rows, ys))
            self._line = (a, b, d, c)
        return self._line

    @property
    def per_token_bytes(self) -> float:
        """Transient bytes one more prefilled token costs (the fit's ``b``)."""
        return self._text_line()[1]

    @staticmethod
    def media_signature(media: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(sorted((k, tuple(v.shape), str(v.dtype)) for k, v in media.items() if isinstance(v, torch.Tensor)))

    def prefill_bytes(self, input_ids: torch.Tensor, media: dict[str, Any], cached_tokens: int) -> int:
        """Transient bytes of prefilling ``input_ids`` (the new tokens) over ``cached_tokens``."""
        n = int(input_ids.shape[1])
        a, b, d, c = self._text_line()
        total = cached_tokens + n
        if media:
            sig = self.media_signature(media) + (n,)
            if sig not in self._media:
                self._media[sig] = (self._measure(input_ids, media, cached_tokens), cached_tokens)
            measured, at_cached = self._media[sig]
            return int(_MARGIN * (measured + (d + c * n) * max(0, cached_tokens - at_cached)))
        return int(_MARGIN * (a + b * n + d * total + c * n * total))

    def decode_bytes(self, total_tokens: int) -> int:
        a, b, d, c = self._text_line()
        return int(_MARGIN * (a + b + (d + c) * total_tokens))

    def request_bytes(self, input_ids: torch.Tensor, media: dict[str, Any], cached_tokens: int, new_tokens: int) -> int:
        total = cached_tokens + int(input_ids.shape[1]) + new_tokens
        return max(self.prefill_bytes(input_ids, media, cached_tokens), self.decode_bytes(total))
