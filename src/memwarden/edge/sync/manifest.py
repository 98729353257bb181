"""Adapter manifests: what a LoRA adapter file holds, tensor by tensor, without torch.

A manifest lists, per tensor: ``name`` (as PEFT saves it), ``layer`` (the adapted module's path),
``shape``, ``dtype``, ``digest`` (BLAKE2b-256 of the tensor's raw little-endian bytes),
``rank`` (the LoRA rank the tensor carries, 0 for others), ``version`` (the adapter version at
which this tensor last changed) and ``nbytes``. The adapter itself has a ``version`` and a
``content_digest`` over the names, shapes, dtypes and digests only — two files with the same
tensors have the same content digest whatever their versions, which is what a device compares
before applying a delta.

Adapter files are safetensors, read here with ``struct`` and ``json`` (never pickle, never
torch: ``edge/`` is torch-free). Everything read is untrusted: header length, offsets, dtypes,
shapes and names are checked, and a file that fails any check is refused with one
``AdapterFormatError``.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from memwarden.errors import InputError
from memwarden.units import DTYPE_BYTES as ELEMENT_BYTES
from memwarden.units import SAFETENSORS_DTYPES
from memwarden.untrusted import finite_int

__all__ = [
    "AdapterFormatError",
    "Manifest",
    "RawTensor",
    "TensorEntry",
    "build_manifest",
    "canonical_name",
    "digest_bytes",
    "load_json",
    "numel",
    "read_safetensors",
    "write_safetensors",
]

MANIFEST_FORMAT = "memwarden-lora-manifest/1"
MAX_HEADER_BYTES = 16 << 20  # a header with 100k tensors is ~10 MiB; more is not an adapter
MAX_TENSORS = 100_000
MAX_NAME_CHARS = 1024
MAX_NDIM = 8  # LoRA tensors are 2-D (4-D for convolutions); bounded before any product is taken
MAX_DIM = 2**40
MAX_ELEMENTS = 2**40  # per tensor: 4 TiB of F32, above any adapter
MAX_VERSION = 10**12  # store files are v<1-12 digits>.safetensors
_DIGEST = re.compile(r"^[0-9a-f]{64}$")

# safetensors dtype names -> bytes per element (the one table: memwarden.units)
DTYPE_BYTES = {name: ELEMENT_BYTES[name] for name in SAFETENSORS_DTYPES}

_PEFT_PREFIX = "base_model.model."
_LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".lora_embedding_A", ".lora_embedding_B")


class AdapterFormatError(InputError):
    """An adapter file, manifest or delta that is malformed, truncated or fails a digest."""


def canonical_name(name: str) -> str:
    """A PEFT tensor name without ``base_model.model.``: the same file then maps onto a
    ``PeftModel``, its ``LoraModel`` or a model given adapters by ``inject_adapter_in_model``."""
    return name[len(_PEFT_PREFIX) :] if name.startswith(_PEFT_PREFIX) else name


def digest_bytes(data: bytes | memoryview) -> str:
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def load_json(data: bytes | str, what: str) -> Any:
    """JSON from an untrusted body: nesting deep enough to exhaust the parser's recursion is one
    ``AdapterFormatError``, as is anything that is not JSON."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise AdapterFormatError(f"{what} is not JSON (truncated, corrupted or nested too deep)") from None


def numel(shape: object, what: str) -> int:
    """The element count of an untrusted shape: a list of at most ``MAX_NDIM`` integers in
    ``[0, MAX_DIM)``, checked before they are multiplied (a 200,000-dimension shape costs one
    length check, not a minute of big-integer products), the product capped at ``MAX_ELEMENTS``."""
    if not isinstance(shape, list | tuple) or len(shape) > MAX_NDIM:
        raise AdapterFormatError(f"{what}: a shape is a list of at most {MAX_NDIM} dimensions")
    count = 1
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < MAX_DIM:
            raise AdapterFormatError(f"{what}: malformed shape")
        count *= d
        if count > MAX_ELEMENTS:
            raise AdapterFormatError(f"{what}: more than {MAX_ELEMENTS} elements")
    return count


