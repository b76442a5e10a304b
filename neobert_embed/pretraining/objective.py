"""The MLM objective as one module: encoder, head on the masked positions only, loss and accuracy.

Why: the vocabulary projection is the most expensive matmul of a small encoder; only the ~20%
masked positions need it. Wrapping model + loss in one ``nn.Module`` also gives DeepSpeed a
single forward to run under ZeRO (it partitions and gathers this module's parameters).

Example:
    >>> objective = MaskedLMObjective(NeoBERTForMaskedLM(config))
    >>> loss, correct, predicted = objective(input_ids=ids, attention_mask=mask, labels=labels)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neobert_embed.pretraining.masking import IGNORE_INDEX


class MaskedLMObjective(nn.Module):
    """Wraps a ``NeoBERTForMaskedLM``; ``forward`` returns (mean loss, #correct, #masked)."""

    def __init__(self, mlm: nn.Module) -> None:
        super().__init__()
        self.mlm = mlm

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                **packing: torch.Tensor | int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = self.mlm.model(input_ids, attention_mask, return_dict=True, **packing).last_hidden_state
        selected = labels != IGNORE_INDEX
        targets = labels[selected]
        logits = self.mlm.decoder(hidden[selected]).float()
        if targets.numel() == 0:  # nothing masked in this micro-batch: a zero loss keeps ranks in step
            zero = logits.sum() * 0.0
            return zero, targets.new_zeros(()), targets.new_zeros(())
        loss = F.cross_entropy(logits, targets)
        correct = (logits.argmax(-1) == targets).sum()
        return loss, correct, targets.new_tensor(targets.numel())
