"""``run_glue``: the whole protocol — trials in order, on one or several devices, then the table.

What happens, in order:

1. every task's data, the preset and the output's earlier settings are checked (nothing is
   written before that);
2. per model, transfer sources (MNLI) run before their targets (RTE, MRPC, STS-B, QNLI), which
   start from the source's best model; finished trials are skipped;
3. trials run one after another in this process, or in parallel with one worker process per
   entry of ``devices`` (``cuda:0,cuda:1``; ``cpu,cpu`` splits the CPU threads);
4. each trial's result is written the moment it ends (:mod:`neobert_embed.glue.journal`); Ctrl-C
   keeps them and says how to continue;
5. per task the best configuration on validation is chosen; ``summary.md``, ``summary.csv``,
   ``glue.png`` and ``scores.json`` are written, and GLUE-server TSVs with ``predict_test``.

Under ``torchrun`` each trial is a DDP run (the trainer does it): run the command once per node
with ``torchrun --nproc_per_node N -m neobert_embed.cli glue ...``; only rank 0 writes files.

Example:
    >>> result = run_glue(["neobert"], "runs/glue", task_dirs=["tasks/stsb"], preset="quick")
    >>> result.scores["neobert"]["stsb"]
    {'pearson': 0.88, 'spearman': 0.88}
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neobert_embed.console import progress_bar
from neobert_embed.distributed import is_main_process
from neobert_embed.errors import UserInputError
from neobert_embed.glue.data import GlueData, load_glue_data
from neobert_embed.glue.journal import TRIALS_DIR, Journal
from neobert_embed.glue.presets import GluePreset, Trial, expand_trials, load_glue_preset
from neobert_embed.glue.selection import TaskChoice, select_best
from neobert_embed.glue.tasks import TASKS
from neobert_embed.outputs import check_output_directory, model_label
from neobert_embed.records import GLUE_SCORES, RUN
from neobert_embed.runs import Interrupted, claimed_directory

if TYPE_CHECKING:
    import multiprocessing

logger = logging.getLogger(__name__)

_WORKER: dict[str, Any] = {}


@dataclass
class GlueResult:
    """What a run produced: per model label, per task, the chosen configuration's metrics."""

    scores: dict[str, dict[str, dict[str, float]]]
    choices: dict[str, dict[str, TaskChoice | None]]
    summary_md: Path
    summary_csv: Path
    plot: Path
    trials_run: int
    trials_skipped: int
    submissions: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class _Source:
    """Where one task's data comes from (picklable, so workers load it themselves)."""

    task: str
    task_dir: str | None = None

    def load(self) -> GlueData:
        return load_glue_data(task_dir=self.task_dir) if self.task_dir else load_glue_data(task=self.task)


def _sources(tasks: Sequence[str] | None, task_dirs: Sequence[str | Path] | None) -> dict[str, tuple[_Source, GlueData]]:
    """Load and check every task up front; a task named twice is an error."""
    from neobert_embed.glue.tasks import get_task

    hub = [_Source(get_task(t).name) for t in tasks or []]  # every name is checked before anything loads
    loaded: dict[str, tuple[_Source, GlueData]] = {}
    for directory in task_dirs or []:
        data = load_glue_data(task_dir=directory)
        if data.task.name in loaded:
            raise UserInputError(f"{directory}: task {data.task.name!r} is given twice; give each task once")
        loaded[data.task.name] = (_Source(data.task.name, str(Path(directory).resolve())), data)
    for spec in hub:
        if spec.task in loaded:
            raise UserInputError(f"--tasks: task {spec.task!r} is given twice (or also as --task-dir)")
        loaded[spec.task] = (spec, spec.load())
    if not loaded:
        raise UserInputError("no tasks: pass --tasks cola,sst2,... (hub) or --task-dir DIR (local)")
    return loaded


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _check_model(model: str) -> None:
    """Fail before anything is written when ``model`` has no loadable config."""
    from transformers import AutoConfig

    import neobert_embed.modeling  # noqa: F401  (NeoBERT's config class)
    from neobert_embed.glue.trial import backbone_path

    try:
        AutoConfig.from_pretrained(backbone_path(model))
    except (OSError, ValueError) as exc:
        raise UserInputError(f"cannot load model {model!r}: {str(exc).splitlines()[0] if str(exc) else exc!r}. "
                             "Pass a local model directory, a reachable hub id or a registry key "
                             "(HF_HUB_OFFLINE=1 allows only local and cached models)") from None


