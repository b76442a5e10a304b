"""The two evaluation protocols: ``model`` (as the model's authors configured it) and ``uniform``.

Why: a new user checks an evaluation tool by running a model whose scores they already know.
Those published scores were computed by mteb with the model's *own* configuration: its saved
prompts (resolved per task name and type by mteb's ``SentenceTransformerEncoderWrapper``), its
own ``max_seq_length``, pooling and normalization modules. Injecting an instruction the model
was never trained with, or raising its length, silently changes the scores (all-MiniLM-L6-v2 on
Banking77: 0.8004 published, 0.7454 with E5 instructions). So:

* ``model`` (the default of ``neobert-embed mteb`` and :func:`run_mteb`): a model mteb knows by
  name is loaded by ``mteb.get_model`` (its own loader and prompts); any other model is loaded as
  saved and wrapped in mteb's own ``SentenceTransformerEncoderWrapper``. Nothing is added.
* ``uniform`` (the paper's protocol, the default of ``compare``): the evaluation recipe
  (``recipes/mteb-eval.yaml``: instructions, length, pooling, precision) for every backbone.

The protocol is part of the results path (mteb's experiment folder) and of each result file's
metadata, so scores of the two protocols are never mixed.

Example:
    >>> encoder = load_model_encoder(model_identity("runs/minilm"))
    >>> mteb.evaluate(encoder, mteb.get_task("Banking77Classification"))
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neobert_embed.errors import UserInputError
from neobert_embed.inference.runtime import PrecisionChoice

if TYPE_CHECKING:
    from mteb import AbsTask, EncoderProtocol, TaskMetadata
    from mteb.models import ModelMeta
    from mteb.types import PromptType

    from neobert_embed.evaluation.encoder import ModelIdentity

logger = logging.getLogger(__name__)

PROTOCOLS: tuple[str, ...] = ("model", "uniform")
DESCRIPTIONS = {
    "model": "each model as its authors configured it (its saved prompts, max_seq_length, pooling, "
             "normalization; mteb's own loader for models it knows)",
    "uniform": "the paper's uniform protocol (the evaluation recipe's instructions, length, pooling and "
               "precision for every model)",
}
DEFAULT_PRECISION_REASON = "default of mteb/compare: published scores are computed in fp32"
RETRIEVAL_TYPES = ("Retrieval", "Reranking", "InstructionRetrieval", "InstructionReranking")


def check_protocol(protocol: str) -> str:
    """Return ``protocol`` if it is ``model`` or ``uniform``, else raise :class:`UserInputError`.

    Example:
        >>> check_protocol("uniform")
        'uniform'
    """
    if protocol not in PROTOCOLS:
        raise UserInputError(f"--protocol {protocol!r}: choose 'model' (the model's own configuration) or "
                             "'uniform' (the evaluation recipe for every model)")
    return protocol


def _registered_meta(name: str) -> ModelMeta | None:
    """mteb's ``ModelMeta`` for a model it knows by name (with a loader), else None."""
    import mteb

    try:
        meta = mteb.get_model_meta(name)
    except KeyError:
        return None
    return meta if meta.loader is not None else None


def load_model_encoder(identity: ModelIdentity, *, device: str | None = None,
                       max_length: int | None = None, compute_precision: str | None = None,
                       sample_texts: Sequence[str] | None = None) -> EncoderProtocol:
    """An mteb encoder that evaluates ``identity`` exactly as its authors configured it.

    A model in mteb's registry (by hub id) is loaded with ``mteb.get_model`` (its own loader,
    prompts and settings); a directory or an unknown hub model is loaded as saved and wrapped in
    mteb's ``SentenceTransformerEncoderWrapper``, which resolves its saved prompts per task name
    and type. ``max_length`` and ``compute_precision`` override the model's own only when given.

    Without ``compute_precision`` the forward runs in fp32, as the published scores were computed;
    with it (``auto``, ``fp32``, ``bf16``, ``fp16``, ``int8``) the model is loaded by
    :func:`~neobert_embed.inference.runtime.load_inference_model`, so the precision is applied exactly
    as by every other command (``auto`` measures on ``sample_texts``). The encoder's
    ``precision_choice`` says which precision its scores are computed in, and why.

    Example:
        >>> encoder = load_model_encoder(model_identity("sentence-transformers/all-MiniLM-L6-v2"))
        >>> encoder.precision_choice.description
        'fp32 (default of mteb/compare: published scores are computed in fp32)'
    """
    from mteb import SentenceTransformerEncoderWrapper

    from neobert_embed.backbones import resolve_model_name
    from neobert_embed.inference.runtime import load_inference_model

    source = identity.source
    local = Path(source).is_dir()
    meta = None if local or compute_precision else _registered_meta(resolve_model_name(source))
    if meta is not None:
        import mteb

        try:
            encoder = mteb.get_model(meta.name, device=device)
        except Exception as exc:  # any loader failure (offline, missing package) is the user's to fix
            raise UserInputError(f"cannot load {meta.name!r} with mteb's loader: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}. Pass a local "
                                 "SentenceTransformer directory instead") from None
        choice = _loader_choice(encoder, device)
    else:
        loaded = load_inference_model(identity.loadable, compute_precision or "fp32", device=device,
                                      revision=None if local else identity.revision, sample_texts=sample_texts)
        choice = loaded.choice if compute_precision else default_choice(loaded.choice)
        encoder = SentenceTransformerEncoderWrapper(loaded.model)
    inner = getattr(encoder, "model", None)
    if max_length is not None and hasattr(inner, "max_seq_length"):
        inner.max_seq_length = int(max_length)
    encoder.mteb_model_meta = identity.meta("model", overrides=model_overrides(max_length, compute_precision),
                                            base=encoder.mteb_model_meta)
    encoder.precision_choice = choice
    return encoder