@dataclass(frozen=True)
class RawTensor:
    """One tensor of a safetensors file as bytes: dtype (safetensors name), shape, data."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    @property
    def nbytes(self) -> int:
        return len(self.data)


def read_safetensors(blob: bytes) -> tuple[dict[str, RawTensor], dict[str, str]]:
    """(tensors by name, metadata) of a safetensors file, every offset and size checked."""
    if len(blob) < 8:
        raise AdapterFormatError("not a safetensors file: shorter than its 8-byte header length")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len > min(MAX_HEADER_BYTES, len(blob) - 8):
        raise AdapterFormatError(f"safetensors header length {header_len} is out of range (truncated file?)")
    header = load_json(blob[8 : 8 + header_len], "safetensors header")
    if not isinstance(header, dict):
        raise AdapterFormatError("safetensors header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise AdapterFormatError("safetensors metadata must map strings to strings")
    if len(header) > MAX_TENSORS:
        raise AdapterFormatError(f"{len(header)} tensors: more than {MAX_TENSORS}")
    body = memoryview(blob)[8 + header_len :]
    spans = []
    tensors: dict[str, RawTensor] = {}
    for name, info in header.items():
        if not isinstance(info, dict) or len(name) > MAX_NAME_CHARS or not name:
            raise AdapterFormatError(f"tensor {name[:80]!r}: malformed entry")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
            raise AdapterFormatError(f"tensor {name[:80]!r}: unknown dtype {str(dtype)[:40]!r}")
        if not isinstance(shape, list):
            raise AdapterFormatError(f"tensor {name[:80]!r}: malformed shape")
        count = numel(shape, f"tensor {name[:80]!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise AdapterFormatError(f"tensor {name!r}: malformed data_offsets")
        start, end = offsets
        if not 0 <= start <= end <= len(body):
            raise AdapterFormatError(f"tensor {name!r}: data beyond the end of the file (truncated?)")
        if end - start != count * DTYPE_BYTES[dtype]:
            raise AdapterFormatError(f"tensor {name!r}: {end - start} bytes for shape {shape} {dtype}")
        spans.append((start, end))
        tensors[name] = RawTensor(dtype=dtype, shape=tuple(shape), data=bytes(body[start:end]))
    position = 0
    for start, end in sorted(spans):
        if start != position:
            raise AdapterFormatError("safetensors tensors overlap or leave gaps")
        position = end
    if position != len(body):
        raise AdapterFormatError(f"{len(body) - position} trailing bytes after the last tensor")
    return tensors, meta


def write_safetensors(tensors: Mapping[str, RawTensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """safetensors bytes of ``tensors`` (laid out in name order) with ``metadata``."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        header[name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads its header to 8 bytes with spaces
    return struct.pack("<Q", len(text)) + text + b"".join(tensors[n].data for n in sorted(tensors))


def _layer_and_rank(name: str, shape: tuple[int, ...]) -> tuple[str, int]:
    """The adapted module's path and the LoRA rank a PEFT tensor carries (A: (r, in), B: (out, r))."""
    for suffix in _LORA_SUFFIXES:
        if name.endswith(suffix) and len(shape) == 2:
            is_a = "_A" in suffix
            # nn.Linear LoRA: A (r, in), B (out, r). Embedding LoRA: A (r, num_embeddings), B (dim, r).
            return name[: -len(suffix)], shape[0] if is_a else shape[1]
    for suffix in (".lora_magnitude_vector", ".lora_A.bias", ".lora_B.bias"):  # DoRA magnitudes, LoRA biases
        if name.endswith(suffix):
            return name[: -len(suffix)], 0
    return name.rsplit(".", 1)[0] if "." in name else name, 0


