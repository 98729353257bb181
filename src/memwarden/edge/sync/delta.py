"""Adapter deltas: only the tensors that changed between two versions, in one safetensors file.

A delta's metadata carries the new version's full manifest (``manifest``) and the content digest
of the version it applies to (``base``). Its tensors are exactly the manifest's entries whose
content differs from the base. :func:`read_delta` checks all of it — every tensor's BLAKE2b
digest, shape and dtype against the manifest, the manifest's own digests — before anyone may
apply it; a device then checks that what it holds has the ``base`` content digest, so the
unchanged tensors are the manifest's too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from memwarden.edge.sync.manifest import (
    AdapterFormatError,
    Manifest,
    RawTensor,
    build_manifest,
    canonical_name,
    digest_bytes,
    read_safetensors,
    write_safetensors,
)

__all__ = ["Delta", "adapter_manifest", "apply_to_adapter", "check_tensors", "make_delta", "read_delta"]

DELTA_FORMAT = "memwarden-lora-delta/1"
_VERSION_KEY = "memwarden_version"  # optional safetensors metadata of an adapter file
_ADAPTER_KEY = "memwarden_adapter"


@dataclass(frozen=True)
class Delta:
    base_digest: str  # content digest of the version this delta applies to
    base_version: int
    manifest: Manifest  # the version after applying
    tensors: dict[str, RawTensor]  # only the changed ones, digests verified

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
        try:
            version = int(meta[_VERSION_KEY])
        except ValueError:
            raise AdapterFormatError(f"metadata {_VERSION_KEY} is not an integer") from None
    if version is None:
        version = previous.version + 1 if previous is not None else 0
    name = adapter or meta.get(_ADAPTER_KEY) or (previous.adapter if previous is not None else "adapter")
    return build_manifest(tensors, adapter=name, version=version, previous=previous), tensors


def make_delta(old: Manifest, new_blob: bytes, *, version: int | None = None) -> tuple[bytes, Delta]:
    """The delta from the adapter described by ``old`` to the adapter file ``new_blob``."""
    new, tensors = adapter_manifest(
        new_blob, adapter=old.adapter, version=old.version + 1 if version is None else version, previous=old
    )
    if new.version <= old.version:
        raise AdapterFormatError(f"the new version ({new.version}) must be above the old one ({old.version})")
    changed = {t.name: tensors[t.name] for t in new.changed_from(old)}
    meta = {
        "format": DELTA_FORMAT,
        "base": old.content_digest,
        "base_version": str(old.version),
        "manifest": new.to_bytes().decode(),
    }
    blob = write_safetensors(changed, meta)
    return blob, Delta(base_digest=old.content_digest, base_version=old.version, manifest=new, tensors=changed)


def read_delta(blob: bytes) -> Delta:
    """A delta file, verified: its manifest's digests, and every tensor's digest, shape and dtype."""
    tensors, meta = read_safetensors(blob)
    if meta.get("format") != DELTA_FORMAT:
        raise AdapterFormatError(f"not a memwarden adapter delta (format {DELTA_FORMAT})")
    try:
        manifest = Manifest.from_json(json.loads(meta["manifest"]))
        base, base_version = str(meta["base"]), int(meta["base_version"])
    except (KeyError, ValueError):
        raise AdapterFormatError("delta metadata is malformed") from None
    check_tensors(manifest, tensors)
    return Delta(base_digest=base, base_version=base_version, manifest=manifest, tensors=tensors)


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


def apply_to_adapter(base_blob: bytes, delta_blob: bytes) -> tuple[bytes, Manifest]:
    """The new adapter file: ``base_blob`` with ``delta_blob``'s tensors in place, every digest
    checked (the base must have the delta's base content, the result its manifest's content).
    Tensor names keep the base file's spelling, so PEFT loads the result as it loaded the base."""
    delta = read_delta(delta_blob)
    named, meta = read_safetensors(base_blob)
    base, _ = adapter_manifest(base_blob, adapter=delta.manifest.adapter, version=delta.base_version)
    if base.content_digest != delta.base_digest:
        raise AdapterFormatError(
            f"the delta applies to content {delta.base_digest[:12]}, this adapter file has {base.content_digest[:12]}"
        )
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
