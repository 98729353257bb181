"""The feature cache in a folder other processes can write: it deletes only its own files, never
serves a forged or swapped entry, never blocks on a FIFO nor reads ``/dev/zero``, never writes
through a planted symlink, and rebuilds no structure record it did not write. Real files, no mocks."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save as st_save

from memwarden.errors import InputError
from memwarden.runtime import featcache_file
from memwarden.runtime.featcache import FeatureCache
from memwarden.runtime.featcache_contract import TieredEncoderStore, _flatten

MIB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now_s = 1_000_000.0

    def __call__(self) -> float:
        return self.now_s


def feat(seed: int, n: int = 256) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + seed


def entry_path(cache: FeatureCache, fp: str) -> Path:
    assert cache.l2_dir is not None
    return cache.l2_dir / f"mwfc-{featcache_file.stem_of(fp)}.safetensors"


def user_files(folder: Path) -> dict[str, bytes]:
    """What a user keeps beside the cache: a model shard, downloads in progress, big blobs."""
    files = {
        "model-00001-of-00002.safetensors": st_save({"w": torch.ones(64, 64)}),
        "download.partial": b"half a download",
        "model.safetensors.partial": b"another tool's temp file",
        "blob-a.safetensors": os.urandom(MIB),
        "blob-b.bin": os.urandom(MIB),
        "blob-c.safetensors": os.urandom(MIB),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
        os.utime(folder / name, (1.0, 1.0))  # old: no age rule may take them for stale temp files
    return files


def test_sweep_eviction_and_clear_delete_only_the_caches_own_files(tmp_path: Path) -> None:
    clock = Clock()
    mine = user_files(tmp_path)
    # A small budget over a folder of 1 MiB user files: nothing of theirs is indexed, counted or evicted.
    cache = FeatureCache(tmp_path, l2_max_bytes=MIB // 2, clock=clock)
    assert cache.stats().l2.entries == 0 and cache.stats().l2.bytes == 0
    for i in range(40):  # far more than fit: eviction runs many times
        cache.put(f"img{i}", feat(i, n=4096))
    assert 0 < cache.stats().l2.entries < 40 and cache.stats().l2.evictions > 0
    clock.now_s += 7200
    assert cache.sweep() > 0
    cache.put("last", feat(1))
    cache.clear()
    again = FeatureCache(tmp_path, l2_max_bytes=1, clock=clock)  # a restart with the smallest budget
    again.sweep()
    again.clear()
    assert {name: (tmp_path / name).read_bytes() for name in mine} == mine
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*mine, ".memwarden-featcache.key"])


def test_a_foreign_file_at_an_entry_name_is_never_deleted_by_sweep_or_eviction(tmp_path: Path) -> None:
    clock = Clock()
    cache = FeatureCache(tmp_path, clock=clock)
    name = f"mwfc-{'ab' * 20}.safetensors"  # the cache's name shape, someone else's content
    (tmp_path / name).write_bytes(st_save({"w": torch.ones(4)}))
    fresh = FeatureCache(tmp_path, l2_max_bytes=1, clock=clock)  # indexed by name, evicted at once
    clock.now_s += 7200
    fresh.sweep()
    fresh.clear()
    cache.clear()
    assert (tmp_path / name).read_bytes() == st_save({"w": torch.ones(4)})


def forge(path: Path, tensor_value: float, *, created_s: str | None = None) -> None:
    """What an attacker with write access does: new tensor bytes, and the checksum recomputed the
    way the file looks (BLAKE2b-160 of the tensor bytes); optionally a new created_s."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = bytearray(data[8 + n :])
    body[:] = torch.full((len(body) // 4,), tensor_value, dtype=torch.float32).numpy().tobytes()
    meta = header["__metadata__"]
    meta["checksum"] = hashlib.blake2b(bytes(body), digest_size=20).hexdigest()
    if created_s is not None:
        meta["created_s"] = created_s
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(body))


@pytest.mark.parametrize("created_s", [None, "nan", "inf", "1e400"])
def test_a_forged_entry_is_a_miss_and_never_served(tmp_path: Path, created_s: str | None) -> None:
    clock = Clock()
    FeatureCache(tmp_path, clock=clock).put("img", feat(1))
    path = entry_path(FeatureCache(tmp_path, clock=clock), "img")
    forge(path, 666.0, created_s=created_s)
    reader = FeatureCache(tmp_path, clock=clock)
    assert reader.get("img") is None
    assert reader.stats().l2.corrupt == 1 and reader.stats().l2.hits == 0
    # Another key's file (an attacker's cache, or one encoded with no key) is refused the same way.
    path.write_bytes(featcache_file.encode("img", [torch.full((256,), 666.0)], True, clock.now_s))
    reader = FeatureCache(tmp_path, clock=clock)
    assert reader.get("img") is None and reader.stats().l2.corrupt == 1
    reader.put("img", feat(1))  # heals
    assert torch.equal(FeatureCache(tmp_path, clock=clock).get("img"), feat(1))  # type: ignore[arg-type]


def test_a_signed_entry_with_created_s_nan_is_refused_not_kept_for_ever(tmp_path: Path) -> None:
    clock = Clock()
    cache = FeatureCache(tmp_path, clock=clock)
    key = (tmp_path / ".memwarden-featcache.key").read_bytes()
    path = entry_path(cache, "img")
    path.write_bytes(featcache_file.encode("img", [feat(1)], True, float("nan"), key=key))
    fresh = FeatureCache(tmp_path, clock=clock)
    assert fresh.get("img") is None and fresh.stats().l2.corrupt == 1


def test_appended_or_truncated_bytes_are_a_miss(tmp_path: Path) -> None:
    clock = Clock()
    cache = FeatureCache(tmp_path, clock=clock)
    cache.put("img", feat(1))
    path = entry_path(cache, "img")
    good = path.read_bytes()
    for damaged in (good + b"\0" * 8, good[:-4], good[:-4] + b"\0\0\0\0"):
        path.write_bytes(damaged)
        fresh = FeatureCache(tmp_path, clock=clock)
        assert fresh.get("img") is None and fresh.stats().l2.corrupt == 1
        path.write_bytes(good)
    assert torch.equal(FeatureCache(tmp_path, clock=clock).get("img"), feat(1))  # type: ignore[arg-type]


def test_a_fifo_or_dev_zero_in_place_of_an_entry_is_a_miss(tmp_path: Path) -> None:
    clock = Clock()
    cache = FeatureCache(tmp_path, clock=clock)
    cache.put("a", feat(1))
    cache.put("b", feat(2))
    for fp, plant in (("a", lambda p: os.mkfifo(p)), ("b", lambda p: os.symlink("/dev/zero", p))):
        path = entry_path(cache, fp)
        path.unlink()
        plant(path)
        cache.clear(l2=False)  # the next get reads the disk: it must neither block nor read for ever
        assert cache.get(fp) is None
        assert os.path.lexists(path)  # a FIFO or symlink is not the cache's to delete
        fresh = FeatureCache(tmp_path, clock=clock)  # a restart does not index them either
        assert fp not in fresh and fresh.get(fp) is None
        fresh.sweep()
        fresh.put(fp, feat(3))  # the rename replaces the name; nothing is written through it
        assert stat.S_ISREG(os.lstat(path).st_mode)
        assert torch.equal(FeatureCache(tmp_path, clock=clock).get(fp), feat(3))  # type: ignore[arg-type]
    assert cache.stats().l2.corrupt == 2


def test_an_entry_grown_behind_the_caches_back_is_refused_unread(tmp_path: Path) -> None:
    import resource

    clock = Clock()
    cache = FeatureCache(tmp_path, clock=clock)  # L2 budget 2 GiB: the file's indexed size bounds a read
    cache.put("img", feat(1))
    os.truncate(entry_path(cache, "img"), 1 << 30)  # 1 GiB, sparse: costs no disk, would cost memory
    cache.clear(l2=False)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert cache.get("img") is None and cache.stats().l2.corrupt == 1
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 * 1024  # KiB: never read


def test_put_never_writes_through_a_planted_symlink(tmp_path: Path) -> None:
    clock = Clock()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    cache = FeatureCache(tmp_path / "cache", clock=clock)
    path = entry_path(cache, "img")
    os.symlink(victim, path)
    cache.put("img", feat(1))
    assert victim.read_bytes() == b"precious"
    assert stat.S_ISREG(os.lstat(path).st_mode) and stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert torch.equal(FeatureCache(tmp_path / "cache", clock=clock).get("img"), feat(1))  # type: ignore[arg-type]


def test_key_file_is_private_and_someone_elses_is_refused(tmp_path: Path) -> None:
    FeatureCache(tmp_path / "c")
    key = tmp_path / "c" / ".memwarden-featcache.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    assert stat.S_IMODE((tmp_path / "c").stat().st_mode) == 0o700
    key.chmod(0o644)  # readable by others: they could forge entries
    with pytest.raises(InputError, match="cache key"):
        FeatureCache(tmp_path / "c")
    key.unlink()
    os.symlink(tmp_path / "elsewhere", key)
    with pytest.raises(InputError, match="cache key"):
        FeatureCache(tmp_path / "c")
    assert not (tmp_path / "elsewhere").exists()  # nothing was created through the link


def test_structure_records_that_flatten_did_not_write_are_misses(tmp_path: Path) -> None:
    store = TieredEncoderStore(FeatureCache(tmp_path), torch.nn.Linear(2, 2))
    hostile = [
        b"[" * 100_000,  # deep JSON: RecursionError in the parser
        json.dumps({"l": [{"t": 5}]}).encode(),  # a tensor index out of range
        json.dumps({"t": -1}).encode(),
        json.dumps({"d": "x"}).encode(),
        json.dumps({"v": {"x": 1}}).encode(),
        b"\xff\xfe not json",
        json.dumps(json.loads("[" * 60 + "]" * 60)).encode(),
    ]
    for i, record in enumerate(hostile):
        value = (torch.frombuffer(bytearray(record), dtype=torch.uint8), torch.ones(2))
        store.cache.put(store.key(f"m{i}"), value)
        assert store.get(f"m{i}") is None
        assert f"m{i}" not in [k for k in store._seen] and store.key(f"m{i}") not in store.cache
    assert store.unreadable == len(hostile)


def test_deeply_nested_outputs_are_not_cached() -> None:
    nested: list[object] = [torch.ones(1)]
    for _ in range(sys.getrecursionlimit() + 10):
        nested = [nested]
    assert _flatten(nested) is None
    loop: list[object] = []
    loop.append(loop)
    assert _flatten(loop) is None
    store = TieredEncoderStore(FeatureCache(), torch.nn.Linear(2, 2))
    store.put("deep", nested)
    assert store.unstorable == 1 and store.get("deep") is None


def test_fuzz_campaign_small_budget() -> None:
    """benchmarks/bench_fuzz_cache.py on 300 mutations (the benchmark runs 10,000): every mutated
    entry or offload file is a miss, the original value, or ``OffloadFileChanged``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_fuzz_cache

    result = bench_fuzz_cache.run(300, seed=1, hang_s=120.0, offload_share=0.1)
    assert result["mutations"] == 300
    assert (result["tracebacks"], result["hangs"], result["wrong_data"]) == (0, 0, 0), result["first_tracebacks"]
    assert result["foreign_files_damaged"] == 0
    kinds = {k.split(":")[0] for k in result["kinds"]}
    assert {"flip", "truncate", "meta", "structure", "filetype", "offload"} <= kinds