@dataclass(frozen=True, kw_only=True)
class TensorEntry:
    name: str
    layer: str
    shape: tuple[int, ...]
    dtype: str
    digest: str
    rank: int
    version: int
    nbytes: int

    def same_content(self, other: TensorEntry) -> bool:
        return (self.digest, self.shape, self.dtype) == (other.digest, other.shape, other.dtype)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "layer": self.layer,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "digest": self.digest,
            "rank": self.rank,
            "version": self.version,
            "nbytes": self.nbytes,
        }


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """A versioned adapter: its tensors in name order."""

    adapter: str
    version: int
    tensors: tuple[TensorEntry, ...]

    @property
    def by_name(self) -> dict[str, TensorEntry]:
        return {t.name: t for t in self.tensors}

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def layers(self) -> list[str]:
        return sorted({t.layer for t in self.tensors})

    @property
    def content_digest(self) -> str:
        """Digest of what the adapter computes with (names, shapes, dtypes, tensor digests)."""
        h = hashlib.blake2b(digest_size=32)
        for t in self.tensors:
            h.update(json.dumps([t.name, list(t.shape), t.dtype, t.digest]).encode())
        return h.hexdigest()

    def changed_from(self, old: Manifest | None) -> list[TensorEntry]:
        """Entries of this manifest whose content differs from ``old`` (all of them if ``old`` is None)."""
        before = old.by_name if old is not None else {}
        return [t for t in self.tensors if t.name not in before or not t.same_content(before[t.name])]

    def to_json(self) -> dict[str, Any]:
        body = {
            "format": MANIFEST_FORMAT,
            "adapter": self.adapter,
            "version": self.version,
            "content_digest": self.content_digest,
            "tensors": [t.to_json() for t in self.tensors],
        }
        return {**body, "digest": _doc_digest(body)}

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    def with_doc(self, doc: dict[str, Any]) -> bytes:
        """The bytes of this manifest's JSON ``doc`` with extra fields (a signature) added, its
        ``digest`` computed over all of them."""
        body = {k: v for k, v in doc.items() if k != "digest"}
        return json.dumps({**body, "digest": _doc_digest(body)}, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        if len(data) > MAX_HEADER_BYTES:
            raise AdapterFormatError("manifest larger than 16 MiB")
        return cls.from_json(load_json(data, "manifest"))

    @classmethod
    def from_json(cls, doc: Any) -> Manifest:
        """A manifest from its JSON form, its own ``digest`` and ``content_digest`` verified."""
        if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
            raise AdapterFormatError(f"not a memwarden adapter manifest (format {MANIFEST_FORMAT})")
        body = {k: v for k, v in doc.items() if k != "digest"}
        if doc.get("digest") != _doc_digest(body):
            raise AdapterFormatError("manifest digest mismatch (corrupted in transit?)")
        tensors = doc.get("tensors")
        if not isinstance(tensors, list) or len(tensors) > MAX_TENSORS:
            raise AdapterFormatError(f"manifest tensors: a list of at most {MAX_TENSORS} entries")
        try:
            entries = tuple(_entry(t) for t in tensors)
            adapter = _text(doc.get("adapter"), "adapter")
            version = finite_int(doc.get("version"), "manifest version", hi=MAX_VERSION)
        except InputError as exc:
            raise AdapterFormatError(f"manifest entries are malformed: {exc}") from None
        manifest = cls(adapter=adapter, version=version, tensors=entries)
        if [t.name for t in entries] != sorted({t.name for t in entries}):
            raise AdapterFormatError("manifest tensors must be unique and in name order")
        if manifest.content_digest != doc.get("content_digest"):
            raise AdapterFormatError("manifest content digest mismatch")
        return manifest

    def with_version(self, version: int) -> Manifest:
        return replace(self, version=version)


def _text(value: object, field: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
        raise AdapterFormatError(f"{field}: a string of 1 to {MAX_NAME_CHARS} characters")
    return value


def _entry(t: object) -> TensorEntry:
    """One manifest entry from untrusted JSON, every field typed and bounded."""
    if not isinstance(t, dict):
        raise AdapterFormatError("a manifest entry is not an object")
    name = _text(t.get("name"), "tensor name")
    shape, dtype, digest = t.get("shape"), t.get("dtype"), t.get("digest")
    count = numel(shape, f"manifest entry {name[:80]!r}")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise AdapterFormatError(f"manifest entry {name[:80]!r}: unknown dtype")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise AdapterFormatError(f"manifest entry {name[:80]!r}: a digest is 64 hex digits")
    nbytes = finite_int(t.get("nbytes"), "nbytes", hi=MAX_ELEMENTS * 8)
    if nbytes != count * DTYPE_BYTES[dtype]:
        raise AdapterFormatError(f"manifest entry {name[:80]!r}: size does not match shape and dtype")
    assert isinstance(shape, list | tuple)
    return TensorEntry(
        name=name,
        layer=_text(t.get("layer"), "layer"),
        shape=tuple(shape),
        dtype=dtype,
        digest=digest,
        rank=finite_int(t.get("rank"), "rank", hi=MAX_DIM),
        version=finite_int(t.get("version"), "version", hi=MAX_VERSION),
        nbytes=nbytes,
    )


def _doc_digest(body: Mapping[str, Any]) -> str:
    return digest_bytes(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def build_manifest(
    tensors: Mapping[str, RawTensor], *, adapter: str, version: int, previous: Manifest | None = None
) -> Manifest:
    """The manifest of ``tensors`` at ``version``. A tensor whose content equals its entry in
    ``previous`` keeps that entry's version (it did not change); every other one gets ``version``."""
    if version < 0:
        raise AdapterFormatError(f"adapter version must be >= 0, got {version}")
    before = previous.by_name if previous is not None else {}
    entries = []
    for name in sorted(tensors):
        t = tensors[name]
        layer, rank = _layer_and_rank(name, t.shape)
        entry = TensorEntry(
            name=name,
            layer=layer,
            shape=t.shape,
            dtype=t.dtype,
            digest=digest_bytes(t.data),
            rank=rank,
            version=version,
            nbytes=t.nbytes,
        )
        old = before.get(name)
        if old is not None and old.same_content(entry):
            entry = replace(entry, version=old.version)
        entries.append(entry)
    return Manifest(adapter=adapter, version=version, tensors=tuple(entries))
