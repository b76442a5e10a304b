"""train-contrastive end to end: every architecture through the CLI, resume, Ctrl-C, bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from contrastive_helpers import TINY_RECIPE, one_torch_thread, paraphrase_rows, read_metrics, write_jsonl
from tiny_models import ARCHITECTURES, build_tiny_model
from transformers import TrainerCallback
from typer.testing import CliRunner

from neobert_embed.cli import app
from neobert_embed.contrastive import load_contrastive_recipe, train_contrastive
from neobert_embed.errors import UserInputError
from neobert_embed.runs import Interrupted
from neobert_embed.sentence import load_sentence_model

runner = CliRunner()

_one_thread = pytest.fixture(autouse=True)(one_torch_thread)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("contrastive-data")
    write_jsonl(root / "triplets.jsonl", paraphrase_rows(negatives=1))
    write_jsonl(root / "pairs.jsonl", [{"anchor": r["query"], "positive": r["document"]}
                                       for r in paraphrase_rows(negatives=0, extra=False)][:40])
    return root


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return build_tiny_model("bert", tmp_path_factory.mktemp("models") / "bert")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cli_trains_every_architecture(arch, tmp_path, data_dir):
    model_dir = build_tiny_model(arch, tmp_path / arch)
    out = tmp_path / "run"
    result = runner.invoke(app, ["train-contrastive", "--model", str(model_dir), "--recipe", str(TINY_RECIPE),
                                 "--data", f"paraphrases={data_dir / 'triplets.jsonl'}",
                                 "--output", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    assert summary["steps"] == 20 and summary["reload_max_abs_diff"] <= 1e-5
    losses = [m["loss"] for m in read_metrics(out)]
    assert len(losses) == 20 and all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses
    # the final model and the trainer's last checkpoint are two saves of one state: same vectors
    final = load_sentence_model(str(out))
    checkpoint = load_sentence_model(str(out / "checkpoints" / "checkpoint-20"))
    texts = ["the red cat", "a dog whose colour is blue"]
    assert set(final.prompts) >= {"query", "document"}
    np.testing.assert_allclose(final.encode(texts, prompt_name="query"),
                               checkpoint.encode(texts, prompt_name="query"), atol=1e-6)


def test_a_run_that_logged_no_loss_reports_so(tmp_path, data_dir, tiny_bert):
    """logging_steps above the steps run: summary.json's final_loss is null, and the CLI says why
    instead of failing to format it (it raised a TypeError after the model was saved)."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(TINY_RECIPE.read_text(encoding="utf-8").replace("logging_steps: 1", "logging_steps: 50"),
                      encoding="utf-8")
    result = runner.invoke(app, ["train-contrastive", "--model", str(tiny_bert), "--recipe", str(recipe),
                                 "--data", f"p={data_dir / 'pairs.jsonl'}", "--max-steps", "2",
                                 "--output", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "2 steps" in result.stdout and "no loss logged" in result.stdout
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["final_loss"] is None


class StopAt(TrainerCallback):
    """Press Ctrl-C (a real SIGINT) right after step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            signal.raise_signal(signal.SIGINT)


def test_ctrl_c_then_resume_matches_uninterrupted_run(tmp_path, data_dir, tiny_bert):
    recipe = load_contrastive_recipe(TINY_RECIPE, max_steps=12, save_steps=5)
    data = {"triplets": str(data_dir / "triplets.jsonl"), "pairs": str(data_dir / "pairs.jsonl")}
    full = train_contrastive(model=str(tiny_bert), data=data, output=tmp_path / "full", recipe=recipe)

    cut = tmp_path / "cut"
    with pytest.raises(Interrupted, match="stopped at step 7"):
        train_contrastive(model=str(tiny_bert), data=data, output=cut, recipe=recipe, callbacks=[StopAt(7)])
    assert (cut / "checkpoints" / "checkpoint-7").is_dir()
    assert not (cut / "modules.json").exists()  # no model before the run completes
    assert [m["step"] for m in read_metrics(cut)] == list(range(1, 8))

    hard_kill = tmp_path / "hard-kill"  # as if killed after step 7: last checkpoint 5, metrics to 7
    shutil.copytree(cut, hard_kill)
    shutil.rmtree(hard_kill / "checkpoints" / "checkpoint-7")

    expected = read_metrics(full)
    for run, resumed_from in ((cut, "checkpoint-7"), (hard_kill, "checkpoint-5")):
        train_contrastive(output=run, resume=True)
        resumed = read_metrics(run)
        assert [m["step"] for m in resumed] == list(range(1, 13))
        np.testing.assert_allclose([m["loss"] for m in resumed], [m["loss"] for m in expected], atol=1e-4)
        np.testing.assert_allclose([m["lr"] for m in resumed], [m["lr"] for m in expected], rtol=1e-9)
        assert json.loads((run / "summary.json").read_text())["resumed_from"].endswith(resumed_from)
    texts = ["the red cat", "the blue dog"]
    np.testing.assert_allclose(load_sentence_model(str(cut)).encode(texts),
                               load_sentence_model(str(full)).encode(texts), atol=1e-4)


def test_resume_refuses_a_changed_recipe(tmp_path, data_dir, tiny_bert):
    recipe = load_contrastive_recipe(TINY_RECIPE, max_steps=2)
    out = train_contrastive(model=str(tiny_bert), data={"t": str(data_dir / "triplets.jsonl")},
                            output=tmp_path / "run", recipe=recipe)
    with pytest.raises(UserInputError, match=r"recipe\.temperature \(0\.07 → 0\.5\)"):
        train_contrastive(output=out, resume=True, recipe=load_contrastive_recipe(TINY_RECIPE, temperature=0.5))
    with pytest.raises(UserInputError, match="--resume.*--overwrite"):
        train_contrastive(model=str(tiny_bert), data={"t": str(data_dir / "triplets.jsonl")}, output=out,
                          recipe=recipe)


def _bad_rows(kind: str) -> list[dict]:
    rows = paraphrase_rows(negatives=1, extra=False)[:6]
    if kind == "missing":
        del rows[2]["document"]
    elif kind == "empty":
        rows[1]["document"] = "   "
    elif kind == "negatives":
        rows[3]["negative_2"] = "one more negative"
    return rows


@pytest.mark.parametrize(("kind", "message"), [
    ("missing", r"bad\.jsonl:3: column 'document' is missing"),
    ("empty", r"bad\.jsonl:2: column 'document' is empty"),
    ("negatives", r"bad\.jsonl:4: 2 negatives, but .*bad\.jsonl:1 has 1"),
])
def test_bad_rows_name_file_line_and_column(kind, message, tmp_path, tiny_bert):
    bad = write_jsonl(tmp_path / "bad.jsonl", _bad_rows(kind))
    out = tmp_path / "run"
    result = runner.invoke(app, ["train-contrastive", "--model", str(tiny_bert), "--recipe", str(TINY_RECIPE),
                                 "--data", f"bad={bad}", "--output", str(out)])
    assert result.exit_code != 0 and isinstance(result.exception, UserInputError)
    assert re.search(message, str(result.exception)), result.exception
    assert not out.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--data", "x=missing.jsonl"], r"missing\.jsonl.*file not found"),
    (["--data", "x=TRIPLETS", "--model", "no-such-backbone"], r"cannot load model 'no-such-backbone'.*OFFLINE"),
    (["--data", "x=TRIPLETS", "--recipe", "TYPO_RECIPE"], r"typo\.yaml:\d+: unknown key 'temprature'"),
    (["--data", "x=TRIPLETS", "--recipe", str(TINY_RECIPE), "--batch-size", "4", "--text-budget", "8"],
     r"incompatible"),
    (["--data", "novalue"], r"expected NAME=PATH"),
])
def test_bad_options_fail_before_writing(args, message, tmp_path, data_dir, tiny_bert):
    typo = tmp_path / "typo.yaml"
    typo.write_text(TINY_RECIPE.read_text() + "temprature: 0.1\n")
    args = [a.replace("TRIPLETS", str(data_dir / "triplets.jsonl")).replace("TYPO_RECIPE", str(typo))
            for a in args]
    if "--model" not in args:
        args += ["--model", str(tiny_bert)]
    out = tmp_path / "run"
    result = runner.invoke(app, ["train-contrastive", *args, "--output", str(out)])
    assert isinstance(result.exception, UserInputError), result.output
    assert re.search(message, str(result.exception), flags=re.S), result.exception
    assert not out.exists()


def test_failed_final_save_leaves_no_model(tmp_path, data_dir, tiny_bert, monkeypatch):
    from sentence_transformers import SentenceTransformer

    real_save = SentenceTransformer.save

    def broken_save(self, path, *args, **kwargs):  # checkpoints save fine; the final model fails midway
        if not Path(path).name.startswith(".run."):
            return real_save(self, path, *args, **kwargs)
        (Path(path) / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(SentenceTransformer, "save", broken_save)
    out = tmp_path / "run"
    with pytest.raises(OSError, match="disk full"):
        train_contrastive(model=str(tiny_bert), data={"t": str(data_dir / "triplets.jsonl")}, output=out,
                          recipe=load_contrastive_recipe(TINY_RECIPE, max_steps=2, save_steps=1))
    assert not (out / "modules.json").exists() and not (out / "model.safetensors").exists()
    assert not [p for p in tmp_path.iterdir()  # no temp dirs left (the writer lock file may stay)
                if p.name.startswith(".run.") and p.name != ".run.lock"]
    assert (out / "checkpoints" / "checkpoint-2").is_dir()  # the trained state survives for --resume


class FailAt(TrainerCallback):
    """Raise (as a CUDA OOM or a second Ctrl-C would) right after step ``step``."""

    def __init__(self, step: int, error: BaseException) -> None:
        self.step, self.error = step, error

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise self.error


@pytest.mark.parametrize("error", [RuntimeError("CUDA out of memory"), KeyboardInterrupt()])
def test_training_error_stops_the_progress_bar(error, tmp_path, data_dir, tiny_bert, monkeypatch):
    import neobert_embed.contrastive.trainer as trainer_module

    bars, real_bar = [], trainer_module.progress_bar

    def recorded_bar(*args, **kwargs):
        bars.append(real_bar(*args, **kwargs))
        return bars[-1]

    monkeypatch.setattr(trainer_module, "progress_bar", recorded_bar)
    with pytest.raises(type(error)):
        train_contrastive(model=str(tiny_bert), data={"t": str(data_dir / "triplets.jsonl")}, output=tmp_path / "run",
                          recipe=load_contrastive_recipe(TINY_RECIPE, max_steps=4), callbacks=[FailAt(1, error)])
    assert len(bars) == 1 and not bars[0].disable  # the bar was shown, and is gone: no live redraw, cursor back
    assert not bars[0].live.is_started


def test_mine_negatives_output_trains(tmp_path, data_dir, tiny_bert):
    mined = tmp_path / "mined.jsonl"
    result = runner.invoke(app, ["mine-negatives", "--model", str(tiny_bert), "--data",
                                 str(data_dir / "pairs.jsonl"), "--output", str(mined), "--num-negatives", "2",
                                 "--range", "1:20"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in mined.read_text().splitlines()]
    assert rows and set(rows[0]) == {"anchor", "positive", "negative_1", "negative_2"}
    assert all(r["negative_1"] != r["positive"] and r["negative_2"] != r["positive"] for r in rows)
    out = train_contrastive(model=str(tiny_bert), data={"mined": str(mined)}, output=tmp_path / "run",
                            recipe=load_contrastive_recipe(TINY_RECIPE, max_steps=2))
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


@pytest.mark.slow
def test_torchrun_ddp_two_processes(tmp_path, data_dir, tiny_bert):
    out = tmp_path / "ddp"
    command = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", "2", "-m", "neobert_embed.cli",
               "train-contrastive", "--model", str(tiny_bert), "--recipe", str(TINY_RECIPE), "--max-steps", "4",
               "--data", f"t={data_dir / 'triplets.jsonl'}", "--data", f"p={data_dir / 'pairs.jsonl'}",
               "--output", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["world_size"], summary["steps"]) == (2, 4)  # batches of mixed sizes are not dropped
    assert [m["step"] for m in read_metrics(out)] == [1, 2, 3, 4]  # one writer
