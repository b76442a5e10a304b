"""SentenceTransformerTrainer, adapted to the recipe: batching, metrics, progress, Ctrl-C.

Why a subclass: the trainer is reused whole (optimizer, scheduler, checkpoints, DDP, DeepSpeed,
prompts); only what it lacks is added through its documented hooks: per-dataset batch sizes from
the text budget, the α-weighted one-dataset-per-step sampler, a ``metrics.jsonl`` log, a progress
bar that does not print a dict per step, and a Ctrl-C that finishes the current step, saves a
checkpoint and says how to resume instead of killing the run mid-update.

Example:
    >>> trainer = ContrastiveTrainer(recipe=recipe, model=model, args=args,
    ...                              train_dataset=DatasetDict(sets), loss=loss)
    >>> trainer.train()
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from sentence_transformers import SentenceTransformerTrainer
from transformers import TrainerCallback

from neobert_embed.console import progress_bar
from neobert_embed.contrastive.recipe import ContrastiveRecipe
from neobert_embed.contrastive.sampler import AlphaBatchSampler, no_duplicates_sampler
from neobert_embed.distributed import is_main_process
from neobert_embed.runs import MetricsFile
from neobert_embed.training_precision import resolve_training_precision, training_device

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PretrainedConfig

logger = logging.getLogger(__name__)
#: DataLoader worker processes that tokenize and collate batches ahead of a GPU (see :func:`device_flags`).
GPU_LOADER_WORKERS = 2
#: Trainer flags that take two host waits out of every GPU step: the batch is copied from pinned memory
#: without waiting for the previous step's kernels (a blocking copy waits for the whole queue), and the
#: step's loss is not tested for NaN/inf on the host (``bool(torch.isnan(loss))`` waits for the step); the
#: logged loss then shows a non-finite step instead of hiding it behind the running mean.
NO_HOST_WAIT = {"accelerator_config": {"non_blocking": True}, "logging_nan_inf_filter": False}


def device_flags(precision: str, device: str | None = None) -> dict[str, Any]:
    """``TrainingArguments`` flags for mixed precision, the AdamW kernel and the device (``device``:
    "cpu" or "cuda"; None: :func:`~neobert_embed.devices.default_device`, the GPU, else the CPU).

    "auto" is bf16 autocast where the hardware has bf16 matrix units (a bf16 GPU, a CPU with AMX or
    avx512_bf16; :mod:`neobert_embed.training_precision`), else fp32; the trainer keeps fp32 master
    weights either way, and on the CPU ``bf16`` with ``use_cpu`` is torch's CPU autocast. fp16 on the
    CPU is refused (:class:`UserInputError`). The fused AdamW kernel is the trainer's default but is
    several times slower than the multi-tensor one on CPU, so it is used only on GPUs. ``use_cpu`` on
    a CPU-only machine lets torchrun run DDP over gloo. On a GPU, :data:`GPU_LOADER_WORKERS` worker
    processes tokenize and collate the next batches while the GPU runs this one (in the main process
    the GPU would wait for the tokenizer every step); on a CPU they would take the cores the step
    computes on, so batches are made in the main process there. On a GPU the step also waits for no
    host read (:data:`NO_HOST_WAIT`) except at logged steps (``logging_steps``).

    Example:
        >>> device_flags("auto", "cpu")   # NEOBERT_EMBED_CPU_FEATURES=none
        {'bf16': False, 'fp16': False, 'dataloader_pin_memory': False, 'optim': 'adamw_torch', 'use_cpu': True, 'dataloader_num_workers': 0}
    """
    kind = training_device(device)
    chosen = resolve_training_precision(precision, kind)
    cuda = kind == "cuda"
    loader = ({"dataloader_num_workers": GPU_LOADER_WORKERS, "dataloader_prefetch_factor": 4,
               "dataloader_persistent_workers": True, **NO_HOST_WAIT} if cuda else {"dataloader_num_workers": 0})
    return {"bf16": chosen.dtype == "bf16", "fp16": chosen.dtype == "fp16", "dataloader_pin_memory": cuda,
            "optim": "adamw_torch_fused" if cuda else "adamw_torch", "use_cpu": kind == "cpu", **loader}


def texts_per_example(dataset: Dataset) -> int:
    """Number of text columns of a normalized dataset (anchor, positive, negatives)."""
    return len([c for c in dataset.column_names if c != "dataset_name"])


def examples_in(inputs: dict[str, Any]) -> int:
    """Examples (texts of the first column) in a collated batch, padded or a flat token stream
    (``*cu_seq_lens_q`` holds one offset more than texts).

    Example:
        >>> examples_in({"anchor_input_ids": torch.ones(1, 9), "anchor_cu_seq_lens_q": torch.tensor([0, 4, 9])})
        2
    """
    offsets = next((v for k, v in inputs.items() if k.endswith("cu_seq_lens_q")), None)
    if offsets is not None:
        return int(offsets.shape[0]) - 1
    anchor = next((v for k, v in inputs.items() if k.endswith("input_ids")), None)
    return 0 if anchor is None else int(anchor.shape[0])


class ContrastiveTrainer(SentenceTransformerTrainer):
    """SentenceTransformerTrainer whose training batches follow a :class:`ContrastiveRecipe`.

    Each dataset gets ``recipe.batch_examples(texts per row)`` examples per batch (no repeated text
    inside a batch); an :class:`AlphaBatchSampler` picks the dataset of each step. It also counts
    the examples seen so :class:`MetricsFileCallback` can report examples per second.

    Example:
        >>> ContrastiveTrainer(recipe=recipe, model=model, args=args, train_dataset=sets, loss=loss).train()
    """

    def __init__(self, *args: Any, recipe: ContrastiveRecipe, **kwargs: Any) -> None:
        self.recipe = recipe
        self.examples_seen = 0
        super().__init__(*args, **kwargs)

    def get_batch_sampler(self, dataset, batch_size, drop_last, valid_label_columns=None, generator=None,
                          seed=0):
        """One dataset's no-duplicates sampler, sized by the recipe (text budget or fixed examples)."""
        position = next(i for i, d in enumerate(self.train_dataset.values()) if d is dataset)
        return no_duplicates_sampler(dataset, self.recipe.batch_examples(texts_per_example(dataset)),
                                     seed=self.args.seed, position=position)

    def get_multi_dataset_batch_sampler(self, dataset, batch_samplers, generator=None, seed=0):
        """The α-weighted stream: exactly the batches of this run (steps × processes)."""
        world = self.args.world_size
        return AlphaBatchSampler(dataset, batch_samplers, seed=self.args.seed, alpha=self.recipe.alpha,
                                 num_batches=self.args.max_steps * world, batches_per_draw=world)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Count examples (rows of the anchor column) before delegating to the recipe's loss."""
        if model.training:
            self.examples_seen += examples_in(inputs)
        with self.step_autocast(model.training):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def step_autocast(self, training: bool) -> contextlib.AbstractContextManager:
        """With the recipe's ``cast_weights_once``, an outer autocast region, *disabled*, around all of a
        training step's forwards (queries, documents): autocast keeps its cache of weight casts until
        the outermost region ends, so each fp32 weight is cast once per step and the cast reused by
        the other forwards (each forward's own region, which accelerate adds, would cast it again: a
        copy kernel per linear layer per forward). Disabled, the region leaves the loss's own
        arithmetic between the forwards in fp32, as before. The master weights stay fp32; a weight's
        gradient is summed over the forwards in the compute dtype before its cast to fp32 (per
        forward: in fp32), a rounding difference. Not for GradCache (refused by the recipe): its pass
        without gradients would cache casts without autograd history."""
        mixed = self.args.bf16 or self.args.fp16
        if not (training and self.recipe.cast_weights_once and mixed):
            return contextlib.nullcontext()
        return torch.autocast(self.args.device.type, enabled=False)


