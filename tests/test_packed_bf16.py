"""bf16 Linear layers packed for oneDNN, BERT's GELU and NeoBERT's SwiGLU fused: same products as
autocast's, on every path that loads a model at bf16 on a CPU with bf16 units, and never where it
cannot run."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from neobert_embed.inference import runtime
from neobert_embed.inference.kernels import (
    PackedBf16Linear,
    PackedSwiGLU,
    RMSNormToBf16,
    pack_linears_bf16,
    packed_bf16_available,
)
from neobert_embed.inference.runtime import choose_precision, cosine_to, load_inference_model, replaces_layers
from neobert_embed.machine import Machine, describe_machine

needs_packing = pytest.mark.skipif(
    not (describe_machine("cpu").bf16_units and packed_bf16_available()),
    reason="oneDNN bf16 needs a CPU with bf16 units (this one has none: bf16 stays autocast here)")


@needs_packing
@pytest.mark.parametrize(("activation", "bias"), [("none", True), ("none", False), ("gelu", True)])
def test_a_packed_layer_computes_autocasts_bf16_product(activation, bias):
    torch.manual_seed(0)
    linear = nn.Linear(384, 1536, bias=bias)
    x = torch.randn(3, 11, 384)
    with torch.autocast("cpu", torch.bfloat16):
        expected = linear(x)
        expected = F.gelu(expected.float()) if activation == "gelu" else expected.float()
    packed = PackedBf16Linear.from_linear(linear, activation=activation)
    out = packed(x)
    assert out.shape == (3, 11, 1536) and out.dtype == torch.bfloat16
    # the same bf16 operands; the two kernels only round their fp32 sums at different points
    assert torch.allclose(out.float(), expected, atol=0.05, rtol=0.02), (out.float() - expected).abs().max()


@needs_packing
def test_a_packed_layer_adds_the_residual_inside_its_product():
    torch.manual_seed(0)
    linear = nn.Linear(1536, 384)
    x, residual = torch.randn(2, 9, 1536), torch.randn(2, 9, 384).to(torch.bfloat16)
    with torch.autocast("cpu", torch.bfloat16):
        expected = linear(x).float() + residual.float()
    out = PackedBf16Linear.from_linear(linear).forward_add(x, residual)
    assert out.shape == (2, 9, 384) and out.dtype == torch.bfloat16
    # one bf16 rounding of the sum instead of one of the product: within bf16's step at these magnitudes
    assert torch.allclose(out.float(), expected, atol=0.1, rtol=0.02), (out.float() - expected).abs().max()


@needs_packing
def test_a_packed_swiglu_computes_neoberts_feed_forward_block():
    from neobert_embed.modeling.model import SwiGLU

    torch.manual_seed(0)
    block = SwiGLU(96, 256)
    x = torch.randn(3, 7, 96)
    exact = block(x)  # fp32
    with torch.autocast("cpu", torch.bfloat16):
        autocast = block(x).float()
    out = PackedSwiGLU.from_swiglu(block)(x)
    assert out.shape == (3, 7, 96) and out.dtype == torch.bfloat16
    # the SiLU and the halves' product inside the products: no further from fp32 than autocast's block
    error, autocast_error = (out.float() - exact).norm() / exact.norm(), (autocast - exact).norm() / exact.norm()
    assert error <= 1.1 * autocast_error and error < 0.01, (error, autocast_error)


def test_a_bf16_rmsnorm_is_the_fp32_norm_rounded_once():
    torch.manual_seed(0)
    norm = nn.RMSNorm(64, eps=1e-5)
    nn.init.uniform_(norm.weight, 0.5, 1.5)
    x = 3 * torch.randn(10, 64)
    out = RMSNormToBf16.from_norm(norm)(x)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), norm(x).to(torch.bfloat16).float(), rtol=2 ** -8, atol=0)
    default_eps = RMSNormToBf16.from_norm(nn.RMSNorm(64, elementwise_affine=False))(x)
    assert torch.allclose(default_eps.float(), nn.RMSNorm(64, elementwise_affine=False)(x), rtol=2 ** -8, atol=0)


@needs_packing
def test_bf16_loads_neobert_with_its_feed_forward_and_norms_fused(tmp_path):
    from tiny_models import build_tiny_model

    from neobert_embed.modeling.model import NeoBERTLayer

    path = build_tiny_model("neobert", tmp_path / "neobert", hidden=64, heads=4)
    texts = ["a short text", "a somewhat longer text about the weather in the mountains", "x " * 60]
    fp32 = load_inference_model(str(path), "fp32").model.encode(texts)
    model = load_inference_model(str(path), "bf16").model
    layers = [module for module in model.modules() if isinstance(module, NeoBERTLayer)]
    assert layers and all(isinstance(layer.ffn, PackedSwiGLU) and isinstance(layer.qkv, PackedBf16Linear)
                          and isinstance(layer.attention_norm, RMSNormToBf16)
                          and isinstance(layer.ffn_norm, RMSNormToBf16) for layer in layers)
    final_norms = [module for name, module in model.named_modules() if name.endswith(".layer_norm")]
    assert final_norms and all(type(norm) is nn.RMSNorm for norm in final_norms)  # gives the hidden state: fp32
    cosine = cosine_to(fp32, model.encode(texts))
    assert cosine.mean() >= 0.9999 and cosine.min() >= 0.999, (cosine.mean(), cosine.min())


@needs_packing
def test_packing_fuses_only_an_exact_gelu_that_follows_a_dense_product():
    class Block(nn.Module):
        def __init__(self, act: nn.Module) -> None:
            super().__init__()
            self.dense, self.intermediate_act_fn = nn.Linear(8, 8), act

    model = nn.ModuleDict({"erf": Block(nn.GELU()), "tanh": Block(nn.GELU(approximate="tanh")),
                           "plain": nn.Linear(8, 4)})
    assert pack_linears_bf16(model) == 3
    assert model["erf"].dense.activation == "gelu" and isinstance(model["erf"].intermediate_act_fn, nn.Identity)
    assert model["tanh"].dense.activation == "none" and isinstance(model["tanh"].intermediate_act_fn, nn.GELU)
    assert not any(type(module) is nn.Linear for module in model.modules())


@needs_packing
def test_bf16_loads_minilm_packed_with_its_vectors_at_fp32s(minilm_path, shared_data):
    import json

    rows = [json.loads(line) for line in (shared_data / "stsb" / "dev.jsonl").open(encoding="utf-8")]
    texts = [row["sentence1"] for row in rows[:48]] + [row["sentence2"] for row in rows[:16]]
    fp32 = load_inference_model(str(minilm_path), "fp32").model.encode(texts, batch_size=16)
    loaded = load_inference_model(str(minilm_path), "bf16")
    layer = loaded.model[0].auto_model.encoder.layer[0]
    assert isinstance(layer.intermediate.dense, PackedBf16Linear) and layer.intermediate.dense.activation == "gelu"
    assert isinstance(layer.attention.self.query, PackedBf16Linear)
    cosine = cosine_to(fp32, loaded.model.encode(texts, batch_size=16))
    assert cosine.mean() >= 0.9999 and cosine.min() >= 0.999, (cosine.mean(), cosine.min())


@needs_packing
def test_packed_minilm_runs_a_bf16_residual_stream_whatever_a_text_s_batch(minilm_path, shared_data):
    """With packed layers every batch, padded or not, runs the fused blocks on a bf16 residual stream:
    a text's vector is the same alone as beside longer texts, and within bf16's tolerance of fp32."""
    import json

    rows = [json.loads(line) for line in (shared_data / "stsb" / "dev.jsonl").open(encoding="utf-8")]
    texts = [row["sentence1"] for row in rows[:8]]
    model = load_inference_model(str(minilm_path), "bf16").model
    stream = []
    norm = model[0].auto_model.encoder.layer[1].attention.output.LayerNorm
    handle = norm.register_forward_hook(lambda module, inputs, output: stream.append(inputs[0].dtype))
    alone = np.stack([model.encode([text])[0] for text in texts])  # one text: a batch without padding
    handle.remove()
    together = model.encode(texts + [" ".join(texts)], batch_size=16)[:len(texts)]
    assert stream == [torch.bfloat16] * len(texts)
    # oneDNN blocks a product by its row count, so a text's sums are rounded in another order beside
    # other texts: 0.999995+ on an avx512_bf16 EPYC, 0.999982 on an AMX Xeon (2026-11-28)
    assert cosine_to(alone, together).min() >= 0.99995
    fp32 = load_inference_model(str(minilm_path), "fp32").model.encode(texts)
    cosine = cosine_to(fp32, together)
    assert cosine.mean() >= 0.9999 and cosine.min() >= 0.999, (cosine.mean(), cosine.min())


def test_autos_bf16_trial_leaves_the_model_it_measures_unpacked(minilm_path):
    """``auto`` tries bf16 on a copy where bf16 replaces layers: fp32, if chosen, is the model as loaded."""
    machine = describe_machine("cpu")
    loaded = load_inference_model(str(minilm_path), "fp32")
    model = loaded.model
    before = copy.deepcopy(model.state_dict())
    choose_precision(model, ["a short text", "a somewhat longer text about something else"], machine)
    assert not any(isinstance(module, PackedBf16Linear) for module in model.modules())
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_bf16_stays_autocast_where_the_cpu_cannot_pack(minilm_path, monkeypatch):
    no_units = Machine("cpu", "AVX2 CPU", (), "AVX2", 1)
    assert not replaces_layers("bf16", no_units) and replaces_layers("int8", no_units)
    monkeypatch.setattr(runtime, "describe_machine", lambda device=None: Machine("cpu", "x", ("avx512_bf16",), "AVX512", 1))
    monkeypatch.setattr("neobert_embed.inference.kernels.packed_bf16_available", lambda: False)
    loaded = load_inference_model(str(minilm_path), "bf16")
    assert not any(isinstance(module, PackedBf16Linear) for module in loaded.model.modules())
    assert loaded.model.autocast == ("cpu", "bf16")  # the EmbeddingModel's forward enters autocast
    assert np.isfinite(loaded.model.encode(["one text"])).all()
