"""The uniform evaluation recipe: how every model is turned into embeddings for MTEB.

Why: the paper's comparison is only fair if every backbone is encoded the same way — masked mean
pooling, the same maximum length, the same normalization and precision, and the same instruction
per task. All of that lives here, in one validated object, and is written next to the results so
a score can always be traced back to the settings that produced it.

Instructions: a task's instruction is the one the task itself defines, never a guess. For tasks
registered in mteb that is ``TaskMetadata.prompt`` — the per-task instructions mteb maintains for
instruction-tuned models (the E5-mistral instructions of Wang et al. 2024, "Improving Text
Embeddings with Large Language Models", Tables 13-14, as used by mteb's ``e5_instruct`` and other
instruct wrappers). For local tasks it is the ``instruction`` key of ``task.json``. A task that
defines none is encoded without any prefix, for every model. ``overrides`` in the recipe file
replace the instruction of named tasks (e.g. to add one for STS). Queries get the ``query``
instruction; documents get the ``document`` one (mteb defines none for retrieval documents, as
E5 does); symmetric tasks (STS, classification, clustering, pair classification) use the one
instruction for all their texts.

Example:
    >>> recipe = load_evaluation_recipe("recipes/mteb-eval.yaml")
    >>> recipe.max_length, recipe.normalize
    (1024, True)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from neobert_embed.files import value_digest
from neobert_embed.recipes import load_spec

if TYPE_CHECKING:
    from mteb import TaskMetadata
    from mteb.types import PromptType

DEFAULT_RECIPE_NAME = "mteb-eval.yaml"
E5_INSTRUCTION_TEMPLATE = "Instruct: {instruction}\nQuery: "


class TaskInstruction(BaseModel):
    """Instruction for one task: ``query`` for queries (and symmetric tasks), ``document`` for documents."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    query: str | None = None
    document: str | None = None


class EvaluationRecipe(BaseModel):
    """Everything that decides how a model's embeddings are computed for evaluation.

    Attributes:
        max_length: tokens per input (1024 as in the paper); capped by what the encoder's positions allow.
        normalize: L2-normalize embeddings (cosine similarity everywhere).
        precision: compute precision of the model's forward (``auto`` | ``fp32`` | ``bf16`` | ``fp16`` |
            ``int8``, see :mod:`neobert_embed.inference.runtime`); the weights stay as saved. fp32 by
            default, as published scores are computed. Before compute precisions, ``fp16``/``bf16``
            here cast the weights; the same values now mean autocast, and results of those recipes are
            stored apart (see :meth:`fingerprint`).
        pooling: only ``mean`` (masked mean pooling, the paper's choice for every backbone).
        batch_size: encoding batch size (speed only; not part of the fingerprint).
        instructions: ``task`` = the task's own instruction (mteb's TaskMetadata.prompt or the local
            task.json), ``none`` = never any instruction.
        instruction_template: how an instruction becomes a text prefix; must contain ``{instruction}``.
        overrides: task name → instruction, replacing what the task defines.

    Example:
        >>> len(EvaluationRecipe(max_length=512, precision="bf16").fingerprint())
        12
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_length: int = Field(1024, ge=1)
    normalize: bool = True
    precision: Literal["auto", "fp32", "bf16", "fp16", "int8"] = "fp32"
    pooling: Literal["mean"] = "mean"
    batch_size: int = Field(32, ge=1)
    instructions: Literal["task", "none"] = "task"
    instruction_template: str = E5_INSTRUCTION_TEMPLATE
    overrides: dict[str, TaskInstruction] = Field(default_factory=dict)

    @field_validator("instruction_template")
    @classmethod
    def _template_has_slot(cls, value: str) -> str:
        if "{instruction}" not in value:
            raise ValueError("must contain '{instruction}' where the task's instruction goes")
        return value

    def fingerprint(self) -> str:
        """Short hash of every setting that changes scores (batch size excluded).

        Results of different recipes are stored apart (mteb's experiment folder), so changing the
        recipe never mixes or overwrites scores. A precision other than fp32 is hashed as a compute
        precision (``bf16-compute``), so scores an earlier version computed with bf16/fp16 *weights*
        under the same recipe are not reused as if computed by autocast; fp32 hashes as before.
        """
        settings = self.model_dump(exclude={"batch_size"})
        if self.precision != "fp32":
            settings["precision"] = f"{self.precision}-compute"
        return value_digest(settings, 12)

    def instruction(self, task_metadata: TaskMetadata, prompt_type: PromptType | None) -> str:
        """The text prefix for one side of one task ('' when the task defines no instruction).

        Args:
            task_metadata: the task's ``mteb.TaskMetadata`` (its ``prompt`` holds the instruction).
            prompt_type: ``mteb.types.PromptType.query`` / ``.document``, or None for symmetric tasks.

        Example:
            >>> import mteb
            >>> recipe.instruction(mteb.get_task("SciFact").metadata, PromptType.query)
            'Instruct: Given a scientific claim, retrieve documents that support or refute the claim\\nQuery: '
        """
        if self.instructions == "none":
            return ""
        side = getattr(prompt_type, "value", prompt_type) or "query"
        override = self.overrides.get(task_metadata.name)
        if override is not None:
            text = getattr(override, side)
        else:
            prompt = task_metadata.prompt
            text = prompt.get(side) if isinstance(prompt, dict) else (prompt if side == "query" else None)
        return self.instruction_template.format(instruction=text) if text else ""


def load_evaluation_recipe(path: str | Path | None = None, **overrides: Any) -> EvaluationRecipe:
    """Read a recipe YAML (default ``recipes/mteb-eval.yaml``), then apply command-line overrides.

    Unknown keys and bad values raise :class:`UserInputError` naming the file, the line and the key.
    Overrides whose value is None are ignored, so CLI options that were not given keep the file's value.

    Example:
        >>> recipe = load_evaluation_recipe(None, max_length=512, precision="bf16")
    """
    return load_spec(path, EvaluationRecipe, default=DEFAULT_RECIPE_NAME, overrides=overrides)
