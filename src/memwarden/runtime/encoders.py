"""Encoder output cache: the same picture or clip is encoded once.

The session wraps the forward of a model's media encoders (vision tower, audio tower) on the
instance, not the class: a call whose tensor inputs have a fingerprint seen before returns
the stored output instead of running the encoder. This serves the case prefix reuse cannot:
the same image after a *different* prefix (another system prompt, another conversation).
The store is anything with ``get(fingerprint)`` / ``put(fingerprint, value)`` — a dict-backed
LRU here, the tiered feature cache (``runtime/featcache.py``) where one is configured.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from memwarden.record.inputs import tensor_digest

# Attribute names of media encoders in transformers VLMs / audio-LMs (on the model or its .model).
ENCODER_ATTRS = ("vision_tower", "vision_model", "visual", "audio_tower", "audio_model", "image_encoder")


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    if hasattr(value, "to_tuple"):
        return sum(_nbytes(v) for v in value.to_tuple())
    return 0


class LRUStore:
    """In-memory encoder outputs, least recently used dropped first beyond ``capacity_bytes``."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.entries: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self.nbytes = 0
        self.hits = self.misses = self.evictions = 0

    def get(self, key: str) -> Any | None:
        entry = self.entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self.entries.move_to_end(key)
        self.hits += 1
        return entry[0]

    def put(self, key: str, value: Any) -> None:
        size = _nbytes(value)
        if size > self.capacity_bytes:
            return
        if key in self.entries:
            self.nbytes -= self.entries.pop(key)[1]
        self.entries[key] = (value, size)
        self.nbytes += size
        while self.nbytes > self.capacity_bytes:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.nbytes -= dropped
            self.evictions += 1

    def clear(self) -> None:
        self.entries.clear()
        self.nbytes = 0


def _fresh(value: Any) -> Any:
    """A shallow copy of a cached output: callers may reassign its fields (Qwen2-VL splits
    ``pooler_output`` in place), which must not change what the cache holds."""
    if isinstance(value, dict):
        try:
            return type(value)(**value)
        except TypeError:
            return dict(value)
    if isinstance(value, list):
        return list(value)
    return value


def _call_key(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(name.encode())
    for value in list(args) + sorted(kwargs.items(), key=lambda kv: kv[0]):
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
            h.update(value[0].encode())
            value = value[1]
        if isinstance(value, torch.Tensor):
            h.update(str((tuple(value.shape), str(value.dtype))).encode())
            h.update(tensor_digest(value))
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


def find_encoders(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    found: dict[str, torch.nn.Module] = {}
    for owner_name, owner in (("", model), ("model.", getattr(model, "model", None))):
        if not isinstance(owner, torch.nn.Module):
            continue
        for attr in ENCODER_ATTRS:
            module = getattr(owner, attr, None)
            if isinstance(module, torch.nn.Module) and module not in found.values():
                found[owner_name + attr] = module
    return found


class EncoderCache:
    """Installs the caching wrapper on a model's encoders; ``remove()`` restores them."""

    def __init__(self, model: torch.nn.Module, store: Any, on_event: Callable[[str, str], None] | None = None) -> None:
        self.store = store
        self.on_event = on_event
        self.hits = self.misses = 0
        self.encoder_s = 0.0  # time spent encoding (misses): the encoder's share of a request's latency
        self._wrapped: list[torch.nn.Module] = []
        for name, module in find_encoders(model).items():
            self._wrap(name, module)

    @property
    def encoder_names(self) -> list[str]:
        return [getattr(m, "_memwarden_encoder_name", "?") for m in self._wrapped]

    def _wrap(self, name: str, module: torch.nn.Module) -> None:
        original = module.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            key = _call_key(name, args, kwargs)
            cached = self.store.get(key)
            if cached is not None:
                self.hits += 1
                if self.on_event:
                    self.on_event("hit", name)
                return _fresh(cached)
            self.misses += 1
            t0 = time.perf_counter()
            out = original(*args, **kwargs)
            self.encoder_s += time.perf_counter() - t0
            self.store.put(key, _fresh(out))
            if self.on_event:
                self.on_event("miss", name)
            return out

        module._memwarden_encoder_name = name  # type: ignore[assignment]
        module.forward = forward
        self._wrapped.append(module)

    def remove(self) -> None:
        for module in self._wrapped:
            if "forward" in vars(module):
                del module.forward
        self._wrapped.clear()
