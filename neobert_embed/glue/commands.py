"""CLI command of `neobert_embed.glue` (registered on the main app by `neobert_embed.cli`).

``glue`` fine-tunes one or more backbones on GLUE with a preset grid and writes the paper's
table. Heavy imports happen inside the command so ``--help`` is instant.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from neobert_embed import options as opt
from neobert_embed.errors import UserInputError


def glue_command(
    model: list[str] = typer.Option(..., "--model", "-m",
                                    help="Registry key (bert, roberta, modernbert, neobert, ...), hub id, HF model dir, "
                                         "`pretrain export` dir or SentenceTransformer dir. Repeat for one table row "
                                         "per model."),
    output: Path = typer.Option(..., "--output", "-o", help="Run directory; rerun the same command to continue."),
    tasks: str = typer.Option(None, "--tasks", "-t",
                              help="Comma-separated GLUE tasks from the hub: cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte."),
    task_dir: list[Path] = typer.Option(None, "--task-dir",
                                        help="Local task directory (task.json + train/validation.jsonl); repeatable."),
    preset: str = typer.Option("quick", "--preset", "-p", help="quick, paper or a YAML grid file."),
    seeds: int = typer.Option(None, "--seeds", min=1, max=1000, help="Run seeds 0..N-1 for every configuration."),
    epochs: float = typer.Option(None, "--epochs", parser=opt.positive_float(1000.0), help="Override the preset's epochs."),
    max_length: opt.MaxLength = None,
    batch_size: int = typer.Option(None, "--batch-size", min=1, max=opt.MAX_BATCH, help="One batch size instead of the preset's grid."),
    learning_rate: float = typer.Option(None, "--lr", parser=opt.positive_float(opt.MAX_LEARNING_RATE), help="One learning rate instead of the preset's grid."),
    devices: str = typer.Option(None, "--devices", help="Parallel trials, one per device: cuda:0,cuda:1 (or cpu,cpu)."),
    predict_test: bool = typer.Option(False, "--predict-test",
                                      help="Write GLUE-server TSVs for tasks with (unlabelled) test files."),
    as_json: opt.AsJson = False,
    no_wait: opt.NoWait = False,
    verbose: opt.Verbose = False,
) -> None:
    """Fine-tune on GLUE with the paper's protocol (any backbone) and write its table.

    A grid preset reports, per task, its best configuration on validation, as in the paper (optimistic); a
    single-configuration preset (quick) selects nothing, and its summary says so.
    """
    from neobert_embed.console import json_only_stdout, third_party_log
    from neobert_embed.distributed import parse_devices
    from neobert_embed.glue.presets import load_glue_preset
    from neobert_embed.glue.run import run_glue

    if not tasks and not task_dir:
        raise UserInputError("no tasks: pass --tasks cola,sst2,... (hub) or --task-dir DIR (local)")
    loaded = load_glue_preset(preset, seeds=None if seeds is None else list(range(seeds)), epochs=epochs,
                              max_length=max_length, batch_size=None if batch_size is None else [batch_size],
                              learning_rate=None if learning_rate is None else [learning_rate])
    device_list = parse_devices(devices) if devices else None
    show_progress = not as_json or sys.stderr.isatty()
    with third_party_log(output, verbose), json_only_stdout(as_json):
        result = run_glue(model, output, tasks=opt.comma_list(tasks), task_dirs=task_dir or [], preset=loaded,
                          devices=device_list, predict_test=predict_test, progress=show_progress,
                          preset_name=Path(preset).stem, wait=not no_wait)
    first = next(iter(result.scores.values()), {})
    if as_json:
        typer.echo(json.dumps({"scores": first, "models": result.scores, "summary": str(result.summary_md),
                               "trials": {"run": result.trials_run, "skipped": result.trials_skipped},
                               "submission": [str(p) for p in result.submissions]}, indent=2, sort_keys=True))
        return
    typer.echo(result.summary_md.read_text(encoding="utf-8"))
    typer.echo(f"ran {result.trials_run} trial(s), skipped {result.trials_skipped} finished; table in "
               f"{result.summary_md} and {result.summary_csv}, chart {result.plot}"
               + (f", {len(result.submissions)} GLUE-server file(s) in {output / 'submission'}"
                  if result.submissions else ""))


def register(app: typer.Typer) -> None:
    """Attach this area's commands to the main `neobert-embed` app."""
    app.command("glue")(glue_command)
