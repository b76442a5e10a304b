"""Choosing each task's reported configuration from its finished trials.

Why a rule of its own: the paper reports, per task, the best grid point on validation — an
optimistic figure, since validation both selects and scores. With several seeds the rule here is
the same over the *median* seed, so one lucky seed cannot win; the spread (min, max, std over
seeds) is reported beside it. With one configuration (``quick``) this is just median ± spread.

Example:
    >>> chosen = select_best(journal.results("neobert", "rte"), "accuracy")
    >>> chosen.config_key, chosen.scores["accuracy"], chosen.spread["accuracy"]["max"]
    ('bs16-lr2e-05-wd0.01', 0.71, 0.73)
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TaskChoice:
    """The reported configuration of one task and its figures."""

    config_key: str
    scores: dict[str, float]
    spread: dict[str, dict[str, float]]
    seeds: int
    trials: int
    configs: int
    trial_keys: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"config": self.config_key, "scores": self.scores, "spread": self.spread, "seeds": self.seeds,
                "trials": self.trials, "configs": self.configs, "trial_keys": self.trial_keys}


def select_best(results: Sequence[dict[str, Any]], selection: str) -> TaskChoice | None:
    """The configuration with the best median ``selection`` metric; ``None`` without results.

    Example:
        >>> select_best([{"config_key": "a", "key": "a-seed0", "scores": {"accuracy": 0.6}}], "accuracy").scores
        {'accuracy': 0.6}
    """
    if not results:
        return None
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        groups[result["config_key"]].append(result)

    def median_of(group: list[dict[str, Any]], metric: str) -> float:
        return float(statistics.median(r["scores"][metric] for r in group))

    def rank(key: str) -> float:  # NaN (constant predictions) ranks below every real score
        value = median_of(groups[key], selection)
        return float("-inf") if math.isnan(value) else value

    best_key = max(sorted(groups), key=rank)
    group = groups[best_key]
    metrics = [m for m in group[0]["scores"] if all(m in r["scores"] for r in group)]  # what every seed has
    scores = {m: median_of(group, m) for m in metrics}
    spread = {m: {"min": min(r["scores"][m] for r in group), "max": max(r["scores"][m] for r in group),
                  "std": statistics.pstdev(r["scores"][m] for r in group)} for m in metrics}
    return TaskChoice(best_key, scores, spread, len(group), len(results), len(groups),
                      sorted(r["key"] for r in group))
