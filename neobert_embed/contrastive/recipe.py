"""The contrastive fine-tuning recipe: one validated description of a run.

Why: the fair comparison only holds if every backbone is tuned with the *same* settings, so the
settings live in one YAML file checked by pydantic before any model is loaded. Unknown keys and
incompatible options are rejected up front, naming the key; command-line options override the
file. The defaults of :class:`ContrastiveRecipe` are the paper's settings
(``recipes/contrastive.yaml`` spells them out with the reasons).

Example:
    >>> recipe = load_contrastive_recipe("recipes/contrastive.yaml", max_steps=20)
    >>> recipe.temperature, recipe.text_budget
    (0.07, 128)
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from neobert_embed.options import (
    MAX_BATCH,
    MAX_LEARNING_RATE,
    MAX_LENGTH,
    MAX_SEED,
    MAX_STEPS,
    MAX_TEMPERATURE,
)
from neobert_embed.paths import recipe_path
from neobert_embed.recipes import read_spec

DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class DataSource(BaseModel):
    """One named training dataset: a local file/dir or a Hugging Face dataset id.

    ``path`` is anything :func:`neobert_embed.sources.iter_records` reads (a ``.jsonl``,
    ``.ndjson``, ``.json``, ``.csv`` or ``.parquet`` file, a directory of them, a directory written
    by ``datasets.Dataset.save_to_disk``, or a hub id such as
    ``sentence-transformers/natural-questions``; ``subset`` and ``split`` select inside it).
    Instructions are prepended to queries / documents of this dataset only; ``None`` falls back to
    the recipe-wide ones.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    path: str = Field(min_length=1)
    subset: str | None = None
    split: str = "train"
    query_instruction: str | None = None
    document_instruction: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _bare_path(cls, value: Any) -> Any:
        return {"path": value} if isinstance(value, str) else value

    @field_validator("path")
    @classmethod
    def _relative_to_recipe(cls, value: str, info: ValidationInfo) -> str:
        """A relative path is read beside the recipe file when such a file exists there."""
        base = Path((info.context or {}).get("directory", "."))
        return str(base / value) if not Path(value).is_absolute() and (base / value).exists() else value


class ContrastiveRecipe(BaseModel):
    """Every setting of a contrastive fine-tuning run (defaults: the paper's recipe).

    Batching: set exactly one of ``text_budget`` (texts per step; the batch holds
    ``text_budget // texts_per_example`` examples, so a dataset with 3 hard negatives gets smaller
    batches than one with pairs) or ``batch_size`` (fixed examples per step). Both are per device.

    Example:
        >>> ContrastiveRecipe(max_steps=100, batch_size=32, text_budget=None).batch_size
        32
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # optimisation
    max_steps: int = Field(2000, ge=1, le=MAX_STEPS)  # ranges: the flags'
    learning_rate: float = Field(1e-4, gt=0, le=MAX_LEARNING_RATE)
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = Field(0.01, ge=0)
    lr_scheduler: Literal["cosine", "linear", "constant_with_warmup"] = "cosine"
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    max_grad_norm: float = Field(1.0, gt=0)
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    seed: int = Field(0, ge=0, le=MAX_SEED)
    # inputs
    max_length: int = Field(1024, ge=8, le=MAX_LENGTH)
    unpadded: bool = True  # each step's texts as one flat token stream (false: padded, as sentence-transformers)
    query_instruction: str = ""
    document_instruction: str = ""
    # loss
    temperature: float = Field(0.07, gt=0, le=MAX_TEMPERATURE)
    symmetric: bool = False
    cached: bool = False
    mini_batch_size: int | None = Field(None, ge=1)
    mini_batch_tokens: int | None = Field(None, ge=1)  # GradCache mini-batches cut by real tokens (else by texts)
    matryoshka_dims: list[Annotated[int, Field(ge=1)]] | None = None
    gather_across_devices: bool = False
    # GPU step (neobert_embed.layer_compile): off unless benchmarks/gpu.py measured a win
    compile_layers: bool = False  # torch.compile(dynamic=True) of each repeated layer's norm/MLP blocks
    cast_weights_once: bool = False  # one bf16/fp16 cast of the weights per step, not per forward (not cached)
    # batches
    alpha: float = Field(0.5, ge=0, le=1)
    text_budget: int | None = Field(128, ge=2, le=MAX_BATCH)
    batch_size: int | None = Field(None, ge=2, le=MAX_BATCH)
    # bookkeeping
    logging_steps: int = Field(1, ge=1)
    save_steps: int = Field(500, ge=1)
    save_total_limit: int | None = Field(2, ge=1)
    deepspeed: str | dict[str, Any] | None = None
    data: dict[str, DataSource] = Field(default_factory=dict)

    @field_validator("data")
    @classmethod
    def _dataset_names(cls, value: dict[str, DataSource]) -> dict[str, DataSource]:
        for name in value:
            if not DATASET_NAME.match(name):
                raise ValueError(f"dataset name {name!r} must be letters, digits, '_', '.' or '-'")
        return value

    @field_validator("matryoshka_dims")
    @classmethod
    def _dims(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or len(set(value)) != len(value)):
            raise ValueError("must be a non-empty list of distinct positive dimensions, e.g. [768, 256, 64]")
        return sorted(value, reverse=True) if value else value

    @model_validator(mode="after")
    def _compatible(self) -> ContrastiveRecipe:
        if (self.text_budget is None) == (self.batch_size is None):
            raise ValueError("set exactly one of 'text_budget' (texts per step) and 'batch_size' "
                             "(examples per step); they are incompatible")
        if self.mini_batch_size is not None and not self.cached:
            raise ValueError("'mini_batch_size' only applies to the cached (GradCache) loss; "
                             "set 'cached: true' or remove it")
        if self.cast_weights_once and self.cached:
            raise ValueError("'cast_weights_once' does not apply to the cached (GradCache) loss: its pass without "
                             "gradients would cache casts the pass with gradients reuses; remove one of them")
        if self.mini_batch_tokens is not None and not self.cached:
            raise ValueError("'mini_batch_tokens' only applies to the cached (GradCache) loss; "
                             "set 'cached: true' or remove it")
        return self

    def batch_examples(self, texts_per_example: int) -> int:
        """Examples per batch for a dataset whose rows hold ``texts_per_example`` texts.

        Example:
            >>> ContrastiveRecipe(text_budget=128).batch_examples(3)
            42
        """
        if self.batch_size is not None:
            return self.batch_size
        return max(1, self.text_budget // texts_per_example)


def load_contrastive_recipe(path: str | Path | None = None, **overrides: Any) -> ContrastiveRecipe:
    """Read a YAML recipe (default: the bundled ``contrastive.yaml``, the paper's settings), apply
    overrides (``None`` values are ignored), and validate it; errors name the file, line and key.

    Overriding ``batch_size`` clears the file's ``text_budget`` and vice versa, so
    ``--batch-size 64`` on the command line just works with the paper's recipe.

    Example:
        >>> load_contrastive_recipe("recipes/contrastive.yaml", max_steps=20, temperature=0.05)
        >>> load_contrastive_recipe(max_steps=10)          # paper defaults
    """
    spec = read_spec(Path(path) if path is not None else recipe_path("contrastive.yaml"))
    cleared = {"batch_size": "text_budget", "text_budget": "batch_size"}
    data = {**spec.data, **{cleared[key]: None for key, value in overrides.items() if key in cleared and value is not None}}
    return replace(spec, data=data).validate(ContrastiveRecipe, overrides)
