"""Fuzz the files of the feature cache (L2) and of weight streaming; count tracebacks and hangs.

    python benchmarks/bench_fuzz_cache.py [--n 10000] [--seed 0] [--hang-s 10] [--json]

Each mutation takes a valid file the cache (or the streamer) wrote and changes it behind its back,
then runs one operation on it: ``get``, ``prewarm``, ``sweep``, ``clear``, ``resize``, a restart
(``FeatureCache(dir).get``), ``TieredEncoderStore.get`` (which rebuilds a structure record), or a
streamed model's forward pass and ``detach``. Mutations:

- bytes: bits flipped (anywhere, header, body), truncated, extended, the header length replaced;
- header JSON: a metadata field (created_s, count, kind, fingerprint, format, checksum) or a tensor
  entry (dtype, shape, data_offsets) set to a hostile value (``nan``, ``inf``, ``1e400``, a
  400-digit number, negative, empty, a list, 2,000-deep nesting), or the whole header deep JSON;
  *unsigned* (what an attacker can write: the digest does not match) or *signed* with the folder's
  own key (what a bug or a leaked key could produce: exercises every parser after the digest);
- structure records (the encoder store's tensor 0): deep JSON, wrong node shapes, tensor indices
  out of range, not JSON, signed with the folder key so they reach ``_rebuild``;
- the file itself: a FIFO, a symlink to ``/dev/zero`` or to a victim file, a directory, an empty
  file, an 8 GiB sparse file, another entry's valid file (another fingerprint);
- offload group files: bytes flipped, truncated, extended, replaced by a copy, a symlink, a FIFO.

Accepted outcomes: a miss (``None``), the original value exactly, or for streaming the original
output or ``OffloadFileChanged``. Counted: tracebacks (any other exception), hangs (an operation
still running after ``--hang-s``: a SIGALRM watchdog), wrong data (an unsigned mutation served as
data), foreign files deleted or written (a model shard and a download beside the cache, the
symlinks' victim), and the peak RSS. The target is 0 for every count.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import stat
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from memwarden.runtime import featcache_file as ff  # noqa: E402
from memwarden.runtime.featcache import FeatureCache  # noqa: E402
from memwarden.runtime.featcache_contract import TieredEncoderStore  # noqa: E402
from memwarden.runtime.offload import stream_weights  # noqa: E402
from memwarden.runtime.offload_files import OffloadFileChanged  # noqa: E402

HOSTILE: list[Any] = [
    "nan",
    "inf",
    "-inf",
    "1e400",
    "9" * 400,
    "-1",
    "0",
    "",
    "x" * 10_000,
    1e308,
    -5,
    [],
    {},
    None,
    True,
    "[" * 2000,
]
META_FIELDS = ["created_s", "count", "kind", "fingerprint", "format", "checksum"]
FOREIGN = {"model-00001-of-00002.safetensors": b"a user's model shard", "download.partial": b"half a download"}
VICTIM = b"the victim file's bytes"


class Hang(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise Hang()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _split(data: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _join(header: Any, body: bytes, key: bytes | None) -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    out = struct.pack("<Q", len(text)) + text + body
    if key is not None and out[8 : ff._MAC_AT] == ff._LEAD:  # signed: the digest the folder's key gives
        out = out[: ff._MAC_AT] + ff._digest(out, key) + out[ff._MAC_AT + ff._MAC_HEX :]
    return out


class Campaign:
    def __init__(self, workdir: Path, seed: int, hang_s: float) -> None:
        self.rng = random.Random(seed)
        self.hang_s = hang_s
        self.dir = workdir / "cache"
        self.now = 1_000_000.0
        self.cache = FeatureCache(self.dir, clock=lambda: self.now)
        self.key = (self.dir / ff.KEY_FILE).read_bytes()
        self.store = TieredEncoderStore(self.cache, torch.nn.Linear(2, 2))
        self.victim = workdir / "victim.bin"
        self.victim.write_bytes(VICTIM)
        for name, data in FOREIGN.items():
            (self.dir / name).write_bytes(data)
            os.utime(self.dir / name, (1.0, 1.0))
        self.values: dict[str, Any] = {
            "single": torch.arange(64, dtype=torch.float32),
            "pair": (torch.ones(3, 5, dtype=torch.bfloat16), torch.arange(7, dtype=torch.int64)),
        }
        self.media = {"a": torch.ones(2, 3), "b": (torch.zeros(1), 7, "x", None), "c": [torch.arange(4)]}
        self.counts: Counter[str] = Counter()
        self.tracebacks: list[str] = []
        self.n_tracebacks = self.hangs = self.wrong = 0
        self.slowest_s = 0.0  # the longest guarded operation (mutation, read, clean-up), wall time

    # -- one mutation -------------------------------------------------------------------------

    def restore(self, fp: str) -> Path:
        if fp == "store":
            self.store.put("media", self.media)
            fp = self.store.key("media")
        else:
            self.cache.put(fp, self.values[fp])
        return self.dir / f"{ff.PREFIX}{ff.stem_of(fp)}{ff.SUFFIX}"

    def mutate(self, path: Path, store: bool) -> tuple[str, bool]:
        """Changes the file at ``path``; returns (kind, signed)."""
        rng, data = self.rng, path.read_bytes()
        kinds = [
            "flip",
            "flip_header",
            "flip_body",
            "truncate",
            "extend",
            "header_len",
            "meta",
            "meta",
            "tensor_json",
            "deep_header",
            "filetype",
            "swap",
        ] + ["structure"] * (3 if store else 0)
        kind = rng.choice(kinds)
        signed = False
        header, body = _split(data)
        hlen = len(data) - len(body)
        if kind in ("flip", "flip_header", "flip_body"):
            lo, hi = {"flip": (0, len(data)), "flip_header": (0, hlen), "flip_body": (hlen, len(data))}[kind]
            buf = bytearray(data)
            for _ in range(rng.randint(1, 4)):
                if hi > lo:
                    buf[rng.randrange(lo, hi)] ^= 1 << rng.randrange(8)
            out = bytes(buf)
        elif kind == "truncate":
            out = data[: rng.randrange(len(data))]
        elif kind == "extend":
            out = data + os.urandom(rng.choice([1, 8, 4096]))
        elif kind == "header_len":
            n = rng.choice([0, 7, hlen, len(data), 2**63 - 1, 2**64 - 1, rng.randrange(2**32)])
            out = struct.pack("<Q", n) + data[8:]
        elif kind == "meta":
            signed = rng.random() < 0.5
            header["__metadata__"][rng.choice(META_FIELDS)] = rng.choice(HOSTILE)
            out = _join(header, body, self.key if signed else None)
        elif kind == "tensor_json":
            signed = rng.random() < 0.5
            name = rng.choice([k for k in header if k != "__metadata__"])
            field = rng.choice(["dtype", "shape", "data_offsets"])
            header[name][field] = rng.choice(
                [*HOSTILE, "F64", "I8", [2**62, 2**62], [-1], [0, 2**40], [len(body), 0], [1, 1, 1, 1, 1]]
            )
            out = _join(header, body, self.key if signed else None)
        elif kind == "deep_header":
            signed = rng.random() < 0.5
            deep = ff._LEAD.decode() + "0" * ff._MAC_HEX + '","x":' + "[" * rng.choice([100, 5000, 60_000])
            text = deep.encode()
            text += b" " * (-len(text) % 8)
            out = struct.pack("<Q", len(text)) + text + body
            if signed:
                out = out[: ff._MAC_AT] + ff._digest(out, self.key) + out[ff._MAC_AT + ff._MAC_HEX :]
        elif kind == "structure":
            signed = True  # only the folder's key gets a record as far as _rebuild
            record = rng.choice(
                [
                    b"[" * rng.choice([100, 5000, 100_000]),
                    b'{"t": 99}',
                    b'{"t": -1}',
                    b'{"t": true}',
                    b'{"d": 5}',
                    b'{"d": [[1]]}',
                    b'{"l": 3}',
                    b'{"v": [1]}',
                    b'{"u": [{"t": 0}, {"x": 1}]}',
                    b"\xff\xfe",
                    b"",
                    json.dumps({"d": [["k", {"v": 1}]], "c": "os:system"}).encode(),
                    b'{"v": 1e400}',
                    json.dumps({"l": [{"t": 0}] * 50_000}).encode(),
                ]
            )
            tensors = [
                torch.frombuffer(bytearray(record), dtype=torch.uint8) if record else torch.empty(0, dtype=torch.uint8)
            ]
            tensors.append(torch.ones(2))
            fp = header["__metadata__"]["fingerprint"]
            out = ff.encode(fp, tensors, False, self.now, key=self.key)
        elif kind == "swap":
            other = self.dir / f"{ff.PREFIX}{ff.stem_of(rng.choice(list(self.values)))}{ff.SUFFIX}"
            regular = other != path and other.is_file() and other.stat().st_size < (1 << 20)
            out = other.read_bytes() if regular else data[:-1]
        else:  # filetype
            what = rng.choice(["fifo", "dev_zero", "victim_link", "directory", "empty", "sparse"])
            path.unlink()
            if what == "fifo":
                os.mkfifo(path)
            elif what == "dev_zero":
                os.symlink("/dev/zero", path)
            elif what == "victim_link":
                os.symlink(self.victim, path)
            elif what == "directory":
                path.mkdir()
            elif what == "empty":
                path.write_bytes(b"")
            else:
                with path.open("wb") as f:
                    f.truncate(8 << 30)
            return f"filetype:{what}", False
        path.write_bytes(out)
        return kind, signed

    def operate(self, fp: str, store: bool) -> Any:
        """One operation on the mutated entry; returns what a lookup served (or a marker)."""
        self.cache.clear(l2=False)  # the next lookup reads the disk
        op = self.rng.choice(["get", "get", "get", "prewarm", "sweep", "restart", "contains", "resize", "clear"])
        key = self.store.key("media") if store else fp
        if store and op in ("get", "prewarm", "restart"):
            if op == "prewarm":
                self.store.prewarm(["media"])
            return ("value", self.store.get("media"))
        if op == "get":
            return ("value", self.cache.get(key))
        if op == "prewarm":
            self.cache.prewarm([key])
            return ("value", self.cache.get(key))
        if op == "sweep":
            self.now += self.rng.choice([0.0, 4000.0])
            self.cache.sweep()
        elif op == "restart":
            return ("value", FeatureCache(self.dir, clock=lambda: self.now).get(key))
        elif op == "contains":
            _ = key in self.cache
        elif op == "resize":
            self.cache.resize(l2_max_bytes=self.rng.choice([0, 100, 1 << 30]))
            self.cache.resize(l2_max_bytes=2048 << 20)
        else:
            self.cache.clear()
        return ("none", None)

    def cleanup(self, path: Path) -> None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            path.rmdir()
        else:  # the next restore writes it afresh (a sparse 8 GiB file must not stay for "swap" to read)
            path.unlink()

    def guarded(self, fn: Callable[[], Any]) -> tuple[str, Any]:
        signal.setitimer(signal.ITIMER_REAL, self.hang_s)
        started = time.perf_counter()
        try:
            return "ok", fn()
        except Hang:
            self.hangs += 1
            return "hang", None
        except Exception:
            self.n_tracebacks += 1
            if len(self.tracebacks) < 5:
                self.tracebacks.append(traceback.format_exc())
            return "error", None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.slowest_s = max(self.slowest_s, time.perf_counter() - started)

    def one_cache(self) -> None:
        fp = self.rng.choice([*self.values, "store"])
        store = fp == "store"
        path = self.restore(fp)
        status, mutated = self.guarded(lambda: self.mutate(path, store))
        if status != "ok":
            return
        kind, signed = mutated
        self.counts[kind] += 1
        status, served = self.guarded(lambda: self.operate(fp, store))
        self.guarded(lambda: self.cleanup(path))
        if status == "ok" and served[0] == "value" and served[1] is not None and not signed:
            want = self.media if store else self.values[fp]
            if not _same(want, served[1]):
                self.wrong += 1

    def one_offload(self) -> None:
        torch.manual_seed(self.rng.randrange(1000))
        model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)]).eval()
        x = torch.randn(2, 16)
        with torch.no_grad():
            want = model(x)
        total = sum(p.nbytes for p in model.parameters())
        streamer = stream_weights(model, total // 2, prefetch=self.rng.random() < 0.5)
        folder = streamer.offload_dir
        path = self.rng.choice(sorted(folder.iterdir()))
        what = self.rng.choice(["flip", "truncate", "extend", "copy", "symlink", "fifo"])
        self.counts[f"offload:{what}"] += 1
        data = path.read_bytes()
        if what == "flip":
            with path.open("r+b") as f:
                f.seek(self.rng.randrange(len(data)))
                f.write(bytes([self.rng.randrange(256)]))
        elif what == "truncate":
            os.truncate(path, self.rng.randrange(len(data)))
        elif what == "extend":
            with path.open("ab") as f:
                f.write(b"\0" * 64)
        elif what == "copy":
            tmp = folder / "copy.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, path)
        elif what == "symlink":
            path.unlink()
            os.symlink(self.victim, path)
        else:
            path.unlink()
            os.mkfifo(path)

        def forward() -> None:
            for _ in range(2):
                try:
                    with torch.no_grad():
                        got = model(x)
                except OffloadFileChanged:
                    continue
                if not torch.equal(got, want):
                    self.wrong += 1
            try:
                streamer.detach()
            except OffloadFileChanged:
                pass

        self.guarded(forward)
        shutil.rmtree(folder, ignore_errors=True)

    def run(self, n: int, offload_share: float) -> None:
        for _ in range(n):
            if self.rng.random() < offload_share:
                self.one_offload()
            else:
                self.one_cache()

    def foreign_damage(self) -> int:
        intact = [
            (self.dir / name).read_bytes() == data if (self.dir / name).exists() else False
            for name, data in FOREIGN.items()
        ]
        return intact.count(False) + (self.victim.read_bytes() != VICTIM)


def run(n: int, seed: int = 0, *, hang_s: float = 10.0, offload_share: float = 0.05) -> dict[str, Any]:
    old = signal.signal(signal.SIGALRM, _on_alarm)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memwarden-fuzz-cache-") as tmp:
        campaign = Campaign(Path(tmp), seed, hang_s)
        try:
            campaign.run(n, offload_share)
        finally:
            signal.signal(signal.SIGALRM, old)
        damage = campaign.foreign_damage()
    return {
        "mutations": sum(campaign.counts.values()),
        "tracebacks": campaign.n_tracebacks,
        "hangs": campaign.hangs,
        "wrong_data": campaign.wrong,
        "foreign_files_damaged": damage,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "slowest_operation_s": round(campaign.slowest_s, 3),
        "seconds": round(time.perf_counter() - start, 1),
        "kinds": dict(sorted(campaign.counts.items())),
        "first_tracebacks": campaign.tracebacks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000, help="mutations (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-s", type=float, default=10.0, help="an operation running longer is a hang")
    parser.add_argument("--offload-share", type=float, default=0.05, help="share of mutations on offload files")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = run(args.n, args.seed, hang_s=args.hang_s, offload_share=args.offload_share)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"mutations {result['mutations']}  tracebacks {result['tracebacks']}  hangs {result['hangs']}  "
            f"wrong data {result['wrong_data']}  foreign files damaged {result['foreign_files_damaged']}  "
            f"peak RSS {result['peak_rss_mib']} MiB  slowest operation {result['slowest_operation_s']} s  "
            f"({result['seconds']} s)"
        )
        for kind, count in result["kinds"].items():
            print(f"  {kind:24} {count}")
        for tb in result["first_tracebacks"]:
            print(tb)
    bad = result["tracebacks"] + result["hangs"] + result["wrong_data"] + result["foreign_files_damaged"]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
