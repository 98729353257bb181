"""What earlier lines of a pasted device state tell later ones (the parsers' shared, mutable state).

Kept apart from the parsers so that every format module can name it without importing the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["JetsamState", "ParseContext"]


@dataclass
class JetsamState:
    """Where the reader is inside a jetsam report: brace depth, the open process entry, the
    memoryPages block, the page size."""

    active: bool = False
    depth: int = 0
    page_bytes: int | None = None
    pages_depth: int | None = None
    entry_depth: int | None = None
    entry: dict[str, Any] = field(default_factory=dict)


@dataclass
class ParseContext:
    """What earlier lines of the same paste tell later ones: the unit ``free`` printed in, whether
    an NvMap clients table is open (and its largest client), where a jetsam report's reader is."""

    free_unit_bytes: int | None = None
    nvmap_table: bool = False
    nvmap_top: tuple[str, int] | None = None
    jetsam: JetsamState = field(default_factory=JetsamState)