class MetricsFileCallback(TrainerCallback):
    """Append ``{"step", "loss", "lr", "examples_per_s", "grad_norm"}`` per log to ``metrics.jsonl``.

    On resume the lines after the checkpoint's step are dropped first, so the file reads as one
    uninterrupted run.

    Example:
        >>> trainer.add_callback(MetricsFileCallback(Path("runs/x/metrics.jsonl"), trainer))
    """

    def __init__(self, path: Path, trainer: ContrastiveTrainer) -> None:
        self.path = path
        self.trainer = trainer
        self.metrics: MetricsFile | None = None
        self._last_time = time.perf_counter()
        self._last_examples = 0

    def on_train_begin(self, args, state, control, **kwargs):
        if is_main_process():
            self.metrics = MetricsFile(self.path, resume_step=state.global_step)
        self._last_time, self._last_examples = time.perf_counter(), self.trainer.examples_seen

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.metrics is None or not logs or "loss" not in logs:
            return
        now, seen = time.perf_counter(), self.trainer.examples_seen
        record = {"step": state.global_step, "loss": logs["loss"], "lr": logs.get("learning_rate"),
                  "examples_per_s": round((seen - self._last_examples) * args.world_size
                                          / max(now - self._last_time, 1e-9), 2),
                  "grad_norm": logs.get("grad_norm")}
        self._last_time, self._last_examples = now, seen
        self.metrics.write(record)


