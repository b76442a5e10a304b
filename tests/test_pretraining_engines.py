"""Engines own their checkpoint format: every engine is a ``TrainingEngine`` whose checkpoints
export through its own consolidated state dict, and a checkpoint replacement killed at any point
leaves a loadable checkpoint (the old or the new one, never none) and no debris after resume."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from pretraining_helpers import single_thread, tiny_recipe, write_docstring_corpus

from neobert_embed.pretraining import export_checkpoint, prepare_corpus, pretrain, trainer
from neobert_embed.pretraining.checkpoint import consolidated_state_dict, find_checkpoint
from neobert_embed.pretraining.engine import CHECKPOINT_FORMATS, TrainingEngine
from neobert_embed.pretraining.recipe import parse_pretrain_recipe

STEP2 = "step-00000002"


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine-corpus")
    raw = write_docstring_corpus(root / "docs.jsonl", limit=150)
    return prepare_corpus(raw, root / "prepared", tokenizer="train", vocab_size=300, progress=False).path


@pytest.mark.parametrize(("engine", "zero_stage"), [("torch", 0), ("deepspeed", 0), ("deepspeed", 2)])
def test_every_engine_is_a_training_engine_whose_checkpoints_export(corpus, tmp_path, monkeypatch, engine,
                                                                     zero_stage):
    real_build, built = trainer.build_engine, []
    monkeypatch.setattr(trainer, "build_engine", lambda *args: built.append(real_build(*args)) or built[-1])
    result = pretrain(parse_pretrain_recipe(tiny_recipe(engine=engine, zero_stage=zero_stage, max_steps=2)),
                      corpus, tmp_path / "run", progress=False)
    assert isinstance(built[0], TrainingEngine) and CHECKPOINT_FORMATS[engine] is type(built[0])
    weights = consolidated_state_dict(find_checkpoint(tmp_path / "run"))
    trained = result.model.state_dict()
    assert {key.removeprefix("mlm.") for key in weights} == set(trained)
    assert all(torch.equal(value, trained[key.removeprefix("mlm.")]) for key, value in weights.items())
    again = export_checkpoint(tmp_path / "run", tmp_path / "export", progress=False)
    assert (again / "model.safetensors").is_file()


# Run in a child process: resume the run, press Ctrl-C before the first step (the interrupt
# re-saves the same step, replacing its checkpoint) and SIGKILL itself at the chosen point.
KILLED_CHILD = r"""
import json, os, shutil, signal, sys
import torch
from neobert_embed.pretraining import checkpoint, pretrain
from neobert_embed.pretraining.batches import BatchMaker
from neobert_embed.pretraining.engine import TorchEngine
from neobert_embed.pretraining.recipe import parse_pretrain_recipe

recipe, corpus, run, point = json.loads(sys.argv[1])
torch.set_num_threads(1)
kill = lambda: os.kill(os.getpid(), signal.SIGKILL)
events = []

def counted(real):
    def call(*args, **kwargs):
        events.append(real)
        if point == f"before-move-{len(events)}":
            kill()
        return real(*args, **kwargs)
    return call

def replace_directory(source, target, real=checkpoint.replace_directory):
    os.replace, shutil.rmtree = counted(os.replace), counted(shutil.rmtree)
    real(source, target)

def interrupt(self, stream, step):
    raise KeyboardInterrupt

def save_then_die(self, directory, real=TorchEngine.save):
    real(self, directory)
    kill()

checkpoint.replace_directory = replace_directory
BatchMaker.step_batches = interrupt
if point == "inside-engine-save":
    TorchEngine.save = save_then_die
pretrain(parse_pretrain_recipe(recipe), corpus, run, resume=True, progress=False)
"""

# move 1 puts the old checkpoint aside, move 2 the new one in place, move 3 deletes the old copy
KILL_POINTS = {"inside-engine-save": {STEP2, ".step-00000002.saving.tmp"},
               "before-move-2": {".step-00000002.old-*", ".step-00000002.saving.tmp"},
               "before-move-3": {STEP2, ".step-00000002.old-*"}}


@pytest.mark.slow
def test_a_killed_checkpoint_replacement_never_leaves_the_run_without_a_loadable_checkpoint(corpus, tmp_path):
    from transformers import AutoModelForMaskedLM

    recipe = tiny_recipe(max_steps=4)
    base = tmp_path / "base"
    pretrain(parse_pretrain_recipe(recipe), corpus, base, stop_after_steps=2, progress=False)
    expected = consolidated_state_dict(base / "checkpoints" / STEP2)
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    for point, left in KILL_POINTS.items():
        run = tmp_path / point
        shutil.copytree(base, run)
        child = subprocess.run([sys.executable, "-c", KILLED_CHILD, json.dumps([recipe, str(corpus), str(run), point])],
                               capture_output=True, text=True, env=env, timeout=300)
        assert child.returncode == -9, (point, child.stderr[-2000:])
        found = {path.name for path in (run / "checkpoints").iterdir()}
        assert {name.split(".old-")[0] + (".old-*" if ".old-" in name else "") for name in found} == left, point
        exported = export_checkpoint(run, tmp_path / f"{point}-export", progress=False)
        model = AutoModelForMaskedLM.from_pretrained(str(exported))
        assert all(torch.equal(value, expected[f"mlm.{key}"]) for key, value in model.state_dict().items()), point
        resumed = pretrain(parse_pretrain_recipe(recipe), corpus, run, resume=True, stop_after_steps=1,
                           progress=False)
        assert resumed.step == 3, point
        assert sorted(path.name for path in (run / "checkpoints").iterdir()) == [STEP2, "step-00000003"], point
