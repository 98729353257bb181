"""Fuzz adapter sync: mutated manifests, deltas, HTTP responses to the client and requests to the
server; count tracebacks, hangs, forged updates accepted, and the peak RSS.

    python benchmarks/bench_fuzz_sync.py [--n 10000] [--seed 0] [--json] [--only manifest,delta,...]

Targets (round-robin, ``--n`` mutations in all):

- ``manifest``: a signed manifest mutated (bytes flipped, truncated, spliced; JSON values replaced
  by hostile ones: 200,000-dimension shapes, 5,000-digit integers, deep nesting, NaN, wrong types),
  half the time with its digest recomputed and re-signed by an attacker's key, so the mutation
  reaches the checks behind the digest: ``signing.verify_manifest`` with the publisher's key;
- ``delta``: a signed delta mutated the same way, in its safetensors header (dtypes such as U16,
  shapes, offsets) or its manifest: ``read_delta`` with the key, then ``AdapterSlot.apply`` on a
  small PEFT model, which must end on one whole version;
- ``client``: ``SyncClient.pull``/``pull_delta`` over a transport that serves the honest server's
  responses with one mutated (status, ``Content-Range``/``Content-Length`` of 5,000 digits,
  bodies as above). A pull that returns must return exactly the publisher's version;
- ``server``: raw HTTP requests to a real ``SyncServer`` on 127.0.0.1 with mutated paths, queries
  and ``Range`` headers; a 500 or a logged handler exception is a traceback.

A traceback is any exception other than the one clear error (``MemwardenError``); a hang is a
case over ``--hang-s`` seconds (5). The targets: 0 tracebacks, 0 hangs, 0 forged accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import resource
import struct
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

TARGETS = ("manifest", "delta", "client", "server")
HOSTILE: list[Any] = [
    -1,
    0,
    2**63,
    1e308,
    float("nan"),
    True,
    None,
    "",
    "x" * 5000,
    "\x1b[2J",
    [],
    {},
    [[[[1]]]],
    [2] * 200_000,
    [2**40, 2**40],
    [-3, 4],
    ["4", "32"],
    [1.5],
    {"a": 1},
    "U16",
    "F32",
    "../../etc",
]
BIG_INT = "9" * 5000
DEEP = "[" * 100_000 + "]" * 100_000


class World:
    """The honest publisher, server contents and device the mutations start from."""

    def __init__(self) -> None:
        import torch
        from peft import LoraConfig, get_peft_model
        from peft.utils import get_peft_model_state_dict
        from safetensors.torch import save

        from memwarden.edge.sync.delta import adapter_manifest, make_delta
        from memwarden.edge.sync.signing import SigningKey, sign_manifest

        class Stack(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                for layer in self.layers:
                    x = layer(x)
                return x

        torch.manual_seed(0)
        config = LoraConfig(r=2, target_modules=["layers.0", "layers.1", "layers.2"], init_lora_weights=False)
        self.model = get_peft_model(Stack(), config)
        v0 = {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}
        v1 = {k: (v + 1 if ".1." in k else v) for k, v in v0.items()}
        self.key, self.attacker = SigningKey.generate(), SigningKey.generate()
        self.pub = self.key.public_key
        self.v0_blob, self.v1_blob = save(v0), save(v1)
        self.v0, _ = adapter_manifest(self.v0_blob, adapter="a", version=0)
        v1m, self.v1_tensors = adapter_manifest(self.v1_blob, adapter="a", version=1, previous=self.v0)
        self.v1 = v1m
        self.signed_v1 = sign_manifest(v1m, self.key)
        self.delta, _ = make_delta(self.v0, self.v1_blob, signed_manifest=self.signed_v1)


# -- mutations ---------------------------------------------------------------------------------


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(5)
    if kind == 0 and b:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 1:
        b = b[: rng.randrange(len(b) + 1)]
    elif kind == 2 and b:
        i = rng.randrange(len(b))
        b[i:i] = rng.choice([BIG_INT.encode(), DEEP.encode()[:20000], b"\x00" * 64, b"}" * 10, bytes(b[:64])])
    elif kind == 3:
        b += rng.randbytes(rng.randint(1, 4096))
    else:
        b = bytearray(rng.randbytes(rng.randint(0, 256)))
    return bytes(b)


def mutate_doc(rng: random.Random, doc: Any) -> str:
    """``doc`` (JSON) with one value replaced by a hostile one, as JSON text."""
    doc = json.loads(json.dumps(doc))
    holders: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            holders.append((node, key))
            if len(holders) < 5000:
                walk(value)

    walk(doc)
    marker = "\x00MARK\x00"
    if holders:
        node, key = rng.choice(holders)
        choice = rng.randrange(len(HOSTILE) + 2)
        node[key] = HOSTILE[choice] if choice < len(HOSTILE) else marker
    text = json.dumps(doc, allow_nan=True)
    return text.replace(json.dumps(marker), rng.choice([BIG_INT, DEEP, "-" + BIG_INT]))


def redigest(text: str, world: World, rng: random.Random) -> bytes:
    """A mutated manifest made whole again, as an attacker would: digest recomputed, sometimes re-signed."""
    from memwarden.edge.sync.manifest import _doc_digest
    from memwarden.edge.sync.signing import _payload

    try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            return text.encode()
        doc.pop("digest", None)
        if rng.random() < 0.5:
            sig = world.attacker.sign(_payload(doc)).hex()
            doc["signature"] = {"alg": "ed25519", "key_id": world.pub.key_id, "sig": sig}
        return json.dumps({**doc, "digest": _doc_digest(doc)}).encode()
    except (ValueError, RecursionError, TypeError):
        return text.encode()


def mutated_manifest(rng: random.Random, world: World) -> bytes:
    if rng.random() < 0.3:
        return mutate_bytes(rng, world.signed_v1)
    text = mutate_doc(rng, json.loads(world.signed_v1))
    return redigest(text, world, rng) if rng.random() < 0.6 else text.encode()


def mutated_delta(rng: random.Random, world: World) -> bytes:
    blob = world.delta
    if rng.random() < 0.3:
        return mutate_bytes(rng, blob)
    (n,) = struct.unpack("<Q", blob[:8])
    header, body = json.loads(blob[8 : 8 + n]), blob[8 + n :]
    if rng.random() < 0.5:
        header["__metadata__"]["manifest"] = mutated_manifest(rng, world).decode("utf-8", "replace")
        text = json.dumps(header)
    else:
        text = mutate_doc(rng, header)
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw + body


# -- targets -----------------------------------------------------------------------------------


def case_manifest(rng: random.Random, world: World) -> str:
    from memwarden.edge.sync.signing import verify_manifest

    manifest = verify_manifest(mutated_manifest(rng, world), world.pub)
    return "ok" if manifest == world.v1 else "FORGED"


def case_delta(rng: random.Random, world: World, slot: Any) -> str:
    from memwarden.edge.sync.delta import read_delta

    blob = mutated_delta(rng, world)
    outcome = "ok"
    try:
        delta = read_delta(blob, publisher_key=world.pub)
        if delta.manifest != world.v1:
            outcome = "FORGED"
    finally:
        try:
            if slot.version != 0:
                slot.activate(0)
            slot.apply(blob)
        except Exception as exc:  # the slot's own clear errors only
            from memwarden.errors import MemwardenError

            if not isinstance(exc, MemwardenError):
                raise
        held = slot.held_manifest().content_digest
        if held not in (world.v0.content_digest, world.v1.content_digest) or held != slot.content_digest:
            outcome = "HALF-APPLIED"
    return outcome


class MutatingTransport:
    """The honest server's responses, one of them (at random) mutated."""

    def __init__(self, world: World, rng: random.Random) -> None:
        self.world, self.rng = world, rng
        self.victim = rng.randrange(4)
        self.count = 0

    async def get(self, path: str, headers: Mapping[str, str], *, limit: int | None = None) -> Any:
        from memwarden.edge.sync.client import Response

        w, rng = self.world, self.rng
        if path.endswith("/manifest"):
            body = w.signed_v1
        elif "/delta" in path:
            body = w.delta
        else:
            digest = path.rsplit("/", 1)[-1]
            body = next((t.data for n, t in w.v1_tensors.items() if w.v1.by_name[n].digest == digest), b"")
        status, hdrs = 200, {"Content-Length": str(len(body))}
        self.count += 1
        if self.count - 1 == self.victim:
            kind = rng.randrange(4)
            if kind == 0:
                status = rng.choice([206, 301, 404, 416, 500, 999, 0])
            elif kind == 1:
                hdrs = {
                    rng.choice(["Content-Range", "Content-Length"]): rng.choice(
                        [
                            BIG_INT,
                            f"bytes 0-{BIG_INT}/{BIG_INT}",
                            "bytes -1--1/-1",
                            "",
                            "bytes 0-1/99999999999999999999",
                        ]
                    )
                }
                status = rng.choice([200, 206])
            elif path.endswith("/manifest"):
                body = mutated_manifest(rng, w)
            elif "/delta" in path:
                body = mutated_delta(rng, w)
            else:
                body = mutate_bytes(rng, body)
        if limit is not None and len(body) > limit:
            from memwarden.edge.sync.client import TransportError

            raise TransportError("over the limit", b"")
        return Response(status, hdrs, body)


