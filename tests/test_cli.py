"""The command line as a whole: every command documents every option; --help is instant."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from neobert_embed.cli import app

runner = CliRunner()
EXPECTED = {"encode", "convert", "demo", "train-contrastive", "mine-negatives", "mteb", "compare", "pretrain",
            "index"}


def _walk(command, path=()):
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _walk(sub, (*path, name))


def _commands():
    return list(_walk(typer.main.get_command(app)))


def test_every_documented_command_exists():
    top_level = {path[0] for path, _ in _commands() if path}
    assert top_level >= EXPECTED


@pytest.mark.parametrize(("path", "command"), _commands(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_every_command_and_option_has_help(path, command):
    assert (command.help or "").strip(), f"{' '.join(path) or 'neobert-embed'} has no help text"
    for param in command.params:
        if param.name == "help":
            continue
        assert (getattr(param, "help", None) or "").strip(), f"{' '.join(path)}: {param.name} has no help"
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output


def test_cli_import_leaves_heavy_libraries_to_the_commands():
    """Only torch/transformers load with the package (NeoBERT's Auto registration needs them)."""
    heavy = ("mteb", "faiss", "deepspeed", "sentence_transformers", "datasets")
    code = f"import sys; from neobert_embed.cli import app; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"the CLI imported {out.strip()} at import time"
