"""Convert an official NeoBERT checkpoint into this package's self-contained format.

Why: the released ``chandar-lab/NeoBERT`` directory points at remote code (``auto_map``) and
stores its length as ``max_length``; users want a directory that loads with plain
``AutoModel.from_pretrained(dir)`` (after ``import neobert_embed``), carries its tokenizer, and
is guaranteed to hold exactly the weights the architecture needs. The conversion therefore
checks every key and shape against the config BEFORE writing, reports each problem by name,
writes atomically, and re-loads the result to prove it is clean.

Example:
    >>> report = convert_checkpoint("downloads/NeoBERT", "models/neobert")
    >>> report.architecture, report.num_tensors
    ('NeoBERTForMaskedLM', 199)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from neobert_embed.errors import UserInputError, listing
from neobert_embed.files import atomic_directory
from neobert_embed.model_files import shard_files
from neobert_embed.modeling.configuration import NeoBERTConfig
from neobert_embed.modeling.model import NeoBERTForMaskedLM, NeoBERTModel
from neobert_embed.outputs import DirectoryState
from neobert_embed.recipes import read_spec
from neobert_embed.records import CONVERT

REMOTE_CODE_FIELDS = ("auto_map", "trust_remote_code")
SHOWN_PER_PROBLEM = 10
WRITER = "neobert-embed convert"


@dataclass(frozen=True)
class ConversionReport:
    """What :func:`convert_checkpoint` wrote."""

    source: str
    output: Path
    architecture: str
    num_tensors: int
    num_parameters: int
    max_position_embeddings: int


def resolve_source(source: str | Path, revision: str | None = None) -> Path:
    """A local checkpoint directory, or the hub snapshot of ``source`` (needs network access).

    Example:
        >>> resolve_source("chandar-lab/NeoBERT")   # downloads config, weights and tokenizer
    """
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists():
        raise UserInputError(f"{source}: expected a checkpoint DIRECTORY (config.json + weights), got a file")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(source), revision=revision,
                                      allow_patterns=["*.json", "*.safetensors", "*.bin", "*.txt", "*.model"]))
    except Exception as exc:  # hub errors come in many classes (offline, 404, auth)
        raise UserInputError(
            f"{source}: not a local directory and not downloadable from the hub "
            f"({exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). Pass a directory "
            "holding config.json and model.safetensors, or unset HF_HUB_OFFLINE to download."
        ) from exc


def read_config(directory: Path) -> NeoBERTConfig:
    """The checkpoint's NeoBERTConfig; errors name config.json and the offending key."""
    path = directory / "config.json"
    fields = read_spec(path, "config", "a NeoBERT checkpoint directory needs its config.json").data
    if fields.get("model_type") != "neobert":
        raise UserInputError(f"{path}: key 'model_type' is {fields.get('model_type')!r}, expected 'neobert'")
    try:
        return NeoBERTConfig.from_dict(fields)
    except UserInputError as exc:
        raise UserInputError(f"{path}: {exc}") from exc


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` (single or sharded) or ``pytorch_model.bin``."""
    from safetensors.torch import load_file

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return {key: tensor for shard in shard_files(index) for key, tensor in load_file(str(directory / shard)).items()}
    if (directory / "model.safetensors").is_file():
        return load_file(str(directory / "model.safetensors"))
    if (directory / "pytorch_model.bin").is_file():
        return torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise UserInputError(f"{directory}: no model.safetensors, sharded safetensors index or pytorch_model.bin found")


def key_problems(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor]) -> list[str]:
    """Missing, unexpected and wrong-shaped keys, each named (empty when the checkpoint fits).

    Example:
        >>> key_problems({"a": torch.zeros(2)}, {"a": torch.zeros(3), "b": torch.zeros(1)})
        ['unexpected keys (1): b', 'wrong shapes (1): a: checkpoint (3,) vs config (2,)']
    """

    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    wrong = [f"{key}: checkpoint {tuple(found[key].shape)} vs config {tuple(expected[key].shape)}"
             for key in sorted(set(expected) & set(found)) if found[key].shape != expected[key].shape]
    return [f"{title} ({len(items)}): {listing(items, SHOWN_PER_PROBLEM)}" for title, items in
            (("missing keys", missing), ("unexpected keys", unexpected), ("wrong shapes", wrong)) if items]


def _build_model(config: NeoBERTConfig, weights: dict[str, torch.Tensor], source: Path) -> torch.nn.Module:
    """The architecture the key layout asks for (LM-head ``model.*``/``decoder.*`` or bare encoder)."""
    lm_layout = any(key.startswith(("model.", "decoder.")) for key in weights)
    model = NeoBERTForMaskedLM(config) if lm_layout else NeoBERTModel(config)
    problems = key_problems(model.state_dict(), weights)
    if problems:
        raise UserInputError(
            f"{source}: checkpoint does not match the NeoBERT {type(model).__name__} layout of its "
            f"config.json — " + "; ".join(problems)
            + ". Fix config.json (sizes) or pass the matching checkpoint; nothing was written."
        )
    model.load_state_dict(weights, strict=True)
    return model.eval()


def _load_tokenizer(source: Path, tokenizer: str | None, max_length: int, vocab_size: int):
    """The checkpoint's tokenizer (or ``--tokenizer``'s), refused when it has ids the model's embedding
    table lacks: the converted model would fail with an IndexError on the first such token."""
    from transformers import AutoTokenizer

    where = tokenizer or str(source)
    try:
        loaded = AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError) as exc:
        raise UserInputError(
            f"{where}: no usable tokenizer files ({exc.__class__.__name__}). Pass --tokenizer with a "
            "directory or hub id holding NeoBERT's tokenizer (bert-base-uncased vocabulary)."
        ) from exc
    if len(loaded) > vocab_size:
        raise UserInputError(f"{where}: the tokenizer has {len(loaded):,} tokens but the model's vocab_size is "
                             f"{vocab_size:,}, so its ids beyond that have no embedding; pass --tokenizer with "
                             "the tokenizer the checkpoint was trained with")
    loaded.model_max_length = max_length
    return loaded


def _verify(output: Path, model: torch.nn.Module) -> None:
    """Re-load what was written and check it is clean and computes the same thing."""
    reloaded, info = type(model).from_pretrained(output, output_loading_info=True)
    issues = {name: sorted(map(str, keys)) for name, keys in info.items() if keys}
    if issues:
        raise RuntimeError(f"converted checkpoint at {output} does not re-load cleanly: {issues}")
    probe = torch.tensor([[101, 7592, 2088, 102]]) % model.config.vocab_size
    with torch.no_grad():
        if not torch.equal(model(probe)[0], reloaded.eval()(probe)[0]):
            raise RuntimeError(f"converted checkpoint at {output} computes different outputs after re-loading")


def convert_checkpoint(
    source: str | Path,
    output: str | Path,
    *,
    tokenizer: str | None = None,
    revision: str | None = None,
    overwrite: bool = False,
    wait: bool = True,
) -> ConversionReport:
    """Convert an official NeoBERT checkpoint (directory or hub id) into ``output``.

    The output holds ``config.json`` (``max_position_embeddings``, no remote-code fields),
    ``model.safetensors`` and the tokenizer (its ``model_max_length`` set to the model's context).
    Nothing is written unless every key and shape matches; ``output`` appears atomically. With
    ``wait=False`` an output another process is writing fails at once instead of waiting for it.

    Example:
        >>> convert_checkpoint("chandar-lab/NeoBERT", "models/neobert").num_parameters
        245136954
    """
    from neobert_embed.runs import claimed_directory

    output = Path(output)
    with claimed_directory(output, record=CONVERT, command=WRITER, inputs=[source], what="converted model",
                           replace="--overwrite" if overwrite else None, writer=WRITER, wait=wait) as state:
        if state is not DirectoryState.ABSENT and not overwrite:
            raise UserInputError(f"{output} already exists; pass --overwrite (overwrite=True) to replace it "
                                 "or choose another output")
        return _convert(source, output, revision, tokenizer, overwrite)


def _convert(source: str | Path, output: Path, revision: str | None, tokenizer: str | None,
             overwrite: bool) -> ConversionReport:
    """Convert ``source`` into ``output``, which this process owns (see :func:`convert_checkpoint`)."""
    directory = resolve_source(source, revision)
    config = read_config(directory)
    for field in REMOTE_CODE_FIELDS:
        if hasattr(config, field):
            delattr(config, field)
    model = _build_model(config, read_weights(directory), directory)
    loaded_tokenizer = _load_tokenizer(directory, tokenizer, config.max_position_embeddings, config.vocab_size)
    with atomic_directory(output, overwrite=overwrite, record=CONVERT.name) as staging:
        model.save_pretrained(staging)
        loaded_tokenizer.save_pretrained(staging)
        _verify(staging, model)
        CONVERT.write(staging, {"writer": WRITER, "source": str(source), "revision": revision})
    return ConversionReport(
        source=str(source),
        output=output,
        architecture=type(model).__name__,
        num_tensors=len(model.state_dict()),
        num_parameters=sum(p.numel() for p in model.parameters()),
        max_position_embeddings=config.max_position_embeddings,
    )
