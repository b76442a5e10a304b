"""``run_mteb``: evaluate one model on MTEB tasks (hub or local) under a named protocol.

The protocol (:mod:`neobert_embed.evaluation.protocol`) is ``model`` by default — the model as
its authors configured it, which reproduces published leaderboard scores — or ``uniform``, the
paper's recipe for every backbone. It names the results folder and is written into every result
file (``"neobert_embed"`` key: protocol, prompts used per side, max_seq_length, modules, and
``compute_precision``: the precision the model's forward ran in and why, see
:mod:`neobert_embed.inference.runtime`).

Why: the comparison must be rerunnable and robust — finished tasks are reused, a failing task is
reported while the others run, an offline hub task fails at once with what to do, and Ctrl-C
keeps every finished result. Scoring is mteb's (``mteb.evaluate``); results are mteb's own JSON
in an ``mteb.ResultCache`` rooted at the output directory.

Example:
    >>> report = run_mteb("runs/model", task_dirs=["../shared/data/tasks"], output="runs/mteb")
    >>> report.protocol, report.scores
    ('model', {'STSBenchmarkDev': 0.8671..., 'TRECCoarse': 0.5272})
    >>> report.failures
    {}
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from neobert_embed.console import progress_bar
from neobert_embed.errors import UserInputError
from neobert_embed.evaluation.local_tasks import LocalTask, check_task_data, load_task_dirs
from neobert_embed.evaluation.protocol import DESCRIPTIONS, check_protocol, model_overrides
from neobert_embed.evaluation.recipe import EvaluationRecipe, load_evaluation_recipe
from neobert_embed.evaluation.report import EvaluationReport, TaskOutcome
from neobert_embed.evaluation.summary import SUMMARY_MD
from neobert_embed.files import atomic_write_json
from neobert_embed.machine import check_compute_precision
from neobert_embed.model_files import check_model_files
from neobert_embed.outputs import check_output_directory
from neobert_embed.recipes import TASK_FILE
from neobert_embed.records import MTEB_PROTOCOL, check_fields, read_record
from neobert_embed.runs import Interrupted, claimed_directory

if TYPE_CHECKING:
    from mteb import AbsTask, EncoderProtocol, ResultCache
    from mteb.models import ModelMeta

    from neobert_embed.evaluation.encoder import ModelIdentity
    from neobert_embed.outputs import DirectoryState

logger = logging.getLogger(__name__)
DEFAULT_BENCHMARK = "MTEB(eng, v2)"
MTEB_COMMAND = "neobert-embed mteb"
METADATA_KEY = "neobert_embed"
TASK_TYPE_NAMES = ("Classification", "Clustering", "PairClassification", "Reranking", "Retrieval", "STS",
                   "Summarization")


COMPARED_MODELS_DIR = "models"  # compare's fine-tuned models, one folder per backbone
# what a results directory of earlier runs holds: mteb's cache, the table, or compare's trained models
RESULTS_MARKS = ("results", SUMMARY_MD, COMPARED_MODELS_DIR)


def list_benchmarks() -> list[tuple[str, int]]:
    """Every benchmark mteb registers, with its number of tasks.

    Example:
        >>> dict(list_benchmarks())["MTEB(eng, v2)"]
        41
    """
    import mteb

    return [(benchmark.name, len(benchmark.tasks)) for benchmark in mteb.get_benchmarks()]


def select_tasks(benchmark: str | None = None, tasks: Sequence[str] | None = None,
                 task_types: Sequence[str] | None = None,
                 task_dirs: Sequence[str | Path] | None = None,
                 default_benchmark: str = DEFAULT_BENCHMARK) -> list[AbsTask]:
    """The tasks to run: registered ones (benchmark / names) with local copies replacing hub data.

    A local ``mteb_task`` directory named like a selected hub task replaces it (offline copies);
    other local tasks are added. With neither a benchmark nor task names, local directories alone
    are run, or ``default_benchmark`` (``MTEB(eng, v2)``) when none are given either.

    Example:
        >>> [t.metadata.name for t in select_tasks(tasks=["STSBenchmark"], task_dirs=["copies/"])]
        ['STSBenchmark']
    """
    import mteb

    unknown_types = sorted(set(task_types or ()) - set(TASK_TYPE_NAMES))
    if unknown_types:
        raise UserInputError(f"--task-types: unknown type(s) {unknown_types}; choose from {', '.join(TASK_TYPE_NAMES)}")
    local = load_task_dirs(task_dirs) if task_dirs else []
    registered: list[AbsTask] = []
    if benchmark or not (tasks or local):
        name = benchmark or default_benchmark
        try:
            registered = list(mteb.get_benchmark(name).tasks)
        except (KeyError, ValueError) as exc:
            raise UserInputError(f"--benchmark: {exc}; `neobert-embed mteb --list-benchmarks` lists them") from None
        if tasks:
            outside = sorted(set(tasks) - {t.metadata.name for t in registered} - {t.metadata.name for t in local})
            if outside:
                raise UserInputError(f"--tasks: {outside} are not in benchmark {name!r}")
            registered = [t for t in registered if t.metadata.name in set(tasks)]
            local = [t for t in local if t.metadata.name in set(tasks)]
    elif tasks:
        local_names = {t.metadata.name for t in local}
        hub_names = [name for name in tasks if name not in local_names]
        try:
            registered = list(mteb.get_tasks(tasks=hub_names)) if hub_names else []
        except KeyError as exc:
            raise UserInputError(f"--tasks: {exc}") from None
        missing = sorted(set(hub_names) - {t.metadata.name for t in registered})
        if missing:
            raise UserInputError(f"--tasks: {missing} are not mteb tasks; check the names "
                                 "(`mteb.get_tasks()`) or give local copies with --task-dir")
        local = [t for t in local if t.metadata.name in set(tasks)]
    by_name = {t.metadata.name: t for t in registered}
    by_name.update({t.metadata.name: t for t in local})
    selected = list(by_name.values())
    if task_types:
        selected = [t for t in selected if t.metadata.type in set(task_types)]
    if not selected:
        raise UserInputError("no tasks selected; check --benchmark/--tasks/--task-types/--task-dir")
    return selected


class _RecordedPrecision(BaseModel):
    """``compute_precision`` as :meth:`PrecisionChoice.to_json` writes it."""

    model_config = ConfigDict(extra="allow")
    precision: str
    reason: str


class _RecordedSettings(BaseModel):
    """The fields of the ``"neobert_embed"`` key (what the model encoded with) that reruns read back."""

    model_config = ConfigDict(extra="allow")
    protocol: str | None = None
    max_seq_length: int | None = None
    compute_precision: _RecordedPrecision | None = None


class _ResultFile(BaseModel):
    """An mteb result file, as far as this toolkit reads it (mteb's ``TaskResult`` checks the rest)."""

    model_config = ConfigDict(extra="allow")
    neobert_embed: _RecordedSettings | None = None


def read_result(path: Path) -> dict[str, Any]:
    """An mteb result file of an earlier run as JSON; a damaged one (cut short, not an object, a
    ``"neobert_embed"`` key of the wrong shape) is one located error saying how to evaluate that
    task again, not a traceback.

    Example:
        >>> read_result(Path("runs/mteb/results/bert/abc/experiments/protocol_model/STS12.json"))["task_name"]
        'STS12'
    """
    fix = f"delete it to evaluate {path.stem} again (rerunning keeps every other finished task)"
    saved = read_record(path, "mteb result", fix)
    check_fields(path, saved, _ResultFile, fix)
    return saved


def _cached_score(cache: ResultCache, task: AbsTask, meta: ModelMeta) -> float | None:
    """Main score of a finished earlier run of this exact task/model/recipe, else None."""
    from mteb import TaskResult
    from pydantic import ValidationError

    path = cache.get_task_result_path(task.metadata.name, meta)
    if not path.is_file():
        return None
    read_result(path)  # JSON and an object, or a located error
    try:
        result = TaskResult.from_disk(path)
    except (ValidationError, KeyError, TypeError, ValueError) as exc:
        first = (f"no key {exc.args[0]!r}" if isinstance(exc, KeyError) else
                 str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        raise UserInputError(f"{path}: damaged mteb result ({first}); delete it to evaluate {task.metadata.name} "
                             "again (rerunning keeps every other finished task)") from None
    if result.dataset_revision != task.metadata.revision or result.get_missing_evaluations(task):
        return None
    return float(result.get_score())


def _offline_error(task: AbsTask) -> str:
    name = task.metadata.name
    return (f"HF_HUB_OFFLINE is set, so the hub dataset of {name} cannot be downloaded; give a local "
            f"copy with --task-dir DIR, where DIR/{TASK_FILE} is {{\"mteb_task\": \"{name}\"}} beside its data files")


class _LazyEncoder:
    """Loads the model only when a task actually has to be evaluated (reruns may need none)."""

    def __init__(self, identity: ModelIdentity, protocol: str, recipe: EvaluationRecipe, device: str | None,
                 overrides: dict[str, Any]) -> None:
        self.identity, self.protocol, self.recipe, self.device = identity, protocol, recipe, device
        self.overrides, self.encoder = overrides, None

    def get(self, task: AbsTask | None = None) -> EncoderProtocol:
        """The encoder, loaded on first use; ``auto`` measures precisions on a few of ``task``'s texts."""
        if self.encoder is None:
            from neobert_embed.evaluation.protocol import sample_texts

            texts = sample_texts(task) if task is not None else None
            if self.protocol == "uniform":
                from neobert_embed.evaluation.encoder import UniformEncoder

                self.encoder = UniformEncoder.load(self.identity, self.recipe, device=self.device,
                                                   sample_texts=texts)
            else:
                from neobert_embed.evaluation.protocol import load_model_encoder

                self.encoder = load_model_encoder(self.identity, device=self.device, sample_texts=texts,
                                                  **self.overrides)
        return self.encoder


def _record_metadata(path: Path, task: AbsTask, lazy: _LazyEncoder) -> None:
    """Write the protocol, the prompts actually used and the compute precision (``compute_precision``:
    which precision the scores were computed in, and why) into mteb's result file (extra key)."""
    from neobert_embed.evaluation.protocol import encoder_settings, prompts_used

    encoder = lazy.get()
    metadata = {"protocol": lazy.protocol, "description": DESCRIPTIONS[lazy.protocol],
                "prompts": prompts_used(encoder, task), **encoder_settings(encoder)}
    if lazy.overrides:
        metadata["overrides"] = lazy.overrides
    if path.is_file():
        saved = read_result(path)
        saved[METADATA_KEY] = metadata
        atomic_write_json(path, saved)


def _settings(lazy: _LazyEncoder, outcomes: list[TaskOutcome]) -> dict[str, Any]:
    """What the model encoded with: from the loaded encoder, or a cached result's metadata."""
    from neobert_embed.evaluation.protocol import encoder_settings

    if lazy.encoder is not None:
        return encoder_settings(lazy.encoder)
    for outcome in outcomes:
        path = Path(outcome.result_file or "")
        if outcome.status == "cached" and path.is_file():
            saved = read_result(path).get(METADATA_KEY)
            if saved:
                return {key: value for key, value in saved.items() if key not in ("prompts", "description")}
    return {}


def _evaluate_one(task: AbsTask, lazy: _LazyEncoder, cache: ResultCache, meta: ModelMeta) -> TaskOutcome:
    import mteb

    outcome = TaskOutcome(task.metadata.name, task.metadata.type, "failed", task.metadata.main_score,
                          result_file=str(cache.get_task_result_path(task.metadata.name, meta)),
                          splits=list(task.metadata.eval_splits))
    cached = _cached_score(cache, task, meta)
    if cached is not None:
        outcome.status, outcome.score = "cached", cached
        return outcome
    from huggingface_hub import is_offline_mode

    if isinstance(task, LocalTask):
        try:
            check_task_data(task)
        except UserInputError as exc:
            outcome.error = str(exc)
            return outcome
    elif is_offline_mode():
        outcome.error = _offline_error(task)
        return outcome
    encoder = lazy.get(task)  # a model that cannot load stops the run: every task would fail the same way
    result = mteb.evaluate(encoder, task, cache=cache, raise_error=False, show_progress_bar=False,
                           encode_kwargs={"batch_size": lazy.recipe.batch_size, "show_progress_bar": False},
                           overwrite_strategy="only-missing", co2_tracker=False)
    if task.data_loaded:  # we loaded it for the check above; free it before the next task
        task.unload_data()
    if result.exceptions:
        outcome.error = result.exceptions[0].exception
        return outcome
    outcome.status, outcome.score = "done", float(result.task_results[0].get_score())
    _record_metadata(Path(outcome.result_file), task, lazy)
    return outcome


@dataclass
class PlannedEvaluation:
    """One model's evaluation with every input checked (:func:`plan_evaluation`), ready to run into
    ``output``: the caller holds the output's claim (``run_mteb`` its own, ``compare`` the comparison's)."""

    model: str | Path
    output: Path
    protocol: str
    recipe: EvaluationRecipe
    selected: list[AbsTask]
    identity: ModelIdentity
    overrides: dict[str, Any]
    device: str | None
    task_dirs: list[str | Path]

    @property
    def meta(self) -> ModelMeta:
        """mteb's model metadata, which names the results folder (model, revision, protocol)."""
        uniform = self.protocol == "uniform"
        return self.identity.meta(self.protocol, recipe=self.recipe if uniform else None, overrides=self.overrides)

    @property
    def results_dir(self) -> Path:
        """Where this model's results go, inside ``output``."""
        from mteb import ResultCache

        return ResultCache(self.output).get_task_result_path(self.selected[0].metadata.name, self.meta).parent

    def claimed(self, *, command: str = MTEB_COMMAND, wait: bool = True) -> AbstractContextManager[DirectoryState]:
        """Hold this model's results for the block (:func:`~neobert_embed.runs.claimed_directory` with
        a ``part``): a second evaluation of the same model into ``output`` waits (``wait=False``:
        fails at once), evaluations of other models into it run side by side.

        Example:
            >>> with plan.claimed():
            ...     plan.run()
        """
        return claimed_directory(self.output, record=RESULTS_MARKS, command=command, inputs=self.task_dirs,
                                 what="results directory", part=self.results_dir.relative_to(self.output),
                                 wait=wait)

    def run(self, *, summary: bool = True, show_progress: bool = True) -> EvaluationReport:
        """Evaluate every selected task (finished ones are reused), write the summary (``summary``).
        The caller holds :meth:`claimed`."""
        from mteb import ResultCache

        from neobert_embed.evaluation.notices import collect_mteb_notices
        from neobert_embed.evaluation.summary import write_summary

        uniform = self.protocol == "uniform"
        meta, cache, results_dir = self.meta, ResultCache(self.output), self.results_dir
        report = EvaluationReport(str(self.model), self.identity.name, self.identity.revision,
                                  self.recipe.fingerprint() if uniform else "", str(results_dir), protocol=self.protocol)
        MTEB_PROTOCOL.write(report.results_dir,
                            {"protocol": self.protocol, "description": DESCRIPTIONS[self.protocol],
                             "recipe": self.recipe.model_dump() if uniform else None, "overrides": self.overrides})
        logger.info("results of %s (protocol %s) go to %s", self.identity.name, self.protocol, report.results_dir)
        lazy = _LazyEncoder(self.identity, self.protocol, self.recipe, self.device, self.overrides)
        try:
            with progress_bar(show=show_progress, transient=True) as progress, \
                    collect_mteb_notices() as report.notices:
                bar = progress.add_task(f"MTEB {self.identity.name}", total=len(self.selected))
                for task in self.selected:
                    progress.update(bar, description=f"{self.identity.name}: {task.metadata.name}")
                    outcome = _evaluate_one(task, lazy, cache, meta)
                    report.outcomes.append(outcome)
                    logger.info("%s %s: %s", self.identity.name, outcome.task, outcome.status)
                    progress.advance(bar)
        except KeyboardInterrupt:
            raise Interrupted(f"{len(report.outcomes)} of {len(self.selected)} tasks are finished and kept in "
                              f"{report.results_dir}; rerunning skips them", resume_args=()) from None
        finally:
            report.settings = _settings(lazy, report.outcomes)
            for notice in report.notices:
                logger.info("mteb notice: %s", notice)
            if summary and report.outcomes:
                write_summary([report], self.output, tasks=self.selected)
        return report


def plan_evaluation(model: str | Path, *, output: str | Path, protocol: str = "model", benchmark: str | None = None,
                    tasks: Sequence[str] | None = None, task_types: Sequence[str] | None = None,
                    task_dirs: Sequence[str | Path] | None = None, recipe: EvaluationRecipe | None = None,
                    max_length: int | None = None, precision: str | None = None, revision: str | None = None,
                    device: str | None = None, default_benchmark: str = DEFAULT_BENCHMARK) -> PlannedEvaluation:
    """Check everything :func:`run_mteb` is given (output, model files, protocol, precision, tasks)
    before any model is loaded or any file written; the arguments are :func:`run_mteb`'s.

    Example:
        >>> plan_evaluation("runs/model", output="runs/mteb", task_dirs=["tasks/"]).run().scores
        {'STSBenchmarkDev': 0.8671...}
    """
    from mteb import ResultCache

    from neobert_embed.evaluation.encoder import model_identity

    if Path(str(model)).exists() and Path(output).resolve().is_relative_to(Path(str(model)).resolve()):
        raise UserInputError(f"--output {output} lies in the model directory {model}, an input of this command; "
                             "choose an output outside it")
    check_output_directory(output, record=RESULTS_MARKS, inputs=list(task_dirs or []), what="results directory")
    checked = check_model_files(model)  # refused before any result folder is made; handed to the loader
    check_protocol(protocol)
    if precision is not None:
        check_compute_precision(precision)
    overrides = model_overrides(max_length, precision)
    if protocol == "uniform" and overrides:
        raise UserInputError("max_length/compute_precision overrides are for --protocol model; under uniform "
                             "they come from the evaluation recipe")
    selected = select_tasks(benchmark, tasks, task_types, task_dirs, default_benchmark=default_benchmark)
    planned = PlannedEvaluation(model, Path(output), protocol, recipe or load_evaluation_recipe(), selected,
                                replace(model_identity(model, revision), checked=checked), overrides, device,
                                list(task_dirs or []))
    cache, meta = ResultCache(planned.output), planned.meta
    for task in selected:  # a damaged result of a finished task is refused before anything runs
        _cached_score(cache, task, meta)
    return planned


def run_mteb(model: str | Path, *, output: str | Path, protocol: str = "model", benchmark: str | None = None,
             tasks: Sequence[str] | None = None, task_types: Sequence[str] | None = None,
             task_dirs: Sequence[str | Path] | None = None, recipe: EvaluationRecipe | None = None,
             max_length: int | None = None, precision: str | None = None,
             revision: str | None = None, device: str | None = None, summary: bool = True,
             show_progress: bool = True, default_benchmark: str = DEFAULT_BENCHMARK,
             wait: bool = True) -> EvaluationReport:
    """Evaluate ``model`` on the selected tasks under ``protocol`` (``model`` or ``uniform``).

    The model's results in ``output`` are held by this process for the run
    (:meth:`PlannedEvaluation.claimed`): a second evaluation of the same model into the same root
    waits for it, instead of writing the same files at once; other models' run side by side.
    A task that fails (bad data, hub unreachable, offline) is reported in the returned report
    while the others run; a model that cannot be loaded raises :class:`UserInputError`.

    Args:
        model: registry key, hub id, SentenceTransformer directory, plain HF directory, or a
            ``train-contrastive`` output.
        output: results root; mteb JSON goes to
            ``output/results/<name>/<revision>/experiments/protocol_<protocol>.../`` and
            ``summary.md``/``summary.csv`` to ``output`` (when ``summary``).
        protocol: ``model`` (default: the model's own prompts, length, pooling, normalization;
            ``mteb.get_model`` for models mteb knows) or ``uniform`` (the recipe for every model).
        benchmark, tasks, task_types, task_dirs: task selection, see :func:`select_tasks`.
        recipe: the ``uniform`` evaluation recipe (default: ``recipes/mteb-eval.yaml``); with
            ``model`` only its ``batch_size`` is used.
        max_length: ``model`` protocol only: explicit override of the model's own ``max_seq_length``
            (recorded in the results folder name and metadata).
        precision: ``model`` protocol only: the compute precision of the model's forward, ``auto`` |
            ``fp32`` | ``bf16`` | ``fp16`` | ``int8`` (default fp32, as published scores were computed;
            named in the results folder when given). Under ``uniform`` it is the recipe's ``precision``.
            The precision actually used is in ``report.settings["compute_precision"]``.
        revision: hub revision; for local directories the default is a hash of their files.
        wait: when another command writes ``output``, wait for it (default); False fails at once.

    Returns:
        An :class:`EvaluationReport`; ``report.failures`` lists the tasks that failed.

    Example:
        >>> report = run_mteb("bert", tasks=["STSBenchmark"], output="runs/mteb", protocol="uniform")
    """
    evaluation = plan_evaluation(model, output=output, protocol=protocol, benchmark=benchmark, tasks=tasks,
                                 task_types=task_types, task_dirs=task_dirs, recipe=recipe, max_length=max_length,
                                 precision=precision, revision=revision, device=device,
                                 default_benchmark=default_benchmark)
    with evaluation.claimed(wait=wait):
        return evaluation.run(summary=summary, show_progress=show_progress)
