"""The command line as a whole: every command documents every option; --help imports no torch."""

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


HEAVY = ("torch", "transformers", "mteb", "faiss", "deepspeed", "sentence_transformers", "datasets")


def _imported_modules(*args: str) -> set[str]:
    """Top-level modules a fresh ``python -X importtime`` process imported while running ``args``."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("argv", [["--help"], ["index", "build", "--help"], ["mteb", "--help"]],
                         ids=lambda a: " ".join(a))
def test_help_imports_neither_torch_nor_transformers(argv):
    imported = _imported_modules("-m", "neobert_embed.cli", *argv)
    assert "typer" in imported  # the probe sees real imports
    assert not imported & set(HEAVY), f"--help imported {sorted(imported & set(HEAVY))}"


def test_importing_the_package_still_registers_neobert():
    """Light ``import neobert_embed``, then transformers: NeoBERT is an Auto class, in either order."""
    checks = [f"{code}; c = transformers.AutoConfig.for_model('neobert', hidden_size=64, num_attention_heads=2);"
              " m = transformers.AutoModel.from_config(c); print(type(c).__name__, type(m).__name__)"
              for code in ("import sys, neobert_embed; assert 'torch' not in sys.modules; import transformers",
                           "import transformers, neobert_embed")]
    procs = [subprocess.Popen([sys.executable, "-c", check], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for check in checks]  # side by side: each is mostly imports
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        assert out.split() == ["NeoBERTConfig", "NeoBERTModel"]


MODELING_MODULES = ("configuration", "model", "rotary", "attention", "conversion", "auto")


def test_any_modeling_module_imported_first_registers_neobert():
    """A modeling module that is the first to import transformers must not hit a circular import.

    ``neobert-embed convert`` once failed with "partially initialized module" because conversion
    imported ``configuration`` before anything else had loaded transformers. One fresh interpreter
    imports torch (which loads no transformers) and forks one child per module, so each child's
    first import of transformers comes from that module, without paying torch's import six times.
    """
    script = f"""
import os, sys, torch
children = {{}}
for first in {MODELING_MODULES!r}:
    pid = os.fork()
    if pid == 0:
        try:
            assert "transformers" not in sys.modules and "neobert_embed" not in sys.modules
            __import__(f"neobert_embed.modeling.{{first}}")
            import transformers
            c = transformers.AutoConfig.for_model("neobert", hidden_size=64, num_attention_heads=2)
            os.write(1, f"{{first}} {{type(transformers.AutoModel.from_config(c)).__name__}}\\n".encode())  # one write
            os._exit(0)
        except BaseException as exc:
            print(first, "FAILED", repr(exc), file=sys.stderr, flush=True)
            os._exit(1)
    children[pid] = first
failed = [children[pid] for pid in children if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0]
sys.exit(f"failed: {{failed}}" if failed else 0)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert sorted(out.stdout.split("\n")[:-1]) == sorted(f"{first} NeoBERTModel" for first in MODELING_MODULES)
