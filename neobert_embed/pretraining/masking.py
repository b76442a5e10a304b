"""MLM corruption: choose 20% of the real tokens and hide them.

Why our own 30 lines rather than transformers' ``DataCollatorForLanguageModeling``: the choice of
masked tokens must be a pure function of (seed, micro-batch index). That makes a resumed run
bit-identical to an uninterrupted one without saving any RNG stream, and makes a 2-process run
mask exactly what a 1-process run with doubled accumulation masks. The special-token test is one
vectorised ``isin`` instead of a Python loop per row.

Modes:
    ``mask_all``: every selected token becomes [MASK] (NeoBERT's recipe);
    ``bert``: of the selected tokens 80% become [MASK], 10% a random ordinary token, 10% stay.

Example:
    >>> masked, labels = mask_tokens(ids, rate=0.2, mode="mask_all", mask_id=103,
    ...                              special_ids=[0, 100, 101, 102, 103], vocab_size=30522,
    ...                              generator=torch.Generator().manual_seed(0))
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

IGNORE_INDEX = -100


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    rate: float,
    mode: str,
    mask_id: int,
    special_ids: Sequence[int],
    vocab_size: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(corrupted_ids, labels)``; labels hold the original id where a token was selected
    and ``-100`` elsewhere. Special tokens (padding, [CLS], [SEP], [MASK], [UNK]) are never selected.
    """
    if mode not in ("mask_all", "bert"):
        raise ValueError(f"unknown masking mode {mode!r}; use 'mask_all' or 'bert'")
    special = torch.tensor(sorted(set(special_ids)), dtype=input_ids.dtype)
    maskable = ~torch.isin(input_ids, special)
    draws = torch.rand(input_ids.shape, generator=generator)
    selected = (draws < rate) & maskable
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    corrupted = input_ids.clone()
    if mode == "mask_all":
        corrupted[selected] = mask_id
        return corrupted, labels
    kind = torch.rand(input_ids.shape, generator=generator)
    to_mask = selected & (kind < 0.8)
    to_random = selected & (kind >= 0.8) & (kind < 0.9)
    corrupted[to_mask] = mask_id
    ordinary = _ordinary_ids(vocab_size, special)
    picks = torch.randint(len(ordinary), (int(to_random.sum()),), generator=generator)
    corrupted[to_random] = ordinary[picks].to(input_ids.dtype)
    return corrupted, labels


def _ordinary_ids(vocab_size: int, special: torch.Tensor) -> torch.Tensor:
    """Every id of the vocabulary that is not special (random replacements are drawn from these)."""
    everything = torch.arange(vocab_size)
    return everything[~torch.isin(everything, special.to(everything.dtype))]
