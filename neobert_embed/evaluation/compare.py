"""``compare``: the paper's protocol end to end — same fine-tuning, same evaluation, one table.

Why: the headline comparison of BERT, RoBERTa, NomicBERT, ModernBERT and NeoBERT is only
meaningful if every backbone gets the identical contrastive recipe and the identical evaluation
recipe. This runs both for each model, reusing whatever a previous run finished (trainings resume
from their checkpoints, finished task results are skipped), and writes::

    OUTPUT/models/<model>/     fine-tuned SentenceTransformer of each backbone (train-contrastive)
    OUTPUT/results/...         mteb's JSON per task, per model name and revision
    OUTPUT/summary.md|csv      the paper's table (incomplete averages marked), headed by the protocol,
                               with each model's compute precision
    OUTPUT/plots/<cat>.png     one bar chart per category

Evaluation uses the ``uniform`` protocol by default (the paper's: the evaluation recipe for every
backbone); ``protocol="model"`` evaluates each fine-tuned model with the prompts and length it
was trained with instead. Its tasks default to ``MTEB(eng, v1)``, the paper's benchmark.

Example:
    >>> result = compare_models(["bert", "neobert"], recipe="recipes/contrastive.yaml",
    ...                         data={"snli": "triplets.jsonl"}, task_dirs=["../shared/data/tasks"],
    ...                         output="runs/compare")
    >>> result.summary_md, result.failures
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from neobert_embed.errors import UserInputError
from neobert_embed.evaluation.protocol import check_protocol
from neobert_embed.evaluation.recipe import EvaluationRecipe, load_evaluation_recipe
from neobert_embed.evaluation.report import EvaluationReport, TaskOutcome
from neobert_embed.evaluation.run import COMPARED_MODELS_DIR, RESULTS_MARKS, plan_evaluation, select_tasks
from neobert_embed.outputs import check_output_directory, model_label
from neobert_embed.runs import claimed_directory

if TYPE_CHECKING:
    from mteb import AbsTask

    from neobert_embed.contrastive.recipe import ContrastiveRecipe

logger = logging.getLogger(__name__)
COMPARE_PROTOCOL = "uniform"
COMPARE_BENCHMARK = "MTEB(eng, v1)"
COMPARE_COMMAND = "neobert-embed compare"


@dataclass
class CompareResult:
    """Where the comparison's outputs are, and what failed (model → task → error)."""

    summary_md: Path
    summary_csv: Path
    plots: list[Path]
    models: dict[str, Path]
    reports: list[EvaluationReport]
    failures: dict[str, dict[str, str]] = field(default_factory=dict)


def _failed_report(model: str, name: str, tasks: list[AbsTask], error: str, protocol: str) -> EvaluationReport:
    """A report whose every task failed, so a model that could not be trained shows as missing."""
    outcomes = [TaskOutcome(t.metadata.name, t.metadata.type, "failed", t.metadata.main_score, error=error,
                            splits=list(t.metadata.eval_splits)) for t in tasks]
    return EvaluationReport(model, name, "untrained", "", "", outcomes, protocol=protocol)


