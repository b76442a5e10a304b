"""The demo's closing summary: stages, held-out scores, example searches (best model beside its start), outputs.

Every row names its model: the stage table has a model column, the score table shows each model's
display name (``tiny NeoBERT (2×128), MLM + contrastive``, ``all-MiniLM-L6-v2 + contrastive``), and the
example searches show the best fine-tuned model's top hit beside its starting point's, marked ✓ when it
is the held-out query's own document.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from neobert_embed.demo.records import (
    FINE_TUNED,
    MINILM,
    MINILM_TUNED,
    MLM_ONLY,
    SEARCH_STAGE,
    STARTING_POINTS,
    UNTRAINED,
    DemoReport,
    stage_models,
)
from neobert_embed.demo.report import searches_summary
from neobert_embed.records import DEMO_SUMMARY

if TYPE_CHECKING:
    from rich.console import Console


def print_summary(report: DemoReport, console: Console) -> None:
    """Print the stage table, the nDCG@10 table, the example searches and where everything went.

    ``console`` is the toolkit's user console (:func:`neobert_embed.console.user_console`).

    Example:
        >>> print_summary(run_demo("runs/demo"), user_console())
    """
    console.print(_stage_table(report))
    console.print(_score_table(report))
    _print_verdicts(report, console)
    searches = searches_summary(report)
    if searches is not None:
        console.print(_search_table(searches))
        model, base, total = searches["model"], searches["beside"], searches["queries"]
        top1 = searches["top1_correct"]
        console.print(f"top hit is the answer, over all {total} held-out queries: {escape(base)} {top1[base]}/{total}"
                      f" → {escape(model)} {top1[model]}/{total} ({top1[model] - top1[base]:+d}: fine-tuning "
                      f"fixed {searches['top1_fixed']} top hits, broke {searches['top1_broken']})")
    output = Path(report.output)
    console.print(f"every output is under {output} (stages.json lists them); figures in "
                  f"{DEMO_SUMMARY.path(output)} and {output / 'summary.png'}")


def _stage_table(report: DemoReport) -> Table:
    models = stage_models(report.names)
    table = Table(title="neobert-embed demo (outputs under the total row's directory)", show_lines=False,
                  expand=True)
    for column, ratio in (("stage", 3), ("model", 4), ("key figure", 8), ("outputs", 5)):
        table.add_column(column, overflow="fold", ratio=ratio)
        if column == "model":
            table.add_column("time (s)", justify="right", no_wrap=True, min_width=8)
    for stage in report.stages:
        model = models.get(stage.name, "")
        if stage.name == SEARCH_STAGE:
            model = f"{report.name(stage.data['tuned'])} beside {report.name(stage.data['base'])}"
        table.add_row(stage.name, escape(model), f"{stage.seconds:.1f}", escape(stage.figure),
                      escape("\n".join(_relative(path, report.output) for path in stage.outputs)))
    table.add_row("total", "", f"{sum(s.seconds for s in report.stages):.1f}", "", escape(report.output))
    return table


def _relative(path: str, root: str) -> str:
    """An output's path under the demo's directory (the total row names that directory)."""
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path


def _score_table(report: DemoReport) -> Table:
    table = Table(title="held-out retrieval nDCG@10 (every model scored by the same runner)")
    table.add_column("model", overflow="fold")
    table.add_column("nDCG@10", justify="right")
    table.add_column("vs its starting point", justify="right")
    for key, score in report.scores.items():
        start = STARTING_POINTS.get(key)
        change = f"{score - report.scores[start]:+.4f}" if start in report.scores else ""
        table.add_row(escape(report.name(key)), f"{score:.4f}", change)
    return table


def _print_verdicts(report: DemoReport, console: Console) -> None:
    scores = report.scores
    tuned = scores.get(FINE_TUNED)
    if tuned is not None:
        beaten = [label for label in (UNTRAINED, MLM_ONLY) if label in scores and tuned > scores[label]]
        verdict = "beats" if len(beaten) == 2 else "does NOT beat"
        console.print(f"held-out retrieval nDCG@10: {escape(report.name(FINE_TUNED))} {tuned:.4f} {verdict} "
                      f"random init {scores.get('untrained', float('nan')):.4f} and MLM only "
                      f"{scores.get('MLM only', float('nan')):.4f}")
    base, adapted = scores.get(MINILM), scores.get(MINILM_TUNED)
    if base is not None and adapted is not None:
        verdict = "better" if adapted > base else "NOT better"
        console.print(f"held-out retrieval nDCG@10: {MINILM} {base:.4f} → fine-tuned with this recipe "
                      f"{adapted:.4f} ({adapted - base:+.4f}, {verdict})")


def _hit_cell(hits: list[str], rank: int | None, answer: str) -> str:
    if not hits:
        return "(no hit)"
    if rank == 1:
        return f"[green]✓[/] {escape(hits[0])}"
    where = f"answer at #{rank}" if rank else "answer not in top 10"
    return f"[red]✗[/] {escape(hits[0])}\n  ({where})"


def _search_table(searches: dict) -> Table:
    model, base = searches["model"], searches["beside"]
    table = Table(title=f"example searches: held-out queries (never trained on), top hit of {escape(model)} "
                        f"beside {escape(base)}; ✓ = the query's own document", show_lines=True,
                  expand=True)
    table.add_column("query → its document", overflow="fold", ratio=3)
    table.add_column(escape(base), overflow="fold", ratio=2)
    table.add_column(escape(model), overflow="fold", ratio=2)
    for example in searches["examples"]:
        answer = example["answer"]
        table.add_row(f"{escape(example['query'])}\n→ {escape(answer)}",
                      *(_hit_cell(example["hits"][name], example["answer_rank"][name], answer)
                        for name in (base, model)))
    return table
