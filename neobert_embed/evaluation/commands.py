"""CLI commands of `neobert_embed.evaluation` (registered on the main app by `neobert_embed.cli`).

``mteb`` evaluates one model (default protocol ``model``: as its authors configured it);
``compare`` fine-tunes and evaluates several backbones identically (default protocol ``uniform``).
Heavy imports (mteb, torch) happen inside the commands so ``--help`` is instant.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from neobert_embed import options as opt

TASK_DIR_HELP = ("Local task: a directory with task.json, or a folder of them (repeatable). task.json is "
                 '{"mteb_task": "STSBenchmark"} (registered task, data from the directory) or {"name": ..., '
                 '"type": STS|PairClassification|Classification|Clustering|Retrieval|Reranking}. Files for split '
                 "test: STS/PairClassification test.jsonl {sentence1, sentence2, score|label}; Classification "
                 "train.jsonl + test.jsonl {text, label}; Clustering test.jsonl {text, label}; Retrieval "
                 "corpus.jsonl, queries.jsonl, qrels/test.tsv; Reranking adds candidates.jsonl.")

PROTOCOL_HELP = ("model: each model as its authors configured it (its saved prompts resolved per task as mteb "
                 "does, its max_seq_length, pooling and normalization; mteb's own loader for models mteb knows), "
                 "which reproduces published scores. uniform: the paper's protocol, the evaluation recipe's "
                 "instructions, length, pooling and precision for every model.")


def _evaluation_recipe(path: Path | None, batch_size: int | None, max_length: int | None,
                       precision: str | None, no_instructions: bool):
    from neobert_embed.evaluation.recipe import load_evaluation_recipe

    return load_evaluation_recipe(path, batch_size=batch_size, max_length=max_length, precision=precision,
                                  instructions="none" if no_instructions else None)


def _protocol_settings(protocol: str, recipe: Path | None, batch_size: int | None, max_length: int | None,
                       precision: str | None, no_instructions: bool) -> tuple:
    """(evaluation recipe, model-protocol overrides) for the chosen protocol; recipe options need uniform.

    ``precision`` is the compute precision (already checked by :func:`_check_precision`): under
    ``uniform`` it overrides the recipe's, under ``model`` it overrides fp32 (the default, as
    published scores are computed).
    """
    from neobert_embed.errors import UserInputError
    from neobert_embed.evaluation.protocol import check_protocol

    check_protocol(protocol)
    if protocol == "uniform":
        return _evaluation_recipe(recipe, batch_size, max_length, precision, no_instructions), {}
    if recipe is not None or no_instructions:
        given = "--recipe" if recipe is not None else "--no-instructions"
        raise UserInputError(f"{given} sets the uniform recipe; add --protocol uniform (under --protocol model "
                             "each model uses its own saved prompts)")
    return _evaluation_recipe(None, batch_size, None, None, False), {"max_length": max_length,
                                                                    "precision": precision}


def _print_benchmarks() -> None:
    from neobert_embed.evaluation.run import list_benchmarks

    for name, count in list_benchmarks():
        typer.echo(f"{name:40s} {count:4d} tasks")


def _check_precision(precision: str | None, device: str | None) -> None:
    """Refuse a compute precision the device cannot run (int8 off the CPU) before any model is loaded;
    an unknown name was refused while the command line was read (``--precision``'s callback)."""
    if precision is None:
        return
    from neobert_embed.machine import check_precision_fits, describe_machine

    check_precision_fits(precision, describe_machine(device))


def _used_line(report) -> str:
    """One line: the protocol and what the model was evaluated with (compute precision included)."""
    from neobert_embed.evaluation.protocol import describe_precision

    settings = report.settings
    parts = [f"precision {describe_precision(settings.get('compute_precision'))}"] if settings else []
    parts.append(f"protocol {report.protocol}")
    if report.protocol == "uniform":
        parts.append(f"recipe {report.recipe}")
    if "max_seq_length" in settings:
        parts.append(f"max_seq_length {settings['max_seq_length']}")
    if "saved_prompts" in settings and report.protocol == "model":
        names = sorted(k for k, v in settings["saved_prompts"].items() if v)
        parts.append(f"saved prompts {', '.join(names) if names else 'none'}")
    if "modules" in settings:
        parts.append("modules " + "+".join(settings["modules"]))
    return "used: " + "; ".join(parts)


def _finish(failures: dict[str, str], what: str) -> None:
    """List failures on stderr and exit 1 (after everything else was written)."""
    if failures:
        typer.echo(f"{len(failures)} {what} failed:", err=True)
        for name, error in failures.items():
            typer.echo(f"  {name}: {error}", err=True)
        raise typer.Exit(1)


def mteb_command(
    model: str = typer.Option(None, "--model", "-m", help="Registry key, hub id, SentenceTransformer dir, plain "
                              "HF dir, or a train-contrastive output."),
    output: Path = typer.Option(None, "--output", "-o", help="Results root (mteb JSON per model/revision/"
                                "protocol, summary.md, summary.csv)."),
    protocol: str = typer.Option("model", "--protocol", help="model (default) | uniform. " + PROTOCOL_HELP),
    benchmark: str = typer.Option(None, "--benchmark", "-b", help='Any benchmark mteb registers, e.g. '
                                  '"MTEB(eng, v2)" (the default when neither --tasks nor --task-dir is given) or '
                                  '"MTEB(eng, v1)" (the paper\'s); see --list-benchmarks.'),
    list_benchmarks: bool = typer.Option(False, "--list-benchmarks", help="Print every benchmark mteb registers "
                                         "with its task count, then exit."),
    tasks: str = typer.Option(None, "--tasks", "-t", help="Comma-separated task names (within --benchmark if given)."),
    task_types: str = typer.Option(None, "--task-types", help="Comma-separated types, e.g. Retrieval,STS."),
    task_dir: list[Path] = typer.Option(None, "--task-dir", help=TASK_DIR_HELP),
    recipe: Path = typer.Option(None, "--recipe", "-r", help="Evaluation recipe YAML for --protocol uniform "
                                "(default recipes/mteb-eval.yaml)."),
    batch_size: int = typer.Option(None, "--batch-size", min=1, max=opt.MAX_BATCH, help="Encoding batch size."),
    max_length: opt.MaxLength = None,
    precision: opt.ComputePrecision = None,  # None: fp32, or the uniform recipe's
    no_instructions: bool = typer.Option(False, "--no-instructions", help="Uniform protocol: encode without the "
                                         "recipe's task instructions."),
    revision: str = typer.Option(None, "--revision", help="Hub revision (default: the cached commit)."),
    device: opt.Device = None,
    no_wait: opt.NoWait = False,
    as_json: opt.AsJson = False,
    verbose: opt.Verbose = False,
) -> None:
    """Evaluate a model on MTEB (hub or local tasks); by default exactly as its authors configured it.

    --protocol model (default) reproduces published scores; --protocol uniform applies the paper's recipe.
    --precision defaults to fp32 here (published scores are fp32); under uniform, to the recipe's.

    Rerunning the same command skips finished tasks; after Ctrl-C, rerun it to resume. A failing task is
    reported while the others continue; the exit status is 1 when any failed.
    """
    from neobert_embed.console import json_only_stdout, third_party_log
    from neobert_embed.errors import UserInputError
    from neobert_embed.evaluation.run import run_mteb
    from neobert_embed.evaluation.summary import SUMMARY_CSV, SUMMARY_MD

    if list_benchmarks:
        _print_benchmarks()
        return
    if model is None or output is None:
        raise UserInputError("give --model and --output (or --list-benchmarks)")
    _check_precision(precision, device)
    loaded, overrides = _protocol_settings(protocol, recipe, batch_size, max_length, precision, no_instructions)
    with third_party_log(output, verbose), json_only_stdout(as_json):
        report = run_mteb(model, output=output, protocol=protocol, benchmark=benchmark,
                          tasks=opt.comma_list(tasks), task_types=opt.comma_list(task_types),
                          task_dirs=task_dir or None, recipe=loaded,
                          revision=revision, device=device, wait=not no_wait, **overrides)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        typer.echo(_used_line(report))
        for outcome in report.outcomes:
            score = "" if outcome.score is None else f"{outcome.main_score} {outcome.score:.4f}"
            typer.echo(f"{outcome.task:40s} {outcome.status:7s} {score}")
        typer.echo(f"results in {report.results_dir}; table in {Path(output) / SUMMARY_MD} and {SUMMARY_CSV}")
    _finish(report.failures, "task(s)")


def compare_command(
    models: str = typer.Option(..., "--models", help="Comma-separated backbones, e.g. "
                               "bert,roberta,nomicbert,modernbert,neobert (keys, hub ids or directories)."),
    output: Path = typer.Option(..., "--output", "-o", help="Comparison directory (models/, results/, "
                                "summary.md|csv, plots/)."),
    recipe: Path = typer.Option(None, "--recipe", "-r", help="Contrastive recipe YAML, identical for every model."),
    data: list[str] = typer.Option(None, "--data", "-d", help="NAME=PATH training data (repeatable)."),
    protocol: str = typer.Option("uniform", "--protocol", help="uniform (default, the paper's) | model. "
                                 + PROTOCOL_HELP),
    benchmark: str = typer.Option(None, "--benchmark", "-b", help='mteb benchmark to evaluate on (default '
                                  '"MTEB(eng, v1)", the paper\'s, when neither --tasks nor --task-dir is given).'),
    tasks: str = typer.Option(None, "--tasks", "-t", help="Comma-separated task names."),
    task_types: str = typer.Option(None, "--task-types", help="Comma-separated task types."),
    task_dir: list[Path] = typer.Option(None, "--task-dir", help=TASK_DIR_HELP),
    eval_recipe: Path = typer.Option(None, "--eval-recipe", help="Evaluation recipe YAML."),
    batch_size: int = typer.Option(None, "--batch-size", min=1, max=opt.MAX_BATCH, help="Encoding batch size for evaluation."),
    max_length: opt.MaxLength = None,
    precision: opt.ComputePrecision = None,  # None: the evaluation recipe's (fp32)
    device: opt.Device = None,
    no_wait: opt.NoWait = False,
    as_json: opt.AsJson = False,
    verbose: opt.Verbose = False,
    by_length: list[Path] = typer.Option(None, "--by-length", help="Long-context task directory with test_<length> "
                                         "splits (`tasks synth`, LongEmbed copies); repeatable: each fine-tuned model "
                                         "is also scored by length, truncated and with passages (OUTPUT/by_length.*)."),
) -> None:
    """Fine-tune every backbone with one recipe, evaluate each identically: table + one plot per category.

    Defaults: --protocol uniform (the paper's evaluation recipe for every backbone) and "MTEB(eng, v1)";
    --precision: the evaluation recipe's (fp32).

    Resumable: rerun the same command; finished trainings and task results are reused.
    """
    from neobert_embed.console import json_only_stdout, third_party_log
    from neobert_embed.evaluation.compare import compare_models

    _check_precision(precision, device)
    evaluation = _evaluation_recipe(eval_recipe, batch_size, max_length, precision, False)
    with third_party_log(output, verbose), json_only_stdout(as_json):
        result = compare_models(opt.comma_list(models) or [], output=output, recipe=recipe,
                                data=opt.parse_data_option(data or []) or None, benchmark=benchmark,
                                tasks=opt.comma_list(tasks), task_types=opt.comma_list(task_types),
                                task_dirs=task_dir or None, evaluation=evaluation, device=device, protocol=protocol,
                                precision=precision, wait=not no_wait)
        if by_length:
            from neobert_embed.evaluation.long_context import scores_by_length

            scores_by_length(list(result.models.values()), by_length, output, batch_size=batch_size or 32,
                             compute_precision=precision or "fp32")
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


tasks_app = typer.Typer(help="Write long-context tasks (LongEmbed's synthetic passkey and needle) and score models "
                        "by document length, with and without passages.", no_args_is_help=True)


@tasks_app.command("synth")
def synth_command(
    kind: str = typer.Option(..., "--kind", help="passkey | needle (LongEmbed's two synthetic tasks)."),
    haystack: Path = typer.Option(..., "--haystack", help="Any local text the documents are cut from (.txt, or "
                                  ".jsonl/.csv/.parquet with a 'text' field), e.g. ../shared/data/ag_news/test.jsonl."),
    output: Path = typer.Option(..., "--output", "-o", help="Task directory to write (task.json + test_<length>/)."),
    tokenizer: str = typer.Option(..., "--tokenizer", help="Model (directory or name) whose tokenizer counts the "
                                  "lengths."),
    lengths: str = typer.Option("256,512,1024,2048,4096", "--lengths", help="Comma-separated document lengths in "
                                "tokens (LongEmbed: 256 ... 32768)."),
    documents: int = typer.Option(50, "--documents", min=2, help="Documents (and queries) per length."),
    seed: int = typer.Option(0, "--seed", help="Same inputs and seed: same bytes."),
) -> None:
    """Write a synthetic passkey or needle retrieval task, deterministically, from local text (runs offline)."""
    from neobert_embed.errors import UserInputError
    from neobert_embed.evaluation.long_context import write_synthetic_task

    parts = opt.comma_list(lengths) or []
    if not all(part.isdigit() for part in parts):
        raise UserInputError(f"--lengths must be comma-separated token counts such as 256,1024,4096, got {lengths!r}")
    written = write_synthetic_task(kind, haystack, output, lengths=[int(part) for part in parts],
                                   tokenizer=tokenizer, documents=documents, seed=seed)
    typer.echo(f"wrote {written} ({kind}, lengths {lengths}, {documents} documents each); run it with "
               f"`neobert-embed mteb --task-dir {written}` or `neobert-embed tasks lengths --task-dir {written}`")


@tasks_app.command("lengths")
def lengths_command(
    models: str = typer.Option(..., "--models", help="Comma-separated models (directories or names)."),
    task_dir: list[Path] = typer.Option(..., "--task-dir", help="Task directory with test_<length> splits "
                                        "(tasks synth, or a local copy of a LongEmbed task); repeatable."),
    output: Path = typer.Option(..., "--output", "-o", help="Where by_length.json|md|png go."),
    passages: str = typer.Option("both", "--passages", help="both | with | without."),
    batch_size: int = typer.Option(32, "--batch-size", min=1, max=opt.MAX_BATCH,
                                   help="Texts per forward pass (long texts are also capped by a token budget)."),
    precision: str = typer.Option("fp32", "--precision", help="Compute precision (fp32: published scores')."),
) -> None:
    """Score each model on each length through an exact index of each split, truncated and with --passages:
    a table by length bucket and a plot (a line per model and mode, score against length)."""
    from neobert_embed.errors import UserInputError
    from neobert_embed.evaluation.long_context import scores_by_length

    modes = {"both": (False, True), "with": (True,), "without": (False,)}
    if passages not in modes:
        raise UserInputError(f"--passages must be both, with or without, got {passages!r}")
    scores_by_length(opt.comma_list(models) or [], task_dir, output, passages=modes[passages],
                     batch_size=batch_size, compute_precision=precision)
    typer.echo((output / "by_length.md").read_text(encoding="utf-8"))
    typer.echo(f"table: {output / 'by_length.md'}, {output / 'by_length.json'}; plot: {output / 'by_length.png'}")


def register(app: typer.Typer) -> None:
    """Attach this area's commands to the main `neobert-embed` app."""
    app.command("mteb")(mteb_command)
    app.command("compare")(compare_command)
    app.add_typer(tasks_app, name="tasks")
