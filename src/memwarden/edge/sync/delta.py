"""Adapter deltas: only the tensors that changed between two versions, in one safetensors file.

A delta's metadata carries the new version's full manifest (``manifest``) and the content digest
of the version it applies to (``base``). Its tensors are exactly the manifest's entries whose
content differs from the base. :func:`read_delta` checks all of it — every tensor's BLAKE2b
digest, shape and dtype against the manifest, the manifest's own digests — before anyone may
apply it; a device then checks that what it holds has the ``base`` content digest, so the
unchanged tensors are the manifest's too.

A delta made from a published version carries that version's *signed* manifest
(``edge/sync/signing.py``): with the publisher's key, ``read_delta(blob, publisher_key=...)``
refuses one that is unsigned or signed by another key. The ``base`` fields are not signed and need
not be: they only choose which tensors travel, and whoever applies a delta ends with exactly the
signed manifest's content or refuses it (a slot needs every changed tensor; ``apply_to_adapter``
checks the rebuilt file's content digest).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memwarden.edge.sync.manifest import (
    AdapterFormatError,
    Manifest,
    RawTensor,
    build_manifest,
    canonical_name,
    digest_bytes,
    load_json,
    read_safetensors,
    write_safetensors,
)

if TYPE_CHECKING:
    from memwarden.edge.sync.signing import PublicKey

__all__ = [
    "Delta",
    "adapter_manifest",
    "apply_to_adapter",
    "check_shapes",
    "check_tensors",
    "make_delta",
    "read_delta",
]

DELTA_FORMAT = "memwarden-lora-delta/1"
_VERSION_KEY = "memwarden_version"  # optional safetensors metadata of an adapter file
_ADAPTER_KEY = "memwarden_adapter"
_INT = re.compile(r"^-?\d{1,12}$")
_RANK_SUFFIXES = {".lora_A.weight": 0, ".lora_embedding_A": 0, ".lora_B.weight": 1, ".lora_embedding_B": 1}


@dataclass(frozen=True)
class Delta:
    base_digest: str  # content digest of the version this delta applies to
    base_version: int
    manifest: Manifest  # the version after applying
    tensors: dict[str, RawTensor]  # only the changed ones, digests verified
    signed_manifest: bytes = b""  # the publisher's signed manifest bytes, when the delta carries one

    @property
    def changed_layers(self) -> list[str]:
        by_name = self.manifest.by_name
        return sorted({by_name[n].layer for n in self.tensors})

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def adapter_manifest(
    blob: bytes, *, adapter: str | None = None, version: int | None = None, previous: Manifest | None = None
) -> tuple[Manifest, dict[str, RawTensor]]:
    """The manifest and tensors of an adapter file, by canonical name (PEFT's ``base_model.model.``
    prefix removed, as :func:`canonical_name` does). Its name and version come from the arguments,
    else from the file's metadata (``memwarden_adapter``, ``memwarden_version``), else ``adapter``
    and, after ``previous``, its version + 1 (0 without one)."""
    named, meta = read_safetensors(blob)
    if not named:
        raise AdapterFormatError("the adapter file holds no tensors")
    tensors = {canonical_name(n): t for n, t in named.items()}
    if len(tensors) != len(named):
        raise AdapterFormatError("two tensors have the same name once PEFT's base_model.model. prefix is removed")
    if version is None and _VERSION_KEY in meta:
        version = file_version(meta)
    if version is None:
        version = previous.version + 1 if previous is not None else 0
    name = adapter or meta.get(_ADAPTER_KEY) or (previous.adapter if previous is not None else "adapter")
    return build_manifest(tensors, adapter=name, version=version, previous=previous), tensors


def file_version(meta: Mapping[str, str]) -> int:
    """The ``memwarden_version`` an adapter file's metadata records."""
    text = meta.get(_VERSION_KEY, "")
    if not _INT.match(text) or int(text) < 0:
        raise AdapterFormatError(f"metadata {_VERSION_KEY} is not an integer of at most 12 digits")
    return int(text)


def make_delta(
    old: Manifest, new_blob: bytes, *, version: int | None = None, signed_manifest: bytes | None = None
) -> tuple[bytes, Delta]:
    """The delta from the adapter described by ``old`` to the adapter file ``new_blob``.
    ``signed_manifest``: the publisher's signed manifest of the new version, carried in the delta
    (it must describe ``new_blob``; the tensors' ``version`` fields are taken from it)."""
    new, tensors = adapter_manifest(
        new_blob, adapter=old.adapter, version=old.version + 1 if version is None else version, previous=old
    )
    if signed_manifest is not None:
        signed = Manifest.from_bytes(signed_manifest)
        if (signed.adapter, signed.version, signed.content_digest) != (new.adapter, new.version, new.content_digest):
            raise AdapterFormatError("the signed manifest does not describe the new adapter file")
        new = signed
    if new.version <= old.version:
        raise AdapterFormatError(f"the new version ({new.version}) must be above the old one ({old.version})")
    changed = {t.name: tensors[t.name] for t in new.changed_from(old)}
    doc = signed_manifest if signed_manifest is not None else new.to_bytes()
    meta = {
        "format": DELTA_FORMAT,
        "base": old.content_digest,
        "base_version": str(old.version),
        "manifest": doc.decode(),
    }
    blob = write_safetensors(changed, meta)
    return blob, Delta(
        base_digest=old.content_digest,
        base_version=old.version,
        manifest=new,
        tensors=changed,
        signed_manifest=signed_manifest or b"",
    )


