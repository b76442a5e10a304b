"""Training metrics: ``metrics.jsonl`` always, tensorboard / wandb when installed and asked for.

Why a JSON-lines file: it survives any crash up to its last line, is trivially plotted, and on
resume the lines after the restored step are dropped so the file reads as one uninterrupted run
(:class:`neobert_embed.runs.MetricsFile`).

Example:
    >>> log = MetricsLog(run / "metrics.jsonl", resume_step=0)
    >>> log.write({"step": 1, "loss": 9.1, "mlm_accuracy": 0.01, "tokens_per_s": 5120.0,
    ...            "lr": 3e-7, "grad_norm": 2.3})
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from neobert_embed.runs import MetricsFile

logger = logging.getLogger(__name__)


class MetricsLog(MetricsFile):
    """Append-only metrics of one run (process 0 only), mirrored to tensorboard / wandb when asked."""

    def __init__(self, path: Path, resume_step: int, tensorboard: bool = False, wandb: bool = False,
                 run_name: str = "neobert-pretrain") -> None:
        super().__init__(path, resume_step)
        self._tensorboard = _tensorboard_writer(path.parent) if tensorboard else None
        self._wandb = _wandb_run(run_name) if wandb else None

    def write(self, record: dict[str, Any]) -> None:
        super().write(record)
        numbers = {k: v for k, v in record.items() if isinstance(v, int | float) and k != "step"}
        if self._tensorboard is not None:
            for key, value in numbers.items():
                self._tensorboard.add_scalar(f"pretrain/{key}", value, record["step"])
        if self._wandb is not None:
            self._wandb.log(numbers, step=record["step"])

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()


def _tensorboard_writer(directory: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.warning("training.tensorboard is on but tensorboard is not installed; "
                       "logging to metrics.jsonl only (pip install tensorboard)")
        return None
    return SummaryWriter(str(directory / "tensorboard"))


def _wandb_run(name: str):
    try:
        import wandb
    except ImportError:
        logger.warning("training.wandb is on but wandb is not installed; logging to metrics.jsonl only")
        return None
    return wandb.init(project="neobert-embed", name=name)
