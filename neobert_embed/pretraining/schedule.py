"""The NeoBERT learning-rate schedule: linear warmup, cosine decay to a floor, then flat.

Why: the paper warms up for 2,000 steps, decays with a cosine to 10% of the peak over 90% of
training and holds that floor for the rest. Expressed as a multiplicative factor for torch's
``LambdaLR`` so DeepSpeed steps and checkpoints it like any scheduler (the factor object is
picklable, unlike a lambda).

Example:
    >>> factor = WarmupCosineFactor(warmup_steps=2000, total_steps=1_000_000)
    >>> factor(999), factor(2000), round(factor(900_000), 3), factor(950_000)
    (0.5, 1.0, 0.1, 0.1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.optim.lr_scheduler import LambdaLR


@dataclass(frozen=True)
class WarmupCosineFactor:
    """Learning-rate multiplier at optimizer step ``step`` (0-based: the factor for the next update)."""

    warmup_steps: int
    total_steps: int
    decay_fraction: float = 0.9
    final_ratio: float = 0.1

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        decay_end = max(self.warmup_steps + 1, round(self.decay_fraction * self.total_steps))
        if step >= decay_end:
            return self.final_ratio
        progress = (step - self.warmup_steps) / (decay_end - self.warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.final_ratio + (1.0 - self.final_ratio) * cosine


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                    decay_fraction: float = 0.9, final_ratio: float = 0.1) -> LambdaLR:
    """A ``torch.optim.lr_scheduler.LambdaLR`` following :class:`WarmupCosineFactor`.

    Example:
        >>> scheduler = build_scheduler(torch.optim.AdamW(model.parameters(), lr=6e-4), 2000, 1_000_000)
    """
    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, WarmupCosineFactor(warmup_steps, total_steps, decay_fraction, final_ratio))
