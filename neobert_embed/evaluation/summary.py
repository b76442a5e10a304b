"""``summary.md`` / ``summary.csv``: the paper's table layout, honest about missing tasks.

Why: the official script silently averaged over whichever tasks had finished, so a model that
failed on hard tasks looked better. Here every category average and the overall average is over
the *selected* tasks; when any is missing the value is marked incomplete (``*`` and ``k/n`` in
Markdown, ``complete=false`` and the missing names in CSV) instead of being quietly re-normalized.

Layout (as the paper's Table): Class., Clust., PairClass., Rerank., Retr., STS, Summ., Avg.
Scores are mteb main scores × 100. ``Avg.`` is the mean over all selected tasks (the MTEB
leaderboard convention), not the mean of the category means.

Each model's compute precision (the precision its forward ran in, and why: ``--precision``, see
:mod:`neobert_embed.inference.runtime`) is listed under the Markdown table and in the CSV's
``precision`` and ``precision_reason`` columns, so a bf16 or int8 score is never read as fp32.

Both files are headed by the evaluation protocol (``model`` or ``uniform``, see
:mod:`neobert_embed.evaluation.protocol`): the Markdown title line names it, the CSV's first
column holds it. Scores of different protocols are not comparable, so a summary of reports with
different protocols is refused.

Example:
    >>> md_path, csv_path = write_summary([report_bert, report_neobert], "runs/compare")
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neobert_embed.errors import UserInputError
from neobert_embed.files import atomic_write_text

if TYPE_CHECKING:
    from mteb import AbsTask

    from neobert_embed.evaluation.report import EvaluationReport

SUMMARY_MD, SUMMARY_CSV = "summary.md", "summary.csv"  # written into a results root or a comparison directory
CATEGORIES = (("Classification", "Class."), ("Clustering", "Clust."), ("PairClassification", "PairClass."),
              ("Reranking", "Rerank."), ("Retrieval", "Retr."), ("STS", "STS"), ("Summarization", "Summ."))


@dataclass
class Cell:
    """One average: value over the tasks that have scores, and how many of how many."""

    value: float | None
    done: int
    expected: int

    @property
    def complete(self) -> bool:
        return self.done == self.expected

    def markdown(self) -> str:
        if self.expected == 0:
            return "—"
        if self.value is None:
            return f"missing (0/{self.expected})"
        text = f"{self.value:.2f}"
        return text if self.complete else f"{text}* ({self.done}/{self.expected})"


@dataclass
class SummaryRow:
    """One model's line of the table."""

    label: str
    revision: str
    cells: dict[str, Cell]
    average: Cell
    task_scores: dict[str, float | None]
    precision: dict[str, Any] | None = None  # PrecisionChoice.to_json() of the run, None when not recorded

    @property
    def missing(self) -> list[str]:
        return [task for task, score in self.task_scores.items() if score is None]


def _average(scores: list[float | None]) -> Cell:
    present = [s for s in scores if s is not None]
    value = 100 * sum(present) / len(present) if present else None
    return Cell(value, len(present), len(scores))


def summarize(reports: Sequence[EvaluationReport], task_types: dict[str, str]) -> list[SummaryRow]:
    """One :class:`SummaryRow` per report, over the expected tasks ``{name: type}``.

    Example:
        >>> rows = summarize([report], {"STSBenchmark": "STS", "SciFact": "Retrieval"})
        >>> rows[0].average.complete
        False
    """
    names = [r.name for r in reports]
    rows = []
    for report in reports:
        label = report.name if names.count(report.name) == 1 else f"{report.name}@{report.revision[:8]}"
        scores = {task: report.scores.get(task) for task in task_types}
        cells = {short: _average([scores[t] for t, kind in task_types.items() if kind == category])
                 for category, short in CATEGORIES}
        precision = (getattr(report, "settings", None) or {}).get("compute_precision")
        rows.append(SummaryRow(label, report.revision, cells, _average(list(scores.values())), scores, precision))
    return rows


def summary_protocol(reports: Sequence[EvaluationReport]) -> str:
    """The one protocol of ``reports``; raises :class:`UserInputError` when they mix protocols.

    Example:
        >>> summary_protocol([report_a, report_b])
        'uniform'
    """
    protocols = sorted({getattr(report, "protocol", "model") for report in reports})
    if len(protocols) > 1:
        by_protocol = "; ".join(f"{p}: {', '.join(r.name for r in reports if getattr(r, 'protocol', 'model') == p)}"
                                for p in protocols)
        raise UserInputError(f"refusing to write one summary mixing evaluation protocols ({by_protocol}); "
                             "scores of different protocols are not comparable: evaluate every model with "
                             "the same --protocol, or write separate summaries")
    return protocols[0] if protocols else "model"


