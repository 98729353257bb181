"""Tiered feature cache: hit rates, TTL expiry per tier, LRU within a tier, promotion, prewarm,
and recovery from corrupted L2 files (deleted, counted as misses, healed by the next put)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from memwarden.runtime import featcache
from memwarden.runtime.featcache import FeatureCache

KIB = 1024


class Clock:
    def __init__(self) -> None:
        self.now_s = 1_000_000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> Clock:
    return Clock()


def feat(seed: int, n: int = 256) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + seed  # n * 4 bytes


def same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b) and a.dtype == b.dtype
    return isinstance(b, tuple) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]


def files(cache: FeatureCache) -> list[Path]:
    assert cache.l2_dir is not None
    return sorted(cache.l2_dir.glob("*.safetensors"))


def test_hit_rate_l1_only(clock: Clock) -> None:
    cache = FeatureCache(clock=clock)
    for i in range(4):
        assert cache.get(f"img{i}") is None
        cache.put(f"img{i}", feat(i))
    for _ in range(3):
        for i in range(4):
            assert same(cache.get(f"img{i}"), feat(i))
    s = cache.stats()
    assert (s.l1.hits, s.l1.misses, s.l2.hits, s.l2.misses) == (12, 4, 0, 4)
    assert s.hit_rate == pytest.approx(12 / 16) and s.l1.entries == 4 and s.l1.bytes == 4 * 1024


def test_ttl_expiry_and_promotion(tmp_path: Path, clock: Clock) -> None:
    cache = FeatureCache(tmp_path, clock=clock)  # defaults: L1 120 s, L2 3600 s
    value = (feat(1), torch.ones(2, 3, dtype=torch.bfloat16))
    cache.put("a", value)
    clock.now_s += 119
    assert same(cache.get("a"), value) and cache.stats().l1.hits == 1
    clock.now_s += 2  # 121 s: gone from L1, still on disk
    assert same(cache.get("a"), value)
    s = cache.stats()
    assert (s.l1.expirations, s.l1.misses, s.l2.hits) == (1, 1, 1)
    assert same(cache.get("a"), value) and cache.stats().l1.hits == 2  # promoted with a fresh L1 TTL
    clock.now_s += 3600  # the file is now older than the L2 TTL
    assert cache.get("a") is None
    s = cache.stats()
    assert s.l2.expirations == 1 and s.l2.entries == 0 and files(cache) == []


def test_lru_within_l1(clock: Clock) -> None:
    cache = FeatureCache(l1_max_bytes=3 * KIB, clock=clock)
    for k in "abc":
        cache.put(k, feat(ord(k)))
    cache.get("a")  # a is now the most recently used; b the least
    cache.put("d", feat(4))
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    assert cache.stats().l1.evictions == 1 and cache.stats().l1.bytes <= 3 * KIB
    cache.put("huge", feat(0, n=4096))  # larger than L1: not stored, nothing evicted for it
    assert "huge" not in cache and cache.stats().l1.entries == 3
    cache.resize(l1_max_bytes=1 * KIB)  # the budget fell
    assert cache.stats().l1.entries == 1 and cache.stats().l1.evictions == 3


def test_lru_within_l2_and_restart(tmp_path: Path, clock: Clock) -> None:
    one_file = len(featcache._encode("x", [feat(0)], True, clock.now_s)) + 16  # room for 3, not 4
    cache = FeatureCache(tmp_path, l1_max_bytes=0, l2_max_bytes=3 * one_file, clock=clock)
    for k in "abc":
        cache.put(k, feat(ord(k)))
        time.sleep(0.01)  # distinct mtimes: recency order survives a restart
    assert cache.get("a") is not None  # a used; b is the least recently used
    cache.put("d", feat(4))
    assert "b" not in cache and all(k in cache for k in "acd")
    assert cache.stats().l2.evictions == 1 and len(files(cache)) == 3

    (tmp_path / ".old.safetensors.x.partial").write_bytes(b"half")  # a crashed writer's temp file
    past = time.time() - 3600
    os.utime(tmp_path / ".old.safetensors.x.partial", (past, past))
    again = FeatureCache(tmp_path, clock=clock)
    assert again.stats().l2.entries == 3 and not list(tmp_path.glob("*.partial"))
    assert same(again.get("d"), feat(4))


def test_prewarm(tmp_path: Path, clock: Clock) -> None:
    writer = FeatureCache(tmp_path, clock=clock)
    for i in range(5):
        writer.put(f"f{i}", feat(i))
    cache = FeatureCache(tmp_path, l1_max_bytes=3 * KIB, clock=clock)
    assert cache.prewarm(["f0", "missing", "f1", "f2", "f3", "f4"]) == 3  # as many as fit, in order
    assert {k for k in ("f0", "f1", "f2") if cache.get(k) is not None} == {"f0", "f1", "f2"}
    s = cache.stats()
    assert (s.prewarmed, s.l1.hits, s.l1.misses, s.l2.hits) == (3, 3, 0, 0)


def corrupt_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in the tensor data: only the checksum notices
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        corrupt_bytes,
        lambda p: p.write_bytes(p.read_bytes()[:20]),  # truncated
        lambda p: p.write_bytes(b"\x00" * 3),  # shorter than the length prefix
        lambda p: p.write_bytes(b"\xff" * 64),  # header length out of range
        lambda p: p.write_bytes((8).to_bytes(8, "little") + b"not json"),
        lambda p: p.write_bytes(featcache._encode("someone-else", [feat(9)], True, 1e6)),  # other key's file
    ],
)
def test_recovery_from_corrupted_l2_file(tmp_path: Path, clock: Clock, damage) -> None:  # type: ignore[no-untyped-def]
    cache = FeatureCache(tmp_path, clock=clock)
    cache.put("img", feat(1))
    (path,) = files(cache)
    damage(path)
    fresh = FeatureCache(tmp_path, clock=clock)  # a new process: L1 empty, must read the file
    assert fresh.get("img") is None
    s = fresh.stats()
    assert (s.l2.corrupt, s.l2.misses, s.l2.entries) == (1, 1, 0) and not path.exists()
    fresh.put("img", feat(1))  # the caller re-encodes; the entry heals
    assert same(FeatureCache(tmp_path, clock=clock).get("img"), feat(1))


def test_files_are_safetensors_with_checksum(tmp_path: Path, clock: Clock) -> None:
    cache = FeatureCache(tmp_path, clock=clock)
    view = torch.arange(100, dtype=torch.float32)
    cache.put("pair", (view[:10], view[5:20]))  # shared storage: safetensors alone would refuse it
    (path,) = files(cache)
    assert path.read_bytes()[:1] != b"\x80"  # not a pickle
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        assert sorted(f.keys()) == ["0", "1"]
    assert meta["fingerprint"] == "pair" and len(meta["checksum"]) == 40 and meta["kind"] == "tuple"
    assert same(FeatureCache(tmp_path, clock=clock).get("pair"), (view[:10], view[5:20]))


def test_keys_cannot_escape_the_directory(tmp_path: Path, clock: Clock) -> None:
    cache = FeatureCache(tmp_path / "c", clock=clock)
    cache.put("../../etc/passwd", feat(1))
    assert [p.parent for p in files(cache)] == [tmp_path / "c"]
    assert same(cache.get("../../etc/passwd"), feat(1))


def test_disk_errors_are_counted_not_raised(tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(path: object, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(featcache, "atomic_write", full)
    cache = FeatureCache(tmp_path, clock=clock)
    cache.put("a", feat(1))
    assert same(cache.get("a"), feat(1))  # L1 still serves it
    assert cache.stats().l2.write_errors == 1 and cache.stats().l2.entries == 0


def test_bad_values_and_misc(tmp_path: Path, clock: Clock) -> None:
    cache = FeatureCache(tmp_path, clock=clock)
    for bad in (None, (), [1, 2], (torch.ones(1), "x")):
        with pytest.raises(TypeError):
            cache.put("k", bad)  # type: ignore[arg-type]
    cache.put("a", feat(1))
    cache.put("b", feat(2))
    cache.invalidate("a")
    assert "a" not in cache and "b" in cache and 3 not in cache
    clock.now_s += 4000
    assert cache.sweep() == 2 and cache.stats().l1.entries == 0 and files(cache) == []
    cache.put("c", feat(3))
    cache.clear()
    assert files(cache) == [] and cache.get("c") is None
    assert set(cache.stats().to_json()) == {"l1", "l2", "prewarmed", "hit_rate"}


@pytest.mark.cuda
def test_l1_on_device_l2_on_host(tmp_path: Path, clock: Clock) -> None:
    cache = FeatureCache(tmp_path, l1_device="cuda", clock=clock)
    cache.put("a", feat(1))
    assert cache.get("a").device.type == "cuda"  # type: ignore[union-attr]
    fresh = FeatureCache(tmp_path, l1_device="cuda", clock=clock)
    assert fresh.get("a").device.type == "cuda"  # type: ignore[union-attr]
