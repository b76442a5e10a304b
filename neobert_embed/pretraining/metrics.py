"""Training metrics: ``metrics.jsonl`` always, tensorboard / wandb when installed and asked for.

Why a JSON-lines file: it survives any crash up to its last line, is trivially plotted, and on
resume the lines after the restored step are dropped so the file reads as one uninterrupted run.

Example:
    >>> log = MetricsLog(run / "metrics.jsonl", resume_step=0)
    >>> log.write({"step": 1, "loss": 9.1, "mlm_accuracy": 0.01, "tokens_per_s": 5120.0,
    ...            "lr": 3e-7, "grad_norm": 2.3})
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from neobert_embed.files import atomic_write_text

logger = logging.getLogger(__name__)


class MetricsLog:
    """Append-only metrics of one run (process 0 only)."""

    def __init__(self, path: Path, resume_step: int, tensorboard: bool = False, wandb: bool = False,
                 run_name: str = "neobert-pretrain") -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._keep_until(resume_step)
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._tensorboard = _tensorboard_writer(path.parent) if tensorboard else None
        self._wandb = _wandb_run(run_name) if wandb else None

    def _keep_until(self, step: int) -> None:
        if not self.path.is_file():
            return
        kept = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def write(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps(record) + "\n")
        self._handle.flush()
        numbers = {k: v for k, v in record.items() if isinstance(v, int | float) and k != "step"}
        if self._tensorboard is not None:
            for key, value in numbers.items():
                self._tensorboard.add_scalar(f"pretrain/{key}", value, record["step"])
        if self._wandb is not None:
            self._wandb.log(numbers, step=record["step"])

    def close(self) -> None:
        self._handle.close()
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