def render_markdown(rows: Sequence[SummaryRow], task_types: dict[str, str], protocol: str = "model",
                    measures: dict[str, str] | None = None, models_note: str | None = None) -> str:
    """The table (paper layout), then per-task scores and the missing tasks of each model.

    ``measures`` says per task which metric on which split(s) its score is (see :func:`task_measures`);
    ``models_note`` says where the models came from (``compare``: one fine-tuning recipe).
    """
    from neobert_embed.evaluation.protocol import DESCRIPTIONS, describe_precision

    measures = measures or {}
    headers = ["Model"] + [short for _, short in CATEGORIES] + ["Avg."]
    lines = [f"# MTEB summary — protocol: {protocol}", "", f"Protocol `{protocol}`: {DESCRIPTIONS[protocol]}.",
             "", f"Main scores × 100 over {len(task_types)} selected task(s): each task's mteb main metric on "
             "its evaluation split(s), named per task below; nothing is selected or tuned on these splits. "
             "`*` marks an average over fewer tasks than selected (done/selected): it is incomplete, "
             "not comparable.", *(["", models_note] if models_note else []), "",
             "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        cells = [row.cells[short].markdown() for _, short in CATEGORIES]
        lines.append("| " + " | ".join([row.label, *cells, row.average.markdown()]) + " |")
    lines += ["", "## Compute precision", ""]
    lines += [f"- {row.label}: {describe_precision(row.precision)}"
              + (f" on {row.precision['machine']}" if (row.precision or {}).get("machine") else "") for row in rows]
    lines += ["", "## Per task", "", "| Task | Type | Score | " + " | ".join(r.label for r in rows) + " |",
              "|---|---|---|" + "---|" * len(rows)]
    for task, kind in task_types.items():
        values = ["missing" if r.task_scores[task] is None else f"{100 * r.task_scores[task]:.2f}" for r in rows]
        lines.append(f"| {task} | {kind} | {measures.get(task, '?')} | " + " | ".join(values) + " |")
    incomplete = [r for r in rows if r.missing]
    if incomplete:
        lines += ["", "## Missing tasks (averages above are incomplete)", ""]
        lines += [f"- {r.label}: {', '.join(r.missing)}" for r in incomplete]
    return "\n".join(lines) + "\n"


def render_csv(rows: Sequence[SummaryRow], task_types: dict[str, str], protocol: str = "model") -> str:
    """Same numbers as CSV: protocol, category averages, Avg., completeness, compute precision (and its
    reason), then one column per task."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    shorts = [short for _, short in CATEGORIES]
    writer.writerow(["protocol", "model", "revision", *shorts, "Avg.", "tasks_done", "tasks_selected", "complete",
                     "missing", "precision", "precision_reason", *task_types])

    def number(value: float | None) -> str:
        return "" if value is None else f"{value:.4f}"

    for row in rows:
        writer.writerow([protocol, row.label, row.revision, *(number(row.cells[s].value) for s in shorts),
                         number(row.average.value), row.average.done, row.average.expected,
                         str(row.average.complete).lower(), ";".join(row.missing),
                         (row.precision or {}).get("precision", ""), (row.precision or {}).get("reason", ""),
                         *(number(None if s is None else 100 * s) for s in row.task_scores.values())])
    return buffer.getvalue()


def task_measures(reports: Sequence[EvaluationReport], tasks: Sequence[AbsTask] | None = None) -> dict[str, str]:
    """Per task, what its score is: ``"cosine_spearman on test"`` (mteb averages over several splits).

    Example:
        >>> task_measures([report])["STSBenchmark"]
        'cosine_spearman on test'
    """
    described = {(o.task): (o.main_score, o.splits) for report in reports for o in report.outcomes if o.splits}
    described.update({t.metadata.name: (t.metadata.main_score, list(t.metadata.eval_splits)) for t in tasks or ()})
    return {task: f"{metric} on {' + '.join(splits)}" + (" (mean)" if len(splits) > 1 else "")
            for task, (metric, splits) in described.items()}


def write_summary(reports: Sequence[EvaluationReport], output: str | Path, tasks: Sequence[AbsTask] | None = None,
                  models_note: str | None = None) -> tuple[Path, Path]:
    """Write ``summary.md`` and ``summary.csv`` under ``output`` for these evaluation reports.

    Raises :class:`UserInputError` (nothing written) when the reports mix evaluation protocols.

    Args:
        reports: :class:`~neobert_embed.evaluation.run.EvaluationReport` objects (one per model).
        output: directory for the two files (written atomically).
        tasks: the selected mteb tasks; default: every task any report attempted.
        models_note: one sentence on where the models came from, under the protocol line.

    Example:
        >>> write_summary([run_mteb("runs/model", task_dirs=["tasks/"], output="runs/mteb", summary=False)],
        ...               "runs/mteb")
    """
    protocol = summary_protocol(reports)
    task_types = ({t.metadata.name: t.metadata.type for t in tasks} if tasks is not None
                  else {o.task: o.type for report in reports for o in report.outcomes})
    rows = summarize(reports, task_types)
    output = Path(output)
    md_path, csv_path = output / SUMMARY_MD, output / SUMMARY_CSV
    atomic_write_text(md_path, render_markdown(rows, task_types, protocol, task_measures(reports, tasks),
                                               models_note))
    atomic_write_text(csv_path, render_csv(rows, task_types, protocol))
    return md_path, csv_path