def default_choice(choice: PrecisionChoice) -> PrecisionChoice:
    """``choice`` (fp32, asked for) relabelled as the evaluation default, so records say why fp32."""
    return replace(choice, requested="fp32", reason=DEFAULT_PRECISION_REASON)


def _loader_choice(encoder: EncoderProtocol, device: str | None) -> PrecisionChoice:
    """What mteb's own loader set: the dtype of the model's weights (it applies no autocast)."""
    from neobert_embed.machine import describe_machine

    inner = getattr(encoder, "model", None)
    parameters = getattr(inner, "parameters", None)
    first = next(iter(parameters()), None) if callable(parameters) else None
    names = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
    precision = names.get(str(getattr(first, "dtype", "")), "fp32")
    return PrecisionChoice(precision, "fp32", f"mteb's own loader for this model ({precision} weights)",
                           describe_machine(device).summary())


def describe_precision(record: dict[str, Any] | None) -> str:
    """``bf16 (asked for)`` from a recorded ``PrecisionChoice.to_json()``; says so when none was recorded.

    Example:
        >>> describe_precision({"precision": "fp32", "reason": "asked for"})
        'fp32 (asked for)'
    """
    if not record:
        return "not recorded (results computed before compute precisions were recorded)"
    return f"{record.get('precision')} ({record.get('reason')})"


def sample_texts(task: AbsTask, limit: int = 64) -> list[str] | None:
    """A few texts of ``task``'s loaded data, for ``auto`` to measure precisions on (None when its data
    is not loaded: ``auto`` then uses its built-in mixed-length sample).

    Why from the task: which precision is fastest and safe depends on the texts' lengths and words;
    the first rows of each text column are the inputs the model is about to encode.

    Example:
        >>> sample_texts(task_with_loaded_data)[:2]
        ['A plane is taking off.', 'An air plane is taking off.']
    """
    if not getattr(task, "data_loaded", False):
        return None
    texts: list[str] = []
    pending: list[tuple[Any, int]] = [(getattr(task, "dataset", None), 0)]
    while pending and len(texts) < limit:
        node, depth = pending.pop(0)
        if isinstance(node, Mapping) and depth < 5:
            pending.extend((value, depth + 1) for value in node.values())
        elif hasattr(node, "features") and hasattr(node, "num_rows"):  # a datasets.Dataset
            columns = [name for name, feature in node.features.items() if getattr(feature, "dtype", None) == "string"
                       and not any(word in name.lower() for word in ("id", "label"))]
            head = node[: min(limit, node.num_rows)] if columns else {}
            texts += [text for name in columns for text in head[name] if isinstance(text, str) and text.strip()]
    return texts[: 2 * limit] or None


def model_overrides(max_length: int | None, compute_precision: str | None) -> dict[str, Any]:
    """The explicit changes to a model's own configuration (they name the results folder).

    The key is ``compute_precision`` (not ``precision``, which named the weights' dtype before), so
    results computed under the old meaning are never reused as if computed at the new one.
    """
    return {key: value for key, value in (("max_length", max_length), ("compute_precision", compute_precision))
            if value is not None}


def _effective_prompt(encoder: EncoderProtocol, task_metadata: TaskMetadata, prompt_type: PromptType | None) -> str | None:
    """The prefix mteb's wrapper (then sentence-transformers) puts before this side's texts."""
    from mteb.models.abs_encoder import get_prompt_name

    prompts = getattr(encoder, "model_prompts", None)
    name = get_prompt_name(prompts, task_metadata, prompt_type) if prompts else None
    if name is not None:
        return prompts.get(name)
    from neobert_embed.sentence import Prompted, resolve_prompt

    model = getattr(encoder, "model", None)
    side = getattr(prompt_type, "value", None)  # PromptType.query → "query", .document → "document"
    return (resolve_prompt(model, side) or None) if isinstance(model, Prompted) else None


def prompts_used(encoder: EncoderProtocol, task: AbsTask) -> dict[str, str | None]:
    """``{"query": ..., "document": ...}`` (retrieval) or ``{"text": ...}`` prompts for ``task``.

    Under ``uniform`` these are the recipe's instructions; under ``model`` what mteb's wrapper
    resolves from the model's saved prompts (None = no prefix).

    Example:
        >>> prompts_used(encoder, mteb.get_task("SciFact"))
        {'query': 'query: ', 'document': 'passage: '}
    """
    from mteb.types import PromptType

    metadata = task.metadata
    retrieval = metadata.type in RETRIEVAL_TYPES
    recipe = getattr(encoder, "recipe", None)
    sides = {"query": PromptType.query, "document": PromptType.document} if retrieval else {"text": None}
    return {side: (recipe.instruction(metadata, kind) if recipe is not None else
                   _effective_prompt(encoder, metadata, kind)) or None for side, kind in sides.items()}


def encoder_settings(encoder: EncoderProtocol) -> dict[str, Any]:
    """Length, normalization, prompts and compute precision of the encoder's model (for result metadata)."""
    model = getattr(encoder, "model", None)
    settings: dict[str, Any] = {"wrapper": type(encoder).__name__}
    if hasattr(model, "max_seq_length"):
        settings["max_seq_length"] = int(model.max_seq_length)
    if hasattr(model, "prompts"):
        settings["saved_prompts"] = dict(model.prompts or {})
    modules = [type(module).__name__ for module in model] if hasattr(model, "__iter__") else []
    if modules:
        settings["modules"] = modules
    recipe = getattr(encoder, "recipe", None)
    if recipe is not None:
        settings["recipe"] = recipe.model_dump()
    choice = getattr(encoder, "precision_choice", None)
    if choice is not None:
        settings["compute_precision"] = choice.to_json()
    return settings
