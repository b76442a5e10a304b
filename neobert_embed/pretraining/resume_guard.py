"""The resume guard of a pretraining run: a checkpoint continues only the run that wrote it.

Why: ``pretrain --resume`` restores parameters, optimizer, schedule and stream position from a
checkpoint; if the recipe or the corpus changed in between, the result is a run that matches
neither setting, silently. Each checkpoint therefore records the settings that shape the training
trajectory (every recipe key except the operational ones in :data:`RESUMABLE_KEYS`, and the
corpus), and a resume with any of them changed is refused before a model is built, naming each
key. ``training.max_steps`` may change: the run then stops at the new step count (with a warning
that the learning-rate schedule keeps its original length).

Example:
    >>> settings = run_settings(recipe, "docs.jsonl")
    >>> refuse_changed_settings(settings, list_checkpoints(Path("runs/tiny/checkpoints")))
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from neobert_embed.errors import UserInputError
from neobert_embed.pretraining.checkpoint import TRAINER_STATE
from neobert_embed.pretraining.recipe import PretrainRecipe

SETTINGS_KEY = "settings"
RESUMABLE_KEYS = frozenset({
    "training.max_steps", "training.cpu_threads", "training.max_bad_steps", "training.log_every_steps",
    "training.tensorboard", "training.wandb", "checkpoint.every_steps", "checkpoint.keep_last", "data.num_proc",
})


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat |= _flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def run_settings(recipe: PretrainRecipe, corpus: str | Path) -> dict[str, Any]:
    """The settings a checkpoint records: dotted recipe keys (JSON values) and the corpus location.

    Example:
        >>> run_settings(recipe, "docs.jsonl")["optimizer.lr"]
        0.0006
    """
    flat = _flatten(recipe.model_dump(mode="json"))
    settings = {key: value for key, value in flat.items() if key not in RESUMABLE_KEYS}
    settings["corpus"] = os.path.abspath(corpus) if Path(corpus).exists() else str(corpus)
    return settings


def refuse_changed_settings(settings: dict[str, Any], checkpoints: list[Path]) -> None:
    """Raise :class:`UserInputError` naming every key whose value differs from the newest readable
    checkpoint's record. Checkpoints written before settings were recorded are not checked.

    Example:
        >>> refuse_changed_settings(run_settings(recipe, corpus), list_checkpoints(root))
    """
    for checkpoint in checkpoints:
        try:
            saved = json.loads((checkpoint / TRAINER_STATE).read_text(encoding="utf-8")).get(SETTINGS_KEY)
        except (OSError, ValueError, AttributeError):
            continue  # unreadable: loading reports it (and falls back to an older checkpoint)
        if saved is None:
            return
        changed = [f"{key} ({saved.get(key)!r} → {settings.get(key)!r})"
                   for key in sorted(set(saved) | set(settings)) if saved.get(key) != settings.get(key)]
        if changed:
            raise UserInputError(
                f"{checkpoint}: --resume must continue the same run, but {', '.join(changed)} changed; "
                "resume with the run's recipe and corpus, or start a new --output")
        return
