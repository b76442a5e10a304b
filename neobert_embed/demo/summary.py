"""The demo's closing summary: a table of stages, the held-out scores, example searches, outputs."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from neobert_embed.demo.run import MINILM, DemoReport


def print_summary(report: DemoReport, console: Console) -> None:
    """Print the stage table, the nDCG@10 comparison and where everything went.

    Example:
        >>> print_summary(run_demo("runs/demo"), Console())
    """
    table = Table(title="neobert-embed demo", show_lines=False)
    for column in ("stage", "time (s)", "key figure", "outputs"):
        table.add_column(column, overflow="fold")
    for stage in report.stages:
        table.add_row(stage.name, f"{stage.seconds:.1f}", stage.figure, "\n".join(stage.outputs))
    table.add_row("total", f"{sum(s.seconds for s in report.stages):.1f}", "", report.output)
    console.print(table)
    index_stage = next((s for s in report.stages if s.name == "index"), None)
    if index_stage:
        for query, ids in index_stage.data.get("examples", {}).items():
            console.print(f"search [bold]{query!r}[/] → {', '.join(ids)}")
    scores = report.scores
    tuned = scores.get("fine-tuned")
    if tuned is not None:
        beaten = [label for label in ("untrained", "MLM only") if label in scores and tuned > scores[label]]
        verdict = "beats" if len(beaten) == 2 else "does NOT beat"
        console.print(f"held-out retrieval nDCG@10: fine-tuned {tuned:.4f} {verdict} untrained "
                      f"{scores.get('untrained', float('nan')):.4f} and MLM-only "
                      f"{scores.get('MLM only', float('nan')):.4f}")
    base, adapted = scores.get(MINILM), scores.get(f"{MINILM} + contrastive")
    if base is not None and adapted is not None:
        verdict = "better" if adapted > base else "NOT better"
        console.print(f"held-out retrieval nDCG@10: {MINILM} {base:.4f} → fine-tuned with this recipe "
                      f"{adapted:.4f} ({adapted - base:+.4f}, {verdict})")
    output = Path(report.output)
    console.print(f"every output is under {output} (stages.json lists them); figures in "
                  f"{output / 'summary.json'} and {output / 'summary.png'}")
