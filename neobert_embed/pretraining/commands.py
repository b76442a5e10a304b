"""CLI commands of `neobert_embed.pretraining` (registered on the main app by `neobert_embed.cli`).

``neobert-embed pretrain --recipe FILE --corpus FILE|DIR --output DIR`` trains;
``neobert-embed pretrain prepare …`` tokenizes a corpus; ``neobert-embed pretrain export …``
turns a checkpoint into a Hugging Face model directory.
"""

from __future__ import annotations

from pathlib import Path

import typer

from neobert_embed import options as opt

pretrain_app = typer.Typer(
    help="MLM pretraining of NeoBERT (DeepSpeed ZeRO 0-3, or plain PyTorch). Run with --recipe/--corpus/"
    "--output to train, or use the prepare / export subcommands.",
    invoke_without_command=True, no_args_is_help=False)


@pretrain_app.callback()
def pretrain_command(
    ctx: typer.Context,
    recipe: Path = typer.Option(None, "--recipe", help="Pretraining recipe YAML (recipes/pretrain-*.yaml)."),
    corpus: str = typer.Option(None, "--corpus", help="Raw corpus file/dir/HF dataset, or a prepared dir."),
    output: Path = typer.Option(None, "--output", help="Run directory: checkpoints, metrics.jsonl, final/."),
    max_steps: int = typer.Option(None, "--max-steps", min=1, max=opt.MAX_STEPS, help="Override training.max_steps (schedule follows)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest usable checkpoint."),
    stop_after_steps: int = typer.Option(None, "--stop-after-steps", min=1, max=opt.MAX_STEPS,
                                         help="Leave after N steps of this session (checkpointed); --resume later."),
    no_wait: opt.NoWait = False,
    verbose: opt.Verbose = False,
) -> None:
    """Pretrain NeoBERT with masked language modelling.

    Launch several processes with `torchrun --nproc-per-node N -m neobert_embed.cli pretrain ...`.
    """
    if ctx.invoked_subcommand is not None:
        return
    if recipe is None or corpus is None or output is None:
        missing = [name for name, value in (("--recipe", recipe), ("--corpus", corpus), ("--output", output))
                   if value is None]
        if len(missing) == 3:
            typer.echo(ctx.get_help())
            raise typer.Exit(0)
        from neobert_embed.errors import UserInputError

        raise UserInputError(f"pretrain needs {', '.join(missing)} (see `neobert-embed pretrain --help`)")
    from neobert_embed.console import third_party_log
    from neobert_embed.outputs import check_output_directory
    from neobert_embed.pretraining.recipe import load_pretrain_recipe
    from neobert_embed.pretraining.train import pretrain
    from neobert_embed.records import RUN
    from neobert_embed.runs import CHECKPOINTS_DIR

    settings = load_pretrain_recipe(recipe)  # a bad recipe is refused before anything is created
    check_output_directory(output, record=(RUN, CHECKPOINTS_DIR), inputs=[corpus], what="pretraining run")
    with third_party_log(output, verbose):  # (a bad --output is refused before its log is made)
        pretrain(settings, corpus, output, max_steps=max_steps, resume=resume, stop_after_steps=stop_after_steps,
                 wait=not no_wait)


@pretrain_app.command("prepare")
def prepare_command(
    corpus: str = typer.Option(..., "--corpus", help=".txt (a document per line), .jsonl, .json, .csv, "
                               ".parquet, a directory of them, or a Hugging Face dataset id."),
    output: Path = typer.Option(..., "--output", help="Directory of the tokenized corpus."),
    tokenizer: str = typer.Option("google-bert/bert-base-uncased", "--tokenizer",
                                  help="Hub id, local directory, or 'train' (WordPiece on this corpus)."),
    vocab_size: int = typer.Option(None, "--vocab-size", min=100, max=10_000_000, help="Vocabulary size for --tokenizer train."),
    text_field: str = typer.Option("text", "--text-field", help="Field/column holding the document."),
    num_proc: int = typer.Option(1, "--num-proc", min=1, help="Tokenizing processes."),
    split: str = typer.Option("train", "--split", help="Split of a Hugging Face dataset."),
    streaming: bool = typer.Option(False, "--streaming", help="Stream a Hugging Face dataset."),
    shard_documents: int = typer.Option(20_000, "--shard-documents", min=1,
                                        help="Documents per shard (the unit of resumption)."),
    no_wait: opt.NoWait = False,
    verbose: opt.Verbose = False,
) -> None:
    """Tokenize a corpus into an on-disk dataset; rerun the same command to resume."""
    from neobert_embed.console import third_party_log
    from neobert_embed.pretraining.prepare import prepare_corpus

    with third_party_log(output, verbose):
        prepare_corpus(corpus, output, tokenizer=tokenizer, vocab_size=vocab_size, text_field=text_field,
                       num_proc=num_proc, split=split, streaming=streaming, shard_documents=shard_documents,
                       wait=not no_wait)


@pretrain_app.command("export")
def export_command(
    source: Path = typer.Argument(..., help="A pretraining output directory or one checkpoint directory."),
    output: Path = typer.Option(..., "--output", help="Hugging Face model directory to write."),
    no_wait: opt.NoWait = False,
) -> None:
    """Export a checkpoint (ZeRO shards consolidated to fp32) as a Hugging Face MLM model."""
    from neobert_embed.pretraining.export import export_checkpoint

    export_checkpoint(source, output, wait=not no_wait)


def register(app: typer.Typer) -> None:
    """Attach this area's commands to the main `neobert-embed` app."""
    app.add_typer(pretrain_app, name="pretrain")
