"""Tiered cache of encoder outputs (vision/audio features) keyed by content fingerprint.

A repeated image or audio clip should not be encoded again. Two tiers, LRU within each:

- **L1**, in memory (the device the encoder ran on, or ``l1_device``), ``l1_ttl_s`` (120 s)
  after the entry entered the tier, at most ``l1_max_bytes``. Counted by the storage bytes
  each tensor keeps alive (a view of a big tensor keeps all of it; put a ``.clone()`` of it).
- **L2**, on disk (``l2_dir``; none = no L2), ``l2_ttl_s`` (3600 s) after the file was
  written, at most ``l2_max_bytes``. Writes go through to L2 on every ``put`` so an entry
  survives L1 eviction and restarts; an L2 hit is promoted to L1 with a fresh L1 TTL.

TTLs count from entering a tier, not from the last hit: a feature computed from an old model
version or an old input pipeline should age out even if it is popular. L2 ages use the
file's own ``created_s`` and the injectable wall clock, because files outlive processes.

L2 files are safetensors (never pickle: a cache directory is a place other processes can
write), named ``mwfc-<BLAKE2b of the fingerprint>.safetensors``, with the fingerprint, the
creation time and a keyed digest of the whole file (BLAKE2b keyed with the folder's secret key,
``.memwarden-featcache.key``, 0600, made by the first cache on the folder) in the header's
metadata, written to a new temp file (``O_EXCL | O_NOFOLLOW``, 0600) and renamed into place: a
symlink planted at an entry's name is replaced, never written through. A file that is truncated,
garbled, forged (its digest needs the key), a symlink, FIFO or device, or another fingerprint's,
is counted as ``corrupt`` and as a miss, and never used as data; the caller recomputes the
features and ``put`` heals the entry. The cache only ever deletes files of its own: an entry's
name and header (sweep, eviction, ``clear``), its own stale temp files. Other files in the folder
(model shards, downloads) are never indexed, counted or removed. Disk errors while writing are
counted (``write_errors``), never raised: the cache is an optimisation and must not take the
session down. Values are returned as stored, not copied: treat them as read-only.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Union

import torch
from safetensors.torch import load as st_load

from memwarden.runtime import featcache_file as ff
from memwarden.runtime.private_files import folder_key, read_own
from memwarden.runtime.private_files import replace_with as atomic_write
from memwarden.untrusted import finite_int

__all__ = ["CacheStats", "FeatureCache", "FeatureValue", "TierStats"]

FeatureValue = Union[torch.Tensor, tuple[torch.Tensor, ...]]  # noqa: UP007 (a runtime alias)

_MIB = 1 << 20
_encode = ff.encode  # (fp, tensors, single, now, *, key) -> an entry's bytes
_STALE_TEMP_S = 60.0  # a temp file this old is a crashed writer's, not a writer in progress


@dataclass(frozen=True, kw_only=True)
class TierStats:
    hits: int
    misses: int
    evictions: int  # dropped for room (LRU)
    expirations: int  # dropped for age (TTL)
    corrupt: int  # L2 files refused: unreadable, changed, forged or not the cache's
    write_errors: int  # L2 writes that failed (disk full, permissions)
    entries: int
    bytes: int
    max_bytes: int
    ttl_s: float

    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


@dataclass(frozen=True, kw_only=True)
class CacheStats:
    l1: TierStats
    l2: TierStats
    prewarmed: int  # entries loaded into L1 by prewarm()

    @property
    def hit_rate(self) -> float:
        """Lookups answered by either tier (every lookup goes to L1 first)."""
        lookups = self.l1.hits + self.l1.misses
        return (self.l1.hits + self.l2.hits) / lookups if lookups else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "l1": {**asdict(self.l1), "hit_rate": self.l1.hit_rate},
            "l2": {**asdict(self.l2), "hit_rate": self.l2.hit_rate},
            "prewarmed": self.prewarmed,
            "hit_rate": self.hit_rate,
        }


@dataclass
class _L1Entry:
    value: FeatureValue
    nbytes: int
    expires_s: float


class _Counters:
    def __init__(self) -> None:
        self.hits = self.misses = self.evictions = self.expirations = self.corrupt = self.write_errors = 0


class FeatureCache:
    """``get(fp) -> value | None``, ``put(fp, value)``, ``prewarm(fps)``; see the module docstring."""

    def __init__(
        self,
        l2_dir: str | os.PathLike[str] | None = None,
        *,
        l1_max_bytes: int = 256 * _MIB,
        l1_ttl_s: float = 120.0,
        l2_max_bytes: int = 2048 * _MIB,
        l2_ttl_s: float = 3600.0,
        l1_device: str | torch.device | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.l1_max_bytes, self.l1_ttl_s = int(l1_max_bytes), float(l1_ttl_s)
        self.l2_max_bytes, self.l2_ttl_s = int(l2_max_bytes), float(l2_ttl_s)
        self.l1_device = None if l1_device is None else torch.device(l1_device)
        self._clock = clock
        self._lock = threading.RLock()
        self._l1: OrderedDict[str, _L1Entry] = OrderedDict()  # oldest use first
        self._l1_bytes = 0
        self._l2: OrderedDict[str, int] = OrderedDict()  # file stem -> file bytes, oldest use first
        self._l2_bytes = 0
        self._c1, self._c2 = _Counters(), _Counters()
        self._prewarmed = 0
        self.l2_dir = None if l2_dir is None else Path(l2_dir)
        self._key = b""
        if self.l2_dir is not None:
            self.l2_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._key = folder_key(self.l2_dir, ff.KEY_FILE)  # InputError if someone else's
            self._scan()

    # -- public API -----------------------------------------------------------------------

    def get(self, fp: str) -> FeatureValue | None:
        """The features for ``fp``, from L1, else from L2 (then promoted to L1), else None."""
        with self._lock:
            now = self._clock()
            entry = self._l1.get(fp)
            if entry is not None and entry.expires_s <= now:
                self._drop_l1(fp)
                self._c1.expirations += 1
                entry = None
            if entry is not None:
                self._l1.move_to_end(fp)
                self._c1.hits += 1
                return entry.value
            self._c1.misses += 1
            value = self._read_l2(fp, now)
            if value is None:
                self._c2.misses += 1
                return None
            self._c2.hits += 1
            return self._store_l1(fp, value, now)

    def put(self, fp: str, value: FeatureValue) -> None:
        """Store ``value`` (a tensor or a tuple of tensors) in L1 and write it through to L2."""
        tensors = _as_tensors(value)
        with self._lock:
            now = self._clock()
            self._store_l1(fp, value, now)
            if self.l2_dir is not None:
                self._write_l2(fp, tensors, isinstance(value, torch.Tensor), now)

    def prewarm(self, fingerprints: Iterable[str]) -> int:
        """Load these entries from L2 into L1 ahead of use, in order, while they fit in L1
        together (a later one never evicts an earlier one). Returns how many were loaded;
        missing ones are skipped. Not counted as hits or misses."""
        loaded = loaded_bytes = 0
        with self._lock:
            now = self._clock()
            for fp in fingerprints:
                entry = self._l1.get(fp)
                if entry is not None and entry.expires_s > now:
                    continue
                value = self._read_l2(fp, now)
                if value is None:
                    continue
                nbytes = _nbytes(value)
                if loaded_bytes + nbytes > self.l1_max_bytes:
                    break
                self._store_l1(fp, value, now)
                loaded, loaded_bytes = loaded + 1, loaded_bytes + nbytes
            self._prewarmed += loaded
        return loaded

    def __contains__(self, fp: object) -> bool:
        if not isinstance(fp, str):
            return False
        with self._lock:
            entry = self._l1.get(fp)
            return (entry is not None and entry.expires_s > self._clock()) or ff.stem_of(fp) in self._l2

    def invalidate(self, fp: str) -> None:
        with self._lock:
            self._drop_l1(fp)
            self._drop_l2(ff.stem_of(fp))

    def clear(self, *, l2: bool = True) -> None:
        """Drop every entry (``l2=False``: the in-memory tier only, as under memory pressure)."""
        with self._lock:
            for fp in list(self._l1):
                self._drop_l1(fp)
            for stem in list(self._l2) if l2 else []:
                self._drop_l2(stem)

    def resize(self, *, l1_max_bytes: int | None = None, l2_max_bytes: int | None = None) -> None:
        """New limits (the session shrinks L1 when its memory budget falls); evicts to fit."""
        with self._lock:
            if l1_max_bytes is not None:
                self.l1_max_bytes = int(l1_max_bytes)
                self._evict_l1(0)
            if l2_max_bytes is not None:
                self.l2_max_bytes = int(l2_max_bytes)
                self._evict_l2(0)

    def sweep(self) -> int:
        """Drop every expired entry of both tiers now (reads only L2 headers). Returns the count."""
        dropped = 0
        with self._lock:
            now = self._clock()
            for fp, entry in list(self._l1.items()):
                if entry.expires_s <= now:
                    self._drop_l1(fp)
                    self._c1.expirations += 1
                    dropped += 1
            for stem in list(self._l2):
                created_s = self._own_created_s(stem)
                if created_s is None:  # not an entry of ours (any more): forgotten, never deleted
                    self._forget_l2(stem)
                    self._c2.corrupt += 1
                elif created_s + self.l2_ttl_s <= now:
                    self._drop_l2(stem, own=True)
                    self._c2.expirations += 1
                    dropped += 1
        return dropped

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                l1=self._tier(self._c1, len(self._l1), self._l1_bytes, self.l1_max_bytes, self.l1_ttl_s),
                l2=self._tier(self._c2, len(self._l2), self._l2_bytes, self.l2_max_bytes, self.l2_ttl_s),
                prewarmed=self._prewarmed,
            )

    # -- L1 ---------------------------------------------------------------------------------

    def _store_l1(self, fp: str, value: FeatureValue, now: float) -> FeatureValue:
        if self.l1_device is not None:
            value = _to(value, self.l1_device)
        nbytes = _nbytes(value)
        self._drop_l1(fp)
        if nbytes > self.l1_max_bytes:
            return value  # would evict everything and still not fit; L2 (if any) keeps it
        self._evict_l1(nbytes)
        self._l1[fp] = _L1Entry(value=value, nbytes=nbytes, expires_s=now + self.l1_ttl_s)
        self._l1_bytes += nbytes
        return value

    def _evict_l1(self, incoming_bytes: int) -> None:
        now = self._clock()
        for fp in [fp for fp, e in self._l1.items() if e.expires_s <= now]:  # expired go first
            self._drop_l1(fp)
            self._c1.expirations += 1
        while self._l1 and self._l1_bytes + incoming_bytes > self.l1_max_bytes:
            self._drop_l1(next(iter(self._l1)))
            self._c1.evictions += 1

    def _drop_l1(self, fp: str) -> None:
        entry = self._l1.pop(fp, None)
        if entry is not None:
            self._l1_bytes -= entry.nbytes

    # -- L2 ---------------------------------------------------------------------------------

    def _path(self, stem: str) -> Path:
        assert self.l2_dir is not None
        return self.l2_dir / f"{ff.PREFIX}{stem}{ff.SUFFIX}"

    def _scan(self) -> None:
        """Index the files already there, least recently used (oldest mtime) first."""
        assert self.l2_dir is not None
        found = []
        uid = os.geteuid() if hasattr(os, "geteuid") else None
        for entry in os.scandir(self.l2_dir):
            ours, temp = ff.ENTRY_NAME.fullmatch(entry.name), ff.TEMP_NAME.fullmatch(entry.name)
            try:
                st = entry.stat(follow_symlinks=False) if ours or temp else None
            except OSError:
                continue
            if st is None or not stat.S_ISREG(st.st_mode):  # symlinks, FIFOs, others' files: left alone
                continue
            if temp:  # a crashed writer's (this user's), not a writer in progress
                if st.st_uid == (st.st_uid if uid is None else uid) and time.time() - st.st_mtime > _STALE_TEMP_S:
                    _unlink(Path(entry.path))
            else:
                found.append((st.st_mtime, entry.name[len(ff.PREFIX) : -len(ff.SUFFIX)], st.st_size))
        for _, stem, size in sorted(found):
            self._l2[stem] = size
            self._l2_bytes += size
        self._evict_l2(0)

    def _read_l2(self, fp: str, now: float) -> FeatureValue | None:
        stem = ff.stem_of(fp)
        if self.l2_dir is None or stem not in self._l2:
            return None
        path = self._path(stem)
        try:
            # A regular file only (never a FIFO, device or symlink), about the size indexed: one grown
            # behind our back is refused before it is read.
            data = read_own(path, min(self.l2_max_bytes, self._l2[stem] + ff.HEADER_READ_BYTES))
            meta = ff.verify(data, self._key)  # from here on the bytes are ours, as written
            if meta.get("fingerprint") != fp:
                raise ff.CorruptEntry("another fingerprint")
            if ff.created_s(meta) + self.l2_ttl_s <= now:
                self._drop_l2(stem, own=True)
                self._c2.expirations += 1
                return None
            tensors = st_load(data)
            count = finite_int(int(meta["count"]), "count", lo=1, hi=len(tensors))
            value: FeatureValue = (
                tensors["0"] if meta["kind"] == "tensor" else tuple(tensors[str(i)] for i in range(count))
            )
        except FileNotFoundError:  # removed behind our back (another process, a cleaner)
            self._forget_l2(stem)
            return None
        except Exception:  # forged, truncated, garbled, not a regular file, missing keys: all corrupt
            self._discard_l2(stem)
            self._c2.corrupt += 1
            return None
        self._l2.move_to_end(stem)
        try:
            os.utime(path, follow_symlinks=False)  # recency survives restarts: _scan orders by mtime
        except OSError:
            pass
        return value

    def _write_l2(self, fp: str, tensors: list[torch.Tensor], single: bool, now: float) -> None:
        stem = ff.stem_of(fp)
        try:
            data = _encode(fp, tensors, single, now, key=self._key)
        except Exception:
            self._c2.write_errors += 1
            return
        self._drop_l2(stem)
        if len(data) > self.l2_max_bytes:
            return
        self._evict_l2(len(data))
        try:
            atomic_write(self._path(stem), data)
        except OSError:
            self._c2.write_errors += 1
            return
        self._l2[stem] = len(data)
        self._l2_bytes += len(data)

    def _evict_l2(self, incoming_bytes: int) -> None:
        while self._l2 and self._l2_bytes + incoming_bytes > self.l2_max_bytes:
            if self._drop_l2(next(iter(self._l2))):
                self._c2.evictions += 1
            else:
                self._c2.corrupt += 1

    def _drop_l2(self, stem: str, *, own: bool = False) -> bool:
        """Forget the entry and delete its file if it is ours (``own``: just verified): its name and
        header. Whether it was deleted."""
        ours = stem in self._l2 and (own or self._own_created_s(stem) is not None)
        if ours:
            _unlink(self._path(stem))
        self._forget_l2(stem)
        return ours

    def _discard_l2(self, stem: str) -> None:
        """A file at an entry's name that failed verification on read: deleted if a regular file
        (the name is the cache's; a put would replace it), else only forgotten. Never followed."""
        try:
            if stat.S_ISREG(os.lstat(self._path(stem)).st_mode):
                _unlink(self._path(stem))
        except OSError:
            pass
        self._forget_l2(stem)

    def _own_created_s(self, stem: str) -> float | None:
        """The creation time in the entry's file's header if the file is a regular file (never a
        symlink followed) with this cache's header for this name; None otherwise."""
        try:
            head = read_own(self._path(stem), self.l2_max_bytes, head=ff.HEADER_READ_BYTES)
        except Exception:  # OSError, NotOurs
            return None
        return ff.header_created_s(head, stem)

    def _forget_l2(self, stem: str) -> None:
        size = self._l2.pop(stem, None)
        if size is not None:
            self._l2_bytes -= size

    @staticmethod
    def _tier(c: _Counters, entries: int, nbytes: int, max_bytes: int, ttl_s: float) -> TierStats:
        return TierStats(**vars(c), entries=entries, bytes=nbytes, max_bytes=max_bytes, ttl_s=ttl_s)


# -- helpers -----------------------------------------------------------------------------------


def _as_tensors(value: Any) -> list[torch.Tensor]:
    items = [value] if isinstance(value, torch.Tensor) else value
    if not isinstance(items, (tuple, list)) or not items or not all(isinstance(t, torch.Tensor) for t in items):
        raise TypeError(f"a feature value is a tensor or a non-empty tuple of tensors, got {type(value).__name__}")
    return list(items)


def _nbytes(value: FeatureValue) -> int:
    """Bytes the value keeps alive: each distinct storage once."""
    storages = {}
    for t in _as_tensors(value):
        storage = t.untyped_storage()
        storages[(storage.data_ptr(), t.device)] = storage.nbytes()
    return sum(storages.values())


def _to(value: FeatureValue, device: torch.device) -> FeatureValue:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return tuple(t.to(device) for t in value)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError:
        pass  # read-only medium: the index forgets it either way
