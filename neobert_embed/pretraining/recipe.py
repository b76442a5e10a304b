"""Pretraining recipes: one YAML file says everything a run does.

Why: a pretraining run lasts days and is resumed many times; its settings must live in a file that
is checked completely before the first step. Every section rejects unknown keys and every
incompatible combination is refused naming the key, so a typo never silently falls back to a
default. The defaults are the NeoBERT paper's optimisation settings.

Example:
    >>> recipe = load_pretrain_recipe("recipes/pretrain-tiny.yaml")
    >>> recipe.masking.rate
    0.2
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from neobert_embed.errors import UserInputError
from neobert_embed.options import MAX_SEED, MAX_STEPS
from neobert_embed.recipes import Spec, load_spec


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelSection(_Section):
    """The encoder: a fresh NeoBERT of the given sizes, or weights to continue from.

    ``init_from`` (a directory written by ``pretrain export`` / a previous run's ``final``, or a
    hub id) excludes the size keys: the sizes come from that model. ``max_length`` may still be
    given with ``init_from`` to extend the context (stage 2: 1024 -> 4096 positions).
    ``attention_backend`` is NeoBERT's: ``auto`` (un-padded varlen whenever there is padding or
    packing), ``varlen``, or ``padded`` (dense attention over pad tokens: the unpacked baseline).
    """

    init_from: str | None = None
    hidden_size: int | None = Field(default=None, gt=0)
    num_hidden_layers: int | None = Field(default=None, gt=0)
    num_attention_heads: int | None = Field(default=None, gt=0)
    intermediate_size: int | None = Field(default=None, gt=0)
    max_length: int | None = Field(default=None, gt=0)
    attention_backend: Literal["auto", "varlen", "padded"] = "auto"

    @model_validator(mode="after")
    def _sizes_or_init(self) -> ModelSection:
        sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
        given = [key for key in sizes if getattr(self, key) is not None]
        if self.init_from and given:
            raise ValueError(f"model.init_from takes the sizes from that model; remove model.{given[0]}")
        if not self.init_from and len(given) != len(sizes):
            missing = [key for key in sizes if key not in given]
            raise ValueError(f"a new model needs model.{missing[0]} (or set model.init_from)")
        return self


class TokenizerSection(_Section):
    """``source: train`` learns a WordPiece vocabulary of ``vocab_size`` on the corpus itself;
    otherwise ``source`` is a hub id (NeoBERT: ``google-bert/bert-base-uncased``) or a directory."""

    source: str = "google-bert/bert-base-uncased"
    vocab_size: int | None = Field(default=None, ge=64)

    @model_validator(mode="after")
    def _vocab_only_when_training(self) -> TokenizerSection:
        if self.source == "train" and self.vocab_size is None:
            raise ValueError("tokenizer.source 'train' needs tokenizer.vocab_size")
        if self.source != "train" and self.vocab_size is not None:
            raise ValueError("tokenizer.vocab_size only applies to tokenizer.source 'train'; remove it")
        return self


class LengthBucket(_Section):
    """Documents of up to ``max_tokens`` tokens (``null``: any longer one) drawn with ``weight``."""

    max_tokens: int | None = Field(default=None, gt=0)
    weight: float = Field(gt=0)


class DataSection(_Section):
    """How documents become training rows."""

    seq_length: int = Field(default=1024, ge=8)
    packing: bool = True
    text_field: str = "text"
    num_proc: int = Field(default=1, ge=1)
    length_mixture: list[LengthBucket] | None = None

    @model_validator(mode="after")
    def _mixture_is_ordered(self) -> DataSection:
        if self.length_mixture:
            bounds = [b.max_tokens for b in self.length_mixture]
            if any(b is None for b in bounds[:-1]):
                raise ValueError("data.length_mixture: only the last bucket may have max_tokens null")
            finite = [b for b in bounds if b is not None]
            if finite != sorted(set(finite)):
                raise ValueError("data.length_mixture: max_tokens must increase from bucket to bucket")
        return self


class MaskingSection(_Section):
    """MLM corruption: ``mask_all`` (every selected token -> [MASK], NeoBERT) or ``bert`` (80/10/10)."""

    rate: float = Field(default=0.2, gt=0, lt=1)
    mode: Literal["mask_all", "bert"] = "mask_all"


class OptimizerSection(_Section):
    """AdamW as in the NeoBERT paper."""

    lr: float = Field(default=6e-4, gt=0)  # no --lr flag to mirror; the loop skips and stops on NaN itself
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.1, ge=0)
    grad_clip: float = Field(default=1.0, ge=0)


class ScheduleSection(_Section):
    """Linear warmup, then cosine decay to ``final_lr_ratio`` x peak over ``decay_fraction`` of training."""

    warmup_steps: int = Field(default=2000, ge=0)
    decay_fraction: float = Field(default=0.9, gt=0, le=1)
    final_lr_ratio: float = Field(default=0.1, ge=0, le=1)


class TrainingSection(_Section):
    """Length, batch, precision and engine of the run.

    Rows per optimizer step = ``micro_batch_size`` x ``gradient_accumulation_steps`` x processes.
    ``cpu_threads`` sets torch's CPU threads for CPU training (``null``: torch's default); on a
    machine shared with other jobs one thread avoids OpenMP threads spinning against each other.
    ``precision``: ``bf16`` (mixed precision, fp32 master weights), ``fp32``, or ``auto``: bf16 where
    the GPU or CPU has bf16 matrix units, else fp32 (:mod:`neobert_embed.training_precision`).
    ``loss_chunk_tokens`` bounds the MLM head's logits for large micro-batches (same loss; the chunks'
    logits are recomputed in the backward); ``compile_layers`` compiles the repeated layer's norm and
    MLP blocks. Both are off unless set: ``benchmarks/gpu.py`` measures them.
    """

    max_steps: int = Field(default=1_000_000, gt=0, le=MAX_STEPS)
    micro_batch_size: int = Field(default=8, gt=0)
    gradient_accumulation_steps: int = Field(default=1, gt=0)
    precision: Literal["auto", "bf16", "fp32"] = "bf16"
    engine: Literal["auto", "deepspeed", "torch"] = "auto"
    zero_stage: int = Field(default=0, ge=0, le=3)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    cpu_threads: int | None = Field(default=None, gt=0)
    max_bad_steps: int = Field(default=10, gt=0)
    log_every_steps: int = Field(default=10, gt=0)
    loss_chunk_tokens: int | None = Field(default=None, gt=0)  # MLM head over at most this many masked tokens at once
    compile_layers: bool = False  # torch.compile of each layer's norm/MLP blocks (neobert_embed.layer_compile)
    tensorboard: bool = False
    wandb: bool = False

    @model_validator(mode="after")
    def _zero_needs_deepspeed(self) -> TrainingSection:
        if self.engine == "torch" and self.zero_stage > 0:
            raise ValueError("training.zero_stage > 0 needs training.engine 'deepspeed' (or 'auto')")
        return self


class CheckpointSection(_Section):
    """Save every ``every_steps`` optimizer steps; keep the ``keep_last`` newest."""

    every_steps: int = Field(default=1000, gt=0)
    keep_last: int = Field(default=3, gt=0)


class PretrainRecipe(_Section):
    """A whole pretraining run. Sections: model, tokenizer, data, masking, optimizer, schedule,
    training, checkpoint."""

    model: ModelSection
    tokenizer: TokenizerSection = TokenizerSection()
    data: DataSection = DataSection()
    masking: MaskingSection = MaskingSection()
    optimizer: OptimizerSection = OptimizerSection()
    schedule: ScheduleSection = ScheduleSection()
    training: TrainingSection = TrainingSection()
    checkpoint: CheckpointSection = CheckpointSection()

    @model_validator(mode="after")
    def _compatible(self) -> PretrainRecipe:
        if self.model.init_from and self.tokenizer.source == "train":
            raise ValueError("tokenizer.source 'train' cannot be used with model.init_from: the "
                             "vocabulary must be the initial model's; remove tokenizer.source")
        if self.model.max_length is not None and self.data.seq_length > self.model.max_length:
            raise ValueError(f"data.seq_length ({self.data.seq_length}) exceeds model.max_length "
                             f"({self.model.max_length}); raise model.max_length or shorten the rows")
        if self.data.packing and self.model.attention_backend == "padded":
            raise ValueError("data.packing needs the varlen attention path to keep documents apart; "
                             "set model.attention_backend to 'auto' or turn data.packing off")
        return self

    def with_max_steps(self, max_steps: int | None) -> PretrainRecipe:
        """This recipe trained for ``max_steps`` (the schedule stretches or shrinks with it)."""
        if max_steps is None:
            return self
        if max_steps <= 0:
            raise UserInputError(f"--max-steps must be positive, got {max_steps}")
        return self.model_copy(update={"training": self.training.model_copy(update={"max_steps": max_steps})})


def parse_pretrain_recipe(data: dict, source: str = "<recipe>") -> PretrainRecipe:
    """Validate a recipe given as a dict (``source`` names it in errors).

    Example:
        >>> parse_pretrain_recipe({"model": {"init_from": "runs/stage1/final"}}).model.init_from
        'runs/stage1/final'
    """
    return Spec(source, data).validate(PretrainRecipe)


def load_pretrain_recipe(path: str | Path) -> PretrainRecipe:
    """Read and validate a YAML recipe; errors name the file, the line and the offending key.

    Example:
        >>> load_pretrain_recipe("recipes/pretrain-stage1.yaml").data.seq_length
        1024
    """
    return load_spec(path, PretrainRecipe)
