"""Sentence-Transformers models over any Hugging Face encoder.

Why: the fair comparison needs every backbone (BERT, RoBERTa, NomicBERT, ModernBERT, NeoBERT)
wrapped the same way — masked mean pooling and the encoder's real usable length — and the
library default (the tokenizer's ``model_max_length``, 512 for NeoBERT's BERT tokenizer) would
silently cut NeoBERT's 4096-token context.

Example:
    >>> from neobert_embed import load_sentence_model
    >>> model = load_sentence_model("neobert")            # chandar-lab/NeoBERT from the hub
    >>> model = load_sentence_model("runs/my-finetune")   # a saved SentenceTransformer directory
    >>> model.encode(["a sentence"]).shape
    (1, 768)
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from neobert_embed.backbones import BACKBONES, resolve_model_name, usable_max_length
from neobert_embed.errors import UserInputError

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer

    from neobert_embed.model_files import CheckedModel

PRECISIONS = {"fp32": "float32", "float32": "float32", "fp16": "float16", "float16": "float16",
              "bf16": "bfloat16", "bfloat16": "bfloat16"}


@runtime_checkable
class Prompted(Protocol):
    """What the prompt rule reads of a model: a SentenceTransformer (or any model saving prompts)."""

    prompts: Mapping[str, str]
    default_prompt_name: str | None


QUERY_PROMPT = "query"  # the saved prompt every command applies to queries (and training to anchors)
DOCUMENT_PROMPT = "document"  # ... to documents (and training to positives and negatives)


def resolve_prompt(model: Prompted, name: str | None, *, required: str | None = None) -> str:
    """The text put before texts encoded as ``name``: the one rule of every command and the server.

    The model's prompt called ``name`` (``query``, ``document`` or any it saved); without one (or with
    ``name`` None) the model's default prompt, as sentence-transformers applies it; ``""`` when there is
    neither, and for ``name == ""`` (no prompt, asked for). ``required`` (the option that named it, such as
    ``--prompt-name``): a ``name`` the user chose and the model lacks is an error listing its prompts,
    not a fallback.
    Pass the result as ``encode(prompt=...)``, so sentence-transformers adds nothing of its own.

    Example:
        >>> model.prompts, model.default_prompt_name
        ({'query': 'query: ', 'document': 'passage: '}, None)
        >>> resolve_prompt(model, "query"), resolve_prompt(model, "title"), resolve_prompt(model, "")
        ('query: ', '', '')
    """
    prompts = dict(model.prompts or {})
    if name == "":
        return ""
    if name is not None and name in prompts:
        return prompts[name]
    if name is not None and required:
        known = ", ".join(sorted(prompts)) or "none"
        raise UserInputError(f"{required} {name!r}: the model has no such prompt (saved prompts: {known})")
    return prompts.get(model.default_prompt_name or "", "")


def is_sentence_transformer_dir(path: str | Path) -> bool:
    """True when ``path`` is a saved SentenceTransformer (it has ``modules.json``)."""
    from neobert_embed.model_files import MODULES_FILE

    return (Path(path) / MODULES_FILE).is_file()


def _explain_missing(name: str, original: str, exc: Exception) -> UserInputError:
    known = ", ".join(sorted(BACKBONES))
    from huggingface_hub import is_offline_mode

    hint = " (HF_HUB_OFFLINE is set: only local directories and cached models can load)" if is_offline_mode() else ""
    return UserInputError(
        f"cannot load model {original!r} (resolved to {name!r}){hint}: {exc.__class__.__name__}: "
        f"{str(exc).splitlines()[0] if str(exc) else ''}. Pass a local model directory, a hub id "
        f"reachable from this machine, or a registry key ({known})."
    )


def load_sentence_model(
    name_or_path: str | Path | CheckedModel,
    max_seq_length: int | None = None,
    *,
    device: str | None = None,
    precision: str = "fp32",
    prompts: dict[str, str] | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    model_class: type[SentenceTransformer] | None = None,
) -> SentenceTransformer:
    """Build a ``SentenceTransformer`` (mean pooling) over any encoder, or load a saved one.

    Args:
        name_or_path: registry key (``neobert``, ``bert`` …), hub id, plain Hugging Face model
            directory, or a saved SentenceTransformer directory (loaded as saved); or the value a
            command's preflight got from :func:`~neobert_embed.model_files.check_model_files` (its files
            are then not inspected again).
        max_seq_length: inputs are truncated to this many tokens; default: what the encoder's
            positions allow (4096 for NeoBERT, 512 for BERT/RoBERTa), never the tokenizer's default.
        device: ``cpu``, ``cuda`` … (sentence-transformers picks when None).
        precision: ``fp32`` | ``fp16`` | ``bf16`` weights.
        prompts: ``{"query": "...", "document": "..."}`` instructions saved with the model.
        revision: hub revision (branch, tag or commit).
        trust_remote_code: only for third-party architectures; NeoBERT never needs it.
        model_class: the ``SentenceTransformer`` subclass to build (the inference loader's
            :class:`~neobert_embed.inference.embedding_model.EmbeddingModel`); default the plain class.

    Returns:
        A ``sentence_transformers.SentenceTransformer``; ``SentenceTransformer(dir)`` reloads it
        after ``model.save(dir)`` in a fresh process once ``neobert_embed`` is imported.

    Example:
        >>> model = load_sentence_model("bert", max_seq_length=256, precision="bf16")
    """
    from neobert_embed.model_files import CheckedModel, check_model_files

    if not isinstance(name_or_path, CheckedModel):  # a command's preflight inspected its files already
        name_or_path = check_model_files(name_or_path)
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    import neobert_embed.modeling.auto  # noqa: F401  (registers NeoBERT with the Auto classes)

    if precision not in PRECISIONS:
        raise UserInputError(f"unknown precision {precision!r}; choose one of fp32, fp16, bf16")
    import torch

    model_class = model_class or SentenceTransformer
    dtype = getattr(torch, PRECISIONS[precision])
    original = str(name_or_path)
    name = resolve_model_name(original)
    model_kwargs = {"dtype": dtype}
    try:
        if is_sentence_transformer_dir(name):
            model = model_class(name, device=device, model_kwargs=model_kwargs,
                                        trust_remote_code=trust_remote_code)
            if prompts:
                model.prompts.update(prompts)
        else:
            hub = {"revision": revision, "trust_remote_code": trust_remote_code}  # a copy each: they are mutated
            transformer = Transformer(name, model_kwargs={**model_kwargs, **hub}, processor_kwargs=dict(hub),
                                      config_kwargs=dict(hub))
            pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
            model = model_class(modules=[transformer, pooling], device=device,
                                        prompts=prompts or {})
            usable, backbone = usable_max_length(transformer.auto_model.config), BACKBONES.get(original)
            model.max_seq_length = min(backbone.max_length, usable) if backbone else usable
    except (RuntimeError, EOFError, pickle.UnpicklingError, UnicodeDecodeError) as exc:
        if not Path(name).exists():
            raise
        from neobert_embed.model_files import FIX

        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        raise UserInputError(f"{name}: the model's files could not be loaded ({type(exc).__name__}: {reason}); "
                             f"{FIX}") from None
    except (OSError, ValueError) as exc:
        if Path(name).exists() and not isinstance(exc, OSError):
            raise
        raise _explain_missing(name, original, exc) from exc
    check_finite_weights(model, original)
    if max_seq_length is not None:
        if max_seq_length < 1:
            raise UserInputError(f"max_seq_length must be positive, got {max_seq_length}")
        model.max_seq_length = int(max_seq_length)
    return model


def check_finite_weights(model: torch.nn.Module, source: str | Path) -> None:
    """Refuse a model whose weights hold NaN or Inf, naming the first such tensor.

    Why: a diverged training run saves NaN weights without complaint; encoded with them, every
    vector is NaN, an index of them "evaluates" at recall 1.000 and searches return nothing.

    Example:
        >>> check_finite_weights(load_sentence_model("runs/diverged"), "runs/diverged")
        Traceback (most recent call last):
        UserInputError: runs/diverged: weight 0.auto_model.encoder.layer.0.output.dense.weight holds NaN ...
    """
    import torch

    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not _all_finite(tensor):
            kind = "NaN" if bool(torch.isnan(tensor).any()) else "Inf"
            raise UserInputError(f"{source}: weight {name} holds {kind} values (a diverged or damaged "
                                 "checkpoint); use an earlier checkpoint or retrain")


def _all_finite(tensor: torch.Tensor) -> bool:
    """True when every value of a floating-point tensor is finite.

    Why numpy for CPU fp16/fp32/fp64 tensors: ``torch.isfinite(t).all()`` runs two parallel
    regions per tensor; over all-MiniLM-L6-v2's 103 weights that took 2.4 to 4.1 s of every model
    load on a busy 2-core machine (threads waiting on each other), 0.3 s on one thread, where
    numpy's single-threaded pass over the same memory (no copy) takes 0.02 s. Other dtypes (bf16)
    and devices keep torch's check.
    """
    import torch

    if tensor.device.type == "cpu" and tensor.dtype in (torch.float16, torch.float32, torch.float64):
        import numpy as np

        try:
            values = tensor.detach().numpy()  # the tensor's own memory
        except (RuntimeError, TypeError):  # a layout or subclass numpy cannot view: torch checks it
            values = None
        if values is not None:
            return bool(np.isfinite(values).all())
    return bool(torch.isfinite(tensor).all())
