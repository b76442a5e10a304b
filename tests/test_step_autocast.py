"""``cast_weights_once``: one autocast region around a training step's forwards casts each weight once.

Why: accelerate wraps each forward of the model in its own autocast region, so a contrastive step
(queries and documents: two or more forwards) casts every fp32 weight to bf16 three times, a copy
kernel per linear layer per forward (a third of the ~1,500 copies of one step in the H200 profile).
An outer, disabled region around the step keeps autocast's cache of casts across the forwards'
own regions (the cache is cleared when the outermost region ends). Checked on the CPU's bf16 autocast
with accelerate's wrapping reproduced: the weight casts are counted (this fails if torch changes when
it clears the cache), the loss is the same, and the gradients match within bf16 rounding (a weight's
gradient is summed in bf16 before its cast).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
from tiny_models import build_tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from neobert_embed.contrastive import ContrastiveRecipe
from neobert_embed.contrastive.loss import build_contrastive_loss
from neobert_embed.contrastive.trainer import ContrastiveTrainer
from neobert_embed.sentence import load_sentence_model

COLUMNS = [["the red cat sat", "a blue dog ran far away", "green trees"],
           ["a cat that is red sat down", "the dog is blue", "trees that are green grow"],
           ["a fish", "the bird flew over the house", "white snow"]]


class WeightCasts(TorchDispatchMode):
    """Counts bf16 copies of the model's 2-D parameters (autocast's weight casts)."""

    def __init__(self, weights: set[int]) -> None:
        super().__init__()
        self.weights, self.count = weights, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and id(args[0]) in self.weights:
            self.count += kwargs.get("dtype") == torch.bfloat16
        return func(*args, **kwargs)


def _step(model, recipe: ContrastiveRecipe) -> tuple[float, dict[str, torch.Tensor], int]:
    """Loss, gradients and weight casts of one step, forwards wrapped as accelerate wraps them."""
    model.zero_grad(set_to_none=True)
    trainer = SimpleNamespace(recipe=recipe, args=SimpleNamespace(bf16=True, fp16=False, device=torch.device("cpu")))
    features = [model.preprocess(texts) for texts in COLUMNS]
    counter = WeightCasts({id(p) for p in model.parameters() if p.ndim == 2})
    with counter, ContrastiveTrainer.step_autocast(trainer, training=True):
        loss = build_contrastive_loss(model, recipe)(features, labels=None)
        loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, \
        counter.count


@pytest.fixture
def model(tmp_path):
    model = load_sentence_model(str(build_tiny_model("bert", tmp_path / "bert"))).train()
    forward = model.forward

    @functools.wraps(forward)
    def per_forward_autocast(*args, **kwargs):  # what accelerate does to a model under bf16
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return forward(*args, **kwargs)

    model.forward = per_forward_autocast
    return model


def test_weights_are_cast_once_per_step_and_the_step_matches_per_forward_casts(model):
    torch.manual_seed(0)
    loss, grads, casts = _step(model, ContrastiveRecipe())
    torch.manual_seed(0)
    once_loss, once_grads, once_casts = _step(model, ContrastiveRecipe(cast_weights_once=True))
    # the loss runs the queries and the documents in separate forwards (2 or more): each casts every weight
    assert once_casts > 0 and casts >= 2 * once_casts and casts % once_casts == 0
    assert once_loss == loss  # the forwards see the same bf16 weights, the loss runs in fp32 as before
    for name, grad in grads.items():
        torch.testing.assert_close(once_grads[name], grad, rtol=0.05, atol=1e-3, msg=name)


def test_the_cached_loss_refuses_one_cast_per_step():
    with pytest.raises(ValueError, match="cast_weights_once"):
        ContrastiveRecipe(cached=True, cast_weights_once=True)
