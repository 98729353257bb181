"""A resident model's LoRA adapter, updated in place by per-tensor deltas.

Hot-swap semantics, as PEFT's ``hotswap_adapter``: the new weights are copied into the existing
parameters (a lower rank zero-padded into the slot), so no module is created, no parameter is
replaced and a graph compiled over the model (``torch.compile``) keeps its guards — it does not
recompile. Unlike it, an update here is a *delta* (only the changed tensors travel), it is
versioned, and it is all-or-nothing:

1. everything is checked before the model is touched — the delta's digests (``read_delta``) and,
   with ``publisher_key``, its publisher signature; that the device holds the delta's base
   version (content digest) and the delta leads to a higher version; that every tensor names an
   existing parameter with the same dtype and the same shape (only a LoRA A/B matrix may carry a
   lower rank, zero-padded; a ``modules_to_save`` weight of another shape is refused, not padded)
   — on the bytes' description, before any tensor is made of them;
2. the new values are staged and the old ones of the affected parameters saved;
3. the copies run under the slot's lock; if any fails, the ones done are undone from the saved
   values and the error is raised — the model holds the old version, bit for bit.

Serving takes the same lock (``with slot.serving(): model(...)``), so a forward pass sees one
version or the other, never a mix. Every version applied is kept in an :class:`AdapterVersions`
LRU within its byte budget; ``rollback()`` goes back to the previous one and ``activate(v)``
to any version still kept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from memwarden.edge.sync.delta import Delta, adapter_manifest, read_delta
from memwarden.edge.sync.errors import SignatureError
from memwarden.edge.sync.manifest import AdapterFormatError, Manifest, build_manifest
from memwarden.errors import MemwardenError
from memwarden.runtime.lora.tensors import adapter_parameters, check_fits, from_raw, logical_view, padded, to_raw

if TYPE_CHECKING:
    from memwarden.edge.sync.signing import PublicKey
from memwarden.runtime.lora.versions import AdapterVersions

__all__ = ["AdapterSlot", "AdapterSwapError", "SwapResult"]

_DEFAULT_VERSIONS_BYTES = 64 << 20


class AdapterSwapError(MemwardenError):
    """An update that cannot be applied to this model; the model keeps the version it had."""


@dataclass(frozen=True, kw_only=True)
class SwapResult:
    from_version: int
    to_version: int
    tensors_copied: int
    bytes_copied: int
    layers: list[str]


class AdapterSlot:
    """The ``adapter_name`` LoRA weights of ``model`` (a PEFT model), versioned.

    ``manifest`` describes what the model holds now (default: computed from its parameters, as
    ``adapter`` version ``version``). ``versions`` keeps older versions for rollback (default: an
    LRU of 64 MiB). ``before_copy(name)`` runs before each parameter copy (fault injection).
    ``publisher_key``: when given, every delta applied must carry the publisher's signed manifest.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        adapter_name: str = "default",
        adapter: str = "adapter",
        version: int = 0,
        manifest: Manifest | None = None,
        versions: AdapterVersions | None = None,
        before_copy: Callable[[str], None] | None = None,
        publisher_key: PublicKey | None = None,
    ) -> None:
        self.model = model
        self.publisher_key = publisher_key
        self.params = adapter_parameters(model, adapter_name)
        self.versions = versions if versions is not None else AdapterVersions(_DEFAULT_VERSIONS_BYTES)
        self.before_copy = before_copy
        self.lock = threading.RLock()
        self.swaps = self.refused = self.rollbacks = 0
        current = {name: to_raw(p) for name, p in self.params.items()}
        if manifest is None:
            manifest = build_manifest(current, adapter=adapter, version=version)
        self._check_names(manifest)
        self.manifest = manifest
        self.previous: int | None = None
        self.versions.put(manifest, self._logical(manifest), pin=True)

    # -- what is served ---------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def content_digest(self) -> str:
        return self.manifest.content_digest

    @contextmanager
    def serving(self) -> Iterator[Manifest]:
        """Hold the adapter still while a forward pass runs; yields the manifest being served."""
        with self.lock:
            yield self.manifest

    def held_manifest(self) -> Manifest:
        """The manifest of what the parameters hold now, computed from their bytes (for checks)."""
        with self.lock:
            raw = {}
            for entry in self.manifest.tensors:
                raw[entry.name] = to_raw(logical_view(entry.name, self.params[entry.name].detach(), entry.shape))
            return build_manifest(raw, adapter=self.manifest.adapter, version=self.manifest.version)

    # -- updates ------------------------------------------------------------------------------

    def apply(self, delta: Delta | bytes) -> SwapResult:
        """Apply a delta (a verified :class:`Delta` or the bytes of a delta file) in place."""
        try:
            if isinstance(delta, bytes | bytearray | memoryview):
                delta = read_delta(bytes(delta), publisher_key=self.publisher_key)
            elif self.publisher_key is not None:
                self._check_signed(delta)
        except (AdapterFormatError, SignatureError):
            self.refused += 1
            raise
        with self.lock:
            if delta.base_digest != self.manifest.content_digest:
                self.refused += 1
                raise AdapterSwapError(
                    f"the delta to {delta.manifest.adapter} v{delta.manifest.version} applies to v{delta.base_version} "
                    f"(content {delta.base_digest[:12]}); this model holds v{self.version} "
                    f"(content {self.content_digest[:12]}): fetch the delta from v{self.version} or the full adapter"
                )
            if delta.manifest.version <= self.version:
                self.refused += 1
                raise AdapterSwapError(
                    f"the delta leads to v{delta.manifest.version}, not newer than the v{self.version} this model holds"
                )
            try:
                for name, raw in delta.tensors.items():
                    param = self.params.get(name)
                    if param is None:
                        raise AdapterFormatError(f"tensor {name!r}: the model has no slot for it")
                    check_fits(name, raw, param)
                values = {name: from_raw(raw) for name, raw in delta.tensors.items()}
            except AdapterFormatError as exc:
                self.refused += 1
                raise AdapterSwapError(f"refused, the model keeps v{self.version}: {exc}") from None
            return self._swap(delta.manifest, values)

    def _check_signed(self, delta: Delta) -> None:
        from memwarden.edge.sync.signing import verify_manifest

        assert self.publisher_key is not None
        if not delta.signed_manifest:
            raise SignatureError(
                f"the delta to {delta.manifest.adapter} v{delta.manifest.version} is not signed: refused"
            )
        signed = verify_manifest(delta.signed_manifest, self.publisher_key)
        if signed != delta.manifest:
            raise SignatureError("the delta's manifest is not the one its publisher signed: refused")

    def load(self, adapter_blob: bytes, *, version: int | None = None) -> SwapResult:
        """Hot-swap a whole adapter file in (PEFT's ``hotswap_adapter``, versioned): only the
        tensors whose content differs from what the model holds are copied."""
        with self.lock:
            target, raw = adapter_manifest(
                adapter_blob, adapter=self.manifest.adapter, version=version, previous=self.manifest
            )
            if target.version <= self.version and version is None:
                target = target.with_version(self.version + 1)
            if target.version <= self.version:
                self.refused += 1
                raise AdapterSwapError(
                    f"v{target.version} is not newer than the v{self.version} this model holds: versions never go "
                    "backwards (activate() or rollback() switch to a kept version)"
                )
            values = {n: from_raw(t) for n, t in raw.items()}
            return self._swap(target, values)

    def activate(self, version: int) -> SwapResult:
        """Switch to a version still kept in ``versions`` (no transfer)."""
        with self.lock:
            kept = self.versions.get(version)
            if kept is None:
                raise AdapterSwapError(
                    f"version {version} of {self.manifest.adapter} is not kept on this device (kept: "
                    f"{self.versions.versions}); fetch it again"
                )
            return self._swap(*kept)

    def rollback(self) -> SwapResult:
        """Back to the version served before the last swap."""
        with self.lock:
            if self.previous is None:
                raise AdapterSwapError("no earlier version to roll back to")
            result = self.activate(self.previous)
            self.rollbacks += 1
            return result

    # -- the swap itself --------------------------------------------------------------------

    def _swap(self, target: Manifest, values: Mapping[str, torch.Tensor]) -> SwapResult:
        """Make the parameters hold ``target``; ``values`` holds at least its changed tensors."""
        try:
            self._check_names(target)
            changed = target.changed_from(self.manifest)
            staged: list[tuple[str, torch.nn.Parameter, torch.Tensor]] = []
            for entry in changed:
                value = values.get(entry.name)
                if value is None:
                    raise AdapterFormatError(f"tensor {entry.name!r} changed but its values were not sent")
                param = self.params[entry.name]
                staged.append((entry.name, param, padded(entry.name, value, param.detach()).to(param.device)))
        except AdapterFormatError as exc:
            self.refused += 1
            raise AdapterSwapError(f"refused, the model keeps v{self.version}: {exc}") from None
        saved = [(param, param.detach().clone()) for _, param, _ in staged]
        done = 0
        try:
            with torch.no_grad():
                for name, param, value in staged:
                    if self.before_copy is not None:
                        self.before_copy(name)
                    param.copy_(value)  # in place: same Parameter, version counter bumped
                    done += 1
        except BaseException as exc:
            with torch.no_grad():
                for param, old in saved[: done + 1]:
                    param.copy_(old)
            self.refused += 1
            raise AdapterSwapError(
                f"applying {target.adapter} v{target.version} failed after {done} of {len(staged)} tensors "
                f"({exc}); rolled back to v{self.version}"
            ) from exc
        before = self.manifest
        self.manifest = target
        self.previous = before.version if before.version != target.version else self.previous
        self.versions.put(target, {**self._logical_of(before), **dict(values)}, pin=True)
        self.swaps += 1
        return SwapResult(
            from_version=before.version,
            to_version=target.version,
            tensors_copied=len(staged),
            bytes_copied=sum(e.nbytes for e in changed),
            layers=sorted({e.layer for e in changed}),
        )

    def _check_names(self, manifest: Manifest) -> None:
        names = {e.name for e in manifest.tensors}
        extra, missing = sorted(names - set(self.params)), sorted(set(self.params) - names)
        if extra or missing:
            raise AdapterFormatError(
                "hot swap keeps the model's modules: "
                + (f"{len(extra)} tensor(s) the model has no slot for (first {extra[0]!r})" if extra else "")
                + ("; " if extra and missing else "")
                + (f"{len(missing)} adapter tensor(s) missing (first {missing[0]!r})" if missing else "")
            )

    def _logical(self, manifest: Manifest) -> dict[str, torch.Tensor]:
        return {
            e.name: logical_view(e.name, self.params[e.name].detach(), e.shape).to("cpu", copy=True)
            for e in manifest.tensors
        }

    def _logical_of(self, manifest: Manifest) -> dict[str, torch.Tensor]:
        """Tensors of a version: from the kept store where it has them, else from the parameters."""
        out = {}
        for e in manifest.tensors:
            kept = self.versions.tensor(e.digest)
            out[e.name] = kept if kept is not None else logical_view(e.name, self.params[e.name].detach(), e.shape)
        return out
