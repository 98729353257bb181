"""The report's flame graph: the bytes live at the peak, from the user's line down to the module
that held them and the op that made them, drawn as a self-contained SVG (no script, no CDN).

Three levels, widest first, each box as wide as its bytes: the line of the user's code (a block
made during a model call counts for the script's line that called the model, as the source view
counts it), then the module path, then the aten op. Boxes narrower than ``min_share`` of the peak
are gathered into one "(n smaller)" box per parent, so the widths of every level still add up to
the bytes live at the peak. Each box carries ``data-bytes`` and ``data-depth`` attributes (the
exact numbers, for tools and tests) and a ``<title>`` shown on hover.

``flame_tree`` is the data (pure, a Trace and the peak's live rows in); ``flame_svg`` the markup.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field

import numpy as np

from memwarden.analyze.lines import row_lines
from memwarden.trace.model import Trace
from memwarden.units import format_bytes

__all__ = ["FlameNode", "flame_svg", "flame_tree"]

LEVELS = ("line", "module", "op")
_WIDTH_PX = 1200  # the SVG's coordinate width; it scales to the page
_ROW_PX = 22
_MIN_LABEL_PX = 40  # a box narrower than this shows no text (its title still does)
_COLORS = ("#e4572e", "#f3a712", "#669bbc")  # one hue per level


@dataclass
class FlameNode:
    """A box: its label, the bytes under it, its full name (hover) and its children by label."""

    label: str
    nbytes: int = 0
    title: str = ""
    children: dict[str, FlameNode] = field(default_factory=dict)

    def ordered(self) -> list[FlameNode]:
        return sorted(self.children.values(), key=lambda c: (-c.nbytes, c.label))


def _line_label(line: tuple[str, int, str] | None) -> tuple[str, str]:
    if line is None:
        return "(no user line)", "allocations without a line of the user's code (library threads, load)"
    file, number, function = line
    return f"{os.path.basename(file)}:{number}", f"{file}:{number} in {function}"


def flame_tree(trace: Trace, live_rows: np.ndarray, min_share: float = 0.005) -> FlameNode:
    """The bytes of ``live_rows`` (the blocks live at the peak) by user line, module and op."""
    root = FlameNode("all", title="bytes live at the peak")
    if not len(live_rows):
        return root
    e = trace.events
    lines = row_lines(trace, live_rows)
    modules = e["module"][live_rows].tolist()
    ops = e["op"][live_rows].tolist()
    sizes = e["nbytes"][live_rows].tolist()
    for line, module, op, nbytes in zip(lines, modules, ops, sizes, strict=True):
        label, title = _line_label(line)
        mod = trace.string(int(module)) or "(outside modules)"
        op_name = trace.string(int(op)) or "(no op)"
        node = root
        node.nbytes += int(nbytes)
        for key, full in ((label, title), (mod, mod), (op_name, op_name)):
            node = node.children.setdefault(key, FlameNode(key, title=full))
            node.nbytes += int(nbytes)
    _gather_small(root, int(min_share * root.nbytes))
    return root


def _merge(into: FlameNode, node: FlameNode) -> None:
    """Add ``node``'s children (and theirs) to ``into``'s, by label."""
    for child in node.children.values():
        kept = into.children.setdefault(child.label, FlameNode(child.label, title=child.title))
        kept.nbytes += child.nbytes
        _merge(kept, child)


def _gather_small(node: FlameNode, min_bytes: int) -> None:
    """Children under ``min_bytes`` become one box (their bytes summed, their children merged by
    label, so the levels below still add up), recursively."""
    small = [c for c in node.children.values() if c.nbytes < min_bytes]
    if len(small) > 1:
        label = f"({len(small)} smaller)"
        gathered = FlameNode(label, title=f"{len(small)} smaller boxes")
        for c in small:
            del node.children[c.label]
            gathered.nbytes += c.nbytes
            _merge(gathered, c)
        node.children[label] = gathered
    for c in node.children.values():
        _gather_small(c, min_bytes)


def flame_svg(root: FlameNode) -> str:
    """The tree as an icicle SVG: the user's lines on top, their modules below, the ops at the bottom."""
    if root.nbytes <= 0:
        return '<p class="mw-empty">nothing was live at the peak</p>'
    boxes: list[str] = []

    def draw(node: FlameNode, depth: int, x: float) -> None:
        for child in node.ordered():
            w = child.nbytes / root.nbytes * _WIDTH_PX
            y = depth * _ROW_PX
            tip = f"{child.title}: {format_bytes(child.nbytes)} ({child.nbytes / root.nbytes:.1%} of the peak)"
            text = ""
            if w >= _MIN_LABEL_PX:
                chars = max(1, int((w - 6) / 7))
                shown = child.label if len(child.label) <= chars else child.label[: max(1, chars - 1)] + "…"
                text = f'<text x="{x + 3:.2f}" y="{y + 15}" class="mw-flame-label">{html.escape(shown)}</text>'
            boxes.append(
                f'<g class="mw-flame-box" data-depth="{depth}" data-bytes="{child.nbytes}" '
                f'data-level="{LEVELS[depth]}"><title>{html.escape(tip)}</title>'
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{_ROW_PX - 2}" fill="{_COLORS[depth]}" '
                f'stroke="#fff" stroke-width="0.5"></rect>{text}</g>'
            )
            if depth + 1 < len(LEVELS):
                draw(child, depth + 1, x)
            x += w

    draw(root, 0, 0.0)
    height = len(LEVELS) * _ROW_PX
    legend = " → ".join(f'<span style="color:{c}">■</span> {name}' for name, c in zip(LEVELS, _COLORS, strict=True))
    return (
        f'<p class="mw-note">Bytes live at the peak ({html.escape(format_bytes(root.nbytes))}): each box is as wide as '
        f"its bytes; user line, then module, then op ({legend}). Hover a box for its numbers.</p>"
        f'<svg class="mw-flame" data-total-bytes="{root.nbytes}" viewBox="0 0 {_WIDTH_PX} {height}" width="100%" '
        f'role="img" aria-label="flame graph of the bytes at the peak" '
        f'xmlns="http://www.w3.org/2000/svg" style="font: 12px sans-serif">'
        f"{''.join(boxes)}</svg>"
    )
