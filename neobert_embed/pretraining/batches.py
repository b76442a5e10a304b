"""Micro-batches of one optimizer step, identical however many processes share the work.

Why: an optimizer step consumes ``micro_batch_size x accumulation x processes`` rows; micro-batch
``m`` of step ``s`` always holds the same rows and the same masked positions (the masking seed is
derived from the global micro-batch index), and process ``r`` trains on micro-batches
``r, r + P, r + 2P …``. So 2 processes with accumulation A see exactly what 1 process with
accumulation 2A sees, and a resumed run re-creates the very batches it would have had.

Example:
    >>> maker = BatchMaker(corpus, recipe, rank=0, world_size=1)
    >>> batches = maker.step_batches(stream, step=0)
"""

from __future__ import annotations

import numpy as np
import torch

from neobert_embed.pretraining.masking import mask_tokens
from neobert_embed.pretraining.objective import target_positions
from neobert_embed.pretraining.packing import DocumentStream, collate_rows
from neobert_embed.pretraining.recipe import PretrainRecipe


class BatchMaker:
    """Builds this process's masked micro-batches for a step from the shared document stream."""

    def __init__(self, corpus, recipe: PretrainRecipe, rank: int, world_size: int) -> None:
        self.corpus = corpus
        self.recipe = recipe
        self.rank, self.world_size = rank, world_size
        tokenizer = corpus.tokenizer
        self.pad_id = tokenizer.pad_token_id
        self.mask_id = tokenizer.mask_token_id
        self.special_ids = sorted(set(tokenizer.all_special_ids))
        self.vocab_size = len(tokenizer)

    @property
    def micro_batches_per_step(self) -> int:
        return self.recipe.training.gradient_accumulation_steps * self.world_size

    def step_batches(self, stream: DocumentStream, step: int) -> list[dict[str, torch.Tensor]]:
        """This process's micro-batches of optimizer step ``step``; advances ``stream`` past the step."""
        data, training = self.recipe.data, self.recipe.training
        batches = []
        for m in range(self.micro_batches_per_step):
            rows = [stream.next_row(data.seq_length, data.packing) for _ in range(training.micro_batch_size)]
            if m % self.world_size == self.rank:
                batches.append(self._masked(rows, step * self.micro_batches_per_step + m))
        return batches

    def _masked(self, rows, global_index: int) -> dict[str, torch.Tensor]:
        batch = collate_rows(self.corpus, rows, self.recipe.data.seq_length, self.pad_id)
        seed = int(np.random.SeedSequence([self.recipe.training.seed, global_index]).generate_state(1)[0])
        masking = self.recipe.masking
        batch["input_ids"], batch["labels"] = mask_tokens(
            batch["input_ids"], rate=masking.rate, mode=masking.mode, mask_id=self.mask_id,
            special_ids=self.special_ids, vocab_size=self.vocab_size,
            generator=torch.Generator().manual_seed(seed))
        batch["masked_positions"] = target_positions(batch["labels"])  # on the host: the device never counts them
        if not self.recipe.data.packing:  # the baseline: rows are documents, the mask marks padding
            for key in ("position_ids", "cu_seqlens", "max_seqlen"):
                batch.pop(key)
        return batch
