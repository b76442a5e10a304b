"""``compile_layers`` (contrastive and pretraining recipes): the repeated layer's norm and MLP blocks
are compiled in place, attention and bare linears are not, and the model computes and saves the same.

Why: the option is measured on a GPU (``benchmarks/gpu.py``), where a wrong block choice (attention,
whose per-step kernel closure would recompile every step) or a changed state dict (checkpoints that
no longer load) would not show as an error. Compiled here with the ``eager`` backend (dynamo's graph
capture without inductor's code generation, which takes minutes on a small CPU).
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import build_tiny_model

from neobert_embed import layer_compile
from neobert_embed.sentence import load_sentence_model

EXPECTED_BLOCKS = {  # what each family's layers hold besides attention and bare linears (ModernBERT's
    "neobert": {"ffn", "attention_norm", "ffn_norm"},  # first layer has an Identity for attn_norm)
    "bert": {"intermediate", "output"},
    "modernbert": {"attn_norm", "mlp_norm", "mlp"},
}


@pytest.mark.parametrize("arch", sorted(EXPECTED_BLOCKS))
def test_norm_and_mlp_blocks_of_every_layer_are_compiled_and_the_model_computes_the_same(arch, tmp_path):
    model = load_sentence_model(str(build_tiny_model(arch, tmp_path / arch))).eval()
    features = model.preprocess(["a short text", "a somewhat longer text about nothing in particular"])
    with torch.no_grad():
        before = model(dict(features))["sentence_embedding"]
    keys = list(model.state_dict())

    compiled = layer_compile.compile_repeated_layers(model, backend="eager")

    layers = layer_compile.repeated_layers(model)
    assert {name.rsplit(".", 1)[1] for name in compiled} == EXPECTED_BLOCKS[arch]
    assert {int(name.rsplit(".", 2)[1]) for name in compiled} == set(range(len(layers)))  # every layer
    assert not any("Attention" in type(model.get_submodule(name)).__name__ for name in compiled)
    with torch.no_grad():
        after = model(dict(features))["sentence_embedding"]
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)
    assert list(model.state_dict()) == keys  # checkpoints keep their keys


def test_a_model_without_a_stack_of_layers_compiles_nothing():
    assert layer_compile.compile_repeated_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)), backend="eager") == []
