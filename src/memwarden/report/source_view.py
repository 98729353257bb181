"""The report's source view: the user's lines that hold the most at the peak, each with its
function, the bytes it holds at the peak and allocated over the run, and its source text, as a
line profiler shows them.

``source_view_html`` is pure (lines and texts in, markup out). ``read_source_lines`` is the one
I/O, called by ``write_report`` at the edge: it reads a line only from a regular ``.py`` file
that exists (never a device, a FIFO or a directory a hostile trace names), of bounded size, and
the renderer HTML-escapes every text it shows.
"""

from __future__ import annotations

import html
import os
import stat
from collections.abc import Iterable, Mapping, Sequence

from memwarden.analyze.lines import LineBytes
from memwarden.units import format_bytes

__all__ = ["MAX_SOURCE_BYTES", "read_source_lines", "source_view_html"]

MAX_SOURCE_BYTES = 4 << 20  # a script larger than this is not read for the view
_MAX_LINE_CHARS = 240  # a line's text is cut to this many characters


def read_source_lines(lines: Iterable[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """The text of each ``(file, line)`` whose file is a readable regular ``.py`` file; lines that
    cannot be read are left out (the view shows the location alone)."""
    wanted: dict[str, set[int]] = {}
    for file, line in lines:
        if file.endswith(".py") and line > 0:
            wanted.setdefault(file, set()).add(line)
    out: dict[tuple[str, int], str] = {}
    for file, numbers in wanted.items():
        try:
            info = os.stat(file)
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SOURCE_BYTES:
                continue
            with open(file, "rb") as fh:
                text = fh.read(MAX_SOURCE_BYTES + 1).decode("utf-8", "replace")
        except OSError:
            continue
        source = text.splitlines()
        for n in numbers:
            if n <= len(source):
                out[(file, n)] = source[n - 1].strip()[:_MAX_LINE_CHARS]
    return out


def source_view_html(
    at_peak: Sequence[LineBytes],
    allocated: Mapping[tuple[str, int], int],
    source: Mapping[tuple[str, int], str],
) -> str:
    """The source view's table: ``at_peak`` the lines holding the most at the peak (heaviest first),
    ``allocated`` bytes each line allocated over the run, ``source`` each line's text."""
    if not at_peak:
        return '<p class="mw-empty">no allocation at the peak carries a line of the user\'s code</p>'
    rows = []
    for x in at_peak:
        key = (x.file, x.line)
        text = source.get(key)
        code = (
            f"<code>{html.escape(text)}</code>"
            if text is not None
            else '<span class="mw-note">(source not read)</span>'
        )
        rows.append(
            f'<tr><td class="mw-path" title="{html.escape(x.file)}">{html.escape(os.path.basename(x.file))}:{x.line}</td>'
            f"<td>{html.escape(x.function)}</td>"
            f'<td class="num">{html.escape(format_bytes(x.nbytes))}</td>'
            f'<td class="num">{html.escape(format_bytes(allocated.get(key, x.nbytes)))}</td>'
            f'<td class="mw-source-text">{code}</td></tr>'
        )
    return (
        '<p class="mw-note">Lines of the user\'s code holding the most at the peak, with what each '
        "allocated over the whole run.</p>"
        '<table class="mw-table mw-source"><thead><tr><th>line</th><th>function</th><th class="num">at peak</th>'
        f'<th class="num">allocated over the run</th><th>source</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )
