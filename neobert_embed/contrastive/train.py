"""``train_contrastive``: turn any encoder into an embedding model with the recipe.

Output directory layout (``DIR``)::

    DIR/                      the final SentenceTransformer (written atomically at the end)
    DIR/prompts               saved inside config_sentence_transformers.json: "query", "document" =
                              the instructions the run trained with ('' = none), so mteb's
                              wrapper (``neobert-embed mteb``) evaluates with exactly those
    DIR/metrics.jsonl         one line per logged step: step, loss, lr, examples_per_s, grad_norm
    DIR/summary.json          final loss, steps, wall time, examples/s, reload check
    DIR/run.json              model, data and recipe of the run (what --resume continues)
    DIR/checkpoints/          trainer checkpoints (model, optimizer, scheduler, RNG states)

Why this order of work: everything a user can get wrong (recipe, data files, model) is checked
before ``DIR`` is touched, so a bad input never leaves debris; the model files appear in ``DIR``
only by one rename after they are completely written.

Multi-GPU (DDP through the trainer; the text budget is per device)::

    torchrun --nproc_per_node 8 -m neobert_embed.cli train-contrastive --model neobert \\
        --recipe recipes/contrastive.yaml --data nq=nq.jsonl --output runs/neobert-nq

DeepSpeed: set ``deepspeed: ds_config.json`` in the recipe (passed to
``TrainingArguments.deepspeed``) and launch with ``deepspeed`` or ``torchrun`` the same way.

Example:
    >>> recipe = load_contrastive_recipe("recipes/contrastive.yaml", max_steps=20)
    >>> out = train_contrastive(model="bert", data={"snli": "triplets.jsonl"}, output="runs/x", recipe=recipe)
    >>> SentenceTransformer(str(out)).encode(["hi"], prompt_name="query").shape
    (1, 768)
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from neobert_embed import runs
from neobert_embed.contrastive.loss import build_contrastive_loss
from neobert_embed.contrastive.recipe import ContrastiveRecipe, DataSource
from neobert_embed.distributed import is_main_process
from neobert_embed.errors import UserInputError
from neobert_embed.files import check_free_space, follow_umask, remove_debris, writing
from neobert_embed.model_files import CheckedModel, model_bytes
from neobert_embed.outputs import DirectoryState
from neobert_embed.recipes import Spec
from neobert_embed.records import RUN, TRAINER_STATE, TRAINING_SUMMARY
from neobert_embed.sentence import DOCUMENT_PROMPT, QUERY_PROMPT, is_sentence_transformer_dir
from neobert_embed.sources import data_content
from neobert_embed.training_precision import TrainingPrecision

if TYPE_CHECKING:
    from transformers import TrainerCallback

logger = logging.getLogger(__name__)

CHECKPOINTS = runs.CHECKPOINTS_DIR
CHECKPOINT_COPIES = 3  # a checkpoint holds the weights and Adam's two moments
RUN_FILES = (CHECKPOINTS, runs.METRICS_FILE, TRAINING_SUMMARY.name, RUN.name)  # what each run writes anew
RELOAD_TOLERANCE = 1e-5


def _sources(data: dict[str, Any] | None, recipe: ContrastiveRecipe) -> dict[str, DataSource]:
    """Command-line data (name → path or DataSource) takes precedence over the recipe's.

    Sorted by name: the batch stream depends on the datasets' order, so a run must not change
    when ``--data`` options are given in another order or read back from run.json on resume.
    Local paths are made absolute so ``--resume`` works from any directory.
    """
    chosen = Spec("--data", {**recipe.model_dump(), "data": data}).validate(ContrastiveRecipe).data if data else recipe.data
    return {name: source.model_copy(update={"path": str(Path(source.path).resolve())})
            if Path(source.path).exists() else source for name, source in sorted(chosen.items())}


class TrainingSummary(BaseModel):
    """What ``summary.json`` of a finished run holds, as far as the CLI reads it back."""

    model_config = ConfigDict(extra="allow")
    steps: int = Field(ge=0)
    final_loss: float | None = None  # the last logged loss; None when no step was logged (logging_steps > steps)
    precision: str | None = None


class ResumedTrainerState(BaseModel):
    """What resuming needs of transformers' ``trainer_state.json`` in a checkpoint: without a step the
    Trainer would silently start over on the checkpoint's weights."""

    model_config = ConfigDict(extra="allow")
    global_step: int = Field(ge=0)
    log_history: list[dict[str, Any]] = []


def _complete_checkpoints(output: Path) -> list[Path]:
    """Checkpoints under ``output/checkpoints`` whose trainer_state.json (written last) exists, newest first."""
    complete = [p for p in (output / CHECKPOINTS).glob("checkpoint-*")  # none when the folder is absent
                if TRAINER_STATE.exists(p) and p.name.split("-")[-1].isdigit()]
    return sorted(complete, key=lambda p: int(p.name.split("-")[-1]), reverse=True)


def last_checkpoint(output: Path) -> Path | None:
    """The newest *usable* checkpoint under ``output/checkpoints``: complete (trainer_state.json is
    written last) and with a trainer state that says its step. A damaged one is skipped with a
    warning, as pretraining does; when every one is damaged, the error names the last problem.

    Example:
        >>> last_checkpoint(Path("runs/x"))
        PosixPath('runs/x/checkpoints/checkpoint-500')
    """
    problem = ""
    for checkpoint in _complete_checkpoints(output):
        try:
            TRAINER_STATE.validate(checkpoint, ResumedTrainerState)
            _check_tensor_files(checkpoint)
            return checkpoint
        except UserInputError as exc:
            problem = str(exc)
            logger.warning("skipping damaged checkpoint: %s", exc)
    if problem:
        raise UserInputError(f"--resume: every checkpoint in {output / CHECKPOINTS} is damaged (last problem: "
                             f"{problem}); start again without --resume, with a new --output")
    return None


def _check_tensor_files(checkpoint: Path) -> None:
    """Refuse a checkpoint whose weights, optimizer or scheduler file is truncated or not what it should
    be (read their headers only: milliseconds), so that ``--resume`` falls back to the one before instead
    of failing in the Trainer with a traceback."""
    from neobert_embed.model_files import check_safetensors, check_torch_bin

    for path in sorted(checkpoint.rglob("*")):
        if path.suffix == ".safetensors":
            check_safetensors(path)
        elif path.suffix in (".pt", ".pth", ".bin") and path.is_file():
            check_torch_bin(path)


def _record(model: str, sources: dict[str, DataSource], recipe: ContrastiveRecipe,
            saved: dict[str, Any] | None = None) -> dict[str, Any]:
    """What run.json holds: the model, the recipe with the data it trains on, and that data's content
    (:func:`~neobert_embed.sources.data_content`; not for a ``saved`` record written before it)."""
    return {"model": model, "recipe": {**recipe.model_dump(mode="json"),
                                       "data": {k: v.model_dump(mode="json") for k, v in sources.items()}},
            **data_content([source.path for source in sources.values()], saved)}


def _resolve_run(output: Path, model: str | None, data: dict[str, Any] | None,
                 recipe: ContrastiveRecipe | None, resume: bool, overwrite: bool
                 ) -> tuple[str, dict[str, DataSource], ContrastiveRecipe]:
    """Decide model, data and recipe; on resume they come from run.json and must not change."""
    saved = RUN.read(output) if resume else None
    if saved is not None:
        saved_recipe = Spec(f"{RUN.path(output)} (recipe)", saved["recipe"]).validate(ContrastiveRecipe)
        asked = _record(model or saved["model"], _sources(data, saved_recipe) if data else saved_recipe.data,
                        recipe or saved_recipe, saved)
        runs.check_resume(output, asked, hint="drop those options or start a new --output")
        return saved["model"], saved_recipe.data, saved_recipe
    if resume:
        logger.warning("%s: nothing to resume (no %s); starting a new run", output, RUN.name)
    elif output.exists() and any(output.iterdir()) and not overwrite:
        raise UserInputError(f"{output} already exists and is not empty; pass --resume to continue its run, "
                             "--overwrite to replace it, or choose another --output")
    if model is None:
        raise UserInputError("no model: pass --model (a registry key, hub id or local directory)")
    recipe = recipe or ContrastiveRecipe()
    return model, _sources(data, recipe), recipe


