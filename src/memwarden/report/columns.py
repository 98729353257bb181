"""Tables that fit the terminal they are printed in (80 columns is the test).

Rich squeezes every column of a table that is too wide until headers vanish and names wrap
over five lines. ``FitTable`` decides at render time, when the width is known: it drops the
least important columns first, gives the width left over to one column (a module path, a
name) and elides that column's values in the middle, where a dotted path says least.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

__all__ = ["Col", "FitTable", "elide_middle"]

ELLIPSIS = "…"
_SEPARATOR = 3  # " │ " between columns (no outer edge)


def elide_middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells, cut in the middle: a dotted path keeps its first part
    and as many of its last parts as fit (``model.…layers.1.mlp.act_fn``)."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    parts = text.split(".")
    if len(parts) > 2:
        head = parts[0] + "." + ELLIPSIS
        tail: list[str] = []
        for part in reversed(parts[1:]):
            candidate = ".".join([part, *tail])
            if cell_len(head) + cell_len(candidate) > width:
                break
            tail = [part, *tail]
        if tail:
            return head + ".".join(tail)
    keep = width - 1
    front = keep - keep // 2
    return text[:front] + ELLIPSIS + text[len(text) - keep // 2 :] if keep // 2 else text[:front] + ELLIPSIS


@dataclass(frozen=True)
class Col:
    """One column. ``drop``: the order in which columns leave a narrow terminal (1 first; 0
    never). ``elide``: this column takes the width left over and is cut in the middle."""

    header: str
    justify: Literal["left", "right", "center"] = "left"
    drop: int = 0
    elide: bool = False
    min_width: int = 8


class FitTable:
    """A rich renderable: a table laid out for the width it is rendered at."""

    def __init__(self, columns: Sequence[Col], rows: Sequence[Sequence[str]], *, title: str | None = None) -> None:
        self.columns = list(columns)
        self.rows = [list(r) for r in rows]
        self.title = title

    def _natural(self, i: int) -> int:
        return max([cell_len(self.columns[i].header), *(cell_len(r[i]) for r in self.rows)])

    def layout(self, width: int) -> tuple[list[int], dict[int, int]]:
        """The columns kept (indices) and the width given to each."""
        keep = list(range(len(self.columns)))

        def needed(cols: list[int]) -> int:
            fixed = sum(
                min(self._natural(i), self.columns[i].min_width) if self.columns[i].elide else self._natural(i)
                for i in cols
            )
            return fixed + _SEPARATOR * (len(cols) - 1)

        while needed(keep) > width:
            droppable = [i for i in keep if self.columns[i].drop > 0]
            if not droppable:
                break
            keep.remove(min(droppable, key=lambda i: self.columns[i].drop))
        widths = {i: self._natural(i) for i in keep}
        elided = [i for i in keep if self.columns[i].elide]
        if elided:
            i = elided[0]
            others = sum(w for j, w in widths.items() if j != i) + _SEPARATOR * (len(keep) - 1)
            widths[i] = max(self.columns[i].min_width, min(self._natural(i), width - others))
        return keep, widths

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        keep, widths = self.layout(options.max_width)
        table = Table(title=self.title, title_justify="left", show_edge=False, pad_edge=False, expand=False)
        for i in keep:
            col = self.columns[i]
            table.add_column(col.header, justify=col.justify, no_wrap=True, overflow="ellipsis", width=widths[i])
        for row in self.rows:
            cells = []
            for i in keep:
                value = row[i]
                if self.columns[i].elide:
                    value = elide_middle(value, widths[i])
                cells.append(Text(value, no_wrap=True, overflow="ellipsis"))
            table.add_row(*cells)
        yield table
