"""Progress on stderr for commands that take more than about a second.

Shown only where a person watches: stderr is a terminal and the command was not asked for
``--json`` or ``--quiet``. Anywhere else (a pipe, a CI log, a test) nothing is written, so
progress never mixes with output a program reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

__all__ = ["Step", "progress"]

Step = Callable[..., None]  # step(text, fraction=None): what is happening now, and how far (0..1) if known


@contextmanager
def progress(label: str, *, enabled: bool = True, known_total: bool = True) -> Iterator[Step]:
    """A transient progress bar named ``label``; yields ``step(text, fraction=None)``.

    ``known_total`` false: a pulsing bar (how long is not known), with the elapsed time."""
    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield _quiet
        return
    columns = [
        SpinnerColumn(),
        TextColumn(f"[bold]{label}[/]"),
        BarColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("starting", total=1.0 if known_total else None)

        def step(text: str, fraction: float | None = None) -> None:
            if fraction is None:
                bar.update(task, description=text)
            else:
                bar.update(task, description=text, completed=fraction)

        yield step


def _quiet(text: str, fraction: float | None = None) -> None:
    return None
