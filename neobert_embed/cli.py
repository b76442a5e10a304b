"""The ``neobert-embed`` command line: a thin shell over the library.

Each area of the toolkit owns its commands in ``neobert_embed/<area>/commands.py`` and attaches
them here. Heavy libraries (torch, transformers, faiss) are imported inside the commands, so
``--help`` is instant and a bad option fails before any model is loaded.
"""

from __future__ import annotations

import atexit
import gc
import shlex
import sys

import typer
from rich.markup import escape
from typer.core import TyperGroup

from neobert_embed import commands as general_commands
from neobert_embed.console import user_console
from neobert_embed.contrastive import commands as contrastive_commands
from neobert_embed.distributed import current_world, is_main_process
from neobert_embed.errors import UserInputError, system_failure
from neobert_embed.evaluation import commands as evaluation_commands
from neobert_embed.glue import commands as glue_commands
from neobert_embed.index import commands as index_commands
from neobert_embed.modeling import commands as modeling_commands
from neobert_embed.native_memory import bound_native_memory
from neobert_embed.pretraining import commands as pretraining_commands
from neobert_embed.runs import Interrupted
from neobert_embed.serve import commands as serve_commands


class _Root(TyperGroup):
    """Answers :class:`~neobert_embed.runs.Interrupted` with the command that resumes the run (exit 130)."""

    def parse_args(self, ctx, args):
        ctx.meta["argv"] = list(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except Interrupted as stop:
            if is_main_process():  # one message per torchrun job; the same command, never --overwrite
                words = [word for word in ctx.meta["argv"] if word != "--overwrite"]
                command = shlex.join([*_launcher(), *words, *(a for a in stop.resume_args if a not in words)])
                user_console(stderr=True).print(f"[yellow]interrupted[/]: {escape(str(stop))}\nResume with:\n  "
                                           f"{escape(command)}", highlight=False, soft_wrap=True)
            raise typer.Exit(130) from None


def _launcher() -> list[str]:
    """How this process was started: several processes resume under torchrun as they ran (add your
    launcher's node options for several machines), one process as the console script."""
    processes = current_world().local_size
    if processes > 1:
        return ["torchrun", f"--nproc-per-node={processes}", "-m", "neobert_embed.cli"]
    return ["neobert-embed"]


app = typer.Typer(
    name="neobert-embed",
    help="Build and judge text-embedding models: pretrain NeoBERT, fine-tune any encoder "
    "contrastively, evaluate on MTEB, and search with FAISS.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=_Root,
)

for _area in (general_commands, modeling_commands, contrastive_commands, evaluation_commands, index_commands,
              pretraining_commands, glue_commands, serve_commands):
    _area.register(app)


@app.callback()
def _root(ctx: typer.Context) -> None:
    """Build and judge text-embedding models (see each command's --help)."""
    from neobert_embed.console import show_records

    handler = show_records()  # the library's log records, on this command's stderr
    ctx.call_on_close(handler.detach)


def main() -> None:
    """Console-script entry point: user errors print one clear line and exit 2, not a traceback.

    The operating system's refusals (a full disk, a quota, a read-only file system, a name too
    long, a permission, memory, a busy port) are user errors too: one line naming the file and what to
    do (:func:`~neobert_embed.errors.system_failure`), exit 2. Click's own usage errors (typer vendors click, so they are recognised by their ``show`` and
    ``exit_code`` attributes) are printed as one line too, naming the command's ``--help``; Ctrl-C
    exits 130 after the command has said how to resume.

    At exit the garbage collector's objects are frozen: tearing the interpreter down would otherwise
    run full collections over the ~500k objects torch, transformers and the model made (1.5 to 3 s
    on a busy 2-core machine) for memory the operating system takes back anyway. Registered with
    :mod:`atexit`, so a process that calls ``main()`` several times (the tests) still collects
    until it exits.
    """
    bound_native_memory()  # before any command builds a kernel (native_memory says why)
    atexit.unregister(gc.freeze)  # once, however often main() runs in this process
    atexit.register(gc.freeze)
    console = user_console(stream=sys.stderr)  # the handler of the command is gone when it fails
    try:
        status = app(standalone_mode=False)
    except UserInputError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        console.print("[yellow]interrupted[/]: finished work was kept (see above for how to resume)")
        sys.exit(130)
    except Exception as exc:
        if hasattr(exc, "format_message") and getattr(exc, "exit_code", None) == 2:
            ctx = getattr(exc, "ctx", None)
            where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            console.print(f"[bold red]error:[/] {escape(' '.join(exc.format_message().split()) + where)}",
                          highlight=False, soft_wrap=True)
            sys.exit(2)
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            sys.exit(exc.exit_code)
        failure = system_failure(exc)  # a full disk, memory, a permission outside any writer: one line too
        if failure is None:
            raise
        console.print(f"[bold red]error:[/] {escape(str(failure))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    sys.exit(status or 0)


if __name__ == "__main__":
    main()
