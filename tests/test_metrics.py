"""A GovernedSession's Prometheus metrics: scraped over 127.0.0.1 from a real governed run of a
tiny zoo model, parsed with prometheus_client's own parser, and compared with ``stats()`` taken at
the same moment (no request in flight between the scrape and the stats call). The expected values
are counted here from ``stats()``'s lists of requests and events, while the exporter reads the
session's running counts (``stats(include_requests=False)``): the two must agree."""

from __future__ import annotations

import gzip
import urllib.request
from typing import Any

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from conftest import ServedSession
from memwarden.govern.telemetry import TelemetrySample
from memwarden.models import zoo
from memwarden.runtime.admission import AdmissionError
from memwarden.runtime.host_memory import state_bytes
from memwarden.runtime.metrics import SessionMetrics, serve_metrics
from memwarden.runtime.session import GovernedSession
from memwarden.runtime.session_config import SessionConfig
from memwarden.runtime.session_tally import SessionTally


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
        if e["kind"] == "refuse":
            key = ("memwarden_admission_refusals_total", (("reason", e["reason"]),))
            out[key] = out.get(key, 0) + 1
    budget_notes = [e for e in stats["events"] if e["kind"] == "budget" and "temp_c" in e]
    for field, name in (("temp_c", "temp_celsius"), ("power_w", "power_watts"), ("fps", "fps")):
        if budget_notes and budget_notes[-1].get(field) is not None:
            out[(f"memwarden_telemetry_{name}", ())] = budget_notes[-1][field]
    return out


def test_every_value_equals_stats_at_the_same_moment(served_session: ServedSession) -> None:
    session, metrics = served_session.session, served_session.metrics
    assert metrics.url.startswith("http://127.0.0.1:") and metrics.port and metrics.port > 0

    before = scrape(metrics.url)
    assert before == expected(session.stats())
    assert before[("memwarden_requests_total", ())] == 0
    # The same session asked again in OpenMetrics, gzipped, then plain: each answer in the format asked for.
    asked = {"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"}
    with urllib.request.urlopen(urllib.request.Request(metrics.url, headers=asked), timeout=30) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        assert response.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(response.read()).decode().endswith("# EOF\n")
    assert scrape(metrics.url) == before

    served_session.serve()
    served_session.serve()  # the same image again: prefix blocks reused
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


def test_ports_are_the_users_and_the_server_stops(served_session: ServedSession) -> None:
    session, metrics = served_session.session, served_session.metrics
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


def test_stats_without_the_lists_says_the_same_and_the_counts_match_a_recount() -> None:
    model = zoo.build_model("llava")
    inputs = zoo.make_inputs(model, prompt_tokens=24)
    with (
        GovernedSession(model, budget="1GiB", config=SessionConfig(encoder_cache=True)) as session,
        torch.inference_mode(),
    ):
        session.stats(include_requests=False)  # a look before any request: the counts then advance from it
        for _ in range(2):
            session.generate(**inputs, max_new_tokens=3, **zoo.generate_kwargs("llava"))
        full, lean = session.stats(), session.stats(include_requests=False)
        assert "requests" not in lean and "events" not in lean  # what a scrape reads: no list of the history
        assert lean == {k: v for k, v in full.items() if k not in ("requests", "events")}
        assert lean["requests_served"] == len(full["requests"]) == 2
        assert lean["decisions"] == {"admit": 2} and lean["degradation_rung"] == 0
        assert lean["event_counts"] == {"admit": 2} and sum(lean["event_counts"].values()) == len(full["events"])
        # The running counts, advanced look by look, equal a count over the whole lists from scratch.
        assert SessionTally().look(session.records, session.events) == session.tally.look(
            session.records, session.events
        )


def test_every_refusal_is_recorded_with_its_reason_and_scraped() -> None:
    model = zoo.build_model("llava")
    generate = zoo.generate_kwargs("llava")
    text = {"input_ids": torch.randint(3, 200, (1, 20), generator=torch.Generator().manual_seed(3))}
    # A pool of exactly the request's blocks, no weight streaming: nothing to give back but the budget.
    with (
        GovernedSession(
            model, budget="1GiB", config=SessionConfig(num_kv_blocks=2, stream=False, encoder_cache=False)
        ) as session,
        serve_metrics(session, 0) as metrics,
    ):
        assert scrape(metrics.url) == expected(session.stats())
        assert not any(name == "memwarden_admission_refusals_total" for name, _ in scrape(metrics.url))
        long = {"input_ids": torch.randint(3, 200, (1, 40), generator=torch.Generator().manual_seed(4))}
        with pytest.raises(AdmissionError, match="tokens of KV cache"), torch.inference_mode():
            session.generate(**long, max_new_tokens=8, **generate)
        session.set_budget(state_bytes(model) // 2)  # below the weights: no plan fits
        for _ in range(2):
            with pytest.raises(AdmissionError, match="exceeds the budget"), torch.inference_mode():
                session.generate(**text, max_new_tokens=8, **generate)
        samples, stats = scrape(metrics.url), session.stats()
        assert samples == expected(stats)
        assert stats["refusals"] == {"kv_pool_fixed": 1, "over_budget": 2} and stats["requests_served"] == 0
        assert samples[("memwarden_admission_refusals_total", (("reason", "over_budget"),))] == 2
        assert samples[("memwarden_admission_refusals_total", (("reason", "kv_pool_fixed"),))] == 1
        refused = [e for e in stats["events"] if e["kind"] == "refuse"]
        assert [e["reason"] for e in refused] == ["kv_pool_fixed", "over_budget", "over_budget"]
        assert "exceeds the budget" in refused[-1]["label"]  # the whole reason, as AdmissionError said it
        assert refused[-1]["budget_bytes"] == state_bytes(model) // 2