def _training_args(recipe: ContrastiveRecipe, output: Path, batch_size: int, prompts: dict | None,
                   precision: str | None = None):
    """The trainer's arguments; ``precision``: what the run measured (default: the recipe's)."""
    from sentence_transformers import SentenceTransformerTrainingArguments

    from neobert_embed.contrastive.trainer import device_flags

    return SentenceTransformerTrainingArguments(
        output_dir=str(output / CHECKPOINTS), max_steps=recipe.max_steps,
        per_device_train_batch_size=batch_size, learning_rate=recipe.learning_rate,
        adam_beta1=recipe.betas[0], adam_beta2=recipe.betas[1], weight_decay=recipe.weight_decay,
        lr_scheduler_type=recipe.lr_scheduler, warmup_steps=recipe.warmup_ratio,
        max_grad_norm=recipe.max_grad_norm, seed=recipe.seed, data_seed=recipe.seed,
        logging_steps=recipe.logging_steps, save_strategy="steps", save_steps=recipe.save_steps,
        save_total_limit=recipe.save_total_limit, report_to="none", deepspeed=recipe.deepspeed,
        prompts=prompts, **device_flags(precision or recipe.precision))


def _instruction(recipe: ContrastiveRecipe, source: DataSource, side: str) -> str:
    """The dataset's own ``query``/``document`` instruction, else the recipe's."""
    own = getattr(source, f"{side}_instruction")
    return getattr(recipe, f"{side}_instruction") if own is None else own


def _training_prompts(sources: dict[str, DataSource], recipe: ContrastiveRecipe, sets: dict[str, Any]):
    """Per-dataset, per-column instructions for the collator (None when there are none)."""
    prompts = {name: {column: _instruction(recipe, source, QUERY_PROMPT if column == "anchor" else DOCUMENT_PROMPT)
                      for column in sets[name].column_names} for name, source in sources.items()}
    return prompts if any(p for cols in prompts.values() for p in cols.values()) else None


def trained_prompts(sources: dict[str, DataSource], recipe: ContrastiveRecipe) -> dict[str, str]:
    """The ``query``/``document`` instructions the run trains with, saved as the model's prompts.

    Each side gets the instruction every dataset used ('' = no prefix, which also replaces a base
    model's own prompt: the run trained without one). When datasets use different instructions
    there is no single right prompt; the recipe's is saved and a warning names the datasets.

    Example:
        >>> trained_prompts({"nq": DataSource(path="nq.jsonl")}, ContrastiveRecipe(query_instruction="q: "))
        {'query': 'q: ', 'document': ''}
    """
    prompts = {}
    for side in (QUERY_PROMPT, DOCUMENT_PROMPT):
        key = f"{side}_instruction"
        used = {name: _instruction(recipe, source, side) for name, source in sources.items()}
        values = set(used.values())
        if len(values) > 1:
            logger.warning("datasets use different %s instructions (%s); the saved model's %r prompt is the "
                           "recipe's %r", side, used, side, getattr(recipe, key))
        prompts[side] = values.pop() if len(values) == 1 else getattr(recipe, key)
    return prompts


def _load_model(model_name: str | CheckedModel, recipe: ContrastiveRecipe, sources: dict[str, DataSource]):
    from neobert_embed.sentence import load_sentence_model

    model = load_sentence_model(model_name)
    if recipe.max_length < model.max_seq_length:
        model.max_seq_length = recipe.max_length
    elif recipe.max_length > model.max_seq_length:
        logger.warning("max_length %d exceeds what %s can take; using %d", recipe.max_length, model_name,
                       model.max_seq_length)
    model.prompts = {**model.prompts, **trained_prompts(sources, recipe)}
    return model


