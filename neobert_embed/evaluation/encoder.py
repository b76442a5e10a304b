"""The model side of the ``uniform`` protocol: one mteb encoder that applies the recipe to any model.

Why: mteb's ``SentenceTransformerEncoderWrapper`` takes instructions from the model's own prompts
(which differ per model and must name registered tasks); the comparison needs the *recipe's*
instruction for every task — local ones included — and the recipe's normalization, identical for
every model. This subclass changes only that; batching, similarity and metrics stay mteb's.

Results are stored by mteb under ``results/<model name>/<revision>/experiments/<protocol...>/``
(``protocol_model`` or ``protocol_uniform__recipe_<hash>``): the revision of a local directory is
a hash of its files (so a retrained model never overwrites the scores of the previous one), and
the protocol and recipe hash keep results of different protocols and recipes apart.
The ``model`` protocol's encoder is in :mod:`neobert_embed.evaluation.protocol`.

Example:
    >>> identity = model_identity("runs/bert-contrastive")
    >>> encoder = UniformEncoder.load(identity, EvaluationRecipe())
    >>> mteb.evaluate(encoder, mteb.get_task("STSBenchmark"))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mteb import SentenceTransformerEncoderWrapper
from mteb.models import ModelMeta
from mteb.types import PromptType

from neobert_embed.backbones import resolve_model_name, usable_max_length
from neobert_embed.evaluation.recipe import EvaluationRecipe
from neobert_embed.files import directory_digest
from neobert_embed.inference.runtime import PrecisionChoice
from neobert_embed.model_files import CheckedModel
from neobert_embed.runs import CHECKPOINTS_DIR

if TYPE_CHECKING:
    from mteb import TaskMetadata
    from mteb.types import Array, BatchedInput, EncodeKwargs
    from sentence_transformers import SentenceTransformer
    from torch.utils.data import DataLoader
    from typing_extensions import Unpack


@dataclass(frozen=True)
class ModelIdentity:
    """What results are stored under: ``name`` (hub id or directory name) and ``revision``; ``checked``, when a
    command's preflight inspected the model's files, is what the loader takes (the files are not read again)."""

    source: str
    name: str
    revision: str
    checked: CheckedModel | None = None

    @property
    def loadable(self) -> str | CheckedModel:
        """What to hand :func:`~neobert_embed.inference.runtime.load_inference_model`."""
        return self.checked or self.source

    def meta(self, protocol: str, *, recipe: EvaluationRecipe | None = None,
             overrides: dict[str, Any] | None = None, base: ModelMeta | None = None) -> ModelMeta:
        """mteb model metadata carrying this identity, the protocol and the recipe (the results folder).

        Example:
            >>> model_identity("runs/m").meta("model").experiment_name
            'protocol_model'
        """
        experiment: dict[str, Any] = {"protocol": protocol}
        if recipe is not None:
            experiment["recipe"] = recipe.fingerprint()
        experiment.update(overrides or {})
        update = {"name": self.name, "revision": self.revision, "experiment_kwargs": experiment}
        return (base or ModelMeta.create_empty()).model_copy(update=update)


def _hub_revision(repo_id: str, revision: str | None) -> str:
    """Commit of a hub model in the local cache (exact), else the requested revision or ``main``."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True)).name
    except Exception:  # not cached or not a hub id: fall back to what the user asked for
        return revision or "main"


def model_identity(name_or_path: str | Path, revision: str | None = None) -> ModelIdentity:
    """Name and revision a model's results are stored under, computed without loading the model.

    Example:
        >>> model_identity("bert").name
        'google-bert/bert-base-uncased'
        >>> model_identity("runs/model").revision   # hash of the directory's files
        '3f2a9c0d11e4'
    """
    source = str(name_or_path)
    path = Path(source)
    if path.is_dir():
        return ModelIdentity(source, path.resolve().name, revision or directory_digest(path, skip=(CHECKPOINTS_DIR,)))
    name = resolve_model_name(source)
    return ModelIdentity(source, name, _hub_revision(name, revision))


class UniformEncoder(SentenceTransformerEncoderWrapper):
    """mteb encoder applying the evaluation recipe (instruction per task, normalization) to a model."""

    def __init__(self, model: SentenceTransformer, recipe: EvaluationRecipe, identity: ModelIdentity) -> None:
        super().__init__(model)
        self.model_prompts = None  # the recipe decides instructions, never the model's saved prompts
        self.recipe = recipe
        self.precision_choice: PrecisionChoice | None = None  # set by load(): what the forward computes in
        self.mteb_model_meta = identity.meta("uniform", recipe=recipe, base=self.mteb_model_meta)

    @classmethod
    def load(cls, identity: ModelIdentity, recipe: EvaluationRecipe, device: str | None = None,
             sample_texts: Sequence[str] | None = None) -> UniformEncoder:
        """Load ``identity.source`` to compute at the recipe's precision, with its maximum length.

        The precision is applied by :func:`~neobert_embed.inference.runtime.load_inference_model`, as
        by every other command (``auto`` measures on ``sample_texts``); ``precision_choice`` says which
        one the scores are computed in. The length is the recipe's (1024 by default) capped by the
        encoder's position embeddings, so BERT-style models (512 positions) are not asked for more
        than they can take.
        """
        from dataclasses import replace

        from neobert_embed.inference.runtime import load_inference_model

        loaded = load_inference_model(identity.loadable, recipe.precision, device=device,
                                      revision=None if Path(identity.source).is_dir() else identity.revision,
                                      sample_texts=sample_texts, batch_size=recipe.batch_size)
        model = loaded.model
        config = getattr(getattr(model[0], "auto_model", None), "config", None)
        limit = usable_max_length(config) if config is not None else recipe.max_length
        model.max_seq_length = min(recipe.max_length, limit)
        encoder = cls(model, recipe, identity)
        choice = loaded.choice
        encoder.precision_choice = (replace(choice, reason="asked for (evaluation recipe or --precision)")
                                    if choice.requested != "auto" else choice)
        return encoder

    def encode(self, inputs: DataLoader[BatchedInput], *, task_metadata: TaskMetadata, hf_split: str,
               hf_subset: str, prompt_type: PromptType | None = None, **kwargs: Unpack[EncodeKwargs]) -> Array:
        """Embed every text of ``inputs`` with the recipe's instruction for this task and side."""
        texts = [text for batch in inputs for text in batch["text"]]
        prompt = self.recipe.instruction(task_metadata, prompt_type)
        encode = {PromptType.query: self.model.encode_query,
                  PromptType.document: self.model.encode_document}.get(prompt_type, self.model.encode)
        kwargs.setdefault("batch_size", self.recipe.batch_size)
        return encode(texts, prompt=prompt, normalize_embeddings=self.recipe.normalize,
                      convert_to_numpy=True, **kwargs)
