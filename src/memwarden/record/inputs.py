"""What module calls carry: content fingerprints of their tensor inputs, token counts of
root (model) calls, the KV cache in their outputs. Used by live and meta capture."""

from __future__ import annotations

import ctypes
import hashlib
import inspect
import weakref
from typing import Any

import numpy as np
import torch

_FINGERPRINT_FULL_BYTES = 64 * 1024 * 1024  # hash every byte up to this; sample beyond

# Dtypes numpy can view as they are (bfloat16 and the float8s it cannot).
_NUMPY_DTYPES = {
    torch.bool: np.bool_,
    torch.uint8: np.uint8,
    torch.int8: np.int8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.float16: np.float16,
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.complex64: np.complex64,
    torch.complex128: np.complex128,
}


def _memory(address: int, nbytes: int) -> Any:
    """``nbytes`` of host memory at ``address``, as a buffer, read in place."""
    return (ctypes.c_char * nbytes).from_address(address) if nbytes > 0 else b""


def host_array(t: torch.Tensor) -> np.ndarray | None:
    """A numpy view of a CPU tensor's elements, made without ``Tensor.numpy()``, which marks the
    storage non-resizable for good: the capture would change the program it watches (a later
    ``resize_`` of that tensor fails) and take the tensors it read for foreign memory (which
    ``memwarden.record.foreign`` tells apart by that flag). None for a dtype numpy has no view of
    or a tensor without plain strided host memory."""
    np_dtype = _NUMPY_DTYPES.get(t.dtype)
    if np_dtype is None or t.device.type != "cpu" or t.is_meta or t.layout != torch.strided:
        return None
    if t.is_conj() or t.is_neg():
        return None
    item = t.element_size()
    if t.numel() == 0:
        return np.empty(tuple(t.shape), dtype=np_dtype)
    try:
        address = t.data_ptr()
    except RuntimeError:  # a wrapper subclass without storage
        return None
    span = (sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1) * item  # strides are >= 0
    flat: np.ndarray = np.frombuffer(_memory(address, span), dtype=np_dtype)
    return np.lib.stride_tricks.as_strided(flat, tuple(t.shape), tuple(s * item for s in t.stride()), writeable=False)


def tensor_digest(t: torch.Tensor) -> bytes:
    """BLAKE2b of a tensor's shape, dtype and bytes (every byte up to 64 MiB, a strided sample beyond)."""
    h = hashlib.blake2b(digest_size=12)
    if t.device.type == "meta":
        h.update(f"meta{tuple(t.shape)}{t.dtype}".encode())
        return h.digest()
    t = t.detach()
    h.update(f"{tuple(t.shape)}{t.dtype}".encode())
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    flat = t.reshape(-1)
    if flat.numel() * flat.element_size() > _FINGERPRINT_FULL_BYTES:
        step = max(1, flat.numel() // (_FINGERPRINT_FULL_BYTES // flat.element_size()))
        flat = flat[::step]
    flat = flat.cpu().contiguous()
    # The bytes in place, not through ``numpy()``: see ``host_array``.
    h.update(_memory(flat.data_ptr(), flat.numel() * flat.element_size()))
    return h.digest()


class DigestCache:
    """Digests of tensors already hashed, keyed by identity and version.

    generate() passes the same pixel_values to every decode step; hashing them again
    each step cost more than the rest of the capture. A tensor modified in place bumps
    its ``_version``, so a stale digest is never reused.
    """

    def __init__(self, limit: int = 4096) -> None:
        self._cache: dict[tuple[Any, ...], tuple[weakref.ReferenceType[torch.Tensor], bytes]] = {}
        self._limit = limit

    def digest(self, t: torch.Tensor) -> bytes:
        if t.is_inference():  # no version counter to tell a stale digest by (raising costs more)
            return tensor_digest(t)
        try:
            key = (id(t), t.data_ptr(), t._version, tuple(t.shape), tuple(t.stride()), t.dtype)
        except Exception:  # tensors without storage: hash them plainly
            return tensor_digest(t)
        hit = self._cache.get(key)
        if hit is not None and hit[0]() is t:
            return hit[1]
        value = tensor_digest(t)
        if len(self._cache) >= self._limit:
            self._cache.clear()
        try:
            self._cache[key] = (weakref.ref(t), value)
        except TypeError:
            pass
        return value


def fingerprint(values: Any, cache: DigestCache | None = None) -> str | None:
    """Content hash of every tensor in ``values`` (shape, dtype and bytes), in a stable order."""
    h = hashlib.blake2b(digest_size=12)
    seen = 0
    stack = [values]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            h.update(cache.digest(v) if cache is not None else tensor_digest(v))
            seen += 1
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed(v))
        elif isinstance(v, dict):
            stack.extend(v[k] for k in sorted(v, key=str) if k not in _CACHE_KEYS)
    return h.hexdigest() if seen else None


