"""CLI commands of `neobert_embed.contrastive` (registered on the main app by `neobert_embed.cli`).

``train-contrastive`` fine-tunes any encoder with the recipe; ``mine-negatives`` adds hard
negatives to a pairs file. Heavy imports happen inside the commands so ``--help`` is instant.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from neobert_embed import options as opt
from neobert_embed.errors import UserInputError


def _parse_range(value: str | None) -> tuple[int, int | None]:
    if value is None:
        return 0, None
    low, sep, high = value.partition(":")
    if not sep:
        low, high = "0", low
    try:
        return int(low or 0), int(high) if high else None
    except ValueError:
        raise UserInputError(f"--range {value!r}: expected MIN:MAX ranks, e.g. 10:50 (or MAX)") from None


def train_contrastive_command(
    output: Path = typer.Option(..., "--output", "-o", help="Run directory: becomes the SentenceTransformer."),
    model: str = typer.Option(None, "--model", "-m",
                              help="Registry key (bert, roberta, nomicbert, modernbert, neobert, ...), hub id, "
                                   "HF model dir or SentenceTransformer dir. Optional with --resume."),
    data: list[str] = typer.Option(None, "--data", "-d",
                                   help="NAME=PATH (repeatable): .jsonl/.json/.csv/.parquet, a directory, "
                                        "saved dataset or hub id."),
    recipe: Path = typer.Option(None, "--recipe", "-r", help="YAML recipe (default: the paper's settings)."),
    max_steps: int = typer.Option(None, "--max-steps", min=1, max=opt.MAX_STEPS, help="Override the recipe's max_steps."),
    text_budget: int = typer.Option(None, "--text-budget", min=2, max=opt.MAX_BATCH, help="Texts per step (clears batch_size)."),
    batch_size: int = typer.Option(None, "--batch-size", min=2, max=opt.MAX_BATCH, help="Examples per step (clears text_budget)."),
    learning_rate: float = typer.Option(None, "--lr", parser=opt.positive_float(opt.MAX_LEARNING_RATE), help="Override the recipe's learning_rate."),
    temperature: float = typer.Option(None, "--temperature", parser=opt.positive_float(opt.MAX_TEMPERATURE), help="Override the InfoNCE temperature."),
    max_length: opt.MaxLength = None,
    cached: bool = typer.Option(None, "--cached/--no-cached", help="GradCache loss (large batches, low memory)."),
    seed: int = typer.Option(None, "--seed", min=0, max=opt.MAX_SEED, help="Override the recipe's seed."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in --output."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing run in --output."),
    as_json: opt.AsJson = False,
    no_wait: opt.NoWait = False,
    verbose: opt.Verbose = False,
) -> None:
    """Fine-tune an encoder into an embedding model with the contrastive recipe.

    Multi-GPU: torchrun --nproc_per_node N -m neobert_embed.cli train-contrastive ... (DDP);
    DeepSpeed: set 'deepspeed: ds_config.json' in the recipe.
    """
    from neobert_embed.console import json_only_stdout, third_party_log
    from neobert_embed.contrastive import load_contrastive_recipe, train_contrastive
    from neobert_embed.model_files import check_length_flag, check_model_files
    from neobert_embed.runs import METRICS_FILE

    checked = None
    if model is not None:
        checked = check_model_files(model)  # handed to the loader: the files are inspected once
        check_length_flag(model, max_length, "--max-length")
    overrides = {"max_steps": max_steps, "text_budget": text_budget, "batch_size": batch_size,
                 "learning_rate": learning_rate, "temperature": temperature, "max_length": max_length,
                 "cached": cached, "seed": seed}
    given = recipe is not None or any(v is not None for v in overrides.values())
    loaded = load_contrastive_recipe(recipe, **overrides) if given else None
    with third_party_log(output, verbose), json_only_stdout(as_json):
        out = train_contrastive(model=checked, data=opt.parse_data_option(data or []) or None, output=output,
                                recipe=loaded, resume=resume, overwrite=overwrite, wait=not no_wait)
    from neobert_embed.contrastive.train import TrainingSummary
    from neobert_embed.records import TRAINING_SUMMARY

    if not TRAINING_SUMMARY.exists(out):  # a non-zero rank under torchrun: rank 0 reports
        return
    summary = TRAINING_SUMMARY.validate(out, TrainingSummary)
    if as_json:
        typer.echo(json.dumps(summary.model_dump(), indent=2, sort_keys=True))
    else:
        precision = f" ({summary.precision})" if summary.precision else ""
        loss = ("no loss logged (logging_steps is above the steps run)" if summary.final_loss is None
                else f"final loss {summary.final_loss:.4f}")
        typer.echo(f"saved {out} (SentenceTransformer, prompts 'query'/'document'); "
                   f"{summary.steps} steps{precision}, {loss}; "
                   f"metrics in {out / METRICS_FILE}, summary in {TRAINING_SUMMARY.path(out)}")


def mine_negatives_command(
    model: str = typer.Option(..., "--model", "-m", help="Model that ranks candidates (key, hub id or dir)."),
    data: Path = typer.Option(..., "--data", "-d", help="Pairs file (query/positive columns)."),
    output: Path = typer.Option(..., "--output", "-o", help="JSON-lines file: anchor, positive, negative_1..n."),
    num_negatives: int = typer.Option(3, "--num-negatives", "-n", min=1, max=1000, help="Negatives per row."),
    rank_range: str = typer.Option(None, "--range",
                                   help="Candidate ranks MIN:MAX (skip the top MIN to avoid false negatives)."),
    margin: float = typer.Option(None, "--margin", parser=opt.finite_float(0.0), help="Keep candidates scoring ≥ margin below the positive."),
    batch_size: opt.BatchSize = 32,
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing output written by mine-negatives."),
    max_length: opt.MaxLength = None,
    precision: opt.ComputePrecision = "auto",
    device: opt.Device = None,
    verbose: opt.Verbose = False,
) -> None:
    """Mine hard negatives with FAISS; the output is ready for train-contrastive.

    The model encodes with its own max_seq_length and its saved "query"/"document" prompts, at
    --precision (auto: measured on a few of the pairs); the used: line and OUTPUT.json say which.
    """
    from neobert_embed.console import third_party_log
    from neobert_embed.contrastive.mining import mine_negatives

    range_min, range_max = _parse_range(rank_range)
    with third_party_log(output, verbose):
        out = mine_negatives(model, data, output, num_negatives=num_negatives, range_min=range_min,
                             range_max=range_max, margin=margin, batch_size=batch_size, max_seq_length=max_length,
                             overwrite=overwrite, precision=precision, device=device)
    typer.echo(f"wrote {out}")


def register(app: typer.Typer) -> None:
    """Attach this area's commands to the main `neobert-embed` app."""
    app.command("train-contrastive")(train_contrastive_command)
    app.command("mine-negatives")(mine_negatives_command)