def _reload_difference(model, directory: Path, texts: list[str]) -> float:
    """Largest |Δ| between the in-memory model's and the saved copy's embeddings of ``texts``."""
    import numpy as np

    from neobert_embed.sentence import load_sentence_model

    reloaded = load_sentence_model(str(directory), device=str(model.device))
    before = model.encode(texts, prompt_name=QUERY_PROMPT, convert_to_numpy=True)
    after = reloaded.encode(texts, prompt_name=QUERY_PROMPT, convert_to_numpy=True)
    return float(np.abs(before - after).max())


def _save_final(model, output: Path, summary: dict[str, Any], texts: list[str]) -> None:
    """Write the model in a temp dir beside the run, check it reloads, and promote it with the run's files."""
    follow_umask(output / CHECKPOINTS)  # the Trainer saves their weights privately (0600)
    with runs.promoted(output, record=RUN) as tmp:
        model.save(str(tmp))
        summary["reload_max_abs_diff"] = _reload_difference(model, tmp, texts)
        if summary["reload_max_abs_diff"] > RELOAD_TOLERANCE:
            raise RuntimeError(f"the saved model encodes differently from the trained one "
                               f"(max |Δ| {summary['reload_max_abs_diff']:.2e}); nothing was written")
        TRAINING_SUMMARY.write(tmp, summary)


def train_contrastive(model: str | CheckedModel | None = None, data: dict[str, Any] | None = None,
                      output: str | Path = "runs/contrastive", recipe: ContrastiveRecipe | None = None,
                      resume: bool = False, overwrite: bool = False,
                      callbacks: list[TrainerCallback] | None = None, wait: bool = True) -> Path:
    """Fine-tune ``model`` contrastively on ``data`` with ``recipe``; return the saved model dir.

    Args:
        model: registry key (``bert``, ``neobert`` …), hub id, HF or SentenceTransformer directory,
            or the :class:`~neobert_embed.model_files.CheckedModel` a preflight made of one (its files are
            then not inspected again). May be omitted with ``resume=True`` (taken from the run).
        data: ``{name: path or DataSource}``; overrides the recipe's ``data``.
        output: run directory; becomes the SentenceTransformer (see the module docstring).
        recipe: settings (default: the paper's, :class:`ContrastiveRecipe`).
        resume: continue from the last checkpoint in ``output``; the run's model/data/recipe are
            reused and passing different ones is an error.
        overwrite: replace a finished or abandoned run in ``output`` (its old model stays until
            the new one is complete).
        callbacks: extra ``transformers.TrainerCallback`` objects (loggers, early stopping …).
        wait: when another process trains into ``output``, wait for it (else fail at once).

    ``output`` must be absent, empty, or a run directory (it holds ``run.json``): a directory with
    other content is refused, ``overwrite`` included, and nothing in it is deleted. One process at
    a time writes a run directory (an exclusive lock; ranks of one torchrun job share rank 0's).

    Raises:
        UserInputError: bad recipe/data/model or output conflict (before anything is written).
        Interrupted: after Ctrl-C, once a resumable checkpoint has been saved (continue with ``resume=True``).

    Example:
        >>> out = train_contrastive(model="bert", data={"snli": "triplets.jsonl"}, output="runs/x",
        ...                         recipe=load_contrastive_recipe(max_steps=20))
    """
    output = Path(output)
    inputs = [None if model is None else str(model)] + [getattr(v, "path", v) for v in (data or {}).values()]
    with runs.claimed_directory(output, record=RUN, command="neobert-embed train-contrastive",
                                inputs=inputs, what="training run", wait=wait,
                                on_stale=lambda _: remove_debris(output)) as state:  # a killed run's .NAME.old-PID
        return _train_in(output, model, data, recipe, resume, overwrite, callbacks, state)


