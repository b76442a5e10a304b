"""GradCache mini-batches cut by a token budget (recipe key ``mini_batch_tokens``).

Why: a fixed number of texts per mini-batch is a poor fit for mixed lengths (a mini-batch of long
texts runs out of memory where one of short texts leaves the GPU idle); sentence-transformers'
``CachedMultipleNegativesRankingLoss`` packs mini-batches by real tokens (``mini_batch_num_tokens``)
and the recipe passes its key through. These checks go through the toolkit's entry point
(``build_contrastive_loss``): every embedding call holds at most the budget's real tokens (a lone
longer text excepted), the first pass runs without autograd, and the loss and every gradient equal
the uncached loss's.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import build_tiny_model

from neobert_embed.contrastive import ContrastiveRecipe
from neobert_embed.contrastive.loss import build_contrastive_loss
from neobert_embed.sentence import load_sentence_model

WORDS = ["the", "a", "red", "cat", "sat", "on", "mat", "near", "blue", "dog", "under", "green", "tree", "by", "white", "house", "of", "old", "town"]
BUDGET = 40  # real tokens per mini-batch


def _texts(count: int, seed: int) -> list[str]:
    """Texts of 1 to 24 words (3 to ~26 tokens with [CLS]/[SEP]): mixed lengths, none alone over the budget
    except when asked for."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 25, (count,), generator=generator).tolist()
    return [" ".join(WORDS[(seed + i + j) % len(WORDS)] for j in range(n)) for i, n in enumerate(lengths)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.manual_seed(0)
    return load_sentence_model(str(build_tiny_model("bert", tmp_path_factory.mktemp("m") / "bert"))).double().eval()


def _loss_and_grads(model, recipe: ContrastiveRecipe, features) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = build_contrastive_loss(model, recipe)(features, labels=None)
    loss.backward()
    return float(loss.detach()), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_token_budget_mini_batches_hold_the_budget_and_give_the_uncached_loss_and_gradients(model):
    columns = [_texts(12, seed) for seed in (1, 2, 3)]
    columns[2][5] = " ".join(WORDS * 3)  # one negative longer than the budget alone: its own mini-batch
    features = [model.preprocess(texts) for texts in columns]
    calls: list[tuple[int, int, bool]] = []  # (texts, real tokens, autograd on) of each embedding call

    def record(module, args):
        mask = args[0]["attention_mask"]
        calls.append((int(mask.shape[0]), int(mask.sum()), torch.is_grad_enabled()))

    cached = ContrastiveRecipe(cached=True, mini_batch_tokens=BUDGET)
    hook = model[0].register_forward_pre_hook(record)
    try:
        value, grads = _loss_and_grads(model, cached, [dict(f) for f in features])
    finally:
        hook.remove()
    expected_value, expected_grads = _loss_and_grads(model, ContrastiveRecipe(), [dict(f) for f in features])

    first_pass, second_pass = calls[:len(calls) // 2], calls[len(calls) // 2:]
    assert first_pass == [(texts, tokens, False) for texts, tokens, _ in second_pass]  # no autograd, then replay
    assert all(grad for *_, grad in second_pass)
    assert sum(texts for texts, *_ in first_pass) == sum(len(c) for c in columns)  # every text once per pass
    assert all(tokens <= BUDGET or texts == 1 for texts, tokens, _ in first_pass), first_pass
    assert any(texts == 1 and tokens > BUDGET for texts, tokens, _ in first_pass)  # the long text alone
    assert len(first_pass) > len(columns)  # the budget cut the batch (not one call per column)
    assert value == pytest.approx(expected_value, abs=1e-10)
    assert grads.keys() == expected_grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-8, atol=1e-10, msg=name)


def test_the_budget_only_applies_to_the_cached_loss():
    with pytest.raises(ValueError, match="mini_batch_tokens"):
        ContrastiveRecipe(mini_batch_tokens=1024)
    with pytest.raises(ValueError, match="mini_batch_tokens"):
        ContrastiveRecipe(cached=True, mini_batch_tokens=0)
