"""``summary.md``, ``summary.csv`` and ``glue.png``: the paper's GLUE table, one row per model.

Why: the paper's Table reports one number per task (MNLI QNLI QQP RTE SST MRPC CoLA STS) and
their average; every model written into one output gets its row, as ``compare`` does for MTEB.
The number per task is its selection metric × 100 (MNLI matched accuracy, QQP F1, CoLA Matthews,
STS-B Pearson, the rest accuracy); the other metrics, the chosen configuration and the spread
over seeds follow in a second table. An average over fewer tasks than selected is marked ``*``
(the MTEB summary's :class:`~neobert_embed.evaluation.summary.Cell`), never silently re-normalized.

Example:
    >>> write_glue_summary({"neobert": {"rte": choice}}, ["rte", "stsb"], "runs/glue")
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

from neobert_embed.charts import png_bytes, subplots
from neobert_embed.evaluation.summary import Cell
from neobert_embed.files import atomic_write_bytes, atomic_write_text
from neobert_embed.glue.selection import TaskChoice
from neobert_embed.glue.tasks import PAPER_ORDER, TASKS

Table = dict[str, dict[str, TaskChoice | None]]


def ordered_tasks(tasks: Sequence[str]) -> list[str]:
    """Selected tasks in the paper's column order."""
    return [t for t in PAPER_ORDER if t in tasks]


def headline(choice: TaskChoice | None, task: str) -> float | None:
    """The task's table number (selection metric × 100), or None when it has no result."""
    return None if choice is None else 100 * choice.scores[TASKS[task].selection_metric]


def average(row: dict[str, TaskChoice | None], tasks: Sequence[str]) -> Cell:
    values = [headline(row.get(t), t) for t in tasks]
    present = [v for v in values if v is not None]
    return Cell(sum(present) / len(present) if present else None, len(present), len(values))


def how_obtained(table: Table, preset_name: str) -> str:
    """How the table's figures were obtained: selected among configurations on validation (the
    paper's protocol, optimistic), or one configuration per task with nothing selected.

    Example:
        >>> how_obtained(table, "quick")
        'Preset `quick` trains one configuration per task: each figure is its validation score ...'
    """
    choices = [choice for row in table.values() for choice in row.values() if choice is not None]
    if any(choice.configs > 1 for choice in choices):
        return (f"Preset `{preset_name}`. Each task reports its best configuration chosen **on validation** "
                "(median over seeds), as the paper does: the figure is optimistic.")
    return (f"Preset `{preset_name}` trains one configuration per task: each figure is its validation score "
            "(median over seeds); nothing was selected on validation.")


def render_markdown(table: Table, tasks: Sequence[str], preset_name: str) -> str:
    tasks = ordered_tasks(tasks)
    titles = [TASKS[t].title for t in tasks]
    lines = ["# GLUE summary (validation)", "", how_obtained(table, preset_name) + " Numbers × 100: "
             + ", ".join(f"{TASKS[t].title} {TASKS[t].selection_metric}" for t in tasks) + ". "
             "`*` marks an average over fewer tasks than selected.", "",
             "| Model | " + " | ".join(titles) + " | Avg. |", "|---|" + "---|" * (len(tasks) + 1)]
    for label, row in table.items():
        cells = ["missing" if headline(row.get(t), t) is None else f"{headline(row.get(t), t):.2f}" for t in tasks]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {average(row, tasks).markdown()} |")
    lines += ["", "## Per task", "", "| Model | Task | Config | Seeds | Trials | Metrics (median; min–max) |",
              "|---|---|---|---|---|---|"]
    for label, row in table.items():
        for task in tasks:
            choice = row.get(task)
            if choice is None:
                lines.append(f"| {label} | {TASKS[task].title} | — | 0 | 0 | missing |")
                continue
            metrics = "; ".join(f"{m} {100 * v:.2f} ({100 * choice.spread[m]['min']:.2f}–"
                                f"{100 * choice.spread[m]['max']:.2f})" for m, v in choice.scores.items())
            lines.append(f"| {label} | {TASKS[task].title} | {choice.config_key} | {choice.seeds} | "
                         f"{choice.trials} | {metrics} |")
    return "\n".join(lines) + "\n"


def render_csv(table: Table, tasks: Sequence[str]) -> str:
    tasks = ordered_tasks(tasks)
    detail = [f"{t}_{m}" for t in tasks for m in TASKS[t].metrics]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["model", *(TASKS[t].title for t in tasks), "Avg.", "tasks_done", "tasks_selected",
                     "complete", *detail, *(f"{t}_config" for t in tasks)])

    def number(value: float | None) -> str:
        return "" if value is None else f"{value:.4f}"

    for label, row in table.items():
        avg = average(row, tasks)
        values = {f"{t}_{m}": number(100 * v) for t in tasks if row.get(t) for m, v in row[t].scores.items()}
        writer.writerow([label, *(number(headline(row.get(t), t)) for t in tasks), number(avg.value), avg.done,
                         avg.expected, str(avg.complete).lower(), *(values.get(d, "") for d in detail),
                         *((row[t].config_key if row.get(t) else "") for t in tasks)])
    return buffer.getvalue()


def plot_table(table: Table, tasks: Sequence[str], path: str | Path) -> Path:
    """Grouped bars: one group per task plus Avg., one bar per model (matplotlib, Agg)."""
    import numpy as np

    tasks = ordered_tasks(tasks)
    groups = [TASKS[t].title for t in tasks] + ["Avg."]
    labels = list(table)
    width = 0.8 / max(len(labels), 1)
    figure, axis = subplots(figsize=(2 + 0.9 * len(groups) * max(1, len(labels) / 2), 3.8))
    for i, label in enumerate(labels):
        row = table[label]
        avg = average(row, tasks)
        values = [headline(row.get(t), t) for t in tasks] + [avg.value]
        positions = np.arange(len(groups)) + (i - (len(labels) - 1) / 2) * width
        bars = axis.bar(positions, [v or 0.0 for v in values], width, label=label)
        for bar, value in zip(bars, values, strict=True):
            text = "–" if value is None else f"{value:.1f}"
            axis.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                          va="bottom", fontsize=7)
        if not avg.complete and avg.value is not None:
            bars[-1].set_hatch("//")
    axis.set_xticks(np.arange(len(groups)), groups)
    axis.set_ylabel("validation score × 100")
    axis.set_title("GLUE (best configuration on validation)")
    axis.legend(fontsize=8)
    atomic_write_bytes(path, png_bytes(figure))
    return Path(path)


def summary_paths(output: str | Path) -> tuple[Path, Path, Path]:
    """Where a GLUE run's table, CSV and chart are: ``summary.md``, ``summary.csv``, ``glue.png``.

    Example:
        >>> summary_paths("runs/glue")[2]
        PosixPath('runs/glue/glue.png')
    """
    output = Path(output)
    return output / "summary.md", output / "summary.csv", output / "glue.png"


def write_glue_summary(table: Table, tasks: Sequence[str], output: str | Path, preset_name: str = "custom"
                       ) -> tuple[Path, Path, Path]:
    """Write ``summary.md``, ``summary.csv`` and ``glue.png`` under ``output``; return their paths.

    Example:
        >>> md, csv_path, png = write_glue_summary(table, ["stsb", "mrpc"], "runs/glue", "quick")
    """
    md, csv_path, chart = summary_paths(output)
    atomic_write_text(md, render_markdown(table, tasks, preset_name))
    atomic_write_text(csv_path, render_csv(table, tasks))
    return md, csv_path, plot_table(table, tasks, chart)
