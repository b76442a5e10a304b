"""CLI commands of `neobert_embed.modeling` (registered on the main app by `neobert_embed.cli`)."""

from __future__ import annotations

from pathlib import Path

import typer

from neobert_embed import options as opt


def convert(
    source: str = typer.Argument(..., help="Official NeoBERT checkpoint directory, or hub id (e.g. "
                                 "chandar-lab/NeoBERT) when online."),
    output: Path = typer.Option(..., "--output", "-o", help="Directory to write the converted model to."),
    tokenizer: str = typer.Option(None, "--tokenizer", help="Tokenizer directory or hub id when SOURCE "
                                  "has no tokenizer files."),
    revision: str = typer.Option(None, "--revision", help="Hub revision (branch, tag or commit)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace OUTPUT if it exists."),
    no_wait: opt.NoWait = False,
) -> None:
    """Convert an official NeoBERT checkpoint into a directory that loads without remote code.

    Every key and shape is checked against config.json first; problems are listed by key and
    nothing is written. The output (weights, config, tokenizer) appears atomically.
    """
    from neobert_embed.console import spinner, user_console
    from neobert_embed.modeling.conversion import convert_checkpoint

    console = user_console(stderr=True)
    with spinner(f"converting {source} (strict key check, then re-load verification) …", console):
        report = convert_checkpoint(source, output, tokenizer=tokenizer, revision=revision,
                                    overwrite=overwrite, wait=not no_wait)
    console.print(
        f"[green]converted[/] {report.source} → {report.output}: {report.architecture}, "
        f"{report.num_tensors} tensors, {report.num_parameters:,} parameters, "
        f"{report.max_position_embeddings} positions; all keys and shapes matched.\n"
        f"Load it with `import neobert_embed; AutoModel.from_pretrained('{report.output}')` or "
        f"`neobert-embed encode --model {report.output} …`.",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    """Attach this area's commands to the main `neobert-embed` app."""
    app.command("convert")(convert)