async def case_client(rng: random.Random, world: World) -> str:
    from memwarden.edge.sync.client import SyncClient

    client = SyncClient(
        MutatingTransport(world, rng),
        publisher_key=world.pub,
        max_attempts=2,
        backoff_s=lambda a: 0.0,
        transfer_timeout_s=30,
    )
    if rng.random() < 0.5:
        delta = await client.pull("a", world.v0 if rng.random() < 0.5 else None)
        got = delta.manifest if delta is not None else world.v0
    else:
        got = (await client.pull_delta("a", world.v0)).manifest
    return "ok" if got == world.v1 else "FORGED"


def server_request(rng: random.Random, digest: str) -> bytes:
    paths = [
        "/v1/adapters",
        "/v1/adapters/a/manifest",
        "/v1/adapters/a/delta?from=0",
        f"/v1/tensors/{digest}",
        f"/v1/adapters/a/manifest?version={BIG_INT}",
        f"/v1/adapters/a/delta?from={BIG_INT}&to=-1",
        "/v1/adapters/%2e%2e%2f%2e%2e/manifest",
        "/v1/adapters/" + "a" * 5000 + "/manifest",
        "/v1/tensors/" + "0" * 5000,
        "/v1/adapters/a/delta?from=0&to=0",
        "/v1/adapters/\x00/manifest",
    ]
    path = rng.choice(paths)
    ranges = [
        None,
        f"bytes={BIG_INT}-",
        f"bytes=0-{BIG_INT}",
        "bytes=5-2",
        "bytes=-5",
        "bytes=0-0,2-3",
        "pages=1-2",
        "bytes=" + "1" * 19 + "-",
        "bytes=99999999999-",
        "\x1b[2J",
    ]
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    r = rng.choice(ranges)
    if r is not None:
        lines.append(f"Range: {r}")
    if rng.random() < 0.1:
        lines.append("X-Junk: " + "j" * rng.choice([100, 9000]))
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "replace")
    return mutate_bytes(rng, raw) if rng.random() < 0.15 else raw


