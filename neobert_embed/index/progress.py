"""Progress bars for long index jobs, showing documents per second.

Example:
    >>> with document_progress(show=True) as progress:
    ...     task = progress.add_task("encoding", total=1000)
    ...     progress.advance(task, 100)
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class DocsPerSecondColumn(ProgressColumn):
    """Throughput in documents per second (the figure users compare between models)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} docs/s" if speed else "… docs/s")


def document_progress(show: bool = True) -> Progress:
    """A rich progress display on stderr: description, bar, done/total, docs/s, elapsed, remaining.

    Example:
        >>> progress = document_progress(show=False)  # disabled: nothing is drawn
    """
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    DocsPerSecondColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                    console=Console(stderr=True), disable=not show)
