"""Estimates as terminal or Markdown text: where a model stops fitting (a sweep) and the verdict
of one card on further devices. Pure: results in, strings out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from memwarden.estimation.card import Device, MemoryCard
from memwarden.units import format_bytes

if TYPE_CHECKING:  # estimate.run builds models (torch); only its result type is needed here
    from memwarden.estimation.run import SweepResult

__all__ = ["card_text", "sweep_text"]

_AXIS_LABELS = {"image": "image (px)", "prompt_tokens": "prompt tokens", "audio_seconds": "audio (s)"}


def card_text(card: MemoryCard, more_devices: Sequence[Device] = ()) -> str:
    """The card as text, then one line per further device: its usable memory and the verdict."""
    lines = [card.to_text()]
    lines += [
        f"  {d.name}: usable {d.usable_bytes / 2**30:.1f} GiB, {card.verdict(d.usable_bytes)}" for d in more_devices
    ]
    return "\n".join(lines) + "\n"


def sweep_text(result: SweepResult, markdown: bool) -> str:
    """One table per swept axis (value, peak, fits or not per device), then each device's limits."""
    lines = [f"{'### ' if markdown else ''}Where {result.model} stops fitting", ""]
    names = [d.name for d in result.devices]
    for axis, points in result.axes.items():
        header = [_AXIS_LABELS[axis], "peak", *names]
        rows = []
        for i, (value, card) in enumerate(points):
            shown = f"{value[0]}x{value[1]}" if isinstance(value, tuple) else f"{value:g}"
            cells = ["fits" if result.fits(axis, i, d) else "no" for d in result.devices]  # estimate's own verdict
            rows.append([shown, format_bytes(card.peak_bytes), *cells])
        if markdown:
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "---|" * len(header))
            lines += ["| " + " | ".join(r) + " |" for r in rows]
        else:
            widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
            lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
            lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        lines.append("")
    for dev_id, axes in result.limits().items():
        name = next(d.name for d in result.devices if d.id == dev_id)
        parts = []
        for axis, value in axes.items():
            if value is None:
                parts.append(f"no {axis.replace('_', ' ')} fits")
            elif isinstance(value, tuple):
                parts.append(f"largest image {value[0]}x{value[1]}")
            else:
                parts.append(f"longest {axis.replace('_', ' ')} {value:g}")
        lines.append(f"{'- ' if markdown else ''}{name}: " + "; ".join(parts))
    return "\n".join(lines).rstrip() + "\n"
