"""Top-level CLI commands that belong to no single area: ``encode`` (and the demo)."""

from __future__ import annotations

from pathlib import Path

import typer


def encode(
    model: str = typer.Option(..., "--model", "-m", help="Registry key, hub id, HF or SentenceTransformer directory."),
    input_path: Path = typer.Option(..., "--input", "-i", help="Texts: .txt (one per line) or .jsonl."),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the embedding matrix (.npy)."),
    field: str = typer.Option("text", "--field", help="JSON field holding the text (jsonl input)."),
    precision: str = typer.Option("float32", "--precision",
                                  help="Stored precision: float32, float16, int8 or binary (packed bits)."),
    batch_size: int = typer.Option(32, "--batch-size", help="Texts per forward pass."),
    max_seq_length: int = typer.Option(None, "--max-length", help="Truncate inputs to this many tokens "
                                       "(default: the model's own max_seq_length; for a plain encoder, what its "
                                       "positions allow)."),
    prompt_name: str = typer.Option("document", "--prompt-name", help="Saved prompt to prepend (default "
                                    "'document' when the model saved one; '' for none)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON line."),
) -> None:
    """Encode a file of texts into an .npy matrix (length-batched, with progress)."""
    from neobert_embed.encoding import STORAGE_PRECISIONS, encode_file, report_json
    from neobert_embed.errors import UserInputError

    if precision not in STORAGE_PRECISIONS:
        raise UserInputError(f"--precision {precision!r} is not one of {', '.join(STORAGE_PRECISIONS)}")
    report = encode_file(model, input_path, output, field=field, precision=precision, batch_size=batch_size,
                         max_seq_length=max_seq_length, prompt_name=prompt_name, show_progress=not as_json)
    typer.echo(report.used, err=True)
    if as_json:
        typer.echo(report_json(report))
    else:
        typer.echo(f"encoded {report.texts} texts → {report.output} ({report.dimension}-d, {report.precision}) "
                   f"in {report.seconds:.1f} s: {report.texts_per_second:.1f} docs/s")


def demo(
    output: Path = typer.Option(Path("runs/demo"), "--output", "-o", help="Where every demo output goes."),
    fresh: bool = typer.Option(False, "--fresh", help="Start over instead of skipping finished stages."),
    quick: bool = typer.Option(False, "--quick", help="Seconds-long sizes for smoke tests (scores mean nothing)."),
) -> None:
    """Run the whole pipeline offline on the Python standard library's docstrings.

    Pretrains a small NeoBERT, fine-tunes it contrastively on (summary, body) pairs, evaluates it
    beside baselines on a held-out retrieval task, and indexes the corpus with FAISS. Finished
    stages are skipped when the command is rerun (after Ctrl-C, say); --fresh starts over.
    """
    from rich.console import Console

    from neobert_embed.demo.pipeline import DemoSettings, run_demo
    from neobert_embed.demo.summary import print_summary

    console = Console()
    console.print(f"[bold]neobert-embed demo[/] → {output} (rerun to continue after an interruption)")
    settings = DemoSettings.quick() if quick else DemoSettings()
    report = run_demo(output, settings, fresh=fresh,
                      on_stage=lambda s: console.print(f"[green]✓[/] {s.name} ({s.seconds:.0f} s): {s.figure}"))
    print_summary(report, console)


def register(app: typer.Typer) -> None:
    """Attach ``encode`` and ``demo`` to the main app."""
    app.command("encode")(encode)
    app.command("demo")(demo)
