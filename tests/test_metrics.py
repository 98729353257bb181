"""A GovernedSession's Prometheus metrics: scraped over 127.0.0.1 from a real governed run of a
tiny zoo model, parsed with prometheus_client's own parser, and compared with ``stats()`` taken at
the same moment (no request in flight between the scrape and the stats call)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from memwarden.govern.telemetry import TelemetrySample
from memwarden.models import zoo
from memwarden.runtime.metrics import SessionMetrics, serve_metrics
from memwarden.runtime.session import GovernedSession

NAME = "llava"


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def expected(stats: dict[str, Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What a scrape must say, written from ``stats()`` independently of the exporter's code."""
    requests = stats["requests"]
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {
        ("memwarden_budget_bytes", ()): stats["budget_bytes"],
        ("memwarden_held_bytes", (("category", "weight"),)): stats["weights_bytes"],
        ("memwarden_held_bytes", (("category", "kv_cache"),)): stats["kv_pool_bytes"],
        ("memwarden_weights_resident_bytes", ()): stats["weights_bytes"],
        ("memwarden_weights_streamed_bytes", ()): 0,
        ("memwarden_kv_pool_bytes", ()): stats["kv_pool_bytes"],
        ("memwarden_kv_blocks", ()): stats["kv_blocks"],
        ("memwarden_kv_blocks_used", ()): stats["kv_blocks"] - stats["kv_free_blocks"],
        ("memwarden_kv_blocks_cached", ()): stats["kv_cached_blocks"],
        ("memwarden_kv_block_size_tokens", ()): stats["block_size"],
        ("memwarden_prefix_hits_total", ()): stats["prefix_hits"],
        ("memwarden_prefix_misses_total", ()): stats["prefix_misses"],
        ("memwarden_kv_evictions_total", ()): stats["evictions"],
        ("memwarden_encoder_cache_hits_total", ()): stats["encoder_hits"],
        ("memwarden_encoder_cache_misses_total", ()): stats["encoder_misses"],
        ("memwarden_requests_total", ()): len(requests),
        ("memwarden_degradation_rung", ()): requests[-1]["rung"] if requests else 0,
        ("memwarden_latency_level", ()): stats["latency_level"],
        ("memwarden_meta_predictions_total", ()): stats["meta_predictions"],
    }
    for r in requests:
        key = ("memwarden_admission_decisions_total", (("action", r["decision"]["action"]),))
        out[key] = out.get(key, 0) + 1
    for e in stats["events"]:
        key = ("memwarden_session_events_total", (("kind", e["kind"]),))
        out[key] = out.get(key, 0) + 1
    budget_notes = [e for e in stats["events"] if e["kind"] == "budget" and "temp_c" in e]
    for field, name in (("temp_c", "temp_celsius"), ("power_w", "power_watts"), ("fps", "fps")):
        if budget_notes and budget_notes[-1].get(field) is not None:
            out[(f"memwarden_telemetry_{name}", ())] = budget_notes[-1][field]
    return out


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[GovernedSession, SessionMetrics, dict[str, torch.Tensor]]]:
    model = zoo.build_model(NAME)
    inputs = zoo.make_inputs(model, prompt_tokens=24)
    with GovernedSession(model, budget="1GiB", encoder_cache=True) as session:
        metrics = serve_metrics(session, 0)
        try:
            yield session, metrics, inputs
        finally:
            metrics.stop()


def _serve(session: GovernedSession, inputs: dict[str, torch.Tensor]) -> None:
    with torch.inference_mode():
        session.generate(**inputs, max_new_tokens=3, **zoo.generate_kwargs(NAME))


def test_every_value_equals_stats_at_the_same_moment(served: Any) -> None:
    session, metrics, inputs = served
    assert metrics.url.startswith("http://127.0.0.1:") and metrics.port and metrics.port > 0

    before = scrape(metrics.url)
    assert before == expected(session.stats())
    assert before[("memwarden_requests_total", ())] == 0

    _serve(session, inputs)
    _serve(session, inputs)  # the same image again: prefix blocks reused
    after = scrape(metrics.url)
    stats = session.stats()
    assert after == expected(stats)
    assert after[("memwarden_requests_total", ())] == 2
    assert after[("memwarden_prefix_hits_total", ())] >= 1 and after[("memwarden_kv_blocks_cached", ())] >= 1
    assert after[("memwarden_admission_decisions_total", (("action", "admit"),))] == 2

    # A hot, squeezed device: the budget follows the reading, and the scrape shows both.
    available = stats["weights_bytes"] + stats["kv_pool_bytes"]
    budget = session.on_telemetry(
        TelemetrySample(t_s=1.0, mem_total_bytes=2**31, mem_available_bytes=available, temp_c=91.5, fps=12.0),
        in_use_bytes=0,
    )
    hot = scrape(metrics.url)
    assert hot == expected(session.stats())
    assert hot[("memwarden_budget_bytes", ())] == budget < 2**30
    assert hot[("memwarden_telemetry_temp_celsius", ())] == 91.5
    assert hot[("memwarden_telemetry_fps", ())] == 12.0


def test_ports_are_the_users_and_the_server_stops(served: Any) -> None:
    session, metrics, _ = served
    second = SessionMetrics(session).start(0)
    try:
        assert second.port != metrics.port
        with pytest.raises(RuntimeError, match="already serving"):
            second.start(0)
        with pytest.raises(OSError):  # the port is taken: the user hears it, nothing is shared
            SessionMetrics(session).start(int(second.port or 0))
    finally:
        second.stop()
    with pytest.raises(OSError):
        scrape(second.url)
