"""The server's adapter versions on disk: ``ROOT/<adapter>/v<version>.safetensors``.

Files are written atomically, so a server that restarts (or crashes mid-publish) finds every
version whole or absent; everything else is derived from them and rebuilt on start. Tensors are
addressed by digest, so a device asks for exactly the bytes it lacks whatever version they
first appeared in.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from memwarden.edge.sync.delta import adapter_manifest, make_delta
from memwarden.edge.sync.manifest import AdapterFormatError, Manifest, RawTensor
from memwarden.trace.io import atomic_write

__all__ = ["AdapterStore", "check_adapter_name"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_FILE = re.compile(r"^v(\d{1,12})\.safetensors$")


def check_adapter_name(name: str) -> str:
    """A name that is safe as one path component and one URL segment."""
    if not _NAME.match(name) or ".." in name:
        raise AdapterFormatError(f"adapter name {name[:80]!r}: use letters, digits, '_', '-', '.' (max 128)")
    return name


class AdapterStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._manifests: dict[str, dict[int, Manifest]] = {}
        self._tensors: dict[str, RawTensor] = {}  # digest -> tensor (any version that has it)
        for folder in sorted(self.root.iterdir()):
            if folder.is_dir() and _NAME.match(folder.name):
                versions = sorted(int(m.group(1)) for f in folder.iterdir() if (m := _FILE.match(f.name)))
                for version in versions:
                    self._index(folder.name, version, (folder / f"v{version}.safetensors").read_bytes())

    def adapters(self) -> list[str]:
        return sorted(self._manifests)

    def publish(self, adapter: str, blob: bytes, *, version: int | None = None) -> Manifest:
        """Keep ``blob`` as the next version of ``adapter`` (or ``version``, above the latest)."""
        check_adapter_name(adapter)
        latest = self.latest(adapter) if adapter in self._manifests else None
        if version is None:
            version = latest.version + 1 if latest is not None else 0
        if latest is not None and version <= latest.version:
            raise AdapterFormatError(f"{adapter}: version {version} is not above the latest ({latest.version})")
        manifest, _ = adapter_manifest(blob, adapter=adapter, version=version, previous=latest)  # validates
        (self.root / adapter).mkdir(exist_ok=True)
        atomic_write(self.root / adapter / f"v{version}.safetensors", blob)
        self._index(adapter, version, blob)
        return manifest

    def latest(self, adapter: str) -> Manifest:
        versions = self._versions(adapter)
        return versions[max(versions)]

    def manifest(self, adapter: str, version: int) -> Manifest:
        versions = self._versions(adapter)
        if version not in versions:
            raise KeyError(f"{adapter} v{version}")
        return versions[version]

    def tensor(self, digest: str) -> RawTensor:
        return self._tensors[digest]

    def file(self, adapter: str, version: int) -> bytes:
        self.manifest(adapter, version)
        return (self.root / adapter / f"v{version}.safetensors").read_bytes()

    def delta(self, adapter: str, from_version: int, to_version: int | None = None) -> bytes:
        """A delta file from ``from_version`` to ``to_version`` (default the latest)."""
        target = self.latest(adapter).version if to_version is None else to_version
        blob, _ = make_delta(self.manifest(adapter, from_version), self.file(adapter, target), version=target)
        return blob

    def _versions(self, adapter: str) -> dict[int, Manifest]:
        versions = self._manifests.get(adapter)
        if not versions:
            raise KeyError(adapter)
        return versions

    def _index(self, adapter: str, version: int, blob: bytes) -> None:
        versions = self._manifests.setdefault(adapter, {})
        previous = versions[max(versions)] if versions else None
        manifest, tensors = adapter_manifest(blob, adapter=adapter, version=version, previous=previous)
        versions[version] = manifest
        for entry in manifest.tensors:
            self._tensors.setdefault(entry.digest, tensors[entry.name])
