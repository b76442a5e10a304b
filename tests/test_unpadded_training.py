"""Un-padded training: each step's texts as one flat token stream, for every backbone of the recipe.

The padded step (what sentence-transformers runs) is the reference: the un-padded one must give the
same loss and the same gradient for every parameter in fp32, on a batch of very different lengths,
and the same weights after an optimizer step; on a GPU it must attend through the varlen kernel.
"""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from contrastive_helpers import one_torch_thread, paraphrase_rows, write_jsonl
from sentence_transformers.sentence_transformer.losses import (
    CachedMultipleNegativesRankingLoss,
    MatryoshkaLoss,
    MultipleNegativesRankingLoss,
)
from test_attention_dispatch import ReferenceVarlen
from tiny_models import ARCHITECTURES, build_tiny_model

from neobert_embed.contrastive import load_contrastive_recipe, train_contrastive
from neobert_embed.contrastive.unpadding import training_layout
from neobert_embed.modeling import attention
from neobert_embed.sentence import load_sentence_model
from neobert_embed.training_precision import TrainingPrecision, chosen_precision, measured_cpu_precision

_one_thread = pytest.fixture(autouse=True)(one_torch_thread)

ANCHORS = ["a cat", "the quick brown fox jumps over the lazy dog while the farmer watches from his porch " * 3,
           "a mid-sized sentence about the weather", "why", "red bird on a wire"]
POSITIVES = ["a small cat", "a fox and a dog", "it will rain tomorrow in the north of the country " * 4,
             "because", "a bird sits on a cable above the street"]
TOLERANCE = 1e-5  # absolute, and relative to gradients above 1 (fp32 rounding of a sum of ~100 terms)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("unpadded-models")
    return {arch: build_tiny_model(arch, root / arch) for arch in ARCHITECTURES}


def load_without_dropout(path):
    """The model in training mode with every dropout at 0, so two runs can be compared exactly."""
    torch.manual_seed(0)
    model = load_sentence_model(str(path), device="cpu")
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    config = model[0].auto_model.config
    for name in ("attention_probs_dropout_prob", "attention_dropout"):
        if hasattr(config, name):
            setattr(config, name, 0.0)
    return model.train()


def step(model, loss, unpadded: bool):
    """One forward and backward of ``loss`` on the mixed-length batch; the features, loss and gradients."""
    model.zero_grad(set_to_none=True)
    with training_layout(model, unpadded):
        features = [model.preprocess(texts) for texts in (ANCHORS, POSITIVES)]
        value = loss(features, None)
        value.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return features, value.detach(), grads


def assert_same_step(padded, unpadded):
    (_, loss_p, grads_p), (features, loss_u, grads_u) = padded, unpadded
    assert features[0]["input_ids"].shape[0] == 1 and "cu_seq_lens_q" in features[0]  # one flat stream
    assert len(features[0]["cu_seq_lens_q"]) == len(ANCHORS) + 1
    assert abs(loss_p.item() - loss_u.item()) <= TOLERANCE
    assert grads_p.keys() == grads_u.keys() and len(grads_p) > 4
    for name, grad in grads_p.items():
        torch.testing.assert_close(grads_u[name], grad, atol=TOLERANCE, rtol=TOLERANCE, msg=name)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_unpadded_loss_and_every_gradient_equal_padded_in_fp32(arch, tiny_models):
    model = load_without_dropout(tiny_models[arch])
    loss = MultipleNegativesRankingLoss(model)
    padded = step(model, loss, unpadded=False)
    assert padded[0][0]["input_ids"].shape[0] == len(ANCHORS)
    assert_same_step(padded, step(model, loss, unpadded=True))
    assert "cu_seq_lens_q" not in model.preprocess(ANCHORS)  # the model is restored after training


@pytest.mark.parametrize("make_loss", [
    lambda model: CachedMultipleNegativesRankingLoss(model, mini_batch_size=2),
    lambda model: MatryoshkaLoss(model, MultipleNegativesRankingLoss(model), matryoshka_dims=[32, 8]),
], ids=["gradcache", "matryoshka"])
@pytest.mark.parametrize("arch", ["bert", "neobert"])
def test_gradcache_and_matryoshka_train_unpadded_with_the_padded_gradients(arch, make_loss, tiny_models):
    model = load_without_dropout(tiny_models[arch])
    loss = make_loss(model)
    assert_same_step(step(model, loss, unpadded=False), step(model, loss, unpadded=True))


@pytest.mark.parametrize("arch", ["bert", "modernbert", "neobert"])
def test_one_optimizer_step_gives_the_same_weights(arch, tiny_models):
    """SGD: Adam's first step is lr·sign(g), which turns fp32 noise on gradients near 0 into ±lr."""
    weights = []
    for unpadded in (False, True):
        model = load_without_dropout(tiny_models[arch])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, weight_decay=0.01)
        step(model, MultipleNegativesRankingLoss(model), unpadded)
        optimizer.step()
        weights.append({name: p.detach().clone() for name, p in model.named_parameters()})
    for name, weight in weights[0].items():
        torch.testing.assert_close(weights[1][name], weight, atol=TOLERANCE, rtol=0, msg=name)


