"""The demo's files for people and scripts: ``summary.json`` and a PNG of scores and training losses.

Why: the console table scrolls away; a newcomer (or a test, or the README) needs the figures in
one stable place — every evaluated model's held-out nDCG@10 under its display name — and one
picture that shows the fine-tuned models beating their starting points and their losses falling.

Example:
    >>> write_demo_outputs(run_demo("runs/demo"))
    (PosixPath('runs/demo/summary.json'), PosixPath('runs/demo/summary.png'))
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neobert_embed.charts import png_bytes, subplots
from neobert_embed.files import atomic_write_bytes, atomic_write_json

if TYPE_CHECKING:
    from neobert_embed.demo.run import DemoReport

LOSS_CURVES = {"MLM (tiny NeoBERT)": ("pretrain",), "InfoNCE (tiny NeoBERT)": ("models", "fine-tuned"),
               "InfoNCE (all-MiniLM-L6-v2)": ("models", "minilm-fine-tuned")}


def read_losses(run_dir: Path) -> list[tuple[int, float]]:
    """(step, loss) pairs from a run's ``metrics.jsonl``; empty when the run logged none.

    Example:
        >>> read_losses(Path("runs/demo/pretrain"))[:1]
        [(10, 7.81)]
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(row["step"], row["loss"]) for row in rows if "loss" in row and "step" in row]


def write_demo_outputs(report: DemoReport) -> tuple[Path, Path]:
    """Write ``summary.json`` (``models`` → ``{"ndcg_at_10": …}``, stage times) and ``summary.png``.

    Example:
        >>> json.loads(Path("runs/demo/summary.json").read_text())["models"]["all-MiniLM-L6-v2"]
        {'ndcg_at_10': 0.47...}
    """
    output = Path(report.output)
    losses = {label: read_losses(output.joinpath(*parts)) for label, parts in LOSS_CURVES.items()}
    summary: dict[str, Any] = {
        "task": "held-out stdlib docstring retrieval (summary → body), nDCG@10",
        "models": {name: {"ndcg_at_10": score} for name, score in report.scores.items()},
        "stages": {stage.name: {"seconds": stage.seconds, "figure": stage.figure} for stage in report.stages},
        "losses": {label: {"first": curve[0][1], "last": curve[-1][1], "steps": curve[-1][0]}
                   for label, curve in losses.items() if curve},
    }
    json_path, png_path = output / "summary.json", output / "summary.png"
    atomic_write_json(json_path, summary)
    atomic_write_bytes(png_path, _chart(report.scores, losses))
    return json_path, png_path


def _chart(scores: dict[str, float], losses: dict[str, list[tuple[int, float]]]) -> bytes:
    figure, (bars, curves) = subplots(1, 2, figsize=(12, 4.2))
    names = list(scores)
    drawn = bars.barh(names, [scores[name] for name in names], color="#4C72B0")
    for bar, name in zip(drawn, names, strict=True):
        bars.annotate(f"{scores[name]:.3f}", (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                      va="center", fontsize=8, xytext=(3, 0), textcoords="offset points")
    bars.invert_yaxis()
    bars.set_xlabel("held-out nDCG@10")
    bars.set_title("Retrieval on held-out docstring queries")
    for label, curve in losses.items():
        if curve:
            steps, values = zip(*curve, strict=True)
            curves.plot(steps, values, label=label)
    curves.set_xlabel("step")
    curves.set_ylabel("training loss")
    curves.set_title("Training losses")
    curves.legend(fontsize=8)
    return png_bytes(figure, dpi=110)