_POSITIONAL: dict[type, list[str] | None] = {}  # per module class: its forward's positional names


def bound_inputs(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by the names its ``forward`` gives them: ``model(ids)`` reads as
    ``input_ids=ids``, as the callee reads it. Keywords win; arguments that cannot be bound (a
    forward taking ``*args``, a signature that cannot be read) are left out."""
    if not args:
        return kwargs
    cls = type(module)
    if cls not in _POSITIONAL:
        try:
            params = inspect.signature(module.forward).parameters.values()
            _POSITIONAL[cls] = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            _POSITIONAL[cls] = None
    names = _POSITIONAL[cls]
    if names is None:
        return kwargs
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    return bound


def sequence_length(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    for key in ("input_ids", "inputs_embeds", "decoder_input_ids"):
        v = kwargs.get(key)
        if isinstance(v, torch.Tensor) and v.dim() >= 2:
            return int(v.shape[1])
    if args and isinstance(args[0], torch.Tensor) and args[0].dim() >= 2 and not args[0].is_floating_point():
        return int(args[0].shape[1])
    return None


_CACHE_KEYS = ("cache", "past_key_values", "cache_params")  # transformers 5 renamed past_key_values to cache


def cache_in(values: Any) -> Any:
    for key in _CACHE_KEYS:
        found = values.get(key) if isinstance(values, dict) else getattr(values, key, None)
        if found is not None:
            return found
    return None


_MEDIA_TOKEN_ATTRS = {
    "vision": ("image_token_id", "image_token_index", "video_token_id", "video_token_index"),
    "audio": ("audio_token_id", "audio_token_index"),
}
_PREFIX_TOKENS_KEPT = 8192  # token ids of a prefill kept in the trace, to find re-prefilled prefixes


def step_tokens(module: torch.nn.Module, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """Token counts by modality of a root call's input_ids (first row), and the ids themselves."""
    ids = kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_meta:
        return None
    row = ids[0].tolist()
    config = getattr(module, "config", None)
    counts = {"vision": 0, "audio": 0}
    for modality, attrs in _MEDIA_TOKEN_ATTRS.items():
        media_ids = {getattr(config, a, None) for a in attrs} - {None}
        counts[modality] = sum(1 for tok in row if tok in media_ids)
    counts["text"] = len(row) - counts["vision"] - counts["audio"]
    info = {"tokens": counts, "batch": int(ids.shape[0]), "input_ids": row[:_PREFIX_TOKENS_KEPT]}
    items = media_digests(kwargs)
    if items:
        info["media_digests"] = items
    return info


class StepMedia:
    """Each step's inputs as ``step_tokens`` reads them, with the media a request sent before its
    language model's step: a VLM whose ``generate`` encodes ``pixel_values`` with its vision tower
    (an outermost call, not a step) and then runs its decoder's own ``generate`` on
    ``inputs_embeds`` (BLIP-2, InstructBLIP) sends its prefill no ids and no pixels, so the items
    the tower was sent are that prefill's, and the embeddings' rows are its batch."""

    def __init__(self) -> None:
        self._pending: tuple[str, ...] = ()

    def saw(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """An outermost call that is not a step (a vision tower run by a model's generate)."""
        if any(isinstance(a, torch.Tensor) and a.is_floating_point() for a in (*args, *kwargs.values())):
            items = media_digests(bound_inputs(module, args, kwargs))
            if items:
                self._pending = items

    def step_info(self, module: torch.nn.Module, named: dict[str, Any]) -> dict[str, Any] | None:
        info = step_tokens(module, named)
        embeds = named.get("inputs_embeds")
        if info is None and isinstance(embeds, torch.Tensor) and embeds.dim() == 3 and not embeds.is_meta:
            info = {"tokens": {}, "batch": int(embeds.shape[0])}
            if self._pending:
                info["media_digests"] = self._pending
        self._pending = ()
        return info


_MEDIA_DIGESTS_KEPT = 1024  # per-item digests a root call keeps


def media_digests(kwargs: dict[str, Any]) -> tuple[str, ...]:
    """Short content digests of a root call's media items, in order: each image or frame of the
    float media inputs (``pixel_values`` (N, C, H, W) or (B, N, C, H, W), Qwen-VL's flattened
    patches cut by ``image_grid_thw``, audio features per row), or, where generate encoded the
    media before the call (transformers 5 passes ``mm_encoder_outputs``), each item's embeddings.
    What a request sent, item by item: the same chart in six rows is six equal digests; a chat
    that re-sends its photos sends the earlier turns' digests again. Integer inputs (grids, sizes)
    are not items."""
    from memwarden.record.modality import input_modality
    from memwarden.trace.model import Modality

    parts: list[torch.Tensor] = []
    for name, t in kwargs.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.is_meta or t.dim() == 0:
            continue
        if input_modality(name) not in (Modality.VISION, Modality.AUDIO):
            continue
        grid = kwargs.get("video_grid_thw" if "video" in name else "image_grid_thw")
        t = t.detach()
        if t.dim() == 2 and isinstance(grid, torch.Tensor) and grid.dim() == 2 and grid.shape[1] == 3:
            sizes = [int(x) for x in grid.prod(-1).tolist()]
            parts += list(t.split(sizes)) if sum(sizes) == t.shape[0] else [t]
        elif t.dim() >= 4:
            parts += list(t.reshape(-1, *t.shape[-3:]).unbind(0))
        elif t.dim() == 3:
            parts += list(t.unbind(0))
        else:
            parts.append(t)
    encoded = kwargs.get("mm_encoder_outputs")
    for out in encoded.values() if isinstance(encoded, dict) else ():
        pooled = out.get("pooler_output") if hasattr(out, "get") else None
        hidden = out.get("last_hidden_state") if hasattr(out, "get") else None
        if isinstance(hidden, torch.Tensor) and hidden.dim() == 3 and not hidden.is_meta:
            parts += list(hidden.detach().unbind(0))  # (items, tokens, hidden): a tower's batch of images
        elif isinstance(pooled, (list, tuple)):
            parts += [x for x in pooled if isinstance(x, torch.Tensor) and not x.is_meta]
        elif isinstance(pooled, torch.Tensor) and not pooled.is_meta and pooled.dim() >= 2:
            parts += list(pooled.detach().unbind(0))
    return tuple(tensor_digest(part).hex()[:16] for part in parts[:_MEDIA_DIGESTS_KEPT])


def mask_padding(mask: Any) -> dict[str, int] | None:
    """How much of a (B, T) batch is padding, read from its attention mask: ``length`` T, the
    ``longest`` row's real tokens, all ``real`` tokens and the ``batch``. None when the mask pads
    nothing or is not a plain CPU (B, T) mask. Read through numpy (``host_array``): the capture's
    own reading allocates nothing the allocator recorder would log."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return None
    if mask.device.type != "cpu" or mask.is_meta or mask.requires_grad or mask.dtype.is_complex:
        return None
    view = host_array(mask)
    if view is None:  # a dtype numpy cannot view (bfloat16)
        return None
    rows = (view != 0).sum(axis=1)
    real = int(rows.sum())
    if real == mask.numel():
        return None
    return {
        "length": int(mask.shape[1]),
        "longest": int(rows.max(initial=0)),
        "real": real,
        "batch": int(mask.shape[0]),
    }


def label_padding(labels: Any, ignore_index: int = -100) -> dict[str, int] | None:
    """How much of a (B, T) ``labels`` batch is padding, read from its trailing ``ignore_index``
    (-100): a seq2seq collator (Whisper, T5) pads the labels the decoder runs over, and no attention
    mask says so. A row's real length ends at its last label that is not ignored, so a prompt masked
    with -100 at the start of a causal LM's row is not padding. Same keys as ``mask_padding``."""
    if not isinstance(labels, torch.Tensor) or labels.dim() != 2 or labels.dtype != torch.long:
        return None
    if labels.device.type != "cpu" or labels.is_meta or labels.numel() == 0:
        return None
    view = host_array(labels)
    if view is None:
        return None
    kept = view != ignore_index
    width = int(labels.shape[1])
    # the last kept position + 1 per row (0 for a row with nothing kept)
    rows = np.where(kept.any(axis=1), width - np.argmax(kept[:, ::-1], axis=1), 0)
    if int(rows.max(initial=0)) == width:
        return None
    return {
        "length": width,
        "longest": int(rows.max(initial=0)),
        "real": int(rows.sum()),
        "batch": int(labels.shape[0]),
    }


def cache_is_empty(kwargs: dict[str, Any]) -> bool:
    cache = cache_in(kwargs)
    if cache is None:
        return True
    get_len = getattr(cache, "get_seq_length", None)
    if callable(get_len):
        try:
            return int(get_len()) == 0
        except Exception:  # a cache type that cannot say
            return False
    return False


def cache_tensors(output: Any) -> list[torch.Tensor]:
    """Tensors of a transformers KV cache found in a model output."""
    try:
        cache = cache_in(output)
    except Exception:  # outputs whose attribute access raises (ModelOutput without the key)
        cache = None
    found: list[torch.Tensor] = []
    if cache is None:
        return found
    pooled = getattr(cache, "kv_pool_tensors", None)  # a paged cache: its pool, not per-layer tensors
    if isinstance(pooled, (list, tuple)):
        found.extend(t for t in pooled if isinstance(t, torch.Tensor))
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for layer in layers:
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if isinstance(t, torch.Tensor):
                    found.append(t)
    for name in ("key_cache", "value_cache"):  # transformers 4.x DynamicCache
        for t in getattr(cache, name, None) or []:
            if isinstance(t, torch.Tensor):
                found.append(t)
    if isinstance(cache, (tuple, list)):  # legacy tuple-of-tuples
        stack: list[Any] = list(cache)
        while stack:
            v = stack.pop()
            if isinstance(v, torch.Tensor):
                found.append(v)
            elif isinstance(v, (tuple, list)):
                stack.extend(v)
    return found


def named_inputs(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], limit: int = 64
) -> list[tuple[str, torch.Tensor]]:
    """The call's tensors, each with the name of the argument that carries it (bound to the
    forward signature; "" for a positional argument it does not name), the cache left out."""
    named = bound_inputs(module, args, kwargs)
    found: list[tuple[str, torch.Tensor]] = []
    unnamed = args[sum(1 for k in named if k not in kwargs) :] if args else ()
    for name, value in [*named.items(), *(("", v) for v in unnamed)]:
        if name in _CACHE_KEYS:
            continue
        found.extend((name, t) for t in _tensors_in(value, limit - len(found)))
        if len(found) >= limit:
            break
    return found


def _tensors_in(values: Any, limit: int = 64) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    stack = [values]
    while stack and len(found) < limit:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v[k] for k in v if k not in _CACHE_KEYS)
    return found