def test_dropout_stays_on_in_unpadded_training(tiny_models):
    model = load_sentence_model(str(tiny_models["bert"]), device="cpu").train()
    with training_layout(model, unpadded=True):
        features = model.preprocess(ANCHORS)
        first, second = (model(dict(features))["sentence_embedding"] for _ in range(2))
        assert not torch.allclose(first, second)
        model.eval()
        first, second = (model(dict(features))["sentence_embedding"] for _ in range(2))
        torch.testing.assert_close(first, second)


@pytest.fixture
def simulated_gpu(monkeypatch):
    """Dispatch as on a CUDA sm80+ GPU in bf16, with a reference kernel standing in for ``varlen_attn``."""
    kernel = ReferenceVarlen()
    real_choice = attention.choose_attention_backend

    def on_gpu(requested, device_type, dtype, **options):
        options.update(flash_capable_gpu=True, native_available=True, flash_attn_available=False)
        return real_choice(requested, "cuda", torch.bfloat16, **options)

    monkeypatch.setattr(attention, "choose_attention_backend", on_gpu)
    monkeypatch.setattr(attention, "flash_capable", lambda device, head_dim: True)  # no CUDA to ask here
    monkeypatch.setattr(attention, "load_native_varlen", lambda: kernel)
    monkeypatch.setattr(attention, "_sdpa_varlen", lambda *a, **k: pytest.fail("per-length SDPA on a GPU"))
    return kernel


@pytest.mark.parametrize("arch", ["bert", "modernbert", "neobert"])
def test_on_a_gpu_training_attends_through_one_varlen_call_per_layer(arch, tiny_models, simulated_gpu):
    model = load_without_dropout(tiny_models[arch])
    layers = model[0].auto_model.config.num_hidden_layers
    with training_layout(model, unpadded=True, device="cuda", autocast_dtype=torch.bfloat16) as layout:
        assert layout.kernel == "native_varlen" and layout.unpadded
        features = model.preprocess(ANCHORS)
        model(dict(features))["sentence_embedding"].sum().backward()
    assert len(simulated_gpu.calls) == layers
    call = simulated_gpu.calls[0].arguments
    assert call["cu_seq_q"].tolist() == features["cu_seq_lens_q"].tolist()
    assert call["max_q"] == max(features["cu_seq_lens_q"].diff().tolist())
    assert sum(p.grad is not None for p in model.parameters()) > 4  # the backward ran through the kernel


def test_on_a_gpu_attention_dropout_never_silently_vanishes(tiny_models, simulated_gpu):
    """``varlen_attn`` has no dropout: BERT's attention dropout then runs in one padded SDPA call."""
    model = load_sentence_model(str(tiny_models["bert"]), device="cpu").train()
    assert model[0].auto_model.config.attention_probs_dropout_prob > 0
    with training_layout(model, unpadded=True, device="cuda", autocast_dtype=torch.bfloat16) as layout:
        assert layout.kernel == "padded"
        model(dict(model.preprocess(ANCHORS)))
    assert simulated_gpu.calls == []


@pytest.mark.parametrize("unpadded", [True, False])
def test_train_contrastive_reports_its_batch_layout_and_trains(unpadded, tmp_path, tiny_models, caplog):
    data = write_jsonl(tmp_path / "triplets.jsonl", paraphrase_rows(negatives=1))
    recipe = load_contrastive_recipe(max_steps=3, batch_size=4, precision="fp32", unpadded=unpadded,
                                     max_length=64, save_steps=10)
    with caplog.at_level("INFO", logger="neobert_embed.contrastive.train"):
        output = train_contrastive(model=str(tiny_models["bert"]), data={"triplets": str(data)}, output=tmp_path / "run",
                                   recipe=recipe)
    summary = json.loads((output / "summary.json").read_text())
    assert summary["unpadded"] is unpadded and summary["steps"] == 3
    assert summary["attention_kernel"] == ("sdpa_varlen" if unpadded else "sdpa")
    assert summary["examples_per_s"] > 0 and summary["final_loss"] is not None
    announced = [r.getMessage() for r in caplog.records if r.getMessage().startswith("batches:")]
    assert len(announced) == 1 and announced[0].startswith("batches: un-padded" if unpadded else "batches: padded")
    assert "cu_seq_lens_q" not in load_sentence_model(str(output)).preprocess(["hi"])