async def case_server(rng: random.Random, world: World, port: int, hang_s: float) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(server_request(rng, world.v1.tensors[0].digest))
        writer.write_eof()  # a request cut short ends here, as a client that went away
        await writer.drain()
        try:
            head = await asyncio.wait_for(reader.readline(), hang_s)
        except asyncio.TimeoutError:
            return "HANG"
        parts = head.split()
        return "SERVER-500" if len(parts) > 1 and parts[1] == b"500" else "ok"
    finally:
        writer.close()


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        from aiohttp.http_exceptions import HttpProcessingError

        if record.exc_info and isinstance(record.exc_info[1], HttpProcessingError):
            return  # aiohttp's parser refusing a malformed request (a 400), logged at ERROR level
        self.count += 1


def run(n: int = 10_000, *, seed: int = 0, only: list[str] | None = None, hang_s: float = 5.0) -> dict[str, Any]:
    """The campaign: per target, outcomes counted; tracebacks, hangs and forged accepted summed."""
    from memwarden.edge.sync.server import SyncServer
    from memwarden.edge.sync.store import AdapterStore
    from memwarden.errors import MemwardenError
    from memwarden.runtime.lora.slot import AdapterSlot

    targets = only or list(TARGETS)
    world, rng = World(), random.Random(seed)
    slot = AdapterSlot(world.model, adapter="a", version=0)
    counts: dict[str, Counter[str]] = {t: Counter() for t in targets}
    examples: list[str] = []
    slowest = 0.0
    errors = _Errors()
    for name in ("aiohttp.server", "aiohttp.web", "aiohttp.access", "asyncio"):
        logging.getLogger(name).addHandler(errors)
        logging.getLogger(name).propagate = False

    async def main() -> None:
        nonlocal slowest
        with tempfile.TemporaryDirectory() as tmp:
            store = AdapterStore(tmp, signing_key=world.key)
            store.publish("a", world.v0_blob)
            store.publish("a", world.v1_blob)
            server = SyncServer(store)
            await server.start()
            try:
                for i in range(n):
                    target = targets[i % len(targets)]
                    case_rng = random.Random(rng.getrandbits(64))
                    t0 = time.perf_counter()
                    before = errors.count
                    try:
                        if target == "manifest":
                            outcome = case_manifest(case_rng, world)
                        elif target == "delta":
                            outcome = case_delta(case_rng, world, slot)
                        elif target == "client":
                            outcome = await case_client(case_rng, world)
                        else:
                            outcome = await case_server(case_rng, world, server.port, hang_s)
                    except MemwardenError:
                        outcome = "clear error"
                    except Exception as exc:  # noqa: BLE001 - what the campaign counts
                        outcome = "TRACEBACK"
                        if len(examples) < 10:
                            examples.append(f"{target}: {type(exc).__name__}: {str(exc)[:160]}")
                    if errors.count > before and outcome != "TRACEBACK":
                        outcome = "SERVER-TRACEBACK"
                    elapsed = time.perf_counter() - t0
                    slowest = max(slowest, elapsed)
                    if elapsed > hang_s and outcome != "HANG":
                        outcome = "HANG"
                    counts[target][outcome] += 1
            finally:
                await server.stop()

    asyncio.run(main())
    total = Counter[str]()
    for c in counts.values():
        total.update(c)
    return {
        "mutations": n,
        "seed": seed,
        "by_target": {t: dict(c) for t, c in counts.items()},
        "tracebacks": total["TRACEBACK"] + total["SERVER-TRACEBACK"] + total["SERVER-500"],
        "hangs": total["HANG"],
        "forged_accepted": total["FORGED"] + total["HALF-APPLIED"],
        "slowest_case_s": round(slowest, 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "examples": examples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="mutations in all (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", help=f"comma-separated targets of {','.join(TARGETS)}")
    parser.add_argument("--hang-s", type=float, default=5.0, help="a case slower than this is a hang")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    only = [t for t in args.only.split(",") if t] if args.only else None
    if only and set(only) - set(TARGETS):
        parser.error(f"--only: targets are {', '.join(TARGETS)}")
    t0 = time.perf_counter()
    report = run(args.n, seed=args.seed, only=only, hang_s=args.hang_s)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for target, c in report["by_target"].items():
            print(f"{target:9s} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
        print(
            f"{report['mutations']} mutations in {report['wall_s']} s: tracebacks {report['tracebacks']}, "
            f"hangs {report['hangs']}, forged accepted {report['forged_accepted']}, "
            f"slowest case {report['slowest_case_s']} s, peak RSS {report['peak_rss_mib']} MiB"
        )
        for line in report["examples"]:
            print("  " + line)
    bad = report["tracebacks"] or report["hangs"] or report["forged_accepted"]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
