"""CLI commands of `neobert_embed.evaluation` (registered on the main app by `neobert_embed.cli`).

``mteb`` evaluates one model with the uniform recipe; ``compare`` fine-tunes and evaluates several
backbones identically. Heavy imports (mteb, torch) happen inside the commands so ``--help`` is instant.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from neobert_embed.contrastive.commands import _parse_data

TASK_DIR_HELP = ("Local task: a directory with task.json, or a folder of them (repeatable). task.json is "
                 '{"mteb_task": "STSBenchmark"} (registered task, data from the directory) or {"name": ..., '
                 '"type": STS|PairClassification|Classification|Clustering|Retrieval|Reranking}. Files for split '
                 "test: STS/PairClassification test.jsonl {sentence1, sentence2, score|label}; Classification "
                 "train.jsonl + test.jsonl {text, label}; Clustering test.jsonl {text, label}; Retrieval "
                 "corpus.jsonl, queries.jsonl, qrels/test.tsv; Reranking adds candidates.jsonl.")


def _split(value: str | None) -> list[str] | None:
    return [item.strip() for item in value.split(",") if item.strip()] if value else None


def _evaluation_recipe(path: Path | None, batch_size: int | None, max_length: int | None,
                       precision: str | None, no_instructions: bool):
    from neobert_embed.evaluation.recipe import load_evaluation_recipe

    return load_evaluation_recipe(path, batch_size=batch_size, max_length=max_length, precision=precision,
                                  instructions="none" if no_instructions else None)


def _finish(failures: dict[str, str], what: str) -> None:
    """List failures on stderr and exit 1 (after everything else was written)."""
    if failures:
        typer.echo(f"{len(failures)} {what} failed:", err=True)
        for name, error in failures.items():
            typer.echo(f"  {name}: {error}", err=True)
        raise typer.Exit(1)


def mteb_command(
    model: str = typer.Option(..., "--model", "-m", help="Registry key, hub id, SentenceTransformer dir, plain "
                              "HF dir, or a train-contrastive output."),
    output: Path = typer.Option(..., "--output", "-o", help="Results root (mteb JSON per model/revision, "
                                "summary.md, summary.csv)."),
    benchmark: str = typer.Option(None, "--benchmark", "-b", help='mteb benchmark, e.g. "MTEB(eng, v1)" (the '
                                  "default when neither --tasks nor --task-dir is given)."),
    tasks: str = typer.Option(None, "--tasks", "-t", help="Comma-separated task names (within --benchmark if given)."),
    task_types: str = typer.Option(None, "--task-types", help="Comma-separated types, e.g. Retrieval,STS."),
    task_dir: list[Path] = typer.Option(None, "--task-dir", help=TASK_DIR_HELP),
    recipe: Path = typer.Option(None, "--recipe", "-r", help="Evaluation recipe YAML (default "
                                "recipes/mteb-eval.yaml)."),
    batch_size: int = typer.Option(None, "--batch-size", help="Encoding batch size."),
    max_length: int = typer.Option(None, "--max-length", help="Maximum tokens per input (default 1024, capped "
                                   "by the model's positions)."),
    precision: str = typer.Option(None, "--precision", help="fp32 | fp16 | bf16."),
    no_instructions: bool = typer.Option(False, "--no-instructions", help="Encode without task instructions."),
    revision: str = typer.Option(None, "--revision", help="Hub revision (default: the cached commit)."),
    device: str = typer.Option(None, "--device", help="cpu, cuda, ... (default: automatic)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
) -> None:
    """Evaluate a model on MTEB (hub or local tasks) with the uniform recipe.

    Rerunning the same command skips finished tasks; after Ctrl-C, rerun it to resume. A failing
    task is reported while the others continue; the exit status is 1 when any failed.
    """
    from neobert_embed.evaluation.runner import run_mteb

    loaded = _evaluation_recipe(recipe, batch_size, max_length, precision, no_instructions)
    report = run_mteb(model, output=output, benchmark=benchmark, tasks=_split(tasks),
                      task_types=_split(task_types), task_dirs=task_dir or None, recipe=loaded,
                      revision=revision, device=device)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        for outcome in report.outcomes:
            score = "" if outcome.score is None else f"{outcome.main_score} {outcome.score:.4f}"
            typer.echo(f"{outcome.task:40s} {outcome.status:7s} {score}")
        typer.echo(f"results in {report.results_dir}; table in {Path(output) / 'summary.md'} and summary.csv")
    _finish(report.failures, "task(s)")


def compare_command(
    models: str = typer.Option(..., "--models", help="Comma-separated backbones, e.g. "
                               "bert,roberta,nomicbert,modernbert,neobert (keys, hub ids or directories)."),
    output: Path = typer.Option(..., "--output", "-o", help="Comparison directory (models/, results/, "
                                "summary.md|csv, plots/)."),
    recipe: Path = typer.Option(None, "--recipe", "-r", help="Contrastive recipe YAML, identical for every model."),
    data: list[str] = typer.Option(None, "--data", "-d", help="NAME=PATH training data (repeatable)."),
    benchmark: str = typer.Option(None, "--benchmark", "-b", help="mteb benchmark to evaluate on."),
    tasks: str = typer.Option(None, "--tasks", "-t", help="Comma-separated task names."),
    task_types: str = typer.Option(None, "--task-types", help="Comma-separated task types."),
    task_dir: list[Path] = typer.Option(None, "--task-dir", help=TASK_DIR_HELP),
    eval_recipe: Path = typer.Option(None, "--eval-recipe", help="Evaluation recipe YAML."),
    batch_size: int = typer.Option(None, "--batch-size", help="Encoding batch size for evaluation."),
    max_length: int = typer.Option(None, "--max-length", help="Evaluation maximum tokens per input."),
    precision: str = typer.Option(None, "--precision", help="Evaluation precision: fp32 | fp16 | bf16."),
    device: str = typer.Option(None, "--device", help="Evaluation device."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON on stdout."),
) -> None:
    """Fine-tune every backbone with one recipe, evaluate each identically: table + one plot per category.

    Resumable: rerun the same command; finished trainings and task results are reused.
    """
    from neobert_embed.evaluation.compare import compare_models

    evaluation = _evaluation_recipe(eval_recipe, batch_size, max_length, precision, False)
    result = compare_models(_split(models) or [], output=output, recipe=recipe, data=_parse_data(data or []) or None,
                            benchmark=benchmark, tasks=_split(tasks), task_types=_split(task_types),
                            task_dirs=task_dir or None, evaluation=evaluation, device=device)
    if as_json:
        typer.echo(json.dumps({"summary_md": str(result.summary_md), "summary_csv": str(result.summary_csv),
                               "plots": [str(p) for p in result.plots],
                               "models": {k: str(v) for k, v in result.models.items()},
                               "failures": result.failures}, indent=2, sort_keys=True))
    else:
        typer.echo(result.summary_md.read_text(encoding="utf-8"))
        typer.echo(f"table: {result.summary_md}, {result.summary_csv}; plots: {', '.join(map(str, result.plots))}")
    _finish({f"{model}/{task}": err for model, errs in result.failures.items() for task, err in errs.items()},
            "model task(s)")


def register(app: typer.Typer) -> None:
    """Attach this area's commands to the main `neobert-embed` app."""
    app.command("mteb")(mteb_command)
    app.command("compare")(compare_command)