def read_delta(blob: bytes, *, publisher_key: PublicKey | None = None) -> Delta:
    """A delta file, verified: its manifest's digests, and every tensor's digest, shape and dtype;
    with ``publisher_key``, its manifest's signature (``SignatureError`` if unsigned or forged)."""
    tensors, meta = read_safetensors(blob)
    if meta.get("format") != DELTA_FORMAT:
        raise AdapterFormatError(f"not a memwarden adapter delta (format {DELTA_FORMAT})")
    text, base, base_version = meta.get("manifest", ""), meta.get("base", ""), meta.get("base_version", "")
    if not _INT.match(base_version) or not isinstance(base, str) or len(base) > 128:
        raise AdapterFormatError("delta metadata is malformed")
    doc = load_json(text, "the delta's manifest")
    manifest = Manifest.from_json(doc)
    if publisher_key is not None:
        from memwarden.edge.sync.signing import check_signature

        check_signature(doc, publisher_key, f"{manifest.adapter} v{manifest.version}")
    check_tensors(manifest, tensors)
    signed = text.encode() if isinstance(doc, dict) and "signature" in doc else b""
    return Delta(
        base_digest=base, base_version=int(base_version), manifest=manifest, tensors=tensors, signed_manifest=signed
    )


def check_shapes(new: Manifest, base: Manifest, *, allow_rank: bool = True) -> None:
    """Every tensor of ``new`` has the shape and dtype it has in ``base`` (the same names on both
    sides); with ``allow_rank``, a LoRA A/B matrix may change its rank dimension only (a slot
    zero-pads a lower rank; nothing else is padded). ``AdapterFormatError`` otherwise."""
    old = base.by_name
    if set(old) != set(new.by_name):
        extra = sorted(set(new.by_name) - set(old)) or sorted(set(old) - set(new.by_name))
        raise AdapterFormatError(f"v{new.version} names other tensors than v{base.version} (first {extra[0]!r})")
    for entry in new.tensors:
        was = old[entry.name]
        if entry.dtype != was.dtype:
            raise AdapterFormatError(f"tensor {entry.name!r}: dtype {entry.dtype}, v{base.version} has {was.dtype}")
        if entry.shape == was.shape:
            continue
        rank_dim = next((d for s, d in _RANK_SUFFIXES.items() if entry.name.endswith(s)), None)
        fits = (
            allow_rank
            and rank_dim is not None
            and len(entry.shape) == len(was.shape) == 2
            and entry.shape[1 - rank_dim] == was.shape[1 - rank_dim]
        )
        if not fits:
            raise AdapterFormatError(
                f"tensor {entry.name!r}: shape {entry.shape}, v{base.version} has {was.shape}: refused"
            )


def check_tensors(manifest: Manifest, tensors: Mapping[str, RawTensor]) -> None:
    """Every tensor is in ``manifest`` with the same shape, dtype and digest, or AdapterFormatError."""
    entries = manifest.by_name
    for name, t in tensors.items():
        entry = entries.get(name)
        if entry is None:
            raise AdapterFormatError(f"tensor {name!r} is not in the manifest")
        if (t.shape, t.dtype) != (entry.shape, entry.dtype):
            raise AdapterFormatError(f"tensor {name!r}: {t.shape} {t.dtype}, manifest says {entry.shape} {entry.dtype}")
        if digest_bytes(t.data) != entry.digest:
            raise AdapterFormatError(f"tensor {name!r}: digest mismatch (corrupted or truncated)")


def apply_to_adapter(
    base_blob: bytes, delta_blob: bytes, *, publisher_key: PublicKey | None = None
) -> tuple[bytes, Manifest]:
    """The new adapter file: ``base_blob`` with ``delta_blob``'s tensors in place, every digest
    checked (the base must have the delta's base content, the result its manifest's content).
    Tensor names keep the base file's spelling, so PEFT loads the result as it loaded the base.
    Refused: a version that goes backwards from the base file's own (``memwarden_version``), a
    tensor whose shape or dtype differs from the base's, and, with ``publisher_key``, a delta
    the publisher did not sign."""
    delta = read_delta(delta_blob, publisher_key=publisher_key)
    named, meta = read_safetensors(base_blob)
    held = file_version(meta) if _VERSION_KEY in meta else delta.base_version
    base, _ = adapter_manifest(base_blob, adapter=delta.manifest.adapter, version=max(held, 0))
    if base.content_digest != delta.base_digest:
        raise AdapterFormatError(
            f"the delta applies to content {delta.base_digest[:12]}, this adapter file has {base.content_digest[:12]}"
        )
    if delta.manifest.version <= held:
        raise AdapterFormatError(
            f"the delta leads to v{delta.manifest.version}, not newer than this adapter file's v{held}: "
            "versions never go backwards"
        )
    check_shapes(delta.manifest, base, allow_rank=False)
    spelled = {canonical_name(n): n for n in named}
    if set(spelled) != set(delta.manifest.by_name):
        raise AdapterFormatError("the delta's manifest names other tensors than the base adapter file")
    out = {spelled[n]: delta.tensors.get(n, named[spelled[n]]) for n in spelled}
    new_meta = {k: v for k, v in meta.items() if k not in (_VERSION_KEY, _ADAPTER_KEY)}
    new_meta.update({_VERSION_KEY: str(delta.manifest.version), _ADAPTER_KEY: delta.manifest.adapter})
    blob = write_safetensors(out, new_meta)
    rebuilt, _ = adapter_manifest(blob)
    if rebuilt.content_digest != delta.manifest.content_digest:
        raise AdapterFormatError("the rebuilt adapter does not match the delta's manifest")
    return blob, delta.manifest
