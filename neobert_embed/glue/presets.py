"""GLUE presets: validated YAML recipes describing a grid of trials, and its expansion.

Why: the paper's GLUE protocol is a 60-configuration grid per task with early stopping and
MNLI→{RTE, MRPC, STS-B, QNLI} transfer; written as data (``recipes/glue-paper.yaml``) it can be
read, diffed and changed, and it is checked by pydantic before anything runs. An unknown or
misspelled key is an error naming the file, the line and the key.

``quick`` (``recipes/glue-quick.yaml``) is one configuration over N seeds (median and spread);
any YAML file with the same keys is a custom grid.

Example:
    >>> preset = load_glue_preset("paper")
    >>> len(expand_trials(preset, ["rte", "mnli"]))
    120
    >>> expand_trials(preset, ["rte", "mnli"])[0].task      # MNLI runs first: RTE starts from it
    'mnli'
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from neobert_embed.glue.tasks import TASKS
from neobert_embed.options import MAX_LEARNING_RATE, MAX_SEED
from neobert_embed.recipes import load_spec

BUNDLED = {"quick": "glue-quick.yaml", "paper": "glue-paper.yaml"}


class GluePreset(BaseModel):
    """Every setting of a GLUE run: the grid (lists) and what all trials share.

    Each of ``batch_size``, ``learning_rate``, ``weight_decay`` and ``seeds`` is a list; the
    trials of a task are their product. The reported configuration of a task is the one whose
    median (over seeds) selection metric on validation is best — an optimistic figure, exactly
    as the paper reports it.

    Evaluation runs every ``min(eval_steps, steps per epoch, train rows // 10)`` steps (the
    NeoBERT code's rule; ``eval_steps: null`` means once per epoch), and a trial stops after
    ``early_stopping_patience`` evaluations without improvement; its score is its best evaluation.

    Example:
        >>> GluePreset(batch_size=[16, 32]).batch_size
        [16, 32]
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    batch_size: list[Annotated[int, Field(gt=0)]] = Field(default_factory=lambda: [32])
    learning_rate: list[Annotated[float, Field(gt=0, le=MAX_LEARNING_RATE)]] = Field(default_factory=lambda: [2e-5])
    weight_decay: list[Annotated[float, Field(ge=0)]] = Field(default_factory=lambda: [0.01])
    seeds: list[Annotated[int, Field(ge=0, le=MAX_SEED)]] = Field(default_factory=lambda: [0])
    epochs: float = Field(3, gt=0)
    eval_steps: int | None = Field(None, ge=1)
    early_stopping_patience: int | None = Field(None, ge=1)
    lr_scheduler: Literal["linear", "cosine", "constant_with_warmup"] = "linear"
    warmup_ratio: float = Field(0.06, ge=0, lt=1)
    max_length: int | None = Field(None, ge=8)
    eval_batch_size: int = Field(64, ge=1)
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    # true: the encoder runs each batch's real tokens as one flat stream. Off by default, so that a run equals the
    # plain Trainer's (dropout masks on another layout take another random path: docs/contrastive.md)
    unpadded: bool = False
    transfer: dict[str, str] = Field(default_factory=dict)

    @field_validator("batch_size", "learning_rate", "weight_decay", "seeds", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return [value] if isinstance(value, int | float) and not isinstance(value, bool) else value

    @field_validator("batch_size", "learning_rate", "weight_decay", "seeds")
    @classmethod
    def _non_empty(cls, value: list) -> list:
        if not value or len(set(value)) != len(value):
            raise ValueError("must be a non-empty list of distinct values")
        return value

    @field_validator("transfer")
    @classmethod
    def _known_tasks(cls, value: dict[str, str]) -> dict[str, str]:
        for target, source in value.items():
            for name in (target, source):
                if name not in TASKS:
                    raise ValueError(f"unknown GLUE task {name!r}; choose from {', '.join(TASKS)}")
        return value

    @model_validator(mode="after")
    def _no_chains(self) -> GluePreset:
        chained = sorted(t for t, s in self.transfer.items() if s in self.transfer or s == t)
        if chained:
            raise ValueError(f"transfer sources must be trained from the backbone; {chained} start from a task "
                             "that itself starts from another")
        return self


@dataclass(frozen=True)
class Trial:
    """One fine-tuning run: a task, one point of the grid, and where it starts from."""

    task: str
    batch_size: int
    learning_rate: float
    weight_decay: float
    seed: int
    transfer_from: str | None = None

    @property
    def config_key(self) -> str:
        """The grid point without the seed (trials of one configuration share it); a trial that
        starts from another task's model says so (``-from-mnli``), so it is never confused with
        one that started from the backbone."""
        start = f"-from-{self.transfer_from}" if self.transfer_from else ""
        return f"bs{self.batch_size}-lr{self.learning_rate:g}-wd{self.weight_decay:g}{start}"

    @property
    def key(self) -> str:
        """File-name-safe identity of the trial, e.g. ``bs32-lr2e-05-wd0.01-seed0``."""
        return f"{self.config_key}-seed{self.seed}"


def expand_trials(preset: GluePreset, tasks: list[str], available: set[str] | frozenset[str] = frozenset()
                  ) -> list[Trial]:
    """Every trial of ``tasks`` in running order: transfer sources (MNLI) before their targets.

    A target starts from its source's best model when the source is among ``tasks`` or already
    finished (``available``); otherwise it starts from the backbone (``transfer_from=None``).

    Example:
        >>> [t.task for t in expand_trials(load_glue_preset("quick"), ["rte", "mnli"])]
        ['mnli', 'rte']
    """
    sources = set(tasks) | set(available)
    targets = {t: s for t, s in preset.transfer.items() if s in sources}
    used_as_source = set(targets.values())
    ordered = sorted(dict.fromkeys(tasks), key=lambda t: 2 if t in targets else 0 if t in used_as_source else 1)
    grid = list(itertools.product(preset.batch_size, preset.learning_rate, preset.weight_decay, preset.seeds))
    return [Trial(task, *point, targets.get(task)) for task in ordered for point in grid]


def load_glue_preset(preset: str | Path = "quick", **overrides: Any) -> GluePreset:
    """A bundled preset (``quick``, ``paper``) or a YAML file, with overrides (``None`` ignored).

    Example:
        >>> load_glue_preset("quick", seeds=[0, 1, 2], epochs=2).seeds
        [0, 1, 2]
    """
    bundled = BUNDLED.get(str(preset))
    return load_spec(None if bundled else preset, GluePreset, "preset", default=bundled, overrides=overrides)
