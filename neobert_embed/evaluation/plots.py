"""Bar charts of the comparison: one PNG per MTEB category (matplotlib, Agg backend).

Why: the paper's headline figure is per-category bars of the five backbones; an incomplete
average is drawn hatched and labelled with ``*`` so it cannot be read as a full score.

Example:
    >>> paths = plot_categories(summarize(reports, task_types), "runs/compare/plots")
    >>> [p.name for p in paths]
    ['Class.png', 'STS.png']
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from neobert_embed.charts import png_bytes, subplots
from neobert_embed.evaluation.summary import CATEGORIES, SummaryRow
from neobert_embed.files import atomic_write_bytes


def _file_name(short: str) -> str:
    return short.rstrip(".").replace(".", "_") + ".png"


def plot_categories(rows: Sequence[SummaryRow], directory: str | Path) -> list[Path]:
    """Write ``<category>.png`` for every category with selected tasks; return the paths."""
    directory = Path(directory)
    written = []
    for category, short in CATEGORIES:
        cells = [row.cells[short] for row in rows]
        if not cells or cells[0].expected == 0:
            continue
        figure, axis = subplots(figsize=(1.2 + 1.1 * len(rows), 3.6))
        values = [cell.value or 0.0 for cell in cells]
        bars = axis.bar([row.label for row in rows], values, color="#4C72B0")
        for bar, cell in zip(bars, cells, strict=True):
            label = "missing" if cell.value is None else f"{cell.value:.1f}"
            if cell.value is not None and not cell.complete:
                bar.set_hatch("//")
                bar.set_alpha(0.6)
                label += f"* ({cell.done}/{cell.expected})"
            axis.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                          ha="center", va="bottom", fontsize=8)
        axis.set_title(f"{category} ({cells[0].expected} task(s), main score × 100)")
        axis.set_ylabel("score")
        axis.set_ylim(0, max(max(values) * 1.15, 1.0))
        axis.tick_params(axis="x", labelrotation=20)
        path = directory / _file_name(short)
        atomic_write_bytes(path, png_bytes(figure))
        written.append(path)
    return written
