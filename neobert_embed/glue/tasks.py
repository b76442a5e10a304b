"""The eight GLUE tasks as data: columns, labels, official metrics, and GLUE-server file names.

Why one table: everything that differs between tasks (single sentence or pair, classes or
regression, which metric selects the best configuration, the test file the GLUE server wants)
lives here, so the trainer, the data reader and the summary never branch on task names.

Metrics are scikit-learn/scipy (``evaluate``'s ``glue`` metric downloads a script from the hub
and fails offline); the selection metric of each task is the one the NeoBERT code selects on
(``TASK_TO_METRIC`` in chandar-lab/NeoBERT): STS-B Pearson, CoLA Matthews, QQP F1, the others
accuracy (MNLI: matched).

Example:
    >>> TASKS["stsb"].is_regression, TASKS["stsb"].selection_metric
    (True, 'pearson')
    >>> compute_metrics("mrpc", [1, 0, 1], [1, 1, 1])["accuracy"]
    0.6666666666666666
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task.

    Attributes:
        name: lower-case key (``--tasks``, ``task.json``'s ``glue_task``).
        title: the name in tables (``STS-B``).
        hub_columns: the hub dataset's text columns, mapped to ``sentence1``/``sentence2``.
        labels: class names in label-id order (empty for the STS-B regression).
        metrics: metric names reported for the task, the selection metric first.
        validation_splits: ``{metric prefix: split}``; MNLI has matched and mismatched.
        test_files: ``{test split: GLUE-server TSV name}``.
    """

    name: str
    title: str
    hub_columns: tuple[str, str | None]
    labels: tuple[str, ...]
    metrics: tuple[str, ...]
    validation_splits: tuple[tuple[str, str], ...] = (("", "validation"),)
    test_files: tuple[tuple[str, str], ...] = (("test", "X.tsv"),)

    @property
    def is_pair(self) -> bool:
        return self.hub_columns[1] is not None

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        return len(self.labels) or 1

    @property
    def selection_metric(self) -> str:
        """The metric the best configuration (and the best step of a trial) is chosen on."""
        return self.metrics[0]


TASKS: dict[str, GlueTask] = {t.name: t for t in (
    GlueTask("cola", "CoLA", ("sentence", None), ("unacceptable", "acceptable"), ("matthews",),
             test_files=(("test", "CoLA.tsv"),)),
    GlueTask("sst2", "SST-2", ("sentence", None), ("negative", "positive"), ("accuracy",),
             test_files=(("test", "SST-2.tsv"),)),
    GlueTask("mrpc", "MRPC", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"), ("accuracy", "f1"),
             test_files=(("test", "MRPC.tsv"),)),
    GlueTask("stsb", "STS-B", ("sentence1", "sentence2"), (), ("pearson", "spearman"),
             test_files=(("test", "STS-B.tsv"),)),
    GlueTask("qqp", "QQP", ("question1", "question2"), ("not_duplicate", "duplicate"), ("f1", "accuracy"),
             test_files=(("test", "QQP.tsv"),)),
    GlueTask("mnli", "MNLI", ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"),
             ("matched_accuracy", "mismatched_accuracy"),
             validation_splits=(("matched_", "validation_matched"), ("mismatched_", "validation_mismatched")),
             test_files=(("test_matched", "MNLI-m.tsv"), ("test_mismatched", "MNLI-mm.tsv"))),
    GlueTask("qnli", "QNLI", ("question", "sentence"), ("entailment", "not_entailment"), ("accuracy",),
             test_files=(("test", "QNLI.tsv"),)),
    GlueTask("rte", "RTE", ("sentence1", "sentence2"), ("entailment", "not_entailment"), ("accuracy",),
             test_files=(("test", "RTE.tsv"),)),
)}

#: The paper's table order (NeoBERT Table: MNLI QNLI QQP RTE SST MRPC CoLA STS).
PAPER_ORDER = ("mnli", "qnli", "qqp", "rte", "sst2", "mrpc", "cola", "stsb")


def get_task(name: str) -> GlueTask:
    """The task called ``name`` (case-insensitive; ``sst-2``/``sts-b`` spellings accepted).

    Example:
        >>> get_task("STS-B").name
        'stsb'
    """
    from neobert_embed.errors import UserInputError

    key = name.strip().lower().replace("-", "")
    if key not in TASKS:
        raise UserInputError(f"unknown GLUE task {name!r}; choose from {', '.join(TASKS)}")
    return TASKS[key]


def _base_metrics(task: GlueTask, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    if task.is_regression:
        return {"pearson": float(pearsonr(predictions, labels)[0]),
                "spearman": float(spearmanr(predictions, labels)[0])}
    scores = {"accuracy": float(accuracy_score(labels, predictions))}
    if "f1" in task.metrics:
        scores["f1"] = float(f1_score(labels, predictions))
    if "matthews" in task.metrics:
        scores = {"matthews": float(matthews_corrcoef(labels, predictions))}
    return scores


def compute_metrics(task: str | GlueTask, predictions: Sequence[float], labels: Sequence[float],
                    prefix: str = "") -> dict[str, float]:
    """The official metric(s) of ``task`` for predicted labels (or STS-B scores) against gold.

    ``prefix`` names MNLI's split (``matched_`` / ``mismatched_``).

    Example:
        >>> compute_metrics("stsb", [0.1, 2.0, 4.5], [0.0, 2.5, 5.0])["spearman"]
        1.0
    """
    task = task if isinstance(task, GlueTask) else get_task(task)
    scores = _base_metrics(task, np.asarray(predictions), np.asarray(labels))
    return {f"{prefix}{name}": value for name, value in scores.items()}


def predictions_from_logits(task: GlueTask, logits: np.ndarray) -> np.ndarray:
    """Class ids (argmax) or regression scores from a head's logits (batch, num_labels).

    Example:
        >>> predictions_from_logits(TASKS["rte"], np.array([[0.1, 0.9]]))
        array([1])
    """
    logits = np.asarray(logits)
    return logits.reshape(-1) if task.is_regression else logits.argmax(axis=-1)
