"""Batches for multi-dataset contrastive training: one dataset per step, drawn ∝ rows^α.

Why: in-batch negatives only make sense among texts of one dataset (mixing a QA set with NLI
pairs makes the negatives trivially easy), and sampling datasets ∝ rows^α with α < 1 keeps huge
datasets from drowning small ones. sentence-transformers offers round-robin and proportional
multi-dataset samplers but neither α-weighting nor a step-based stream, so this module adds
:class:`AlphaBatchSampler` on top of its ``MultiDatasetDefaultBatchSampler`` and reuses its
``NoDuplicatesBatchSampler`` inside each dataset (no text twice in a batch).

Resume safety: the stream is a pure function of (seed, epoch). Its length is the run's number of
batches, so the Trainer sees one epoch and, on ``--resume``, fast-forwards by replaying the same
stream and skipping the first k batches; no state outside the seed is needed.

Example:
    >>> sampler = AlphaBatchSampler(ConcatDataset([a, b]), [sampler_a, sampler_b], seed=0,
    ...                             alpha=0.5, num_batches=2000)
    >>> next(iter(sampler))          # indices into the ConcatDataset, all from a or all from b
    [412, 7, 93, 1001]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import accumulate

import numpy as np
import torch
from sentence_transformers.base.sampler import MultiDatasetDefaultBatchSampler, NoDuplicatesBatchSampler
from torch.utils.data import BatchSampler, ConcatDataset

from neobert_embed.errors import UserInputError

CHILD_SEED_STRIDE = 1_000_003  # seeds of different datasets' samplers never meet
PASSES_PER_EPOCH = 10_007  # a child's pass counter within one epoch of the stream


def dataset_probabilities(sizes: Sequence[int], alpha: float) -> np.ndarray:
    """Probability of drawing each dataset for a step: ``rows**alpha`` normalised.

    Example:
        >>> dataset_probabilities([100, 400], alpha=0.5).round(3)
        array([0.333, 0.667])
    """
    weights = np.asarray(sizes, dtype=np.float64) ** alpha
    return weights / weights.sum()


def no_duplicates_sampler(dataset, batch_size: int, seed: int, position: int) -> NoDuplicatesBatchSampler:
    """A sampler of full batches without repeated texts for the ``position``-th dataset, with its own RNG
    (``train_contrastive`` has checked that the dataset fills one batch).

    Example:
        >>> len(next(iter(no_duplicates_sampler(ds, batch_size=8, seed=0, position=0))))
        8
    """
    return NoDuplicatesBatchSampler(dataset, batch_size=batch_size, drop_last=True,
                                    generator=torch.Generator(),
                                    seed=seed + (position + 1) * CHILD_SEED_STRIDE)


class AlphaBatchSampler(MultiDatasetDefaultBatchSampler):
    """Yield ``num_batches`` batches; each from one dataset drawn with probability ∝ rows^α.

    Args:
        dataset: the ConcatDataset of all training datasets (indices are offset into it).
        batch_samplers: one sampler per dataset; each is restarted (new epoch, new shuffle) when
            exhausted, so small datasets cycle while large ones are still mid-pass.
        seed: makes the stream reproducible (the epoch is mixed in by ``set_epoch``).
        alpha: 1 = proportional to size, 0 = uniform over datasets.
        num_batches: length of the stream: steps × processes, for one Trainer epoch.
        batches_per_draw: consecutive batches taken from each drawn dataset; set to the number of
            processes under DDP so that all ranks of one optimizer step share a dataset.

    Example:
        >>> sampler = AlphaBatchSampler(concat, samplers, seed=0, alpha=0.5, num_batches=100)
        >>> len(sampler)
        100
    """

    def __init__(self, dataset: ConcatDataset, batch_samplers: list[BatchSampler],
                 generator: torch.Generator | None = None, seed: int = 0, *, alpha: float = 0.5,
                 num_batches: int, batches_per_draw: int = 1) -> None:
        super().__init__(dataset, batch_samplers, generator=generator, seed=seed)
        if num_batches < 1 or batches_per_draw < 1:
            raise ValueError("num_batches and batches_per_draw must be positive")
        self.alpha = alpha
        self.num_batches = num_batches
        self.batches_per_draw = batches_per_draw
        self.probabilities = dataset_probabilities([len(d) for d in dataset.datasets], alpha)
        # Batch sizes differ between datasets (text budget // texts per row): declare them dynamic,
        # or accelerate's DDP sharding silently drops every batch whose size differs from the first
        # dataset's. Every batch is full, so nothing is "last and partial".
        self.batch_size = None
        self.drop_last = True

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch only: children's epochs are the pass counters managed in ``__iter__``."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        offsets = [0, *accumulate(len(d) for d in self.dataset.datasets)]
        passes = [0] * len(self.batch_samplers)
        streams: list[Iterator[list[int]] | None] = [None] * len(self.batch_samplers)
        choice = 0
        for position in range(self.num_batches):
            if position % self.batches_per_draw == 0:
                choice = int(rng.choice(len(self.probabilities), p=self.probabilities))
            batch = self._next_batch(choice, streams, passes)
            yield [index + offsets[choice] for index in batch]

    def _next_batch(self, choice: int, streams: list, passes: list[int]) -> list[int]:
        for _ in range(2):
            if streams[choice] is not None:
                batch = next(streams[choice], None)
                if batch is not None:
                    return batch
            sampler = self.batch_samplers[choice]
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(self.epoch * PASSES_PER_EPOCH + passes[choice])
            passes[choice] += 1
            streams[choice] = iter(sampler)
        raise UserInputError(f"dataset #{choice} cannot fill a single batch without repeating a text; "
                             "lower text_budget/batch_size or deduplicate the dataset")
