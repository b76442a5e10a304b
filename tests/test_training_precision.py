"""Training precision: ``auto`` is bf16 autocast on a CPU with bf16 matrix units and fp32 on one without,
the trainers get those flags, fp16 on the CPU is refused before anything is written, and a short bf16
run (contrastive and MLM pretraining) learns like the fp32 run over the same steps.

The real runs force the bf16 unit through ``NEOBERT_EMBED_CPU_FEATURES`` so they run bf16 on any CPU
(on one without the unit it is emulated: slower, same numerics).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from contrastive_helpers import TINY_RECIPE, one_torch_thread, paraphrase_rows, read_metrics, write_jsonl
from glue_helpers import tiny_task_dir
from pretraining_helpers import losses, tiny_recipe, write_docstring_corpus
from tiny_models import build_tiny_model
from typer.testing import CliRunner

from neobert_embed.cli import app
from neobert_embed.contrastive import load_contrastive_recipe, train_contrastive
from neobert_embed.contrastive.trainer import device_flags
from neobert_embed.errors import UserInputError
from neobert_embed.machine import FEATURES_VARIABLE, describe_machine
from neobert_embed.training_precision import TrainingPrecision, chosen_precision, resolve_training_precision

_one_thread = pytest.fixture(autouse=True)(one_torch_thread)

# Largest per-step |loss(bf16) - loss(fp32)| allowed over the same steps, data and seed. Measured on
# an AMD EPYC (avx512_bf16): contrastive-tiny, 20 steps, max 3.0e-4 (loss 2.27 → 0.38); the tiny
# NeoBERT, 10 pretraining steps, max 2.2e-4 (loss 5.68 → 5.57). The bound is far under the losses'
# own step-to-step changes (0.1-0.3), so a bf16 run that drifted from the fp32 one would fail it.
TOLERANCE = 0.01


@pytest.fixture
def bf16_cpu(monkeypatch):
    """A CPU with avx512_bf16 as far as ``auto`` can tell (whatever this one has)."""
    monkeypatch.setenv(FEATURES_VARIABLE, "avx512_bf16")


@pytest.fixture
def plain_cpu(monkeypatch):
    """A CPU without bf16 (or int8) matrix units."""
    monkeypatch.setenv(FEATURES_VARIABLE, "none")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return build_tiny_model("bert", tmp_path_factory.mktemp("models") / "bert")


@pytest.fixture(scope="module")
def triplets(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("data") / "triplets.jsonl", paraphrase_rows(negatives=1))


def test_auto_is_bf16_autocast_on_this_cpu_when_it_has_bf16_units(monkeypatch):
    monkeypatch.delenv(FEATURES_VARIABLE, raising=False)
    unit = describe_machine("cpu").bf16_units
    if unit is None:
        pytest.skip("this CPU has no bf16 matrix units (amx_bf16, avx512_bf16)")
    assert chosen_precision("auto", "cpu") == TrainingPrecision("bf16", unit)
    assert chosen_precision("auto", "cpu").label == f"bf16 autocast: {unit}"
    assert device_flags("auto", "cpu") == {"bf16": True, "fp16": False, "dataloader_pin_memory": False,
                                           "optim": "adamw_torch", "use_cpu": True, "dataloader_num_workers": 0}


@pytest.mark.parametrize(("features", "dtype", "label"), [
    ("none", "fp32", "fp32: this CPU has no bf16 matrix units"),
    ("avx512_vnni,amx_int8", "fp32", "fp32: this CPU has no bf16 matrix units"),
    ("avx512_bf16", "bf16", "bf16 autocast: avx512_bf16"),
    ("avx512_bf16,amx_bf16", "bf16", "bf16 autocast: amx_bf16"),  # the faster unit is named
])
def test_auto_follows_the_cpus_bf16_units(monkeypatch, features, dtype, label):
    monkeypatch.setenv(FEATURES_VARIABLE, features)
    chosen = chosen_precision("auto", "cpu")
    assert (chosen.dtype, chosen.label) == (dtype, label)
    flags = device_flags("auto", "cpu")
    assert (flags["bf16"], flags["fp16"], flags["use_cpu"]) == (dtype == "bf16", False, True)


def test_asked_precisions_are_kept_and_fp16_on_the_cpu_is_refused(plain_cpu):
    assert chosen_precision("fp32", "cpu").label == "fp32: asked for"
    assert chosen_precision("bf16", "cpu").label == \
        "bf16 autocast: asked for (this CPU has no bf16 matrix units: slower than fp32)"
    assert device_flags("bf16", "cpu")["bf16"] is True
    with pytest.raises(UserInputError, match=r"^precision fp16 cannot train on the CPU \(CPUs have no fp16"):
        device_flags("fp16", "cpu")


#: On a GPU, worker processes tokenize and collate the next batches while the GPU computes, and the step
#: waits for no host read: batches are copied without waiting, the loss is not tested for NaN on the host.
GPU_LOADER = {"dataloader_num_workers": 2, "dataloader_prefetch_factor": 4, "dataloader_persistent_workers": True,
              "accelerator_config": {"non_blocking": True}, "logging_nan_inf_filter": False}


@pytest.mark.parametrize(("bf16_gpu", "flags"), [
    (True, {"bf16": True, "fp16": False, "dataloader_pin_memory": True, "optim": "adamw_torch_fused",
            "use_cpu": False, **GPU_LOADER}),
    (False, {"bf16": False, "fp16": False, "dataloader_pin_memory": True, "optim": "adamw_torch_fused",
             "use_cpu": False, **GPU_LOADER}),
])
def test_gpu_behaviour_is_kept(monkeypatch, bf16_gpu, flags):
    """On a GPU ``auto`` is bf16 exactly when the GPU supports it, as before (a fake GPU: this suite runs
    on CPUs); MPS keeps fp32 under ``auto``."""
    from neobert_embed import machine

    fake = machine.Machine("cuda", "NVIDIA H100", gpu_bf16=bf16_gpu)
    monkeypatch.setattr(machine, "describe_machine", lambda device=None: fake if device == "cuda" else
                        machine.Machine(str(device), "mps", gpu_bf16=True))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device_flags("auto") == device_flags("auto", "cuda") == flags
    assert chosen_precision("auto", "cuda").label == ("bf16 autocast: NVIDIA H100" if bf16_gpu
                                                      else "fp32: this GPU does not support bf16")
    assert device_flags("fp16", "cuda")["fp16"] is True  # fp16 stays available on GPUs
    assert resolve_training_precision("auto", "mps").dtype == "fp32"


def test_trainers_get_the_chosen_flags(monkeypatch, tmp_path):
    from neobert_embed.contrastive.recipe import ContrastiveRecipe
    from neobert_embed.contrastive.train import _training_args
    from neobert_embed.glue.presets import GluePreset, Trial
    from neobert_embed.glue.tasks import TASKS
    from neobert_embed.glue.trial import training_arguments

    for features, bf16 in (("avx512_bf16", True), ("none", False)):
        monkeypatch.setenv(FEATURES_VARIABLE, features)
        contrastive = _training_args(ContrastiveRecipe(max_steps=2), tmp_path, 4, None)
        glue = training_arguments(GluePreset(), Trial("rte", 8, 2e-5, 0.01, 0), TASKS["rte"], 48, tmp_path, "cpu")
        for args in (contrastive, glue):
            assert (args.bf16, args.fp16, args.use_cpu, args.optim.value) == (bf16, False, True, "adamw_torch")


def test_fp16_on_the_cpu_is_refused_before_a_run_is_written(plain_cpu, tmp_path, tiny_bert, triplets):
    from neobert_embed.glue.presets import GluePreset
    from neobert_embed.glue.run import run_glue

    recipe = load_contrastive_recipe(TINY_RECIPE, precision="fp16")
    with pytest.raises(UserInputError, match="precision fp16 cannot train on the CPU"):
        train_contrastive(model=str(tiny_bert), data={"x": str(triplets)}, output=tmp_path / "c", recipe=recipe)
    assert not (tmp_path / "c").exists()
    task = tiny_task_dir(tmp_path / "tasks", "rte")
    with pytest.raises(UserInputError, match="precision fp16 cannot train on the CPU"):
        run_glue([str(tiny_bert)], tmp_path / "g", task_dirs=[task], preset=GluePreset(precision="fp16"),
                 devices=["cpu"], progress=False)
    assert not (tmp_path / "g" / "trials").exists()


def test_a_short_bf16_contrastive_run_learns_like_fp32(bf16_cpu, tmp_path, tiny_bert, triplets):
    reference = train_contrastive(model=str(tiny_bert), data={"paraphrases": str(triplets)}, output=tmp_path / "fp32",
                                  recipe=load_contrastive_recipe(TINY_RECIPE, precision="fp32"))
    # bf16 by name: ``auto`` keeps bf16 only where it measures faster (a tiny model may not), see
    # tests/test_unpadded_training.py::test_train_contrastive_with_auto_trains_in_the_precision_it_measured
    bf16_recipe = tmp_path / "bf16.yaml"
    bf16_recipe.write_text(TINY_RECIPE.read_text().replace("precision: fp32", "precision: bf16"))
    result = CliRunner().invoke(app, ["train-contrastive", "--model", str(tiny_bert), "--recipe", str(bf16_recipe),
                                      "--data", f"paraphrases={triplets}", "--output", str(tmp_path / "bf16")])
    assert result.exit_code == 0, result.output
    assert "20 steps (bf16 autocast: asked for), final loss" in result.output
    summary = json.loads((tmp_path / "bf16" / "summary.json").read_text())
    assert summary["precision"] == "bf16 autocast: asked for"
    assert json.loads((reference / "summary.json").read_text())["precision"] == "fp32: asked for"
    fp32 = np.array([m["loss"] for m in read_metrics(reference)])
    bf16 = np.array([m["loss"] for m in read_metrics(tmp_path / "bf16")])
    assert len(bf16) == len(fp32) == 20 and np.isfinite(bf16).all()
    assert bf16[-5:].mean() < 0.8 * bf16[:5].mean(), bf16
    difference = np.abs(bf16 - fp32).max()
    assert 0 < difference <= TOLERANCE, (difference, fp32, bf16)  # > 0: bf16 really ran


def test_a_short_bf16_pretraining_run_learns_like_fp32(bf16_cpu, tmp_path):
    from neobert_embed.pretraining import prepare_corpus, pretrain
    from neobert_embed.pretraining.recipe import parse_pretrain_recipe

    raw = write_docstring_corpus(tmp_path / "docs.jsonl", limit=200)
    corpus = prepare_corpus(raw, tmp_path / "prepared", tokenizer="train", vocab_size=300, progress=False).path
    curves, states = {}, {}
    for precision in ("fp32", "auto"):
        recipe = parse_pretrain_recipe(tiny_recipe(engine="deepspeed", precision=precision, max_steps=10))
        result = pretrain(recipe, corpus, tmp_path / precision, progress=False)
        curves[precision] = np.array(list(losses(result.metrics_path).values()))
        states[precision] = json.loads((result.checkpoint / "trainer_state.json").read_text())
        assert all(p.dtype == torch.float32 for p in result.model.parameters())  # fp32 master weights
    assert states["auto"]["precision"] == "bf16 autocast: avx512_bf16"
    assert states["fp32"]["precision"] == "fp32: asked for"
    assert curves["auto"][-3:].mean() < curves["auto"][:3].mean() - 0.05, curves
    difference = np.abs(curves["auto"] - curves["fp32"]).max()
    assert 0 < difference <= TOLERANCE, (difference, curves)


def test_training_goes_where_encoding_goes_even_where_the_trainer_would_pick_mps(monkeypatch):
    """One default-device rule: on a Mac (MPS, no CUDA) the trainer is pinned to the CPU, as
    devices.default_device puts the encoders, not left to pick MPS by itself."""
    from neobert_embed.devices import default_device
    from neobert_embed.training_precision import training_device

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert training_device() == default_device() == "cpu"
    assert device_flags("fp32")["use_cpu"] is True
    assert training_device("cuda:1") == "cpu"  # asked for a GPU this machine lacks: the CPU, as before
