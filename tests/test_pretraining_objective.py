"""The MLM objective computes the head on the masked tokens only, from positions the batch brings,
optionally in chunks, and gives exactly the full-vocabulary loss over all positions.

Why: the head over every position is the costliest matmul of a small encoder and its logits the
largest tensor of a 128k-token micro-batch; the positions come from the host so the device never
counts them. These checks compare against the plain reference (``NeoBERTForMaskedLM`` with labels:
logits at every position, cross-entropy with ``ignore_index``) in fp32 on a tiny NeoBERT: loss,
accuracy and every parameter's gradient, and that no call of the decoder sees more rows than the chunk.
"""

from __future__ import annotations

import copy

import pytest
import torch

from neobert_embed.modeling import NeoBERTConfig, NeoBERTForMaskedLM
from neobert_embed.pretraining.masking import IGNORE_INDEX, mask_tokens
from neobert_embed.pretraining.objective import MaskedLMObjective, target_positions

VOCAB, BATCH, LENGTH = 97, 3, 24


@pytest.fixture
def batch():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, VOCAB, (BATCH, LENGTH), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0  # a padded row: its padding is never a target
    ids[1, 17:] = 0
    ids, labels = mask_tokens(ids, rate=0.3, mode="mask_all", mask_id=4, special_ids=[0, 1, 2, 3, 4],
                              vocab_size=VOCAB, generator=generator)
    labels[mask == 0] = IGNORE_INDEX
    return ids, mask, labels


def _mlm() -> NeoBERTForMaskedLM:
    torch.manual_seed(0)
    return NeoBERTForMaskedLM(NeoBERTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                            num_attention_heads=2, intermediate_size=64, max_length=64)).float()


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("chunk_tokens", [None, 4, 1000])
def test_masked_only_head_equals_the_full_vocabulary_loss_over_all_positions(batch, chunk_tokens):
    ids, mask, labels = batch
    reference = _mlm()
    output = reference(ids, mask, labels=labels, return_dict=True)
    output.loss.backward()
    selected = labels != IGNORE_INDEX
    expected_correct = int((output.logits.argmax(-1)[selected] == labels[selected]).sum())

    mlm = copy.deepcopy(reference)
    mlm.zero_grad(set_to_none=True)
    rows_seen: list[int] = []
    mlm.decoder.register_forward_pre_hook(lambda module, args: rows_seen.append(args[0].shape[0]))
    objective = MaskedLMObjective(mlm, chunk_tokens=chunk_tokens)
    positions = target_positions(labels)
    loss, correct, count = objective(input_ids=ids, attention_mask=mask, labels=labels, masked_positions=positions)
    loss.backward()

    assert int(count) == int(selected.sum()) == positions.numel() > 8
    assert int(correct) == expected_correct
    torch.testing.assert_close(loss, output.loss, rtol=1e-6, atol=1e-6)
    grads, expected = _grads(mlm), _grads(reference)
    assert grads.keys() == expected.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-5, atol=1e-6, msg=name)
    assert max(rows_seen) <= (chunk_tokens or positions.numel())  # the head never sees more than a chunk
    if chunk_tokens is not None and chunk_tokens < positions.numel():
        assert len(rows_seen) > positions.numel() // chunk_tokens  # chunks, recomputed in the backward


def test_positions_from_the_batch_and_from_the_labels_give_one_loss(batch):
    ids, mask, labels = batch
    objective = MaskedLMObjective(_mlm())
    with torch.no_grad():
        given = objective(input_ids=ids, attention_mask=mask, labels=labels, masked_positions=target_positions(labels))
        counted = objective(input_ids=ids, attention_mask=mask, labels=labels)
    assert [float(v) for v in given] == [float(v) for v in counted]