def _init_worker(devices: multiprocessing.Queue[str], threads: int) -> None:
    """Pin this worker process to one device before torch starts (spawned workers only)."""
    device = devices.get()
    if device.startswith("cuda:"):
        os.environ["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
        device = "cuda"
    _WORKER["device"] = device
    import torch

    if device == "cpu":
        torch.set_num_threads(threads)


def execute_job(job: dict[str, Any]) -> dict[str, Any]:
    """Run one trial and write its result (in the worker, so a finished trial is never lost).

    Public so the process pool can pickle it; ``job`` holds plain values only.
    """
    from neobert_embed.glue.trial import run_trial

    cache = _WORKER.setdefault("data", {})
    source: _Source = job["source"]
    if source not in cache:
        cache[source] = job.get("data") or source.load()
    trial: Trial = job["trial"]
    result = run_trial(job["model"], cache[source], trial, GluePreset(**job["preset"]), job["work_dir"],
                       device=_WORKER.get("device", job["device"]), start_from=job["start_from"],
                       predict_test=job["predict_test"], keep_model=job["keep_model"])
    if is_main_process():
        Journal(job["output"]).write(job["label"], trial, result)
    _barrier()  # under torchrun: the next trial may start from the model rank 0 just saved
    return {"task": trial.task, "key": trial.key, "scores": result["scores"]}


class _Progress:
    """Progress on the user console: trial i/N, the task, the best score so far per task."""

    def __init__(self, total: int, enabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

        self.best: dict[str, float] = {}
        self.done = 0
        self.progress = progress_bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), show=enabled)
        self.bar = self.progress.add_task("GLUE", total=total)
        self.enabled = enabled

    def started(self, label: str, index: int, total: int, trial: Trial) -> None:
        best = self.best.get(f"{label}/{trial.task}")
        shown = "—" if best is None else f"{100 * best:.2f}"
        self.progress.update(self.bar, description=f"{label} · trial {index}/{total} · {TASKS[trial.task].title} "
                                                   f"{trial.key} · best {shown}")

    def finished(self, label: str, outcome: dict[str, Any]) -> None:
        task = TASKS[outcome["task"]]
        value = outcome["scores"][task.selection_metric]
        key = f"{label}/{task.name}"
        self.best[key] = max(value, self.best.get(key, float("-inf")))
        if self.enabled:
            logger.info("%s %s %s: %s %.2f (best %.2f)", label, task.title, outcome["key"], task.selection_metric,
                        100 * value, 100 * self.best[key])
        self.done += 1
        self.progress.advance(self.bar)


def _jobs(label: str, model: str, trials: list[Trial], journal: Journal, preset: GluePreset,
          sources: dict[str, tuple[_Source, GlueData]], predict_test: bool, device: str,
          in_process: bool) -> list[dict[str, Any]]:
    keep = set(preset.transfer.values())
    jobs = []
    for trial in trials:
        source, data = sources[trial.task]
        start = journal.best_model_dir(label, trial.transfer_from) if trial.transfer_from else None
        jobs.append({"model": model, "label": label, "source": source, "data": data if in_process else None,
                     "trial": trial, "preset": preset.model_dump(), "output": str(journal.output),
                     "work_dir": str(journal.output / ".work" / label / trial.task / trial.key),
                     "device": device, "start_from": str(start) if start else None, "predict_test": predict_test,
                     "keep_model": str(journal.best_model_dir(label, trial.task)) if trial.task in keep else None})
    return jobs


