"""The tiered feature cache as the session's encoder cache, keyed by the encoder's contract.

vLLM's encoder cache keys features by the media hash alone, and a disk cache keyed only on
the input served stale embeddings after a model switch. Here every key is
``BLAKE2b(contract digest, media key)``, where the contract is everything the features depend
on besides the pixels: the encoders' weights (a digest of their bytes, LoRA adapters on them
included), the processor's preprocessing parameters, the encoders' dtypes and the image-size
policy (resize, crop, min/max pixels, patch size). Swap an encoder, load an adapter into it,
change the processor or the dtype, and every old entry stops matching: zero stale hits, and
the old entries age out of both tiers by TTL and LRU.

The weights digest is recomputed only when the weights may have changed: each lookup reads a
cheap token per encoder parameter (identity, storage pointer, autograd version counter — which
``copy_``, ``load_state_dict`` and :class:`AdapterSlot` swaps bump — and a strided sample of
values, which catches writes through ``.data`` that bypass the counter) and rehashes when it
moves. ``adapters`` adds the content digest of LoRA slots explicitly. ``refresh()`` forces it.

:class:`TieredEncoderStore` is what ``GovernedSession(encoder_cache=...)`` accepts
(``get``/``put``/``clear``/``nbytes``): encoder outputs (tensors, tuples, transformers
``ModelOutput``) are flattened to tensors plus a structure record for the cache and rebuilt on a
hit; ``clear()`` (memory pressure) drops L1 only, disk stays. ``manifest()`` lists the media keys
seen, with the contract, so another process (or the same device after a restart) can
``prewarm`` exactly those and serve them without running the encoder.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from memwarden.record.inputs import host_array
from memwarden.runtime.encoders import find_encoders
from memwarden.runtime.featcache import FeatureCache, FeatureValue
from memwarden.runtime.lora.slot import AdapterSlot

__all__ = ["TieredEncoderStore", "default_encoder_store", "encoder_contract"]

MANIFEST_FORMAT = "memwarden-prewarm/1"
_SIZE_WORDS = ("size", "pixels", "resize", "crop", "resample", "patch", "pad", "max_image", "image_seq")
_SAMPLES = 16  # values sampled per parameter for the change token
_MAX_NESTING = 32  # an encoder output nests a few levels; deeper is never cached, never rebuilt
_MAX_STRUCTURE_BYTES = 1 << 20


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def preprocessing_of(processor: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(preprocessing parameters, image-size policy) of a transformers processor (or None)."""
    params: dict[str, Any] = {}
    for attr in ("image_processor", "video_processor", "feature_extractor"):
        part = getattr(processor, attr, None)
        to_dict = getattr(part, "to_dict", None)
        if callable(to_dict):
            params[attr] = _jsonable(to_dict())
    if not params and callable(getattr(processor, "to_dict", None)):
        params["processor"] = _jsonable(processor.to_dict())
    policy = {
        f"{part}.{key}": value
        for part, fields in params.items()
        for key, value in (fields.items() if isinstance(fields, dict) else [])
        if any(word in key for word in _SIZE_WORDS)
    }
    return params, policy


def weights_digest(encoders: dict[str, torch.nn.Module]) -> str:
    h = hashlib.blake2b(digest_size=32)
    for name, module in sorted(encoders.items()):
        for pname, t in list(module.named_parameters()) + list(module.named_buffers()):
            h.update(f"{name}.{pname}:{tuple(t.shape)}:{t.dtype}".encode())
            if t.device.type == "meta":  # streamed weights (runtime.offload): no bytes here to hash
                continue
            flat = t.detach().to("cpu").contiguous().reshape(-1)
            h.update(_host_bytes(flat))
    return h.hexdigest()


def _host_bytes(flat: torch.Tensor) -> bytes:
    """A contiguous CPU tensor's bytes, read without ``Tensor.numpy()``: that marks the storage of the
    model's own weights non-resizable for good, which the capture takes for foreign memory (and a
    later ``resize_`` of a weight would fail)."""
    view = host_array(flat.view(torch.uint8)) if flat.numel() else None
    return view.tobytes() if view is not None else b""