def _train_in(output: Path, model: str | CheckedModel | None, data: dict[str, Any] | None, recipe: ContrastiveRecipe | None,
              resume: bool, overwrite: bool, callbacks: list[TrainerCallback] | None, state: DirectoryState) -> Path:
    """The body of :func:`train_contrastive`, run while holding the run directory's lock."""
    model_name, sources, recipe = _resolve_run(output, None if model is None else str(model), data, recipe, resume,
                                               overwrite)
    if resume and TRAINING_SUMMARY.exists(output) and is_sentence_transformer_dir(output):
        logger.warning("%s: this run already finished; nothing to resume", output)
        return output
    chosen = _chosen_precision(recipe)  # refuses fp16 on the CPU before anything is written
    sets = _checked_training_data(sources, recipe)
    if is_main_process():  # the final model and the checkpoints kept (each with the optimizer's two moments)
        kept = min(recipe.save_total_limit or 1, recipe.max_steps // max(recipe.save_steps, 1))
        check_free_space(output, model_bytes(model_name, 1 + CHECKPOINT_COPIES * kept),
                         what=f"the model and checkpoints of {model_name}")
    checked = model if isinstance(model, CheckedModel) and str(model) == model_name else None
    sentence_model = _load_model(checked or model_name, recipe, sources)
    chosen = _measured_precision(sentence_model, recipe, chosen, sets)
    if recipe.compile_layers:
        from neobert_embed.layer_compile import compile_repeated_layers

        logger.info("compiled %d norm/MLP blocks (compile_layers)", len(compile_repeated_layers(sentence_model)))
    logger.info(chosen.announcement)
    precision = chosen.label
    loss = build_contrastive_loss(sentence_model, recipe)
    checkpoint = last_checkpoint(output) if resume else None
    fresh = checkpoint is None and (state is not DirectoryState.OWNED or overwrite)
    replacing = is_main_process() and overwrite and not resume and state is DirectoryState.OWNED
    with _old_run_aside(output, replacing):  # the old run stays whole until the new one is complete
        if is_main_process():  # record what the run is (run.json)
            RUN.write(output, _record(model_name, sources, recipe))
        try:
            trainer, interrupt, progress = _build_trainer(sentence_model, loss, sets, sources, recipe, output, callbacks,
                                                          chosen)
            started = time.perf_counter()
            with (_batch_layout(sentence_model, recipe, chosen) as layout, interrupt, contextlib.closing(progress),
                  writing(output)):  # the bar stops however training ends
                result = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        except UserInputError:
            if fresh and is_main_process() and not _complete_checkpoints(output):
                _discard_new_run(output, remove_directory=state is DirectoryState.ABSENT)
            raise
        # Mixed precision: accelerate wrapped the model's forward in autocast for training and leaves it
        # there; without unwrapping, the final encode (and the reload check against the saved fp32 copy)
        # would run in bf16 (max |Δ| 2.4e-4 on a tiny BERT, over RELOAD_TOLERANCE).
        trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
        if interrupt.requested:
            raise runs.Interrupted(f"stopped at step {trainer.state.global_step}; checkpoint saved in "
                                   f"{output / CHECKPOINTS}")
        if not is_main_process():
            return output
        elapsed = time.perf_counter() - started
        summary = {
            "model": model_name, "output": str(output), "steps": trainer.state.global_step,
            "final_loss": next((e["loss"] for e in reversed(trainer.state.log_history) if "loss" in e), None),
            "train_loss": result.training_loss,
            "wall_s": round(elapsed, 2), "examples_per_s": round(trainer.examples_seen / max(elapsed, 1e-9), 2),
            "datasets": {name: d.num_rows for name, d in sets.items()}, "world_size": trainer.args.world_size,
            "resumed_from": str(checkpoint) if checkpoint else None, "precision": precision,
            "unpadded": layout.unpadded, "attention_kernel": layout.kernel,
        }
        first = next(iter(sets.values()))
        _save_final(sentence_model, output, summary, first["anchor"][:4] + first["positive"][:4])
        logger.info("saved the model, metrics.jsonl and summary.json in %s", output)
        return output


@contextlib.contextmanager
def _batch_layout(sentence_model, recipe: ContrastiveRecipe, chosen: TrainingPrecision,
                  announce: bool = True) -> Iterator[Any]:
    """The recipe's batch layout (``unpadded``) for the duration of training, announced once."""
    import torch

    from neobert_embed.contrastive.unpadding import training_layout
    from neobert_embed.training_precision import training_device

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(chosen.dtype)
    with training_layout(sentence_model, recipe.unpadded, device=training_device(),
                         autocast_dtype=dtype) as layout:
        if announce:
            logger.info(layout.announcement)
        yield layout


def _measured_precision(sentence_model, recipe: ContrastiveRecipe, chosen: TrainingPrecision,
                        sets: dict[str, Any]) -> TrainingPrecision:
    """``auto``'s bf16 on a CPU, confirmed on one batch of the run's first dataset
    (:func:`~neobert_embed.training_precision.measured_cpu_precision`); anything else as chosen."""
    from neobert_embed.contrastive.trainer import texts_per_example
    from neobert_embed.training_precision import measured_cpu_precision, training_device

    if recipe.precision != "auto" or chosen.dtype != "bf16" or training_device() != "cpu":
        return chosen
    first = next(iter(sets.values()))
    rows = min(first.num_rows, recipe.batch_examples(texts_per_example(first)))
    batches = []
    for call in range(3):  # a warm-up and two timed pairs, each on other rows: new shapes, as every step has
        picked = [(call * rows + i) % first.num_rows for i in range(max(1, rows - call))]
        batches.append([text for column in ("anchor", "positive") for text in first.select(picked)[column]])
    with _batch_layout(sentence_model, recipe, chosen, announce=False):
        return measured_cpu_precision(chosen, _step_timer(sentence_model, batches))


def _step_timer(sentence_model, batches: list[list[str]]):
    """Seconds of one forward and backward of ``sentence_model`` (bf16 autocast or fp32); calls 2k and
    2k + 1 run ``batches[k]``, so both precisions meet each batch's shapes for the first time (kernels set
    up per shape are part of a real step's cost: every step has new ones). The model's gradients, mode
    and the random streams are left as they were."""
    import torch

    calls = iter(range(2 * len(batches)))

    def run(bf16: bool) -> float:
        texts = batches[min(next(calls, 2 * len(batches) - 1) // 2, len(batches) - 1)]
        training = sentence_model.training
        with torch.random.fork_rng(devices=[]):
            sentence_model.eval()
            started = time.perf_counter()
            features = sentence_model.preprocess(texts)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                embeddings = sentence_model(features)["sentence_embedding"]
            embeddings.float().square().mean().backward()
            elapsed = time.perf_counter() - started
        sentence_model.zero_grad(set_to_none=True)
        sentence_model.train(training)
        return elapsed

    return run


def _chosen_precision(recipe: ContrastiveRecipe) -> TrainingPrecision:
    """The precision this run trains in, named with its reason (``bf16 autocast: avx512_bf16``),
    which the run shows once its inputs are loaded: ``auto`` depends on the machine."""
    from neobert_embed.training_precision import chosen_precision

    return chosen_precision(recipe.precision)


def _checked_training_data(sources: dict[str, DataSource], recipe: ContrastiveRecipe) -> dict[str, Any]:
    """Load every dataset and check each can fill one batch of the recipe's size."""
    from neobert_embed.contrastive.data import load_training_data
    from neobert_embed.contrastive.trainer import texts_per_example

    sets = load_training_data(sources)
    for name, dataset in sets.items():
        needed = recipe.batch_examples(texts_per_example(dataset))
        if needed > dataset.num_rows:
            raise UserInputError(f"dataset {name!r} has {dataset.num_rows} rows but one batch needs {needed}; "
                                 "lower text_budget/batch_size or add data")
    return sets


@contextlib.contextmanager
def _old_run_aside(output: Path, replacing: bool) -> Iterator[None]:
    """With ``replacing`` (``--overwrite`` of a run), move the old run in ``output`` aside whole
    (the hidden sibling ``.NAME.old-PID``) while the new one trains in ``output``.

    Why: deleting the old run's record, metrics and checkpoints first left, when the new run
    failed (a full disk), the old weights under no record: neither run. Now a failure brings the
    old run back exactly as it was; a complete new run gets the old one's other entries (a user's
    notes) and the rest is deleted; Ctrl-C keeps the new run (``--resume`` continues it).

    Example:
        >>> with _old_run_aside(Path("runs/x"), replacing=True):
        ...     train_into("runs/x")
    """
    if not replacing:
        yield
        return
    aside = output.with_name(f".{output.name}.old-{os.getpid()}")
    os.replace(output, aside)
    output.mkdir()
    try:
        yield
    except runs.Interrupted:
        _keep_user_entries(aside, output)
        raise
    except BaseException:
        shutil.rmtree(output, ignore_errors=True)
        os.replace(aside, output)
        raise
    _keep_user_entries(aside, output)


def _keep_user_entries(old_run: Path, output: Path) -> None:
    """Move the entries of the set-aside ``old_run`` that are no run file and that the new run in
    ``output`` lacks into it, then delete the old run."""
    for entry in sorted(old_run.iterdir()):
        if entry.name not in RUN_FILES and not (output / entry.name).exists():
            os.replace(entry, output / entry.name)
    shutil.rmtree(old_run, ignore_errors=True)


def _discard_new_run(output: Path, remove_directory: bool = False) -> None:
    """Remove what a new (or overwritten) run wrote, so a rerun with fixed data works."""
    shutil.rmtree(output / CHECKPOINTS, ignore_errors=True)
    for name in (runs.METRICS_FILE, TRAINING_SUMMARY.name, RUN.name):
        (output / name).unlink(missing_ok=True)
    if remove_directory and output.is_dir() and not any(output.iterdir()):
        output.rmdir()


def _build_trainer(sentence_model, loss, sets: dict[str, Any], sources: dict[str, DataSource],
                   recipe: ContrastiveRecipe, output: Path, callbacks: list[TrainerCallback] | None,
                   chosen: TrainingPrecision):
    """The recipe's trainer with its callbacks: metrics file, quiet progress bar, graceful Ctrl-C
    (the last two returned as well: ``train()`` runs inside them)."""
    from datasets import DatasetDict
    from transformers.trainer_callback import ProgressCallback

    from neobert_embed.contrastive.trainer import (
        ContrastiveTrainer,
        GracefulInterrupt,
        KeepSpecialTokenIds,
        MetricsFileCallback,
        QuietProgressCallback,
        texts_per_example,
    )
    from neobert_embed.divergence import StopOnNonFinite

    batch = max(recipe.batch_examples(texts_per_example(d)) for d in sets.values())
    args = _training_args(recipe, output, batch, _training_prompts(sources, recipe, sets), chosen.dtype)
    trainer = ContrastiveTrainer(recipe=recipe, model=sentence_model, args=args, train_dataset=DatasetDict(sets),
                                 loss=loss, callbacks=list(callbacks or []))
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(KeepSpecialTokenIds(sentence_model[0].auto_model.config))
    trainer.add_callback(StopOnNonFinite())  # a NaN/inf loss or gradient stops the run, never trains on
    progress = QuietProgressCallback()
    trainer.add_callback(progress)
    trainer.add_callback(MetricsFileCallback(output / runs.METRICS_FILE, trainer))
    interrupt = GracefulInterrupt()
    trainer.add_callback(interrupt)
    return trainer, interrupt, progress
