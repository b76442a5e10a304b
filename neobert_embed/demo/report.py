"""The demo's files for people and scripts: ``summary.json`` and a PNG of scores and training losses.

Why: the console table scrolls away; a newcomer (or a test, or the README) needs the figures in
one stable place — every evaluated model's held-out nDCG@10 under its journal key and its display
name, the example searches of the best fine-tuned model beside its starting point — and one picture
that shows the fine-tuned models beating their starting points and their losses falling. Every bar
and curve names its model (tiny NeoBERT or all-MiniLM-L6-v2). Both files are written atomically:
a reader sees the previous summary or the whole new one.

Example:
    >>> write_demo_outputs(run_demo("runs/demo"))
    (PosixPath('runs/demo/summary.json'), PosixPath('runs/demo/summary.png'))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from neobert_embed.charts import png_bytes, subplots
from neobert_embed.demo.records import (
    FINE_TUNED,
    MINILM,
    MINILM_TUNED,
    MLM_ONLY,
    MODEL_DIRS,
    MODELS_DIR,
    PRETRAIN_DIR,
    SEARCH_STAGE,
    SUMMARY_CHART,
    TINY,
    DemoReport,
)
from neobert_embed.files import atomic_write_bytes
from neobert_embed.records import DEMO_SUMMARY
from neobert_embed.runs import METRICS_FILE, read_metrics

# curve label (without the tiny model's size) → the run directory under the demo's output
LOSS_CURVES = {f"{TINY}: MLM": (PRETRAIN_DIR,), f"{TINY}: InfoNCE": (MODELS_DIR, MODEL_DIRS[FINE_TUNED]),
               f"{MINILM}: InfoNCE": (MODELS_DIR, MODEL_DIRS[MINILM_TUNED])}


def read_losses(run_dir: Path) -> list[tuple[int, float]]:
    """(step, loss) pairs from a run's ``metrics.jsonl``; empty when the run logged none.

    Example:
        >>> read_losses(Path("runs/demo/pretrain"))[:1]
        [(10, 7.81)]
    """
    rows = read_metrics(run_dir / METRICS_FILE)
    return [(row["step"], row["loss"]) for row in rows if "loss" in row and "step" in row]


def _loss_label(label: str, report: DemoReport) -> str:
    """Put the tiny model's size into its curve labels (``tiny NeoBERT (2×128): MLM``)."""
    tiny = report.name(MLM_ONLY).rsplit(",", 1)[0]
    return label.replace(TINY, tiny, 1) if label.startswith(TINY) else label


def searches_summary(report: DemoReport) -> dict[str, Any] | None:
    """The search stage's figures with display names: which model searched, beside which, and the examples.

    Example:
        >>> searches_summary(report)["model"]
        'all-MiniLM-L6-v2 + contrastive'
    """
    stage = report.stage(SEARCH_STAGE)
    if stage is None:
        return None
    data = stage.data
    base, tuned = data["base"], data["tuned"]
    return {
        "model": report.name(tuned), "beside": report.name(base), "queries": data["queries"],
        "top1_correct": {report.name(key): data["top1"][key] for key in (base, tuned)},
        "top10_correct": {report.name(key): data["top10"][key] for key in (base, tuned)},
        "top1_fixed": data["fixed"], "top1_broken": data["broken"],
        "examples": [{"query": example["query"], "answer": example["answer"],
                      "hits": {report.name(key): example["hits"][key] for key in (base, tuned)},
                      "answer_rank": {report.name(key): example["answer_rank"][key] for key in (base, tuned)}}
                     for example in data["examples"]],
        "indexes": {report.name(key): path for key, path in data["indexes"].items()},
    }


def write_demo_outputs(report: DemoReport) -> tuple[Path, Path]:
    """Write ``summary.json`` and ``summary.png`` atomically.

    ``summary.json``: ``models`` → ``{journal key: {"name": display name, "ndcg_at_10": …}}``,
    ``searches`` (:func:`searches_summary`), stage times and figures, first and last training losses.

    Example:
        >>> json.loads(Path("runs/demo/summary.json").read_text())["models"]["all-MiniLM-L6-v2"]
        {'name': 'all-MiniLM-L6-v2', 'ndcg_at_10': 0.56...}
    """
    output = Path(report.output)
    losses = {_loss_label(label, report): read_losses(output.joinpath(*parts)) for label, parts in LOSS_CURVES.items()}
    summary: dict[str, Any] = {
        "task": "held-out stdlib docstring retrieval (summary → body), nDCG@10",
        "models": {key: {"name": report.name(key), "ndcg_at_10": score} for key, score in report.scores.items()},
        "searches": searches_summary(report),
        "stages": {stage.name: {"seconds": stage.seconds, "figure": stage.figure} for stage in report.stages},
        "losses": {label: {"first": curve[0][1], "last": curve[-1][1], "steps": curve[-1][0]}
                   for label, curve in losses.items() if curve},
    }
    json_path, png_path = DEMO_SUMMARY.write(output, summary), output / SUMMARY_CHART
    atomic_write_bytes(png_path, _chart({report.name(key): score for key, score in report.scores.items()}, losses))
    return json_path, png_path


def _chart(scores: dict[str, float], losses: dict[str, list[tuple[int, float]]]) -> bytes:
    figure, (bars, curves) = subplots(1, 2, figsize=(13, 4.2))
    names = list(scores)
    colors = ["#4C72B0" if name.startswith(MINILM) else "#8C8C8C" for name in names]  # MiniLM blue, tiny grey
    drawn = bars.barh(names, [scores[name] for name in names], color=colors)
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
