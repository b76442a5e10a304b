"""The run journal of ``neobert-embed glue``: what a run is, and every finished trial.

Layout of ``OUTPUT``::

    run.json                              the preset all trials share (a rerun must match it)
    trials/<model>/model.json             which model the folder belongs to
    trials/<model>/<task>/<trial>.json    one finished trial: config, scores, history, timing
    models/<model>/<task>/                best model of a transfer source (MNLI), with best.json

Why files per trial: a GLUE grid is hundreds of runs; each result lands atomically the moment its
trial ends, so Ctrl-C, a crash or a pre-empted node loses only the trial in flight, and a rerun
runs only what is missing. A rerun whose settings differ is refused, naming the key, because its
trials would not be comparable with the ones already on disk (the run record and its check are
:mod:`neobert_embed.runs`'s; what is GLUE's own is one result file per trial).

Example:
    >>> journal = Journal("runs/glue")
    >>> journal.check_run(preset, {"neobert": "neobert"})   # raises on a changed preset or model
    >>> journal.results("neobert", "rte")                    # [result of each finished trial]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from neobert_embed.errors import UserInputError
from neobert_embed.files import atomic_write_json
from neobert_embed.glue.presets import GluePreset, Trial
from neobert_embed.records import RUN, TRIAL_MODEL, validate_record
from neobert_embed.runs import check_resume

TRIALS_DIR = "trials"  # OUTPUT/trials/<model>/<task>/<trial>.json: one file per finished trial
TRIAL_FIX = "delete that file to run the trial again (a rerun runs only missing trials)"


class TrialScores(BaseModel):
    """What selection reads of a finished trial: its key and validation scores (``best.json`` holds
    the same for a kept best model)."""

    model_config = ConfigDict(extra="allow")
    key: str
    scores: dict[str, float]

    def check_metric(self, source: Path, metric: str, fix: str) -> None:
        """Refuse scores without ``metric`` (the task's selection metric), naming the file."""
        if metric not in self.scores:
            raise UserInputError(f"{source}: key 'scores' has no {metric!r} (the metric trials are selected "
                                 f"on); {fix}")


class TrialResult(TrialScores):
    """One finished trial's result file, as far as selection and the report read it."""

    config_key: str


class Journal:
    """Reads and writes one output directory's run file and trial results."""

    def __init__(self, output: str | Path) -> None:
        self.output = Path(output)

    def trial_path(self, label: str, trial: Trial) -> Path:
        return self.output / TRIALS_DIR / label / trial.task / f"{trial.key}.json"

    def best_model_dir(self, label: str, task: str) -> Path:
        return self.output / "models" / label / task

    def check_run(self, preset: GluePreset, models: dict[str, str]) -> None:
        """Refuse a rerun whose preset or model (for an existing label) differs; name the key."""
        check_resume(self.output, {"preset": preset.model_dump(mode="json")}, verb="a rerun",
                     hint="finished trials would not be comparable. Use the same preset and options, "
                          "or another --output")
        for label, model in models.items():
            check_resume(self.output / TRIALS_DIR / label, {"model": model}, record=TRIAL_MODEL, verb="a rerun",
                         hint=f"the results named {label!r} belong to another model; rename the model "
                              "directory or use another --output")

    def start(self, preset: GluePreset, models: dict[str, str]) -> None:
        """Record the run (called after every input was checked, before the first trial)."""
        RUN.write(self.output, {"preset": preset.model_dump(mode="json")})
        for label, model in models.items():
            TRIAL_MODEL.write(self.output / TRIALS_DIR / label, {"model": model})

    def is_finished(self, label: str, trial: Trial) -> bool:
        return self.trial_path(label, trial).is_file()

    def results(self, label: str, task: str) -> list[dict[str, Any]]:
        """Every finished trial of ``label`` on ``task``; a damaged result file (cut short, a field
        missing or of the wrong type, no selection metric) is one error naming it.

        Example:
            >>> [r["key"] for r in Journal("runs/glue").results("bert", "rte")][:1]
            ['bs16-lr2e-05-wd0.01-seed0']
        """
        from neobert_embed.glue.tasks import TASKS

        folder, found = self.output / TRIALS_DIR / label / task, []
        for path in sorted(folder.glob("*.json")):
            result = validate_record(path, TrialResult, "trial result", TRIAL_FIX)
            result.check_metric(path, TASKS[task].selection_metric, TRIAL_FIX)
            found.append(result.model_dump())
        return found

    def write(self, label: str, trial: Trial, result: dict[str, Any]) -> None:
        atomic_write_json(self.trial_path(label, trial), result)
