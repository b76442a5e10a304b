"""Pretraining runs end to end on tiny NeoBERTs: DeepSpeed ZeRO stages, exact resume, export,
Ctrl-C, corrupt checkpoints, NaN handling, the plain-PyTorch fallback and the CLI; every engine is
a ``TrainingEngine`` whose checkpoints export through its own consolidated state dict, and a
checkpoint replacement killed at any point leaves a loadable checkpoint and, after resume, no debris."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest
import torch
import yaml
from pretraining_helpers import ctrl_c_at_step, losses, single_thread, tiny_recipe, write_docstring_corpus
from typer.testing import CliRunner

from neobert_embed.errors import UserInputError
from neobert_embed.pretraining import export_checkpoint, prepare_corpus, pretrain
from neobert_embed.pretraining import train as pretrain_module
from neobert_embed.pretraining.checkpoint import consolidated_state_dict, find_checkpoint
from neobert_embed.pretraining.engine import CHECKPOINT_FORMATS, TrainingEngine
from neobert_embed.pretraining.recipe import parse_pretrain_recipe
from neobert_embed.runs import Interrupted

STEP2 = "step-00000002"


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrain-corpus")
    raw = write_docstring_corpus(root / "docs.jsonl", limit=300)
    prepared = prepare_corpus(raw, root / "prepared", tokenizer="train", vocab_size=300, progress=False)
    return prepared.path


def _recipe(**training):
    return parse_pretrain_recipe(tiny_recipe(**training))


@pytest.mark.parametrize("zero_stage", [0, 1, 2])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_deepspeed_zero_stages_lower_the_loss(corpus, tmp_path, zero_stage, precision):
    recipe = _recipe(engine="deepspeed", zero_stage=zero_stage, precision=precision, max_steps=5)
    result = pretrain(recipe, corpus, tmp_path / "run", progress=False)
    curve = losses(result.metrics_path)
    assert result.finished and len(curve) == 5
    # 0.02, not more: the WordPiece vocabulary of the fixture is trained anew each run and the
    # tokenizers library orders tied pieces differently from run to run (drops of 0.045-0.06 seen)
    assert curve[5] < curve[1] - 0.02, curve
    rows = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    assert all(r["grad_norm"] is not None and r["grad_norm"] > 0 and r["real_token_fraction"] >= 0.95 for r in rows)
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def test_resume_matches_uninterrupted_run_and_export_matches_training_model(corpus, tmp_path):
    recipe = _recipe(engine="deepspeed", zero_stage=1, gradient_accumulation_steps=2, max_steps=8)
    full = pretrain(recipe, corpus, tmp_path / "full", progress=False)
    first = pretrain(recipe, corpus, tmp_path / "split", stop_after_steps=3, progress=False)
    assert first.step == 3 and not first.finished and first.export_dir is None
    resumed = pretrain(recipe, corpus, tmp_path / "split", resume=True, progress=False)
    expected, got = losses(full.metrics_path), losses(resumed.metrics_path)
    assert sorted(got) == list(range(1, 9))
    for step in range(4, 9):
        assert abs(got[step] - expected[step]) <= 1e-5, (step, got[step], expected[step])

    from transformers import AutoModelForMaskedLM

    exported = AutoModelForMaskedLM.from_pretrained(str(full.export_dir)).eval()
    ids = torch.randint(5, 300, (2, 24), generator=torch.Generator().manual_seed(0))
    trained = full.model.eval()
    assert torch.allclose(_logits(exported, ids), _logits(trained, ids), atol=1e-5)
    again = export_checkpoint(tmp_path / "full", tmp_path / "again", progress=False)
    assert torch.equal(_logits(AutoModelForMaskedLM.from_pretrained(str(again)), ids), _logits(exported, ids))


def test_zero3_export_consolidates_the_sharded_weights(corpus, tmp_path):
    import deepspeed
    from transformers import AutoModelForMaskedLM

    result = pretrain(_recipe(engine="deepspeed", zero_stage=3, max_steps=3), corpus, tmp_path / "z3",
                      progress=False)
    exported = AutoModelForMaskedLM.from_pretrained(str(result.export_dir)).eval()
    ids = torch.randint(5, 300, (2, 24), generator=torch.Generator().manual_seed(1))
    with deepspeed.zero.GatheredParameters(list(result.model.parameters())):
        trained = _logits(result.model.eval(), ids)
    assert torch.allclose(_logits(exported, ids), trained, atol=1e-5)
    assert not torch.allclose(exported.decoder.bias, torch.zeros_like(exported.decoder.bias))


def test_ctrl_c_saves_a_resumable_checkpoint(corpus, tmp_path, monkeypatch):
    recipe = parse_pretrain_recipe(tiny_recipe() | {"checkpoint": {"every_steps": 100, "keep_last": 2}})
    reference = pretrain(recipe, corpus, tmp_path / "reference", progress=False)
    undo = ctrl_c_at_step(monkeypatch, 3)
    with pytest.raises(Interrupted, match="checkpoint of step 3 saved"):
        pretrain(recipe, corpus, tmp_path / "run", progress=False)
    assert (tmp_path / "run" / "checkpoints" / "step-00000003").is_dir()
    undo()
    resumed = pretrain(recipe, corpus, tmp_path / "run", resume=True, progress=False)
    expected, got = losses(reference.metrics_path), losses(resumed.metrics_path)
    assert all(abs(got[s] - expected[s]) <= 1e-6 for s in range(1, 7))


def test_corrupt_newest_checkpoint_falls_back_with_a_warning(corpus, tmp_path):
    recipe = _recipe()
    run = tmp_path / "run"
    pretrain(recipe, corpus, run, stop_after_steps=4, progress=False)
    newest = run / "checkpoints" / "step-00000004" / "engine.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    with pytest.raises(UserInputError, match="step-00000004.*contents changed"):
        export_checkpoint(run / "checkpoints" / "step-00000004", tmp_path / "bad-export", progress=False)
    with pytest.warns(UserWarning, match="skipping corrupt checkpoint.*step-00000004"):
        result = pretrain(recipe, corpus, run, resume=True, progress=False)
    assert result.finished and result.step == 6
    for checkpoint in (run / "checkpoints").iterdir():
        (checkpoint / "trainer_state.json").write_text("{broken")
    with pytest.raises(UserInputError, match="every checkpoint .* is corrupt"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pretrain(recipe, corpus, run, resume=True, progress=False)


def test_existing_run_needs_resume_and_cpu_threads_apply(corpus, tmp_path, monkeypatch):
    torch.set_num_threads(2)
    set_threads = torch.set_num_threads
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), set_threads(n)))
    pretrain(_recipe(max_steps=2, cpu_threads=1), corpus, tmp_path / "run", progress=False)
    assert calls == [1, 2] and torch.get_num_threads() == 2  # applied for the run, restored after
    assert "WORLD_SIZE" not in os.environ  # the world-of-one variables do not leak
    with pytest.raises(UserInputError, match="already holds a run.*--resume"):
        pretrain(_recipe(max_steps=2), corpus, tmp_path / "run", progress=False)


def test_resume_with_changed_settings_is_refused_naming_each_key(corpus, tmp_path):
    run = tmp_path / "run"
    pretrain(_recipe(max_steps=4), corpus, run, stop_after_steps=2, progress=False)
    changed = tiny_recipe(max_steps=4, micro_batch_size=2)
    changed["masking"] = {"rate": 0.3}
    with pytest.raises(UserInputError, match=r"masking\.rate \(0\.2 → 0\.3\), training\.micro_batch_size \(4 → 2\)"):
        pretrain(parse_pretrain_recipe(changed), corpus, run, resume=True, progress=False)
    with pytest.raises(UserInputError, match=r"--resume must continue the same run, but corpus"):
        pretrain(_recipe(max_steps=4), tmp_path / "another-corpus", run, resume=True, progress=False)
    # operational keys (logging, checkpoint cadence, threads) may change; the run continues exactly
    result = pretrain(_recipe(max_steps=4, log_every_steps=2, cpu_threads=1), corpus, run, resume=True,
                      progress=False)
    assert result.finished and result.step == 4


def test_non_finite_losses_are_skipped_then_stop_the_run(corpus, tmp_path):
    data = tiny_recipe(max_bad_steps=2, max_steps=20)
    data["optimizer"] = {"lr": 1e30, "grad_clip": 0.0}
    data["schedule"] = {"warmup_steps": 0}
    with pytest.raises(UserInputError, match="NaN/inf for 2 steps in a row"):
        pretrain(parse_pretrain_recipe(data), corpus, tmp_path / "run", progress=False)
    rows = [r for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert '"skipped_steps": 2' in rows[-1]


def test_without_deepspeed_the_loop_runs_in_plain_pytorch(corpus, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # import deepspeed -> ImportError
    recipe = _recipe(engine="auto", zero_stage=2, max_steps=3)
    with pytest.warns(UserWarning, match="deepspeed is not installed.*zero_stage 2 ignored"):
        result = pretrain(recipe, corpus, tmp_path / "run", progress=False)
    assert result.finished and (tmp_path / "run" / "checkpoints" / "step-00000003" / "engine.pt").is_file()


def test_cli_prepare_pretrain_export(tmp_path):
    from transformers import AutoModelForMaskedLM

    from neobert_embed.cli import app
    from neobert_embed.sentence import load_sentence_model

    runner = CliRunner()
    raw = write_docstring_corpus(tmp_path / "docs.jsonl", limit=80)
    recipe = tiny_recipe()
    recipe["tokenizer"] = {"source": "train", "vocab_size": 300}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(recipe))
    result = runner.invoke(app, ["pretrain", "--recipe", str(tmp_path / "tiny.yaml"), "--corpus", str(raw),
                                 "--output", str(tmp_path / "run"), "--max-steps", "2"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "prepared" / "corpus.json").is_file()
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(recipe | {"optimizer": {"lr": 1e-3}}))
    result = runner.invoke(app, ["pretrain", "--recipe", str(tmp_path / "changed.yaml"), "--corpus", str(raw),
                                 "--output", str(tmp_path / "run"), "--max-steps", "4", "--resume"])
    assert isinstance(result.exception, UserInputError), result.output
    assert "optimizer.lr (0.003 → 0.001) changed" in str(result.exception)
    result = runner.invoke(app, ["pretrain", "export", str(tmp_path / "run"), "--output", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    assert type(AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf"))).__name__ == "NeoBERTForMaskedLM"
    assert load_sentence_model(str(tmp_path / "hf")).encode(["def f(): pass"]).shape == (1, 32)
    result = runner.invoke(app, ["pretrain", "prepare", "--corpus", str(raw), "--tokenizer", "train",
                                 "--vocab-size", "300", "--output", str(tmp_path / "prep")])
    assert result.exit_code == 0 and (tmp_path / "prep" / "corpus.json").is_file()
    (tmp_path / "bad.yaml").write_text("model: {hidden_size: 32}\nmasking: {rat: 0.2}\n")
    result = runner.invoke(app, ["pretrain", "--recipe", str(tmp_path / "bad.yaml"), "--corpus", str(raw),
                                 "--output", str(tmp_path / "x")])
    assert isinstance(result.exception, UserInputError) and "bad.yaml:2: unknown key 'masking.rat'" in str(result.exception)
    assert not (tmp_path / "x").exists()
    assert "prepare" in runner.invoke(app, ["pretrain"]).output


def test_checkpoint_files_are_pinned_and_a_checkpoint_pinned_under_the_old_key_still_verifies(corpus, tmp_path):
    """The manifest pins each file with files.FilePin ({size, sha256}, as an index's manifest does);
    a checkpoint saved before that ({bytes, sha256}) verifies the same way, so it still resumes."""
    from neobert_embed.pretraining.checkpoint import CorruptCheckpoint, verify_checkpoint

    run = tmp_path / "run"
    pretrain(_recipe(), corpus, run, stop_after_steps=2, progress=False)
    saved = run / "checkpoints" / STEP2
    manifest = json.loads((saved / "checkpoint.json").read_text(encoding="utf-8"))
    assert manifest and all(set(entry) == {"size", "sha256"} for entry in manifest.values())
    legacy = {name: {"bytes": entry["size"], "sha256": entry["sha256"]} for name, entry in manifest.items()}
    (saved / "checkpoint.json").write_text(json.dumps(legacy), encoding="utf-8")
    verify_checkpoint(saved)
    engine = saved / "engine.pt"
    engine.write_bytes(engine.read_bytes()[:-10])
    with pytest.raises(CorruptCheckpoint, match=r"engine.pt: contents changed since it was saved \(\d+ bytes, but"):
        verify_checkpoint(saved)


def test_stage2_continues_from_stage1_weights_with_a_length_mixture(corpus, tmp_path):
    stage1_recipe = tiny_recipe(max_steps=10)
    stage1_recipe["optimizer"] = {"lr": 1e-2}
    stage1 = pretrain(parse_pretrain_recipe(stage1_recipe), corpus, tmp_path / "stage1", progress=False)
    data = tiny_recipe(max_steps=2)
    data["model"] = {"init_from": str(stage1.export_dir), "max_length": 128}
    data["data"] = {"seq_length": 128, "length_mixture": [{"max_tokens": 32, "weight": 0.2},
                                                          {"max_tokens": None, "weight": 0.8}]}
    stage2 = pretrain(parse_pretrain_recipe(data), corpus, tmp_path / "stage2", progress=False)
    first_loss = losses(stage2.metrics_path)[1]
    random_init = losses(stage1.metrics_path)[1]
    assert first_loss < random_init - 0.3, (first_loss, random_init)  # the stage-1 weights were loaded
    assert stage2.model.config.max_position_embeddings == 128


def test_sigint_to_the_cli_checkpoints_and_says_how_to_resume(corpus, tmp_path):
    import os
    import signal
    import subprocess
    import time

    recipe = tiny_recipe(max_steps=100_000)
    recipe["checkpoint"] = {"every_steps": 100_000, "keep_last": 1}
    recipe["training"]["engine"] = "deepspeed"
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    run = tmp_path / "run"
    cli = os.path.join(os.path.dirname(sys.executable), "neobert-embed")
    # a fresh extensions folder: a world of one must not build DeepSpeed's shared-memory all-reduce (45-90 s)
    env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    process = subprocess.Popen([cli, "pretrain", "--recipe", str(tmp_path / "r.yaml"), "--corpus", str(corpus),
                                "--output", str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        metrics = run / "metrics.jsonl"
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    message = " ".join(err.split())
    assert process.returncode == 130, err[-2000:]
    assert "interrupted" in message and f"--output {run} --resume" in message
    saved = sorted((run / "checkpoints").glob("step-*"))
    assert len(saved) == 1
    assert json.loads((saved[0] / "trainer_state.json").read_text())["engine"] == "deepspeed"
    assert not (tmp_path / "ext" / "deepspeed_shm_comm").exists()
    step = int(saved[0].name.removeprefix("step-"))
    resumed = pretrain(parse_pretrain_recipe(recipe), corpus, run, resume=True, stop_after_steps=1, progress=False)
    assert resumed.step == step + 1


@pytest.mark.parametrize(("engine", "zero_stage"), [("torch", 0), ("deepspeed", 0), ("deepspeed", 2)])
def test_every_engine_is_a_training_engine_whose_checkpoints_export(corpus, tmp_path, monkeypatch, engine,
                                                                     zero_stage):
    real_build, built = pretrain_module.build_engine, []
    monkeypatch.setattr(pretrain_module, "build_engine", lambda *args: built.append(real_build(*args)) or built[-1])
    result = pretrain(parse_pretrain_recipe(tiny_recipe(engine=engine, zero_stage=zero_stage, max_steps=2)),
                      corpus, tmp_path / "run", progress=False)
    assert isinstance(built[0], TrainingEngine) and CHECKPOINT_FORMATS[engine] is type(built[0])
    weights = consolidated_state_dict(find_checkpoint(tmp_path / "run"))
    trained = result.model.state_dict()
    assert {key.removeprefix("mlm.") for key in weights} == set(trained)
    assert all(torch.equal(value, trained[key.removeprefix("mlm.")]) for key, value in weights.items())
    from transformers import AutoModelForMaskedLM

    exported = AutoModelForMaskedLM.from_pretrained(str(export_checkpoint(tmp_path / "run", tmp_path / "hf",
                                                                          progress=False)))
    assert all(torch.equal(value, trained[key]) for key, value in exported.state_dict().items())


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