def _check_start(job: dict[str, Any]) -> None:
    start = job["start_from"]
    if start and not (Path(start) / "config.json").is_file():
        trial: Trial = job["trial"]
        raise UserInputError(f"{start}: the best {trial.transfer_from} model that {trial.task} starts from is "
                             f"missing (its trials are finished but the model was removed); delete "
                             f"{Path(job['output']) / 'trials' / job['label'] / trial.transfer_from} to rerun them")


def _run_jobs(jobs: list[dict[str, Any]], devices: list[str], progress: _Progress, done_before: int,
              total: int) -> int:
    """Run ``jobs`` (one phase) in this process or on a pool; return how many finished."""
    for job in jobs:
        _check_start(job)
    finished = 0
    if len(devices) == 1 and not devices[0].startswith("cuda:"):
        _WORKER["device"] = devices[0]
        for job in jobs:
            progress.started(job["label"], done_before + finished + 1, total, job["trial"])
            progress.finished(job["label"], execute_job(job))
            finished += 1
        return finished
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    for device in devices:
        queue.put(device)
    threads = max(1, (os.cpu_count() or 1) // len(devices))
    with ProcessPoolExecutor(len(devices), mp_context=context, initializer=_init_worker,
                             initargs=(queue, threads)) as pool:
        pending = {}
        try:
            for job in jobs:
                pending[pool.submit(execute_job, job)] = job
            while pending:
                first = next(iter(pending.values()))
                progress.started(first["label"], done_before + finished + 1, total, first["trial"])
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    job = pending.pop(future)
                    progress.finished(job["label"], future.result())
                    finished += 1
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return finished


def _submission(journal: Journal, label: str, choice: TaskChoice, task: str, directory: Path) -> list[Path]:
    """GLUE-server files from the chosen configuration's median-seed trial."""
    from neobert_embed.glue.server import write_submission

    selection = TASKS[task].selection_metric
    trials = [r for r in journal.results(label, task) if r["key"] in choice.trial_keys]
    target = statistics.median_low(r["scores"][selection] for r in trials)
    trial = next(r for r in trials if r["scores"][selection] == target)
    return [write_submission(TASKS[task], split, preds, directory)
            for split, preds in trial.get("test_predictions", {}).items()]


def run_glue(models: Sequence[str], output: str | Path, *, tasks: Sequence[str] | None = None,
             task_dirs: Sequence[str | Path] | None = None, preset: str | Path | GluePreset = "quick",
             devices: Sequence[str] | None = None, predict_test: bool = False, progress: bool = True,
             preset_name: str | None = None, wait: bool = True) -> GlueResult:
    """Fine-tune and evaluate every model on every task with the preset's grid; write the table.

    Args:
        models: registry keys, hub ids, HF/``pretrain export``/SentenceTransformer directories;
            each gets one row of the table (rerunning with another model adds a row).
        output: run directory (see :mod:`neobert_embed.glue.journal`); rerun to continue.
        tasks: GLUE task names loaded from the hub (``nyu-mll/glue``).
        task_dirs: local task directories (see :mod:`neobert_embed.glue.data`).
        preset: ``quick``, ``paper``, a YAML path or a :class:`GluePreset`.
        devices: one worker per entry (``["cuda:0", "cuda:1"]``, ``["cpu", "cpu"]``); default the
            GPU if there is one, else the CPU, in this process.
        predict_test: write GLUE-server TSVs under ``output/submission/<model>/``.
        progress: show the progress bar and one line per finished trial (stderr).
        preset_name: the name shown in the summary (default: the preset file's stem).
        wait: when another process writes ``output``, wait for it (else fail at once).

    Raises:
        UserInputError: bad task, data, preset or output conflict — before anything is written.
        Interrupted: after Ctrl-C, once finished trials are safely on disk (rerun to continue).
    """
    if not models:
        raise UserInputError("no model: pass --model (a registry key, hub id or local directory)")
    preset_name = preset_name or (Path(str(preset)).stem if not isinstance(preset, GluePreset) else "custom")
    check_output_directory(output, record=(RUN, TRIALS_DIR), inputs=[*models, *(task_dirs or [])], what="GLUE run")
    preset = preset if isinstance(preset, GluePreset) else load_glue_preset(preset)
    labels = {model_label(m): m for m in models}
    if len(labels) != len(models):
        raise UserInputError("--model: two models share a name; each row of the table needs its own")
    for model in labels.values():
        _check_model(model)
    sources = _sources(tasks, task_dirs)
    with claimed_directory(output, record=(RUN, TRIALS_DIR), command="neobert-embed glue",
                           inputs=[*models, *(task_dirs or [])], what="GLUE run", wait=wait):
        return _run_claimed(Path(output), labels, preset, sources, devices, predict_test, progress, preset_name)


def _run_claimed(output: Path, labels: dict[str, str], preset: GluePreset, sources: dict[str, tuple[_Source, GlueData]],
                 devices: Sequence[str] | None, predict_test: bool, progress: bool, preset_name: str) -> GlueResult:
    """The body of :func:`run_glue`, run while this process owns ``output``: plan, train, select, tabulate."""
    from neobert_embed.glue.summary import summary_paths, write_glue_summary

    task_names = list(sources)
    journal = Journal(output)
    journal.check_run(preset, labels)
    if not devices:
        from neobert_embed.devices import default_device  # imports torch: only after every input check

        devices = [default_device()]
    devices = list(devices)
    from neobert_embed.devices import check_device
    from neobert_embed.training_precision import chosen_precision

    for device in devices:  # a missing device, or fp16 on the CPU, is refused here, before the run directory is written
        chosen_precision(preset.precision, check_device(device, "--devices"))
    in_process = len(devices) == 1 and not devices[0].startswith("cuda:")

    plans = {}
    for label in labels:
        available = {t for t in TASKS if (journal.best_model_dir(label, t) / "config.json").is_file()}
        plans[label] = expand_trials(preset, task_names, available)
    total = sum(len(p) for p in plans.values())
    pending_total = sum(not journal.is_finished(label, t) for label, plan in plans.items() for t in plan)
    skipped = total - pending_total
    if is_main_process():
        journal.start(preset, labels)
    tracker = _Progress(pending_total, progress)
    ran = 0
    try:
        with tracker.progress:
            for label, model in labels.items():
                for phase in (False, True):
                    trials = [t for t in plans[label] if (t.transfer_from is not None) == phase
                              and not journal.is_finished(label, t)]
                    jobs = _jobs(label, model, trials, journal, preset, sources, predict_test, devices[0],
                                 in_process)
                    ran += _run_jobs(jobs, devices, tracker, ran, pending_total)
    except KeyboardInterrupt:
        raise Interrupted(f"{skipped + tracker.done} of {total} trials are finished and kept in "
                          f"{journal.output / TRIALS_DIR}; the trial in flight was discarded",
                          resume_args=()) from None
    shutil.rmtree(journal.output / ".work", ignore_errors=True)
    choices = {label: {t: select_best(journal.results(label, t), TASKS[t].selection_metric) for t in task_names}
               for label in labels}
    scores = {label: {t: c.scores for t, c in row.items() if c is not None} for label, row in choices.items()}
    if not is_main_process():
        return GlueResult(scores, choices, *summary_paths(journal.output), ran, skipped)
    md, csv_path, plot = write_glue_summary(choices, task_names, journal.output, preset_name)
    GLUE_SCORES.write(journal.output,
                      {label: {t: c.as_dict() for t, c in row.items() if c is not None}
                       for label, row in choices.items()})
    submissions = []
    if predict_test:
        for label, row in choices.items():
            for task, choice in row.items():
                if choice is not None:
                    submissions += _submission(journal, label, choice, task, journal.output / "submission" / label)
    return GlueResult(scores, choices, md, csv_path, plot, ran, skipped, submissions)
