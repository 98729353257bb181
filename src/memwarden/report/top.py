"""``memwarden top``'s screen: a session's metrics as one 80-column panel (rich). Pure: samples in,
a renderable out; fetching and refreshing belong to the command.

Samples are ``{(name, ((label, value), ...)): number}``, the shape prometheus_client's parser
gives, with the ``memwarden_`` names of ``memwarden.runtime.metrics``.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from memwarden.units import format_bytes

__all__ = ["Samples", "render_top"]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
WIDTH = 80
_BAR = 30


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((f"memwarden_{name}", tuple(sorted(labels.items()))))


def _by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    full = f"memwarden_{name}"
    return {dict(key[1])[label]: v for key, v in samples.items() if key[0] == full and key[1]}


def _bar(part: float, whole: float) -> Text:
    share = 0.0 if whole <= 0 else max(0.0, min(1.0, part / whole))
    filled = round(share * _BAR)
    style = "red" if share > 0.9 else "yellow" if share > 0.7 else "green"
    return Text("█" * filled, style=style) + Text("·" * (_BAR - filled), style="dim") + Text(f" {100 * share:5.1f}%")


def render_top(
    samples: Samples, source: str, previous: Samples | None = None, interval_s: float = 1.0
) -> RenderableType:
    """The panel: budget and what the session holds against it, the KV pool, caches, admission,
    the rung and telemetry. ``previous``: the last refresh's samples, for rates."""
    budget = _value(samples, "budget_bytes") or 0.0
    title = Text(f"memwarden top  {source}"[:WIDTH], style="bold")
    memory = Table(box=None, show_header=False, pad_edge=False, width=WIDTH)
    memory.add_column("what", width=18, no_wrap=True)
    memory.add_column("bytes", width=11, justify="right", no_wrap=True)
    memory.add_column("bar", width=WIDTH - 18 - 11 - 2, no_wrap=True)
    memory.add_row("budget", format_bytes(budget), Text(""))
    held = _by_label(samples, "held_bytes", "category")
    for category, nbytes in sorted(held.items(), key=lambda kv: -kv[1]):
        memory.add_row(f"  {category}", format_bytes(nbytes), _bar(nbytes, budget))
    memory.add_row("  held, all", format_bytes(sum(held.values())), _bar(sum(held.values()), budget))
    streamed = _value(samples, "weights_streamed_bytes") or 0.0
    if streamed:
        memory.add_row("weights streamed", format_bytes(streamed), Text("from disk, per use", style="dim"))
    blocks = _value(samples, "kv_blocks") or 0.0
    used = _value(samples, "kv_blocks_used") or 0.0
    memory.add_row("KV blocks used", f"{used:.0f}/{blocks:.0f}", _bar(used, blocks))

    counts = Table(box=None, show_header=False, pad_edge=False, width=WIDTH)
    for width in (18, 20, 18, 20):
        counts.add_column(width=width, no_wrap=True)
    requests = _value(samples, "requests_total") or 0.0
    rate = ""
    if previous is not None and interval_s > 0:
        before = previous.get(("memwarden_requests_total", ()), requests)
        rate = f" ({(requests - before) / interval_s:.1f}/s)"
    hits, misses = _value(samples, "prefix_hits_total") or 0.0, _value(samples, "prefix_misses_total") or 0.0
    ehits, emiss = (
        _value(samples, "encoder_cache_hits_total") or 0.0,
        _value(samples, "encoder_cache_misses_total") or 0.0,
    )
    counts.add_row(
        "requests",
        f"{requests:.0f}{rate}",
        "rung / latency",
        f"{_num(samples, 'degradation_rung')} / {_num(samples, 'latency_level')}",
    )
    counts.add_row(
        "prefix hits", f"{hits:.0f} of {hits + misses:.0f}", "KV evictions", _num(samples, "kv_evictions_total")
    )
    counts.add_row(
        "encoder hits", f"{ehits:.0f} of {ehits + emiss:.0f}", "cached blocks", _num(samples, "kv_blocks_cached")
    )
    decisions = _by_label(samples, "admission_decisions_total", "action")
    refusals = _by_label(samples, "admission_refusals_total", "reason")
    counts.add_row(
        "decisions",
        ", ".join(f"{k} {v:.0f}" for k, v in sorted(decisions.items())) or "none",
        "refusals",
        f"{sum(refusals.values()):.0f}",
    )
    parts: list[RenderableType] = [title, memory, counts]
    for reason, n in sorted(refusals.items(), key=lambda kv: -kv[1])[:3]:
        parts.append(Text(f"  refused {n:.0f}x: {reason}"[:WIDTH], style="red"))
    telemetry = [
        f"{label} {value:g}{unit}"
        for label, name, unit in (
            ("temp", "telemetry_temp_celsius", " °C"),
            ("power", "telemetry_power_watts", " W"),
            ("fps", "telemetry_fps", ""),
        )
        if (value := _value(samples, name)) is not None
    ]
    parts.append(
        Text(("telemetry: " + ", ".join(telemetry)) if telemetry else "telemetry: none followed yet", style="dim")
    )
    return Group(*parts)


def _num(samples: Samples, name: str) -> str:
    value = _value(samples, name)
    return "-" if value is None else f"{value:.0f}"
