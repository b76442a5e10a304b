"""GLUE-server submission files from the chosen configuration's test predictions.

Why: gluebenchmark.com scores only test predictions, in one TSV per task with a fixed name and
label spelling (``index<TAB>prediction``; MNLI/QNLI/RTE as label names, the binary tasks as
``0``/``1``, STS-B as a score clipped to [0, 5]). Getting a name or spelling wrong wastes one of
the few submissions a team has, so the format lives here in one place.

Example:
    >>> write_submission(TASKS["rte"], "test", {"idx": [0, 1], "prediction": [0, 1]}, "runs/glue/submission/neobert")
    PosixPath('runs/glue/submission/neobert/RTE.tsv')
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from neobert_embed.files import atomic_write_text
from neobert_embed.glue.tasks import GlueTask

NAMED_LABELS = {"mnli", "qnli", "rte"}


def format_prediction(task: GlueTask, value: float) -> str:
    """One prediction as the GLUE server expects it.

    Example:
        >>> format_prediction(TASKS["mnli"], 2), format_prediction(TASKS["stsb"], 5.4)
        ('contradiction', '5.000')
    """
    if task.is_regression:
        return f"{min(5.0, max(0.0, float(value))):.3f}"
    return task.labels[int(value)] if task.name in NAMED_LABELS else str(int(value))


def write_submission(task: GlueTask, split: str, predictions: dict[str, Any], directory: str | Path) -> Path:
    """Write ``<directory>/<Task>.tsv`` for ``split``'s predictions (``{"idx": [...], "prediction": [...]}``)."""
    name = dict(task.test_files)[split]
    rows = sorted(zip(predictions["idx"], predictions["prediction"], strict=True))
    text = "index\tprediction\n" + "".join(f"{i}\t{format_prediction(task, p)}\n" for i, p in rows)
    path = Path(directory) / name
    atomic_write_text(path, text)
    return path
