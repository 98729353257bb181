"""The adapter versions a device keeps, least recently used dropped first beyond a byte budget.

Tensors are stored once by digest and shared between versions: two versions that differ in k of
L layers cost the bytes of one version plus k layers, not two versions. ``nbytes`` counts each
distinct tensor once — it is what the versions add to a session's memory. The active version is
pinned: it is never evicted, so a rollback target can always be rebuilt from what is here or
the error says it was evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from memwarden.edge.sync.manifest import Manifest
from memwarden.units import parse_bytes

__all__ = ["AdapterVersions", "ChargedBudget", "VersionsStats"]


@dataclass(frozen=True, kw_only=True)
class VersionsStats:
    versions: list[int]  # least recently used first
    nbytes: int
    budget_bytes: int
    evictions: int


class AdapterVersions:
    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self._manifests: OrderedDict[int, Manifest] = OrderedDict()  # least recently used first
        self._tensors: dict[str, torch.Tensor] = {}  # digest -> CPU tensor
        self._refs: dict[str, int] = {}  # digest -> how many kept versions use it
        self.pinned: int | None = None
        self.evictions = 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    @property
    def versions(self) -> list[int]:
        return list(self._manifests)

    def __contains__(self, version: object) -> bool:
        return version in self._manifests

    def put(self, manifest: Manifest, tensors: Mapping[str, torch.Tensor], *, pin: bool = False) -> None:
        """Keep ``manifest``'s version; ``tensors`` holds (at least) those whose digests are not here."""
        if manifest.version in self._manifests:
            self._release(self._manifests.pop(manifest.version))
        for entry in manifest.tensors:
            if entry.digest not in self._tensors:
                self._tensors[entry.digest] = tensors[entry.name].detach().to("cpu", copy=True)
            self._refs[entry.digest] = self._refs.get(entry.digest, 0) + 1
        self._manifests[manifest.version] = manifest
        if pin:
            self.pinned = manifest.version
        self._evict()

    def get(self, version: int) -> tuple[Manifest, dict[str, torch.Tensor]] | None:
        manifest = self._manifests.get(version)
        if manifest is None:
            return None
        self._manifests.move_to_end(version)
        return manifest, {e.name: self._tensors[e.digest] for e in manifest.tensors}

    def tensor(self, digest: str) -> torch.Tensor | None:
        return self._tensors.get(digest)

    def pin(self, version: int) -> None:
        self.pinned = version
        self._evict()

    def resize(self, budget_bytes: int) -> None:
        self.budget_bytes = int(budget_bytes)
        self._evict()

    def stats(self) -> VersionsStats:
        return VersionsStats(
            versions=self.versions, nbytes=self.nbytes, budget_bytes=self.budget_bytes, evictions=self.evictions
        )

    def _evict(self) -> None:
        while self.nbytes > self.budget_bytes:
            victim = next((v for v in self._manifests if v != self.pinned), None)
            if victim is None:
                return  # only the pinned (active) version is left: it stays whatever it costs
            self._release(self._manifests.pop(victim))
            self.evictions += 1

    def _release(self, manifest: Manifest) -> None:
        for entry in manifest.tensors:
            left = self._refs[entry.digest] - 1
            if left:
                self._refs[entry.digest] = left
            else:
                del self._refs[entry.digest]
                del self._tensors[entry.digest]


class ChargedBudget:
    """A session budget less what adapter versions hold: ``GovernedSession(model, budget=
    ChargedBudget("6GiB", versions))``. The session reads ``budget_bytes`` before every request
    (a budget source), so the bytes a device spends on kept adapter versions come out of what it
    admits and what its KV pool may grow to. ``budget`` is bytes ("6GiB", an int) or another budget
    source (a telemetry controller), charged the same way. The active version's parameters are
    model weights, which the session counts already; every kept version is a copy on the host,
    charged in full (on unified-memory devices host and accelerator memory are one)."""

    def __init__(self, budget: Any, *charges: Any) -> None:
        self.source: Any = budget if hasattr(budget, "budget_bytes") else None
        self.fixed = None if self.source is not None else parse_bytes(budget)
        self.charges = list(charges)  # objects with ``nbytes`` (AdapterVersions, caches)

    @property
    def charged_bytes(self) -> int:
        return sum(int(getattr(c, "nbytes", 0) or 0) for c in self.charges)

    @property
    def budget_bytes(self) -> int:
        base = int(self.source.budget_bytes) if self.source is not None else int(self.fixed or 0)
        return max(0, base - self.charged_bytes)