class QuietProgressCallback(TrainerCallback):
    """The training bar on the user console (not tqdm's, which capturing hides), with the latest loss.

    The trainer calls ``on_train_end`` only when training completes; wrap ``trainer.train()`` in
    ``contextlib.closing(callback)`` so an exception (a second Ctrl-C, CUDA OOM) also stops the bar
    instead of leaving it redrawing under the error with the cursor hidden.
    """

    bar = None

    def on_train_begin(self, args, state, control, **kwargs):
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

        self.bar = progress_bar(TextColumn("training"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                TextColumn("{task.fields[loss]}"), show=is_main_process())
        self.bar.add_task("", total=state.max_steps, completed=state.global_step, loss="")
        self.bar.start()

    def on_step_end(self, args, state, control, **kwargs):
        self.bar.update(self.bar.task_ids[0], completed=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.bar.update(self.bar.task_ids[0], loss=f"loss {logs['loss']:.4f}")

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        """Stop the bar (idempotent: a second call does nothing)."""
        bar, self.bar = self.bar, None
        if bar is not None:
            bar.stop()


class KeepSpecialTokenIds(TrainerCallback):
    """Undo the trainer's "align special tokens" rewrite of the encoder config.

    ``Trainer.train`` copies the tokenizer's pad/bos/eos ids into the model config. For an encoder
    that is not a harmless label: RoBERTa derives position ids from ``pad_token_id``, so a model
    whose tokenizer pads with another id would be *saved* as a different function than the one
    trained (the reload check in ``train_contrastive`` caught exactly this). Fine-tuning must not
    change the architecture, so the original ids are restored as training starts.
    """

    NAMES = ("pad_token_id", "bos_token_id", "eos_token_id")

    def __init__(self, config: PretrainedConfig) -> None:
        self.config = config
        self.saved = {name: getattr(config, name, None) for name in self.NAMES}

    def on_train_begin(self, args, state, control, **kwargs):
        for name, value in self.saved.items():
            setattr(self.config, name, value)


class GracefulInterrupt(TrainerCallback):
    """First Ctrl-C: finish the step, save a checkpoint, stop. Second Ctrl-C: abort immediately.

    Use as a context manager around ``trainer.train()``; ``requested`` tells afterwards whether
    the run stopped early. Outside the main thread (where signals cannot be caught) it is inert.

    Example:
        >>> interrupt = GracefulInterrupt()
        >>> trainer.add_callback(interrupt)
        >>> with interrupt:
        ...     trainer.train()
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)
        logger.warning("interrupt received: finishing this step and saving a checkpoint (press Ctrl-C again to "
                       "abort without saving)")

    def __enter__(self) -> GracefulInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def on_step_end(self, args, state, control, **kwargs):
        if self.requested:
            control.should_save = True
            control.should_training_stop = True
        return control
