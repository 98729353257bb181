"""Admission control: predict a request's peak before it runs, decide whether it may.

The prediction comes from the estimate machinery: the session's own forward (its paged
cache included) runs on a meta-device twin of the model under ``MetaCapture``, which records
every allocation a real run would make without touching memory. A meta forward costs tens of
milliseconds, too much to pay per chat turn, so the predictor calibrates a line per media
signature and interpolates:

- text prefill of ``n`` new tokens over ``total`` tokens:
  ``act(n, total) = a + b·n + c·n·total + g·total``, where ``g`` (one layer's gathered K and V
  per token) is known exactly and ``a``, ``b``, ``c`` come from three meta runs made once per
  session (``c``: attention scores, where the kernel materialises them);
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

from memwarden.runtime.kvcache import KVPool, KVSpec, PagedCache, Sequence

_CALIBRATION_TOKENS = (16, 80)
_MARGIN = 1.05  # meta runs are exact for the ops they see; the margin covers allocator rounding


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


class AdmissionError(RuntimeError):
    """A request that cannot run within the budget even after every allowed change."""


class PeakPredictor:
    """Transient (activation) bytes of the session's prefill and decode steps."""

    def __init__(self, model: torch.nn.Module, spec: KVSpec) -> None:
        self.model = model
        self.spec = spec
        self._meta: torch.nn.Module | None = None
        self._line: tuple[float, float, float] | None = None  # (a, b, c) of text prefill
        self._media: dict[tuple[Any, ...], tuple[int, int]] = {}  # signature -> (bytes, new tokens)
        self.meta_runs = 0

    @property
    def gather_bytes_per_token(self) -> int:
        """One layer's K and V gathered out of the pool, per token (the paged cache's temporary)."""
        return self.spec.bytes_per_token // self.spec.num_layers

    def _meta_model(self) -> torch.nn.Module:
        if self._meta is None:
            from memwarden.trace.meta import build_meta_model

            dtype = next((p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.float32)
            self._meta = build_meta_model(self.model.config, dtype=dtype, model_class=type(self.model).__name__)
        return self._meta

    def _measure(self, input_ids: torch.Tensor, media: dict[str, Any], cached_tokens: int) -> int:
        """Transient bytes of one meta forward of ``input_ids`` after ``cached_tokens`` of cache."""
        from memwarden.analyze.timeline import summary
        from memwarden.trace.meta import MetaCapture, meta_inputs

        model = self._meta_model()
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
            model.generate(**inputs, cache=PagedCache(seq), max_new_tokens=1, **kwargs)
        self.meta_runs += 1
        s = summary(cap.trace)
        held = s.by_category_at_peak.get("weight", 0) + s.by_category_at_peak.get("buffer", 0)
        held += s.by_category_at_peak.get("input", 0)
        return max(0, s.peak_bytes - held)

    def _text_line(self) -> tuple[float, float, float]:
        """(a, b, c) of ``act(n, total) = a + b·n + c·n·total + g·total`` from three meta prefills:
        ``b`` grows with the new tokens (hidden states, MLP), ``c`` with new x all tokens (attention
        scores where the kernel materialises them), ``g`` (the gathered K/V) is known exactly."""
        if self._line is None:
            g = self.gather_bytes_per_token
            n1, n2 = _CALIBRATION_TOKENS
            ids = torch.full((1, n2), 5, dtype=torch.long)
            m1 = self._measure(ids[:, :n1], {}, 0) - g * n1  # n1 new of n1
            m2 = self._measure(ids, {}, 0) - g * n2  # n2 new of n2
            m3 = self._measure(ids[:, :n1], {}, n2 - n1) - g * n2  # n1 new of n2
            c = max(0.0, (m3 - m1) / (n1 * (n2 - n1)))
            b = max(0.0, (m2 - m1 - c * (n2 * n2 - n1 * n1)) / (n2 - n1))
            a = max(0.0, m1 - b * n1 - c * n1 * n1)
            self._line = (a, b, c)
        return self._line

    @staticmethod
    def media_signature(media: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(sorted((k, tuple(v.shape), str(v.dtype)) for k, v in media.items() if isinstance(v, torch.Tensor)))

    def prefill_bytes(self, input_ids: torch.Tensor, media: dict[str, Any], cached_tokens: int) -> int:
        """Transient bytes of prefilling ``input_ids`` (the new tokens) over ``cached_tokens``."""
        n = int(input_ids.shape[1])
        a, b, c = self._text_line()
        g = self.gather_bytes_per_token
        total = cached_tokens + n
        if media:
            sig = self.media_signature(media) + (n,)
            if sig not in self._media:
                self._media[sig] = (self._measure(input_ids, media, cached_tokens), cached_tokens)
            measured, at_cached = self._media[sig]
            return int(_MARGIN * (measured + (g + c * n) * max(0, cached_tokens - at_cached)))
        return int(_MARGIN * (a + b * n + c * n * total + g * total))

    def decode_bytes(self, total_tokens: int) -> int:
        a, b, c = self._text_line()
        return int(_MARGIN * (a + b + (c + self.gather_bytes_per_token) * total_tokens))

    def request_bytes(self, input_ids: torch.Tensor, media: dict[str, Any], cached_tokens: int, new_tokens: int) -> int:
        total = cached_tokens + int(input_ids.shape[1]) + new_tokens
        return max(self.prefill_bytes(input_ids, media, cached_tokens), self.decode_bytes(total))
