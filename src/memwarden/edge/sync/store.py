"""The server's adapter versions on disk: ``ROOT/<adapter>/v<version>.safetensors`` and, beside
each, the publisher's signed manifest ``v<version>.manifest.json``.

Publishing is serialized and never replaces a version: under a per-adapter lock (a thread lock
and an ``flock`` on ``ROOT/<adapter>/.publish.lock``, so two stores on one root in two processes
serialize too) the store reads the versions on disk again, takes the next number, and claims it
with a hard link that fails if the file exists. Two concurrent ``publish`` calls get two versions;
neither upload is lost. The manifest is written (atomically) last: a version is served only once
both files are whole, so a crash mid-publish leaves a claimed number and nothing served.

Reading the store back (a restart) goes through ``untrusted.read_regular``: a FIFO, device or
oversized file in the store is skipped with its reason in ``skipped``, never read. A version
whose signed manifest does not describe its file, or that has none (published before signing),
is skipped the same way. The store needs the publisher's signing key only to publish.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from memwarden.edge.sync.delta import adapter_manifest, make_delta
from memwarden.edge.sync.manifest import MAX_HEADER_BYTES, AdapterFormatError, Manifest, RawTensor
from memwarden.edge.sync.signing import SigningKey, sign_manifest
from memwarden.errors import InputError
from memwarden.trace.io import atomic_write
from memwarden.untrusted import read_regular

__all__ = ["MAX_ADAPTER_BYTES", "AdapterStore", "check_adapter_name"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_FILE = re.compile(r"^v(\d{1,12})\.safetensors$")
MAX_ADAPTER_BYTES = 16 << 30  # a rank-64 adapter of a 70B model is ~1.7 GB
_DELTA_CACHE = 8


def check_adapter_name(name: str) -> str:
    """A name that is safe as one path component and one URL segment."""
    if not _NAME.match(name) or ".." in name:
        raise AdapterFormatError(f"adapter name {name[:80]!r}: use letters, digits, '_', '-', '.' (max 128)")
    return name


class AdapterStore:
    def __init__(self, root: str | os.PathLike[str], *, signing_key: SigningKey | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.signing_key = signing_key
        self.skipped: dict[str, str] = {}  # "adapter/vN" -> why it is not served
        self._manifests: dict[str, dict[int, Manifest]] = {}
        self._signed: dict[str, dict[int, bytes]] = {}  # the signed manifest bytes, as published
        self._tensors: dict[str, RawTensor] = {}  # digest -> tensor (any version that has it)
        self._deltas: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._lock = threading.Lock()
        for folder in sorted(self.root.iterdir()):
            if folder.is_dir() and _NAME.match(folder.name):
                self._scan(folder.name)

    def adapters(self) -> list[str]:
        return sorted(name for name, versions in self._manifests.items() if versions)

    def publish(self, adapter: str, blob: bytes, *, version: int | None = None) -> Manifest:
        """Keep ``blob`` as the next version of ``adapter`` (or ``version``, above the latest),
        its manifest signed with the store's signing key. Atomic and serialized."""
        check_adapter_name(adapter)
        if self.signing_key is None:
            raise InputError(
                "publishing needs the publisher's signing key: AdapterStore(root, signing_key=SigningKey.load(PATH)) "
                "(make one with `memwarden lora keygen`)"
            )
        folder = self.root / adapter
        folder.mkdir(exist_ok=True)
        with self._lock, _FileLock(folder / ".publish.lock"):
            claimed = self._scan(adapter)  # what other stores (processes) published meanwhile
            versions = self._manifests.get(adapter) or {}
            latest = versions[max(versions)] if versions else None
            top = max(claimed, default=-1)
            if version is None:
                version = top + 1
            elif version <= top:
                raise AdapterFormatError(f"{adapter}: version {version} is not above the latest ({top})")
            manifest, _ = adapter_manifest(blob, adapter=adapter, version=version, previous=latest)  # validates
            signed = sign_manifest(manifest, self.signing_key)
            _create(folder / f"v{version}.safetensors", blob)
            atomic_write(folder / f"v{version}.manifest.json", signed)
            self._index(adapter, version, blob, signed)
        return manifest

    def latest(self, adapter: str) -> Manifest:
        versions = self._versions(adapter)
        return versions[max(versions)]

    def manifest(self, adapter: str, version: int) -> Manifest:
        versions = self._versions(adapter)
        if version not in versions:
            raise KeyError(f"{adapter} v{version}")
        return versions[version]

    def signed_manifest(self, adapter: str, version: int | None = None) -> bytes:
        """The publisher's signed manifest bytes of a version (default the latest)."""
        target = self.latest(adapter).version if version is None else self.manifest(adapter, version).version
        return self._signed[adapter][target]

    def tensor(self, digest: str) -> RawTensor:
        return self._tensors[digest]

    def file(self, adapter: str, version: int) -> bytes:
        self.manifest(adapter, version)
        path = self.root / adapter / f"v{version}.safetensors"
        return read_regular(path, MAX_ADAPTER_BYTES, what="an adapter version")

    def delta(self, adapter: str, from_version: int, to_version: int | None = None) -> bytes:
        """A delta file from ``from_version`` to ``to_version`` (default the latest), carrying the
        target's signed manifest. The last few are kept: a resumed transfer asks again."""
        target = self.latest(adapter).version if to_version is None else to_version
        key = (adapter, from_version, target)
        blob = self._deltas.get(key)
        if blob is None:
            blob, _ = make_delta(
                self.manifest(adapter, from_version),
                self.file(adapter, target),
                version=target,
                signed_manifest=self.signed_manifest(adapter, target),
            )
            self._deltas[key] = blob
            while len(self._deltas) > _DELTA_CACHE:
                self._deltas.popitem(last=False)
        self._deltas.move_to_end(key)
        return blob

    def _versions(self, adapter: str) -> dict[int, Manifest]:
        versions = self._manifests.get(adapter)
        if not versions:
            raise KeyError(adapter)
        return versions

    def _scan(self, adapter: str) -> set[int]:
        """Index the versions of ``adapter`` on disk not indexed yet; every number claimed."""
        folder = self.root / adapter
        claimed = {int(m.group(1)) for f in folder.iterdir() if (m := _FILE.match(f.name))}
        known = self._manifests.get(adapter, {})
        for version in sorted(claimed - set(known)):
            where = f"{adapter}/v{version}"
            try:
                blob = read_regular(folder / f"v{version}.safetensors", MAX_ADAPTER_BYTES, what="an adapter version")
                signed = read_regular(folder / f"v{version}.manifest.json", MAX_HEADER_BYTES, what="a signed manifest")
                self._index(adapter, version, blob, signed)
            except InputError as exc:  # AdapterFormatError too
                self.skipped[where] = str(exc)
        return claimed

    def _index(self, adapter: str, version: int, blob: bytes, signed: bytes) -> None:
        versions = self._manifests.setdefault(adapter, {})
        manifest = Manifest.from_bytes(signed)
        if b'"signature"' not in signed:
            raise AdapterFormatError(f"{adapter} v{version}: the manifest is not signed (publish it again)")
        found, tensors = adapter_manifest(blob, adapter=adapter, version=version)
        if (manifest.adapter, manifest.version, manifest.content_digest) != (adapter, version, found.content_digest):
            raise AdapterFormatError(f"{adapter} v{version}: the signed manifest does not describe the file")
        versions[version] = manifest
        self._signed.setdefault(adapter, {})[version] = signed
        for entry in manifest.tensors:
            self._tensors.setdefault(entry.digest, tensors[entry.name])


def _create(path: Path, data: bytes) -> None:
    """Write ``path`` whole, failing if it exists (a hard link never replaces its target)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise AdapterFormatError(f"{path.name} exists already: that version was published") from None
    finally:
        os.unlink(tmp)


class _FileLock:
    """An exclusive ``flock`` held for a ``with`` block (other processes publishing to the root)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> _FileLock:
        import fcntl

        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        import fcntl

        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
