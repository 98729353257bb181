"""Prewarmed feature cache: time to first token and encoder calls, cold vs prewarmed (issue 22).

python benchmarks/bench_featcache.py [--model llava] [--size small] [--images 6] [--json]

A "cloud" process serves N images through a GovernedSession whose encoder cache is the tiered
feature cache (``TieredEncoderStore`` over ``FeatureCache`` with an L2 folder) and writes the
prewarm manifest. A "device" process (a fresh store: empty L1, the same L2 folder) prewarms
from the manifest, then serves the same N requests. Prefix reuse is off, so the only thing that
can spare the encoder is the feature cache. Reported per phase: median TTFT (the session's
``prefill_s``), encoder calls (a hook on the encoder's first submodule) and cache hits per tier.
Then the encoder is swapped (its weights scaled) and the N requests served again: every one
must run the encoder (zero stale hits).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

import torch

from memwarden.models import zoo
from memwarden.runtime.encoders import find_encoders
from memwarden.runtime.featcache import FeatureCache
from memwarden.runtime.featcache_contract import TieredEncoderStore
from memwarden.runtime.session import GovernedSession
from memwarden.runtime.session_config import SessionConfig
from memwarden.runtime.session_hooks import SessionHooks

ENCODER_S: list[float] = []  # the session's time in the encoder, per request served
CPU_S: list[float] = []  # CPU time of this thread per request: TTFT that a loaded box does not blur


def open_session(model: torch.nn.Module, store: TieredEncoderStore) -> GovernedSession:
    return GovernedSession(
        model, "8GiB", config=SessionConfig(prefix_reuse=False), hooks=SessionHooks(encoder_store=store)
    )


def serve(session: GovernedSession, requests: list[dict[str, Any]], name: str) -> list[float]:
    ttft = []
    with torch.inference_mode():
        for inputs in requests:
            cpu = time.thread_time()
            # one new token: the request is its time to first token (encode + prefill + one step)
            session.generate(**inputs, max_new_tokens=1, **zoo.generate_kwargs(name))
            CPU_S.append(time.thread_time() - cpu)
            ttft.append(session.records[-1].prefill_s)
            ENCODER_S.append(session.records[-1].encoder_s)
    return ttft


def _since(stats: dict[str, Any], mark: dict[str, Any]) -> dict[str, Any]:
    """Hits per tier since ``mark``: the phase's own, not the store's running totals."""
    return {tier: {"hits": stats[tier]["hits"] - mark[tier]["hits"]} for tier in ("l1", "l2")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llava")
    parser.add_argument("--size", default="small")
    parser.add_argument("--images", type=int, default=6)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = zoo.build_model(args.model, args.size)
    requests = [zoo.make_inputs(model, prompt_tokens=32, seed=s) for s in range(args.images)]
    calls = [0]
    encoder = next(iter(find_encoders(model).values()))
    next(iter(encoder.children())).register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as l2:
        cloud_store = TieredEncoderStore(FeatureCache(l2), model)
        with open_session(model, cloud_store) as cloud:
            serve(cloud, requests, args.model)
        manifest = cloud_store.manifest()
        device = TieredEncoderStore(FeatureCache(l2), model)
        loaded = device.prewarm(manifest)
        # One session per phase (a model has one governing session at a time), each warmed by one
        # request of another image (a session's first request of a new shape runs the admission
        # predictor once), then the same 6 requests. The cold store has no L2 and each image is new
        # to it: every cold request runs the encoder. The thread's CPU time per request is the
        # figure a loaded box does not blur; wall TTFT is shown beside it.
        warm = zoo.make_inputs(model, prompt_tokens=32, seed=10_000)
        phases = {"cold": TieredEncoderStore(FeatureCache(), model), "prewarmed": device, "swapped": device}
        for phase, store in phases.items():
            if phase == "swapped":
                with torch.no_grad():
                    for p in encoder.parameters():
                        p.mul_(1.01)  # a new encoder version: none of the old entries may be served
            with open_session(model, store) as session:
                serve(session, [warm], args.model)
                mark, enc_mark, cpu_mark = store.stats(), len(ENCODER_S), len(CPU_S)
                calls[0] = 0
                rows[phase] = {"ttft_s": serve(session, requests, args.model), "encoder_calls": calls[0]}
                rows[phase]["ttft_cpu_s"] = CPU_S[cpu_mark:]
                rows[phase]["encoder_s"] = sum(ENCODER_S[enc_mark:])
                rows[phase]["stats"] = _since(store.stats(), mark)
        rows["prewarmed"]["loaded"] = loaded
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return
    print(f"{args.model} ({args.size}), {args.images} images, prefix reuse off")
    head = f"{'phase':<10} {'min TTFT ms':>12} {'median TTFT ms':>15} {'median CPU ms':>14} {'encoder calls':>14}"
    head += f" {'encoder s':>10}"
    print(head + f" {'L1 hits':>8} {'L2 hits':>8}")
    for phase, row in rows.items():
        s = row.get("stats", {"l1": {"hits": 0}, "l2": {"hits": 0}})
        print(
            f"{phase:<10} {min(row['ttft_s']) * 1e3:>12.1f} {statistics.median(row['ttft_s']) * 1e3:>15.1f} "
            f"{statistics.median(row['ttft_cpu_s']) * 1e3:>14.1f} {row['encoder_calls']:>14} {row['encoder_s']:>10.2f} {s['l1']['hits']:>8} {s['l2']['hits']:>8}"
        )


if __name__ == "__main__":
    main()
