"""Adapter sync: bytes on the wire when k of L adapted layers change (edge-cloud issue 22).

python benchmarks/bench_lora_sync.py [--layers 32] [--hidden 2048] [--rank 16] [--dtype F16] [--json]

A LLaMA-shaped LoRA adapter (q, k, v, o projections of every layer, rank r) is published on a
loopback sync server; a device holding version v pulls v+1 in which k layers changed, over real
HTTP (aiohttp on 127.0.0.1). Bytes sent are the server's body bytes (HTTP headers, ~150 B per
request, are left out and shown as a request count). "full" is a device with nothing pulling the
whole adapter; "per-tensor" is ``SyncClient.pull`` (manifest + changed tensors by digest);
"delta file" is ``SyncClient.pull_delta`` (one server-made delta, manifest in its header).
The target: bytes ≤ k/L of a full transfer + 1%.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from typing import Any

from memwarden.edge.sync.client import AiohttpTransport, SyncClient
from memwarden.edge.sync.delta import adapter_manifest
from memwarden.edge.sync.manifest import DTYPE_BYTES, RawTensor, write_safetensors
from memwarden.edge.sync.server import SyncServer
from memwarden.edge.sync.signing import SigningKey
from memwarden.edge.sync.store import AdapterStore

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")
KEY = SigningKey.generate()  # the publisher's; the device pins KEY.public_key


def adapter(layers: int, hidden: int, rank: int, dtype: str, seed_of_layer: dict[int, int]) -> bytes:
    """PEFT-named LoRA tensors; layer i's bytes come from seed ``seed_of_layer.get(i, 0)``."""
    item = DTYPE_BYTES[dtype]
    tensors = {}
    for i in range(layers):
        seed = seed_of_layer.get(i, 0)
        for p in PROJ:
            prefix = f"base_model.model.model.layers.{i}.self_attn.{p}"
            for part, shape in (("lora_A", (rank, hidden)), ("lora_B", (hidden, rank))):
                n = shape[0] * shape[1] * item
                data = _bytes(n, f"{seed}/{i}/{p}/{part}")
                tensors[f"{prefix}.{part}.weight"] = RawTensor(dtype=dtype, shape=shape, data=data)
    return write_safetensors(tensors)


def _bytes(n: int, key: str) -> bytes:
    import hashlib

    block = hashlib.blake2b(key.encode(), digest_size=64).digest()
    return (block * (n // 64 + 1))[:n]


async def measure(args: argparse.Namespace, k: int, root: str) -> dict[str, Any]:
    server = SyncServer(AdapterStore(os.path.join(root, f"k{k}"), signing_key=KEY))
    await server.start()
    transport = AiohttpTransport(server.url)
    try:
        v0 = adapter(args.layers, args.hidden, args.rank, args.dtype, {})
        changed = {i * args.layers // k: 1 for i in range(k)} if k else {}
        v1 = adapter(args.layers, args.hidden, args.rank, args.dtype, changed)
        server.store.publish("a", v0)
        have, _ = adapter_manifest(v0, adapter="a", version=0)
        client = SyncClient(transport, publisher_key=KEY.public_key)
        sent = server.bytes_sent
        t0 = time.perf_counter()
        await client.pull("a", None)
        full_bytes, full_s = server.bytes_sent - sent, time.perf_counter() - t0
        server.store.publish("a", v1)
        sent, requests = server.bytes_sent, server.requests
        t0 = time.perf_counter()
        delta = await client.pull("a", have)
        pull_bytes, pull_s, pull_requests = (
            server.bytes_sent - sent,
            time.perf_counter() - t0,
            server.requests - requests,
        )
        sent = server.bytes_sent
        await client.pull_delta("a", have)
        file_bytes = server.bytes_sent - sent
        changed_layers = len(delta.changed_layers) if delta is not None else 0
        bound = (k / args.layers + 0.01) * full_bytes
        return {
            "k": k,
            "layers": args.layers,
            "changed_layers": changed_layers,
            "adapter_bytes": len(v0),
            "full_bytes": full_bytes,
            "full_s": full_s,
            "pull_bytes": pull_bytes,
            "pull_requests": pull_requests,
            "pull_s": pull_s,
            "delta_file_bytes": file_bytes,
            "bound_bytes": bound,
            "pull_ok": pull_bytes <= bound,
            "delta_file_ok": file_bytes <= bound,
        }
    finally:
        await transport.close()
        await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dtype", default="F16", choices=sorted(DTYPE_BYTES))
    parser.add_argument("--ks", default="0,1,2,4,8,16,32", help="numbers of changed layers")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",") if int(k) <= args.layers]
    with tempfile.TemporaryDirectory() as root:
        rows = [asyncio.run(measure(args, k, root)) for k in ks]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    first = rows[0]
    print(
        f"adapter: {args.layers} layers x {len(PROJ)} projections, rank {args.rank}, hidden {args.hidden}, "
        f"{args.dtype}: {first['adapter_bytes'] / 2**20:.2f} MiB file, full transfer {first['full_bytes']:,} B "
        f"({first['full_s'] * 1e3:.0f} ms)"
    )
    print(f"{'k':>3} {'per-tensor B':>14} {'requests':>8} {'ms':>6} {'delta file B':>14} {'bound k/L+1% B':>15}  ok")
    for r in rows:
        print(
            f"{r['k']:>3} {r['pull_bytes']:>14,} {r['pull_requests']:>8} {r['pull_s'] * 1e3:>6.0f} "
            f"{r['delta_file_bytes']:>14,} {r['bound_bytes']:>15,.0f}  {'yes' if r['pull_ok'] and r['delta_file_ok'] else 'NO'}"
        )


if __name__ == "__main__":
    main()