@pytest.mark.parametrize(("bf16_s", "fp32_s", "expected"), [(2.0, 1.0, "fp32"), (0.5, 1.0, "bf16")])
def test_auto_keeps_bf16_on_a_cpu_only_where_it_measured_faster(bf16_s, fp32_s, expected):
    calls = []

    def time_step(bf16: bool) -> float:
        calls.append(bf16)
        return bf16_s if bf16 else fp32_s

    chosen = measured_cpu_precision(TrainingPrecision("bf16", "amx_bf16"), time_step)
    assert chosen.dtype == expected and "measured" in chosen.reason
    assert calls == [True, False, True, False, True, False]  # a warm-up each, then interleaved
    assert measured_cpu_precision(TrainingPrecision("fp32", "asked for"), time_step).reason == "asked for"


def test_train_contrastive_with_auto_trains_in_the_precision_it_measured(tmp_path, tiny_models, monkeypatch):
    from neobert_embed.contrastive import trainer

    monkeypatch.setattr("neobert_embed.training_precision.measured_cpu_precision",
                        lambda chosen, time_step, repeats=2: TrainingPrecision("fp32", f"measured {time_step(True):.0f}"))
    flags = []
    real_flags = trainer.device_flags
    monkeypatch.setattr(trainer, "device_flags", lambda precision, device=None: flags.append(precision)
                        or real_flags(precision, device))
    if not chosen_precision("auto", "cpu").bf16:
        pytest.skip("this CPU has no bf16 unit: auto is fp32 without measuring")
    data = write_jsonl(tmp_path / "triplets.jsonl", paraphrase_rows(negatives=1))
    recipe = load_contrastive_recipe(max_steps=2, batch_size=4, max_length=64, save_steps=10)
    output = train_contrastive(model=str(tiny_models["bert"]), data={"triplets": str(data)}, output=tmp_path / "run",
                               recipe=recipe)
    assert json.loads((output / "summary.json").read_text())["precision"] == "fp32: measured 0"
    assert flags == ["fp32"]  # the trainer runs what was measured, not the hardware rule


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_glue_heads_train_on_the_flat_stream_with_the_padded_gradients(arch, tiny_models):
    """A sequence classifier (GLUE) over each backbone: the encoder takes the real tokens of a padded
    pair batch as one stream, the head reads each text's first token, loss and gradients unchanged."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from neobert_embed.modeling.flat_attention import unpadded_encoder

    tokenizer = AutoTokenizer.from_pretrained(tiny_models[arch])
    batch = tokenizer(ANCHORS, POSITIVES, padding=True, truncation=True, max_length=100, return_tensors="pt")
    labels = torch.tensor([0, 1, 1, 0, 1])
    results, shapes = [], []
    for unpadded in (False, True):
        torch.manual_seed(0)
        classifier = AutoModelForSequenceClassification.from_pretrained(tiny_models[arch], num_labels=2)
        for module in classifier.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        with unpadded_encoder(classifier) if unpadded else contextlib.nullcontext():
            classifier.base_model.register_forward_pre_hook(  # runs after the stream's own pre-hook
                lambda module, args, kwargs: shapes.append(tuple((kwargs.get("input_ids") if kwargs.get("input_ids")
                                                                  is not None else args[0]).shape)), with_kwargs=True)
            loss = classifier(**batch, labels=labels).loss
            loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in classifier.named_parameters() if p.grad is not None}))
    assert shapes[0] == tuple(batch["input_ids"].shape) and shapes[1] == (1, int(batch["attention_mask"].sum()))
    (loss_p, grads_p), (loss_u, grads_u) = results
    assert abs(loss_p.item() - loss_u.item()) <= TOLERANCE and grads_p.keys() == grads_u.keys()
    for name, grad in grads_p.items():
        torch.testing.assert_close(grads_u[name], grad, atol=TOLERANCE, rtol=TOLERANCE, msg=name)
    assert classifier.config._attn_implementation == "sdpa"  # restored


def test_neobert_joins_the_attention_interface_and_runs_flash_attn_when_asked(monkeypatch):
    """sentence-transformers flattens inputs itself for a model on transformers' attention interface
    loaded with ``flash_attention_2``; NeoBERT then runs the flash-attn package's varlen kernel."""
    from neobert_embed.modeling import NeoBERTConfig, NeoBERTModel

    model = NeoBERTModel(NeoBERTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=100))
    assert model.is_backend_compatible() and model._supports_flash_attn
    real_choice = attention.choose_attention_backend
    monkeypatch.setattr(attention, "choose_attention_backend", lambda requested, device_type, dtype, **options:
                        real_choice(requested, "cuda", torch.bfloat16,
                                    **{**options, "flash_capable_gpu": True, "flash_attn_available": True}))
    offsets = torch.tensor([0, 3, 5], dtype=torch.int32)
    assert model.attention_kernel(None, offsets) == "native_varlen"
    model.config._attn_implementation = "flash_attention_2"
    assert model.attention_kernel(None, offsets) == "flash_attn"
