"""The pretraining loop behind ``neobert-embed pretrain``.

Why this shape: everything that must survive an interruption — parameters, optimizer, scheduler,
RNGs, the data-stream position, counters — is restored from a checkpoint, and batches are a pure
function of the step (see :mod:`batches`), so a resumed run continues exactly. A non-finite loss
on any process skips that step's update (learning rate 0 for it, parameters untouched) and is
counted; ``training.max_bad_steps`` in a row stop the run with a clear error. Ctrl-C saves a
checkpoint of the last finished step and raises :class:`~neobert_embed.runs.Interrupted`. A resume
whose recipe or corpus differs from the run's record (``run.json``) is refused, naming every key,
except the operational keys in :data:`OPERATIONAL_KEYS`.

Outputs in ``output``: ``run.json``, ``metrics.jsonl``, ``checkpoints/step-NNNNNNNN`` (last K),
``final/`` (the exported Hugging Face model, when training ends), ``prepared/`` (when given a raw corpus).

Example:
    >>> result = pretrain("recipes/pretrain-tiny.yaml", "docstrings.jsonl", "runs/tiny")
    >>> result.export_dir
    PosixPath('runs/tiny/final')
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from neobert_embed.console import progress_bar
from neobert_embed.distributed import is_main_process
from neobert_embed.errors import UserInputError
from neobert_embed.pretraining.batches import BatchMaker
from neobert_embed.pretraining.checkpoint import (
    checkpoint_name,
    list_checkpoints,
    load_latest_checkpoint,
    save_checkpoint,
)
from neobert_embed.pretraining.engine import TrainingEngine, build_engine, init_distributed, process_scope
from neobert_embed.pretraining.metrics import MetricsLog
from neobert_embed.pretraining.packing import DocumentStream, LengthMixture, StreamPosition
from neobert_embed.pretraining.prepared import PreparedCorpus, is_prepared, load_prepared
from neobert_embed.pretraining.recipe import PretrainRecipe, load_pretrain_recipe
from neobert_embed.records import RUN
from neobert_embed.runs import (
    CHECKPOINTS_DIR,
    METRICS_FILE,
    Interrupted,
    check_resume,
    claimed_directory,
)
from neobert_embed.sources import data_content

if TYPE_CHECKING:
    from neobert_embed.modeling import NeoBERTForMaskedLM

# Recipe keys that may change on --resume: they do not shape the training trajectory (with
# training.max_steps the run stops at the new count; the schedule keeps its original length).
OPERATIONAL_KEYS = frozenset({
    "training.max_steps", "training.cpu_threads", "training.max_bad_steps", "training.log_every_steps",
    "training.tensorboard", "training.wandb", "checkpoint.every_steps", "checkpoint.keep_last", "data.num_proc",
    "training.loss_chunk_tokens", "training.compile_layers",  # same loss and gradients, other kernels
})

logger = logging.getLogger(__name__)


@dataclass
class PretrainResult:
    """What a :func:`pretrain` call did. ``model`` is the trained ``NeoBERTForMaskedLM`` (its
    parameters are shards under ZeRO-3); ``export_dir`` is set when training reached its end."""

    output: Path
    step: int
    finished: bool
    skipped_steps: int
    metrics_path: Path
    checkpoint: Path | None
    export_dir: Path | None
    model: NeoBERTForMaskedLM | None = field(repr=False, default=None)


@dataclass
class RunState:
    """Counters a checkpoint restores besides the engine."""

    step: int = 0
    position: StreamPosition = field(default_factory=StreamPosition)
    skipped_steps: int = 0
    bad_in_row: int = 0
    real_tokens: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunState:
        return cls(data["step"], StreamPosition(**data["position"]), data["skipped_steps"],
                   data["bad_in_row"], data["real_tokens"])


def pretrain(
    recipe: PretrainRecipe | str | Path,
    corpus: str | Path,
    output: str | Path,
    *,
    max_steps: int | None = None,
    resume: bool = False,
    stop_after_steps: int | None = None,
    progress: bool = True,
    wait: bool = True,
) -> PretrainResult:
    """Pretrain NeoBERT with MLM on ``corpus`` (a raw corpus, prepared into ``output/prepared``
    first, or a directory from ``pretrain prepare``), writing everything under ``output``.

    ``max_steps`` overrides ``training.max_steps`` (the schedule follows it); ``resume`` continues
    from the newest usable checkpoint; ``stop_after_steps`` leaves after that many steps of this
    call with a checkpoint (for time-limited jobs), to be continued with ``resume``.

    Each logged step appends to ``metrics.jsonl``: step, loss, mlm_accuracy, tokens_per_s (real,
    non-pad tokens over all processes), real_token_fraction, lr, grad_norm, skipped_steps.
    One job writes ``output`` at a time (rank 0 holds its lock; ``wait=False`` fails at once when
    another holds it).

    Example:
        >>> result = pretrain("recipes/pretrain-tiny.yaml", "docstrings.jsonl", "runs/tiny", max_steps=200)
        >>> result.finished, result.export_dir
        (True, PosixPath('runs/tiny/final'))
    """
    if not isinstance(recipe, PretrainRecipe):
        recipe = load_pretrain_recipe(recipe)
    recipe = recipe.with_max_steps(max_steps)
    output = Path(output)
    with claimed_directory(output, record=(RUN, CHECKPOINTS_DIR), command="neobert-embed pretrain",
                           inputs=[corpus], what="pretraining run", wait=wait):
        return _pretrain_claimed(recipe, corpus, output, resume, stop_after_steps, progress)


def _pretrain_claimed(recipe: PretrainRecipe, corpus: str | Path, output: Path, resume: bool,
                      stop_after_steps: int | None, progress: bool) -> PretrainResult:
    """The body of :func:`pretrain`, run while this job owns ``output``."""
    _warn_short_schedule(recipe)
    existing = list_checkpoints(output / CHECKPOINTS_DIR)
    if existing and not resume:
        raise UserInputError(f"{output} already holds a run (checkpoint {existing[0].name}); pass --resume "
                             "to continue it, or choose another --output")
    settings = {**recipe.model_dump(mode="json"),
                "corpus": os.path.abspath(corpus) if Path(corpus).exists() else str(corpus),
                **data_content([corpus], RUN.read(output))}  # its content, not its mtime
    # a resume must continue the run the checkpoints belong to; a run that stopped before its first
    # checkpoint still has its record, which a rerun must match too (and never silently replaces)
    recorded = check_resume(output, settings, operational=OPERATIONAL_KEYS,
                            hint="resume with the run's recipe and corpus, or start a new --output")
    if recorded is None and is_main_process():
        RUN.write(output, settings)
    with process_scope(recipe.training.cpu_threads):
        return _run(recipe, corpus, output, resume, existing, stop_after_steps, progress)


def _run(recipe: PretrainRecipe, corpus: str | Path, output: Path, resume: bool, existing: list[Path],
         stop_after_steps: int | None, progress: bool) -> PretrainResult:
    """The body of :func:`pretrain`, inside its :func:`process_scope`."""
    checkpoints = output / CHECKPOINTS_DIR
    init_distributed()
    prepared = _resolve_corpus(recipe, corpus, output)
    from neobert_embed.pretraining.model_factory import build_mlm_model
    from neobert_embed.pretraining.objective import MaskedLMObjective

    model = build_mlm_model(recipe, prepared.tokenizer)
    if recipe.training.compile_layers:
        from neobert_embed.layer_compile import compile_repeated_layers

        logger.info("compiled %d norm/MLP blocks (training.compile_layers)", len(compile_repeated_layers(model)))
    engine = build_engine(recipe, MaskedLMObjective(model, chunk_tokens=recipe.training.loss_chunk_tokens))
    logger.info("training in %s%s", engine.precision,  # auto depends on the machine: say what it chose
                "" if engine.precision.startswith("fp32") else " (fp32 master weights)")
    state = RunState()
    if resume and existing:
        restored, path = load_latest_checkpoint(engine, checkpoints)
        state = RunState.from_dict(restored)
        logger.info("resumed from %s (step %d)", path, state.step)
        if restored.get("max_steps", recipe.training.max_steps) != recipe.training.max_steps:
            logger.warning("the checkpoint's learning-rate schedule was planned for %s steps and is kept; "
                           "training now stops at %d", restored["max_steps"], recipe.training.max_steps)
    elif resume:
        logger.warning("--resume: no checkpoint in %s yet; starting from step 0", checkpoints)
    return _Loop(recipe, prepared, engine, output, state).run(stop_after_steps, progress)


def _warn_short_schedule(recipe: PretrainRecipe) -> None:
    if recipe.schedule.warmup_steps >= recipe.training.max_steps:
        logger.warning("schedule.warmup_steps (%d) >= training.max_steps (%d): the learning rate never reaches "
                       "its peak", recipe.schedule.warmup_steps, recipe.training.max_steps)


def _resolve_corpus(recipe: PretrainRecipe, corpus: str | Path, output: Path) -> PreparedCorpus:
    """A prepared corpus as is, or a raw one prepared into ``output/prepared`` (by process 0)."""
    if is_prepared(corpus):
        return load_prepared(corpus)
    import torch.distributed as dist

    from neobert_embed.pretraining.prepare import prepare_corpus

    target = output / "prepared"
    if is_main_process():
        source = recipe.model.init_from or recipe.tokenizer.source
        prepare_corpus(corpus, target, tokenizer=source, vocab_size=recipe.tokenizer.vocab_size,
                       text_field=recipe.data.text_field, num_proc=recipe.data.num_proc)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return load_prepared(target)


@dataclass
class _StepStats:
    loss_sum: float = 0.0
    finite_batches: int = 0
    correct: int = 0
    masked: int = 0
    real_tokens: int = 0
    slots: int = 0
    bad: bool = False


class _Loop:
    """One invocation of the training loop over an engine restored to ``state``."""

    def __init__(self, recipe: PretrainRecipe, corpus: PreparedCorpus, engine: TrainingEngine, output: Path,
                 state: RunState) -> None:
        self.recipe, self.corpus, self.engine, self.output, self.state = recipe, corpus, engine, output, state
        mixture = recipe.data.length_mixture
        self.stream = DocumentStream(
            corpus.lengths, recipe.training.seed,
            LengthMixture(tuple(b.max_tokens for b in mixture), tuple(b.weight for b in mixture)) if mixture else None,
            replace(state.position))
        self.batches = BatchMaker(corpus, recipe, engine.rank, engine.world_size)
        self.metrics = (MetricsLog(output / METRICS_FILE, state.step, recipe.training.tensorboard,
                                   recipe.training.wandb) if engine.rank == 0 else None)
        self.last_saved = state.step
        self.stats_lr = 0.0

    def run(self, stop_after_steps: int | None, progress: bool) -> PretrainResult:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

        training = self.recipe.training
        end = training.max_steps if stop_after_steps is None else min(training.max_steps,
                                                                      self.state.step + stop_after_steps)
        columns = [TextColumn("pretraining"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   TextColumn("{task.fields[info]}")]
        try:
            with progress_bar(*columns, show=progress) as bar:
                task = bar.add_task("", total=training.max_steps, completed=self.state.step, info="")
                window = _Window()
                while self.state.step < end:
                    stats = self._train_step()
                    self._after_step(stats, window, bar, task)
        except KeyboardInterrupt:
            path = self._checkpoint()
            raise Interrupted(f"checkpoint of step {self.state.step} saved to {path}") from None
        finally:
            if self.metrics is not None:
                self.metrics.close()
        return self._finish()

    def _train_step(self) -> _StepStats:
        """One optimizer step over this process's micro-batches (the stream advances past it)."""
        stats = _StepStats()
        self.stats_lr = self.engine.optimizer.param_groups[0]["lr"]  # before a bad step zeroes it
        for batch in self.batches.step_batches(self.stream, self.state.step):
            loss, correct, masked = self.engine.forward(**batch)
            finite = torch.tensor(float(torch.isfinite(loss.detach()).all()))
            if self.engine.all_reduce_sum(finite).item() < self.engine.world_size:
                stats.bad = True
                loss = self._zero_loss(batch)
            else:
                stats.loss_sum += float(loss.detach())
                stats.finite_batches += 1
                stats.correct += int(correct)
                stats.masked += int(masked)
            stats.real_tokens += int(batch["attention_mask"].sum())
            stats.slots += batch["attention_mask"].numel()
            self.engine.backward(loss)
            if stats.bad:
                for group in self.engine.optimizer.param_groups:
                    group["lr"] = 0.0  # the update of a step with a non-finite loss is skipped
            self.engine.step()
        return stats

    def _zero_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """A loss whose gradient is exactly zero for every parameter (keeps all processes' collective
        gradient reductions in step while contributing nothing)."""
        tiny = {"input_ids": batch["input_ids"][:1, :2], "attention_mask": batch["attention_mask"][:1, :2].clone(),
                "labels": torch.full_like(batch["input_ids"][:1, :2], -100)}
        tiny["attention_mask"].fill_(1)
        loss, _, _ = self.engine.forward(**tiny)
        return loss * 0.0

    def _after_step(self, stats: _StepStats, window: _Window, bar, task) -> None:
        state, training = self.state, self.recipe.training
        totals = self.engine.all_reduce_sum(torch.tensor(
            [stats.loss_sum, stats.finite_batches, stats.correct, stats.masked, stats.real_tokens, stats.slots],
            dtype=torch.float64))
        state.step += 1
        state.position = replace(self.stream.position)
        state.real_tokens += int(totals[4])
        state.skipped_steps += int(stats.bad)
        state.bad_in_row = state.bad_in_row + 1 if stats.bad else 0
        loss = float(totals[0] / totals[1]) if totals[1] else math.nan
        record = {"step": state.step, "loss": loss,
                  "mlm_accuracy": float(totals[2] / totals[3]) if totals[3] else 0.0,
                  "tokens_per_s": window.tokens_per_s(int(totals[4])),
                  "real_token_fraction": float(totals[4] / totals[5]), "lr": self.stats_lr,
                  "grad_norm": None if stats.bad else self.engine.grad_norm(),
                  "skipped_steps": state.skipped_steps}
        if self.metrics is not None and (state.step % training.log_every_steps == 0 or stats.bad):
            self.metrics.write(record)
        bar.update(task, completed=state.step,
                   info=f"loss {loss:.3f}  acc {record['mlm_accuracy']:.3f}  {record['tokens_per_s']:,.0f} tok/s")
        if state.bad_in_row >= training.max_bad_steps:
            good = next(iter(list_checkpoints(self.output / CHECKPOINTS_DIR)), None)
            raise UserInputError(
                f"step {state.step}: the loss was NaN/inf for {state.bad_in_row} steps in a row at learning rate "
                f"{self.stats_lr:g} ({state.skipped_steps} skipped in all, none applied); last good checkpoint: "
                f"{good or 'none (no checkpoint saved yet)'}; lower optimizer.lr, check the data, or use precision fp32")
        if state.step % self.recipe.checkpoint.every_steps == 0:
            self._checkpoint()

    def _checkpoint(self) -> Path:
        path = save_checkpoint(self.engine, self.output / CHECKPOINTS_DIR, self.state.step, asdict(self.state)
                               | {"max_steps": self.recipe.training.max_steps, "world_size": self.engine.world_size,
                                  "precision": self.engine.precision},
                               (self.engine.module.mlm.config, self.corpus.tokenizer),
                               self.recipe.checkpoint.keep_last)
        self.last_saved = self.state.step
        return path

    def _finish(self) -> PretrainResult:
        from neobert_embed.pretraining.export import export_checkpoint

        checkpoint = self._checkpoint() if self.last_saved != self.state.step else (
            self.output / CHECKPOINTS_DIR / checkpoint_name(self.state.step))
        finished = self.state.step >= self.recipe.training.max_steps
        export_dir = (export_checkpoint(checkpoint, self.output / "final", progress=False)
                      if finished and self.engine.rank == 0 else None)
        logger.info("step %d (%s): metrics in %s, checkpoint %s%s", self.state.step, self.engine.precision,
                    self.output / METRICS_FILE, checkpoint,
                    f", model exported to {export_dir}" if export_dir else "; continue with --resume")
        return PretrainResult(self.output, self.state.step, finished, self.state.skipped_steps,
                              self.output / METRICS_FILE, checkpoint, export_dir, self.engine.module.mlm)


class _Window:
    """Real tokens per second since the previous step."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def tokens_per_s(self, tokens: int) -> float:
        now = time.perf_counter()
        rate = tokens / max(now - self.started, 1e-9)
        self.started = now
        return rate
