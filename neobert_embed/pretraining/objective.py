"""The MLM objective as one module: encoder, head on the masked positions only, loss and accuracy.

Why: the vocabulary projection is the most expensive matmul of a small encoder; only the ~20%
masked positions need it. The batch brings those positions as flat indices computed on the host
with the masking (``masked_positions``), so gathering them is one ``index_select`` on the device and
never waits for the device to count them (a boolean mask would). With ``chunk_tokens``, the head and
the cross-entropy run over at most that many masked tokens at a time, each chunk's logits recomputed
in the backward instead of kept: a micro-batch of 128k tokens (26k masked) would otherwise hold
26k x 30,522 fp32 logits and their gradient (~6 GB). Wrapping model + loss in one ``nn.Module`` also
gives DeepSpeed a single forward to run under ZeRO (it partitions and gathers this module's parameters).

Example:
    >>> objective = MaskedLMObjective(NeoBERTForMaskedLM(config), chunk_tokens=8192)
    >>> loss, correct, predicted = objective(input_ids=ids, attention_mask=mask, labels=labels,
    ...                                      masked_positions=target_positions(labels))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from neobert_embed.pretraining.masking import IGNORE_INDEX


def target_positions(labels: torch.Tensor) -> torch.Tensor:
    """Flat indices (into ``labels.reshape(-1)``) of the positions with a target, in order.

    Example:
        >>> target_positions(torch.tensor([[-100, 7], [5, -100]]))
        tensor([1, 2])
    """
    return (labels.reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1)


def _head_sums(decoder: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy, #correct) of the decoder over ``hidden``: logits in fp32, as before. The
    decoder is called as a module, so ZeRO-3's hooks gather its partitioned weight."""
    logits = decoder(hidden).float()
    return F.cross_entropy(logits, targets, reduction="sum"), (logits.argmax(-1) == targets).sum()


class MaskedLMObjective(nn.Module):
    """Wraps a ``NeoBERTForMaskedLM``; ``forward`` returns (mean loss, #correct, #masked).

    ``chunk_tokens``: None runs the head over every masked token at once (fastest while memory
    allows); a number bounds the logits held at a time (recipe key ``training.loss_chunk_tokens``).
    """

    def __init__(self, mlm: nn.Module, chunk_tokens: int | None = None) -> None:
        super().__init__()
        self.mlm = mlm
        self.chunk_tokens = chunk_tokens

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                masked_positions: torch.Tensor | None = None, **packing: torch.Tensor | int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = self.mlm.model(input_ids, attention_mask, return_dict=True, **packing).last_hidden_state
        if masked_positions is None:  # counted on the device: one wait (callers other than the batch maker)
            masked_positions = target_positions(labels)
        positions = masked_positions.to(hidden.device)
        selected = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
        targets = labels.reshape(-1).to(hidden.device).index_select(0, positions)
        count = targets.numel()  # known on the host: positions' shape
        if count == 0:  # nothing masked in this micro-batch: a zero loss keeps ranks in step
            zero = self.mlm.decoder(selected).float().sum() * 0.0
            return zero, targets.new_zeros(()), targets.new_zeros(())
        decoder = self.mlm.decoder
        chunk = self.chunk_tokens or count
        loss_sum, correct = torch.zeros((), device=hidden.device), targets.new_zeros(())
        for start in range(0, count, chunk):
            part = (decoder, selected[start:start + chunk], targets[start:start + chunk])
            chunk_loss, chunk_correct = (checkpoint(_head_sums, *part, use_reentrant=False) if chunk < count
                                         else _head_sums(*part))
            loss_sum, correct = loss_sum + chunk_loss, correct + chunk_correct
        return loss_sum / count, correct, targets.new_tensor(count)
