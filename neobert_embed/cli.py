"""The ``neobert-embed`` command line: a thin shell over the library.

Each area of the toolkit owns its commands in ``neobert_embed/<area>/commands.py`` and attaches
them here. Heavy libraries (torch, transformers, faiss) are imported inside the commands, so
``--help`` is instant and a bad option fails before any model is loaded.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from neobert_embed.contrastive import commands as contrastive_commands
from neobert_embed.errors import UserInputError
from neobert_embed.evaluation import commands as evaluation_commands
from neobert_embed.index import commands as index_commands
from neobert_embed.modeling import commands as modeling_commands
from neobert_embed.pretraining import commands as pretraining_commands

app = typer.Typer(
    name="neobert-embed",
    help="Build and judge text-embedding models: pretrain NeoBERT, fine-tune any encoder "
    "contrastively, evaluate on MTEB, and search with FAISS.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

for _area in (modeling_commands, contrastive_commands, evaluation_commands, index_commands,
              pretraining_commands):
    _area.register(app)


def main() -> None:
    """Console-script entry point: user errors print one clear line and exit 2, not a traceback."""
    console = Console(stderr=True)
    try:
        app(standalone_mode=False)
    except UserInputError as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]; completed work was kept (see the messages above "
                      "for how to resume)")
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:  # click's own usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if isinstance(exc, click.exceptions.Abort):
            console.print("[yellow]aborted[/]")
            sys.exit(130)
        raise


if __name__ == "__main__":
    main()
