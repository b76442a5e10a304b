"""Stop a Trainer-driven run (``train-contrastive``, ``glue``) at its first non-finite loss or gradient.

Why: with a learning rate of ``1e30`` a run went NaN from step 2 and trained on: the Trainer's
``logging_nan_inf_filter`` logged ``"loss": 0.0`` beside ``"grad_norm": NaN``, and checkpoints of
NaN weights were kept; only the final save refused, hours later. Every step is now checked before
the optimizer applies it, so the weights (and every checkpoint) stay those of the last finite step,
and the run stops with one line naming the step, the learning rate and the last good checkpoint.

Under fp16 loss scaling an infinite gradient is a normal, skipped step (the scaler lowers its
scale), so there only the loss is checked (from the logs). Under DeepSpeed the gradients are held
by the engine, so the logged loss and ``grad_norm`` are checked. On a GPU, reading a norm back to the
host every step would stall the device (issue 47: no host wait per step), so there the logged loss and
``grad_norm`` are checked at each logging step, and every checkpoint's weights before it is kept: a
NaN step stops the run at the next log, and no checkpoint of non-finite weights survives.

Example:
    >>> trainer.add_callback(StopOnNonFinite())
    >>> trainer.train()
    Traceback (most recent call last):
    NonFiniteTraining: step 2: the gradients are not finite (nan) at learning rate 1e+30; ...
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from neobert_embed.errors import UserInputError


class NonFiniteTraining(UserInputError):
    """A run stopped at a non-finite loss or gradient (one line: step, learning rate, last good checkpoint)."""


def last_checkpoint_of(directory: str | Path) -> Path | None:
    """The newest ``checkpoint-N`` folder the Trainer saved in ``directory``, or None.

    Example:
        >>> last_checkpoint_of("runs/x/checkpoints")
        PosixPath('runs/x/checkpoints/checkpoint-500')
    """
    found = [(int(match.group(1)), path) for path in Path(directory).glob("checkpoint-*")
             if (match := re.fullmatch(r"checkpoint-(\d+)", path.name)) and path.is_dir()]
    return max(found)[1] if found else None


def _all_finite(tensors: list[torch.Tensor]) -> float:
    """The total 2-norm of ``tensors`` (non-finite when any value is), one host sync."""
    if not tensors:
        return 0.0
    return float(torch.nn.utils.get_total_norm(tensors, error_if_nonfinite=False))


class StopOnNonFinite(TrainerCallback):
    """Raise :class:`NonFiniteTraining` at the first step whose loss or gradients are NaN or infinite,
    before the optimizer applies it; delete a checkpoint that holds non-finite weights."""

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        args.logging_nan_inf_filter = False  # the filter logs a NaN loss as the running mean (0.0 at first)

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              model: torch.nn.Module | None = None, optimizer: Any = None, **kwargs: Any):
        if args.fp16 or args.deepspeed or model is None:  # scaled-away steps / the engine's own gradients
            return
        if args.device.type != "cpu":  # reading the norm back would stall the GPU every step: logs and saves check
            return
        norm = _all_finite([p.grad.detach() for p in model.parameters() if p.grad is not None])
        if not math.isfinite(norm):
            lr = optimizer.param_groups[0]["lr"] if optimizer is not None else args.learning_rate
            self._stop(args, state.global_step + 1, f"the gradients are not finite (norm {norm})", lr)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any):
        logs = logs or {}
        watched = ("loss",) if args.fp16 else ("loss", "grad_norm")
        for key in watched:
            value = logs.get(key)
            if isinstance(value, int | float) and not math.isfinite(value):
                self._stop(args, state.global_step, f"the {key.replace('_', ' ')} is {value}",
                           logs.get("learning_rate", args.learning_rate))

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                model: torch.nn.Module | None = None, **kwargs: Any):
        if model is None or math.isfinite(_all_finite([p.detach() for p in model.parameters()])):
            return
        saved = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        shutil.rmtree(saved, ignore_errors=True)  # never kept: a resume from it would train NaN
        self._stop(args, state.global_step, "the weights are not finite (that checkpoint was deleted)",
                   args.learning_rate)

    @staticmethod
    def _stop(args: TrainingArguments, step: int, what: str, learning_rate: float) -> None:
        good = last_checkpoint_of(args.output_dir)
        raise NonFiniteTraining(
            f"step {step}: {what} at learning rate {learning_rate:g}; training stopped before applying it. "
            f"Last good checkpoint: {good if good is not None else 'none (no checkpoint saved yet)'}. "
            "Lower learning_rate (or check the data and precision) and train again")