def _token(encoders: dict[str, torch.nn.Module]) -> tuple[Any, ...]:
    parts: list[Any] = []
    for name, module in sorted(encoders.items()):
        parts.append((name, id(module)))
        for t in list(module.parameters()) + list(module.buffers()):
            if t.device.type == "meta":
                parts.append((id(t), t.dtype, tuple(t.shape)))
                continue
            flat = t.detach().reshape(-1)
            step = max(1, flat.numel() // _SAMPLES)
            sample = flat[::step][:_SAMPLES].to("cpu").contiguous()
            parts.append((id(t), t.data_ptr(), t._version, t.dtype, tuple(t.shape), _host_bytes(sample)))
    return tuple(parts)


def encoder_contract(
    model: torch.nn.Module, processor: Any = None, adapters: Sequence[AdapterSlot] = ()
) -> dict[str, Any]:
    """What the features of ``model``'s encoders depend on besides the media (see module docstring)."""
    encoders = find_encoders(model)
    params, policy = preprocessing_of(processor)
    dtypes = sorted({str(p.dtype) for m in encoders.values() for p in m.parameters()})
    return {
        "encoders": sorted(encoders),
        "weights_digest": weights_digest(encoders),
        "preprocessing": params,
        "image_size_policy": policy,
        "dtype": dtypes,
        "adapters": [f"{s.manifest.adapter}:{s.content_digest}" for s in adapters],
    }


def _digest(contract: dict[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(contract, sort_keys=True).encode(), digest_size=20).hexdigest()


class TieredEncoderStore:
    """An encoder-cache store over a :class:`FeatureCache` whose keys carry the contract."""

    def __init__(
        self,
        cache: FeatureCache,
        model: torch.nn.Module,
        processor: Any = None,
        *,
        adapters: Sequence[AdapterSlot] = (),
    ) -> None:
        self.cache = cache
        self.model = model
        self.processor = processor
        self.adapters = list(adapters)
        self.contract_changes = 0
        self.unstorable = 0  # outputs with parts that are not tensors, or nested too deep (never cached)
        self.unreadable = 0  # cached values whose structure record could not be rebuilt (dropped, a miss)
        self._seen: dict[str, None] = {}  # media keys put, in order (the prewarm manifest)
        self._token: tuple[Any, ...] | None = None
        self._contract: dict[str, Any] = {}
        self._digest = ""
        self.refresh()

    # -- the contract -------------------------------------------------------------------------

    @property
    def contract(self) -> dict[str, Any]:
        self._check()
        return self._contract

    @property
    def contract_digest(self) -> str:
        self._check()
        return self._digest

    def refresh(self) -> None:
        """Recompute the contract now (after changing weights in a way no token sees)."""
        self._token = (_token(find_encoders(self.model)), tuple(s.content_digest for s in self.adapters))
        contract = encoder_contract(self.model, self.processor, self.adapters)
        digest = _digest(contract)
        if self._digest and digest != self._digest:
            self.contract_changes += 1
        self._contract, self._digest = contract, digest

    def _check(self) -> None:
        token = (_token(find_encoders(self.model)), tuple(s.content_digest for s in self.adapters))
        if token != self._token:
            self.refresh()

    def key(self, media_key: str) -> str:
        return hashlib.blake2b(f"{self.contract_digest}\0{media_key}".encode(), digest_size=20).hexdigest()

    # -- the store protocol ---------------------------------------------------------------------

    def get(self, media_key: str) -> Any | None:
        key = self.key(media_key)
        value = self.cache.get(key)
        if value is None:
            return None
        try:
            return _rebuild(value)
        except Exception:  # a structure record that is not one _flatten wrote: a miss, never an error
            self.cache.invalidate(key)
            self.unreadable += 1
            return None

    def put(self, media_key: str, value: Any) -> None:
        flat = _flatten(value)
        if flat is None:
            self.unstorable += 1
            return
        self.cache.put(self.key(media_key), flat)
        self._seen[media_key] = None

    def clear(self) -> None:
        """Memory pressure: drop the in-memory tier; the disk tier stays."""
        self.cache.clear(l2=False)

    @property
    def nbytes(self) -> int:
        """Bytes held in memory (L1): what the session counts against its budget."""
        return self.cache.stats().l1.bytes

    # -- prewarm ------------------------------------------------------------------------------

    def manifest(self) -> dict[str, Any]:
        """The media keys stored so far, with the contract they were computed under."""
        return {"format": MANIFEST_FORMAT, "contract": self.contract_digest, "media": list(self._seen)}

    def prewarm(self, manifest: dict[str, Any] | Iterable[str]) -> int:
        """Load these media keys' features from L2 into L1. A manifest made under another contract
        loads nothing (its features belong to another encoder). Returns how many were loaded."""
        if isinstance(manifest, dict):
            if manifest.get("format") != MANIFEST_FORMAT or manifest.get("contract") != self.contract_digest:
                return 0
            keys = [str(k) for k in manifest.get("media", [])]
        else:
            keys = [str(k) for k in manifest]
        return self.cache.prewarm(self.key(k) for k in keys)

    def stats(self) -> dict[str, Any]:
        return {
            **self.cache.stats().to_json(),
            "contract": self.contract_digest,
            "contract_changes": self.contract_changes,
            "unstorable": self.unstorable,
            "unreadable": self.unreadable,
        }


# -- encoder outputs <-> tensors ------------------------------------------------------------------


def _flatten(value: Any) -> tuple[torch.Tensor, ...] | None:
    tensors: list[torch.Tensor] = []

    def walk(v: Any, depth: int = 0) -> Any:
        if depth > _MAX_NESTING:
            raise TypeError("nested too deep")
        if isinstance(v, torch.Tensor):
            tensors.append(v.detach())
            return {"t": len(tensors) - 1}
        if v is None or isinstance(v, bool | int | float | str):
            return {"v": v}
        if isinstance(v, dict):  # ModelOutput is an OrderedDict
            cls = type(v)
            return {
                "d": [[str(k), walk(x, depth + 1)] for k, x in v.items()],
                "c": f"{cls.__module__}:{cls.__qualname__}",
            }
        if isinstance(v, list | tuple):
            return {"l" if isinstance(v, list) else "u": [walk(x, depth + 1) for x in v]}
        raise TypeError(type(v).__name__)

    try:
        tree = walk(value)
    except TypeError:
        return None
    structure = torch.frombuffer(bytearray(json.dumps(tree).encode()), dtype=torch.uint8)
    return (structure, *tensors)


def _rebuild(value: FeatureValue) -> Any:
    """The encoder output ``_flatten`` stored. A structure record it did not write (not a uint8
    vector, too large, nested too deep, a node of another shape, a tensor index out of range)
    raises ``ValueError`` (or ``RecursionError`` from the JSON parser), never builds anything else."""
    parts = (value,) if isinstance(value, torch.Tensor) else value
    record = parts[0]
    if record.dtype != torch.uint8 or record.dim() != 1 or record.numel() > _MAX_STRUCTURE_BYTES:
        raise ValueError("not a structure record")
    tree = json.loads(bytes(record.cpu().numpy().tobytes()))
    tensors = parts[1:]

    def build(node: Any, depth: int) -> Any:
        if depth > _MAX_NESTING or not isinstance(node, dict) or len(node) > 2:
            raise ValueError("not a structure node")
        if "t" in node:
            index = node["t"]
            if type(index) is not int or not 0 <= index < len(tensors):
                raise ValueError("tensor index out of range")
            return tensors[index]
        if "v" in node:
            if not (node["v"] is None or isinstance(node["v"], bool | int | float | str)):
                raise ValueError("not a plain value")
            return node["v"]
        if "d" in node:
            pairs = node["d"]
            if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise ValueError("not a field list")
            fields = {str(k): build(x, depth + 1) for k, x in pairs}
            cls = _output_class(str(node.get("c", "")))
            return cls(**fields) if cls is not None else fields
        kind = "l" if "l" in node else "u"
        if not isinstance(node.get(kind), list):
            raise ValueError("not a structure node")
        items = [build(x, depth + 1) for x in node[kind]]
        return items if kind == "l" else tuple(items)

    return build(tree, 0)


def _output_class(spec: str) -> Any:
    """A transformers ``ModelOutput`` class already imported, by ``module:qualname``; else None
    (plain dict). Never imports anything: the name comes from a file other processes can write."""
    module_name, _, qualname = spec.partition(":")
    if not module_name.startswith("transformers.") or "." in qualname:
        return None
    module = sys.modules.get(module_name)
    cls = getattr(module, qualname, None) if module is not None else None
    base = getattr(sys.modules.get("transformers.utils.generic"), "ModelOutput", None)
    return cls if isinstance(cls, type) and base is not None and issubclass(cls, base) else None


def default_encoder_store(model: torch.nn.Module, processor: Any, max_bytes: int) -> TieredEncoderStore:
    """A GovernedSession's encoder cache when none is given: keyed by the encoder's contract (weights
    digest, preprocessing, dtype, size policy), so a swapped encoder or adapter never hits an old entry;
    in memory only (pass a ``TieredEncoderStore`` with a disk tier to keep features across restarts),
    LRU within ``max_bytes``, no expiry."""
    return TieredEncoderStore(FeatureCache(None, l1_max_bytes=max_bytes, l1_ttl_s=float("inf")), model, processor)