def compare_models(models: Sequence[str], *, output: str | Path, recipe: str | Path | ContrastiveRecipe | None = None,
                   data: dict[str, str] | None = None, benchmark: str | None = None,
                   tasks: Sequence[str] | None = None, task_types: Sequence[str] | None = None,
                   task_dirs: Sequence[str | Path] | None = None,
                   evaluation: EvaluationRecipe | None = None, device: str | None = None,
                   protocol: str = COMPARE_PROTOCOL, precision: str | None = None, wait: bool = True) -> CompareResult:
    """Fine-tune each model with one contrastive recipe, evaluate each the same way, tabulate and plot.

    Args:
        models: registry keys (``bert,roberta,nomicbert,modernbert,neobert``), hub ids or directories.
        output: comparison directory (see the module docstring); rerun to resume.
        recipe: contrastive recipe (path or ``ContrastiveRecipe``), identical for every model.
        data: training data ``{name: path}`` (overrides the recipe's ``data``).
        benchmark, tasks, task_types, task_dirs: evaluation tasks, as for ``neobert-embed mteb``.
        evaluation: the evaluation recipe (default ``recipes/mteb-eval.yaml``).
        protocol: ``uniform`` (default, the paper's) or ``model`` (each model's own prompts/length).
        precision: compute precision of every model's forward under ``model`` (default fp32); under
            ``uniform`` it is ``evaluation.precision``. Each model's is in the summary.
        wait: when another command writes ``output``, wait for it (default); False fails at once.

    Returns:
        A :class:`CompareResult`; a model whose training fails is reported and shown as missing.
    """
    from neobert_embed.contrastive import load_contrastive_recipe

    if not models:
        raise UserInputError("--models: give at least one model, e.g. bert,roberta,nomicbert,modernbert,neobert")
    names = [model_label(m) for m in models]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UserInputError(f"--models: {duplicates} appear more than once; each model needs its own name")
    output = Path(output)
    check_output_directory(output, record=RESULTS_MARKS, inputs=[*models, *(task_dirs or [])],
                           what="comparison directory")
    contrastive = recipe if recipe is None or not isinstance(recipe, str | Path) else load_contrastive_recipe(recipe)
    check_protocol(protocol)
    evaluation = evaluation or load_evaluation_recipe()
    selected = select_tasks(benchmark, tasks, task_types, task_dirs,  # bad task dirs fail before training
                            default_benchmark=COMPARE_BENCHMARK)

    def evaluate(trained: Path) -> EvaluationReport:
        """One fine-tuned model's evaluation, into the comparison's results (its claim is held)."""
        plan = plan_evaluation(trained, output=output, benchmark=benchmark, tasks=tasks, task_types=task_types,
                               task_dirs=task_dirs, recipe=evaluation, device=device, protocol=protocol,
                               default_benchmark=COMPARE_BENCHMARK, precision=precision if protocol == "model" else None)
        with plan.claimed(command=COMPARE_COMMAND, wait=wait):  # an `mteb` run of the same model waits, or us
            return plan.run(summary=False)

    with claimed_directory(output, record=RESULTS_MARKS, command=COMPARE_COMMAND, inputs=[*models, *(task_dirs or [])],
                           what="comparison directory", wait=wait):
        return _compare_into(output, list(zip(models, names, strict=True)), selected, contrastive=contrastive,
                             data=data, evaluate=evaluate, protocol=protocol, recipe_name=_recipe_name(recipe))


def _recipe_name(recipe: str | Path | ContrastiveRecipe | None) -> str:
    return ("the bundled contrastive.yaml" if recipe is None
            else str(recipe) if isinstance(recipe, str | Path) else "a ContrastiveRecipe given in Python")


def _compare_into(output: Path, models: list[tuple[str, str]], selected: list[AbsTask], *,
                  contrastive: ContrastiveRecipe | None, data: dict[str, str] | None,
                  evaluate: Callable[[Path], EvaluationReport], protocol: str, recipe_name: str) -> CompareResult:
    """Train and evaluate each ``(model, name)`` into the claimed ``output``, then tabulate and plot."""
    from neobert_embed.contrastive import train_contrastive
    from neobert_embed.evaluation.plots import plot_categories
    from neobert_embed.evaluation.summary import summarize, write_summary

    reports, trained, failures = [], {}, {}
    for model, name in models:
        logger.info("compare: fine-tuning %s into %s", model, output / COMPARED_MODELS_DIR / name)
        try:
            trained[name] = Path(train_contrastive(model=model, data=data, output=output / COMPARED_MODELS_DIR / name,
                                                   recipe=contrastive, resume=True))
        except UserInputError as exc:
            logger.error("compare: training %s failed: %s", model, exc)
            reports.append(_failed_report(model, name, selected, f"training failed: {exc}", protocol))
            failures[name] = {"training": str(exc)}
            continue
        report = evaluate(trained[name])
        reports.append(report)
        if report.failures:
            failures[name] = report.failures
    note = (f"Models: each backbone fine-tuned with the same contrastive recipe ({recipe_name}); the model "
            "saved at the end of training is evaluated (no checkpoint is selected on these scores).")
    summary_md, summary_csv = write_summary(reports, output, tasks=selected, models_note=note)
    task_types_map = {t.metadata.name: t.metadata.type for t in selected}
    plots = plot_categories(summarize(reports, task_types_map), output / "plots")
    logger.info("compare: table in %s, plots in %s", summary_md, output / "plots")
    return CompareResult(summary_md, summary_csv, plots, trained, reports, failures)
