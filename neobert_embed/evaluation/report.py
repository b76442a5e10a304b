"""What one ``mteb`` run did for one model: each task's outcome and where its results are.

Why its own module: ``run_mteb`` makes these reports and ``summary``/``compare`` read them; the report
sits below both, so neither imports the other's runner.

Example:
    >>> report = EvaluationReport("runs/model", "model", "local", "", "runs/mteb/results/model")
    >>> report.outcomes.append(TaskOutcome("LocalSTS", "STS", "done", "cosine_spearman", 0.81))
    >>> report.scores
    {'LocalSTS': 0.81}
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TaskOutcome:
    """One task's fate in a run: ``done`` (evaluated now), ``cached`` (reused) or ``failed``; its
    score is mteb's main score (``main_score`` names it) averaged over mteb's ``splits``."""

    task: str
    type: str
    status: str
    main_score: str
    score: float | None = None
    error: str | None = None
    result_file: str | None = None
    splits: list[str] = field(default_factory=list)


@dataclass
class EvaluationReport:
    """What ``run_mteb`` did for one model: per-task outcomes and where results are."""

    model: str
    name: str
    revision: str
    recipe: str
    results_dir: str
    outcomes: list[TaskOutcome] = field(default_factory=list)
    protocol: str = "model"
    settings: dict[str, Any] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)

    @property
    def scores(self) -> dict[str, float]:
        """Main score per task that has one (fractions, as mteb reports them)."""
        return {o.task: o.score for o in self.outcomes if o.score is not None}

    @property
    def failures(self) -> dict[str, str]:
        """Task name → error, for every task that failed."""
        return {o.task: o.error or "failed" for o in self.outcomes if o.status == "failed"}

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form (for ``--json``)."""
        return {**asdict(self), "scores": self.scores, "failures": self.failures}
