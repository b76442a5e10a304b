"""``pretrain export``: a checkpoint -> a Hugging Face model directory.

Why: DeepSpeed checkpoints are sharded by ZeRO stage and process count, and loading them
"module only" under ZeRO-3 silently loads nothing. Export asks the format of the engine that wrote
the checkpoint for its consolidated fp32 weights (DeepSpeed's own shard merging), loads them
strictly into ``NeoBERTForMaskedLM`` (every key must match) and saves a directory that
``AutoModelForMaskedLM.from_pretrained`` (after ``import neobert_embed``), sentence-transformers
and ``neobert-embed train-contrastive`` load directly, with the tokenizer beside it.

Example:
    >>> export_checkpoint("runs/tiny", "models/neobert-tiny")      # newest valid checkpoint
    PosixPath('models/neobert-tiny')
"""

from __future__ import annotations

import logging
from pathlib import Path

from neobert_embed.errors import UserInputError, listing
from neobert_embed.files import atomic_directory
from neobert_embed.pretraining.checkpoint import MODEL_FILES, consolidated_state_dict, find_checkpoint
from neobert_embed.records import EXPORT
from neobert_embed.runs import claimed_directory

OBJECTIVE_PREFIX = "mlm."
WRITER = "neobert-embed pretrain export"
logger = logging.getLogger(__name__)


def export_checkpoint(source: str | Path, output: str | Path, *, progress: bool = True, wait: bool = True) -> Path:
    """Export ``source`` (a run directory: its newest valid checkpoint; or one checkpoint directory)
    to ``output`` as a Hugging Face ``NeoBERTForMaskedLM`` with its tokenizer.

    ``output`` must be absent, empty or an earlier export (it holds ``export.json``); a directory
    with other content is refused before anything is loaded, and never deleted. With ``wait=False``
    an export another process is writing fails at once instead of waiting for it.

    Example:
        >>> export_checkpoint("runs/stage1/checkpoints/step-00500000", "models/neobert-500k")
        PosixPath('models/neobert-500k')
    """
    output = Path(output)
    with claimed_directory(output, record=EXPORT, command=WRITER, inputs=[source], what="exported model",
                           replace="exporting again", writer=WRITER, wait=wait):
        checkpoint = find_checkpoint(Path(source))
        _export(checkpoint, output)
    if progress:
        logger.info("exported %s -> %s", checkpoint, output)
    return output


def _export(checkpoint: Path, output: Path) -> None:
    """Write the model and tokenizer of ``checkpoint`` into ``output`` (which this process owns)."""
    from transformers import AutoConfig, AutoTokenizer

    import neobert_embed  # noqa: F401  (Auto-class registration)
    from neobert_embed.modeling import NeoBERTForMaskedLM

    config = AutoConfig.from_pretrained(str(checkpoint / MODEL_FILES))
    weights = {key.removeprefix(OBJECTIVE_PREFIX): value for key, value in consolidated_state_dict(checkpoint).items()}
    model = NeoBERTForMaskedLM(config)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise UserInputError(f"{checkpoint}: weights do not fit the saved config (missing: "
                             f"{listing(missing) or 'none'}; unexpected: {listing(unexpected) or 'none'})")
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint / MODEL_FILES))
    tokenizer.model_max_length = config.max_position_embeddings
    with atomic_directory(output, record=EXPORT.name) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        EXPORT.write(tmp, {"writer": WRITER, "checkpoint": str(checkpoint.resolve())})
