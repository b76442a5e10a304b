"""The command line as a whole: every command documents every option; --help is instant."""

from __future__ import annotations

import subprocess
import sys
import time

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


def test_help_does_not_import_heavy_libraries():
    code = ("import sys, time; t = time.perf_counter(); from neobert_embed.cli import app; "
            "print(time.perf_counter() - t, 'torch' in sys.modules, 'mteb' in sys.modules, 'faiss' in sys.modules)")
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[1:] == ["False", "False", "False"], "the CLI imported a heavy library at import time"
    assert time.perf_counter() - start < 30
