"""What the demo records and how it names its models, shared by the runner, its files and its summary.

Why: the runner writes these records, ``report.py`` turns them into ``summary.json``/``summary.png`` and
``summary.py`` prints them; keeping them here (rather than in the runner) means none of those modules
imports another's caller. Every figure the demo shows names its model: the journal keeps short keys
(``"fine-tuned"``), and :func:`model_names` turns them into ``"tiny NeoBERT (2×128), MLM + contrastive"``
or ``"all-MiniLM-L6-v2 + contrastive"``.

Example:
    >>> model_names("tiny NeoBERT (2×128)")["fine-tuned"]
    'tiny NeoBERT (2×128), MLM + contrastive'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neobert_embed.files import read_json_object_or_none

MINILM = "all-MiniLM-L6-v2"
MINILM_TUNED = f"{MINILM} + contrastive"
TINY = "tiny NeoBERT"
# The journal's keys of the tiny NeoBERT at each step: random weights, after MLM, after contrastive tuning.
UNTRAINED, MLM_ONLY, FINE_TUNED = "untrained", "MLM only", "fine-tuned"
SEARCH_STAGE = "search"  # the stage that indexes and searches with the best fine-tuned model and its start
# The journal's keys of every evaluated model, in the order the demo shows them.
MODEL_KEYS = (UNTRAINED, MLM_ONLY, FINE_TUNED, MINILM, MINILM_TUNED)
# fine-tuned model → the model its fine-tuning started from (the searches show both).
STARTING_POINTS = {MINILM_TUNED: MINILM, FINE_TUNED: MLM_ONLY}
# The demo's output folder: the runner writes these parts and the report reads them back.
DATA_DIR, PRETRAIN_DIR, MODELS_DIR, MTEB_DIR, INDEXES_DIR = "data", "pretrain", "models", "mteb", "indexes"
SUMMARY_CHART = "summary.png"
# journal key → the model's folder under models/ (those the demo makes) and its index's under indexes/
MODEL_DIRS = {UNTRAINED: "untrained", MLM_ONLY: "mlm-only", FINE_TUNED: "fine-tuned", MINILM: "minilm",
              MINILM_TUNED: "minilm-fine-tuned"}


@dataclass
class Stage:
    """One finished stage: what it was, how long it took, its key figure and its outputs."""

    name: str
    seconds: float
    figure: str
    outputs: list[str]
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class DemoReport:
    """Everything the demo did, in order, the held-out nDCG@10 of every model (by journal key) and the
    display name of every model (``names``: journal key → a name that says which model it is)."""

    output: str
    stages: list[Stage]
    scores: dict[str, float]
    names: dict[str, str] = field(default_factory=dict)

    def name(self, key: str) -> str:
        """The display name of a model key (the key itself when unknown)."""
        return self.names.get(key, key)

    def stage(self, name: str) -> Stage | None:
        """The finished stage called ``name`` in this run, if any."""
        return next((stage for stage in self.stages if stage.name == name), None)


def tiny_name(model_dir: str | Path | None) -> str:
    """``"tiny NeoBERT (L×H)"`` from a tiny model's ``config.json`` (plain ``"tiny NeoBERT"`` without one).

    Example:
        >>> tiny_name("runs/demo/models/mlm-only")
        'tiny NeoBERT (2×128)'
    """
    values = read_json_object_or_none(Path(model_dir or "") / "config.json") or {}
    try:
        return f"{TINY} ({int(values['num_hidden_layers'])}×{int(values['hidden_size'])})"
    except (ValueError, KeyError, TypeError):
        return TINY


def model_names(tiny: str = TINY) -> dict[str, str]:
    """Journal key → display name of every model the demo evaluates.

    Example:
        >>> model_names()["all-MiniLM-L6-v2 + contrastive"]
        'all-MiniLM-L6-v2 + contrastive'
    """
    return {UNTRAINED: f"{tiny}, random init", MLM_ONLY: f"{tiny}, MLM only",
            FINE_TUNED: f"{tiny}, MLM + contrastive", MINILM: MINILM, MINILM_TUNED: MINILM_TUNED}


def stage_models(names: dict[str, str]) -> dict[str, str]:
    """Stage name → the model(s) the stage trained, scored or searched with (for the stage table).

    Example:
        >>> stage_models(model_names())["MiniLM contrastive"]
        'all-MiniLM-L6-v2'
    """
    tiny = names.get(MLM_ONLY, f"{TINY}, MLM only").rsplit(",", 1)[0]
    return {"corpus": "– (data only)", "pretrain": tiny, "untrained baseline": tiny, "contrastive": tiny,
            "MiniLM contrastive": MINILM, "evaluate": "every model above"}
