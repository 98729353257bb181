"""Link faults injected between a sync client and a real server, at the transport level.

``FaultyTransport`` wraps a transport and, per response, with the probabilities of a
:class:`FaultPlan` (seeded: a campaign replays exactly), does one of:

- ``truncate``: the body ends early but the response looks complete (a proxy that closed
  cleanly mid-body);
- ``corrupt``: one to a few bytes flipped;
- ``reorder``: the body's chunks arrive out of order (a broken reassembly);
- ``drop``: the connection breaks after part of the body (``TransportError`` with the part);
- ``restart``: the server is restarted (``restart`` callback) after part of the body went out,
  then the connection breaks.

Every fault that changes what the client sees is counted in ``injected`` by kind; a fault that
would change nothing (a body of one chunk reordered) is not injected.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from memwarden.edge.sync.client import Response, Transport, TransportError

__all__ = ["FaultPlan", "FaultyTransport"]

KINDS = ("truncate", "corrupt", "reorder", "drop", "restart")


@dataclass(frozen=True, kw_only=True)
class FaultPlan:
    """Probability of each fault per response (at most one fault per response)."""

    truncate: float = 0.0
    corrupt: float = 0.0
    reorder: float = 0.0
    drop: float = 0.0
    restart: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        rates = [getattr(self, k) for k in KINDS]
        if any(r < 0 for r in rates) or sum(rates) > 1:
            raise ValueError(f"fault probabilities must be >= 0 and sum to at most 1, got {rates}")

    @classmethod
    def uniform(cls, rate: float, *, seed: int = 0, restart: bool = False) -> FaultPlan:
        kinds = KINDS if restart else KINDS[:-1]
        each = rate / len(kinds)
        return cls(seed=seed, **{k: each for k in kinds})


class FaultyTransport:
    def __init__(
        self,
        inner: Transport,
        plan: FaultPlan,
        *,
        restart: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.inner = inner
        self.plan = plan
        self.restart = restart
        self.rng = random.Random(plan.seed)
        self.injected: Counter[str] = Counter()
        self.responses = 0

    @property
    def total_injected(self) -> int:
        return sum(self.injected.values())

    async def get(self, path: str, headers: Mapping[str, str], *, limit: int | None = None) -> Response:
        resp = await self.inner.get(path, headers, limit=limit)
        self.responses += 1
        kind = self._draw()
        body = resp.body
        if kind is None or not body:
            return resp
        rng = self.rng
        if kind == "truncate":
            cut = rng.randrange(len(body))
            self.injected[kind] += 1
            return Response(resp.status, resp.headers, body[:cut])
        if kind == "corrupt":
            damaged = bytearray(body)
            for _ in range(rng.randint(1, 3)):
                damaged[rng.randrange(len(damaged))] ^= rng.randint(1, 255)
            self.injected[kind] += 1
            return Response(resp.status, resp.headers, bytes(damaged))
        if kind == "reorder":
            chunks = _chunks(body, rng.randint(2, 4))
            order = list(range(len(chunks)))
            rng.shuffle(order)
            shuffled = b"".join(chunks[i] for i in order)
            if shuffled == body:
                return resp
            self.injected[kind] += 1
            return Response(resp.status, resp.headers, shuffled)
        partial = body[: rng.randrange(len(body))]
        self.injected[kind] += 1
        if kind == "restart" and self.restart is not None:
            await self.restart()
        raise TransportError(f"injected {kind}", partial)

    def _draw(self) -> str | None:
        x = self.rng.random()
        for kind in KINDS:
            rate = getattr(self.plan, kind)
            if kind == "restart" and self.restart is None:
                continue
            if x < rate:
                return kind
            x -= rate
        return None


def _chunks(body: bytes, n: int) -> list[bytes]:
    step = max(1, -(-len(body) // n))
    return [body[i : i + step] for i in range(0, len(body), step)]
