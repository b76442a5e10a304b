"""One GLUE trial: fine-tune a classification head on one task with one grid point.

Why this shape: a trial is the unit of work the runner schedules, skips on rerun and runs on
one device, so it is a plain function from (model, data, grid point) to a JSON-able result. It
uses ``transformers.Trainer`` as is — AdamW without decay on biases and norms, linear schedule
with warmup, evaluation every n steps, ``EarlyStoppingCallback`` — and adds one callback that
keeps the best evaluation's weights in memory (instead of writing a checkpoint per evaluation),
so the reported score is the best evaluation's and test predictions come from that model.

Heads are ``AutoModelForSequenceClassification`` (NeoBERT's own class is registered there);
a SentenceTransformer directory contributes its transformer module.

Example:
    >>> result = run_trial("bert", load_glue_data(task_dir="tasks/rte"), Trial("rte", 32, 2e-5, 0.01, 0),
    ...                    load_glue_preset("quick"), work_dir="runs/glue/.work/x")
    >>> result["scores"]["accuracy"]
    0.61
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neobert_embed.backbones import resolve_model_name, usable_max_length
from neobert_embed.distributed import is_main_process
from neobert_embed.files import value_digest
from neobert_embed.glue.data import GlueData
from neobert_embed.glue.journal import TrialScores
from neobert_embed.glue.presets import GluePreset, Trial
from neobert_embed.glue.tasks import GlueTask, compute_metrics, predictions_from_logits
from neobert_embed.records import BEST_TRIAL

if TYPE_CHECKING:
    from transformers import EvalPrediction, PreTrainedModel, PreTrainedTokenizerBase, TrainingArguments

logger = logging.getLogger(__name__)



def backbone_path(model: str) -> str:
    """What ``from_pretrained`` should load for ``model``: registry key → hub id; a
    SentenceTransformer directory → its transformer module's folder; anything else as given.

    Example:
        >>> backbone_path("neobert")
        'chandar-lab/NeoBERT'
    """
    from neobert_embed.model_files import MODULES_FILE, transformer_module
    from neobert_embed.sentence import is_sentence_transformer_dir

    name = resolve_model_name(model)
    if is_sentence_transformer_dir(name):
        transformer = transformer_module(name)
        if transformer is None:
            from neobert_embed.errors import UserInputError

            raise UserInputError(f"{Path(name) / MODULES_FILE}: no Transformer module to fine-tune")
        return str(Path(name) / transformer.path)
    return name


def load_classifier(source: str, task: GlueTask, reset_head: bool = False) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)``: a fresh ``num_labels`` head on the encoder at ``source``.

    ``reset_head`` starts from another task's fine-tuned model (MNLI → RTE): its classifier is
    discarded (``ignore_mismatched_sizes``) and re-initialised for this task's labels.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    import neobert_embed.modeling  # noqa: F401  (registers NeoBERTForSequenceClassification)
    from neobert_embed.errors import UserInputError
    from neobert_embed.sentence import check_finite_weights

    kwargs: dict[str, Any] = {"num_labels": task.num_labels,
                              "problem_type": "regression" if task.is_regression else "single_label_classification"}
    if task.labels:
        kwargs["id2label"] = dict(enumerate(task.labels))
        kwargs["label2id"] = {name: i for i, name in enumerate(task.labels)}
    if reset_head:
        kwargs["ignore_mismatched_sizes"] = True
    try:
        model = AutoModelForSequenceClassification.from_pretrained(source, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except OSError as exc:
        raise UserInputError(f"cannot load model {source!r}: {str(exc).splitlines()[0] if str(exc) else exc!r}. "
                             "Pass a local model directory, a reachable hub id or a registry key "
                             "(HF_HUB_OFFLINE=1 allows only local and cached models)") from None
    check_finite_weights(model, source)
    return model, tokenizer


def _keep_best_callback(selection: str):
    from transformers import TrainerCallback

    class KeepBestWeights(TrainerCallback):
        """Copy the weights to CPU memory whenever the selection metric improves; restore at the end."""

        def __init__(self) -> None:
            self.best: float | None = None
            self.best_step = 0
            self.state_dict: dict[str, Any] | None = None
            self.history: list[dict[str, float]] = []

        def on_evaluate(self, args, state, control, metrics=None, model=None, **kwargs):
            value = (metrics or {}).get(f"eval_{selection}")
            if value is None:
                return
            self.history.append({"step": state.global_step, selection: float(value)})
            if math.isnan(value):  # e.g. Pearson of constant predictions: never an improvement
                value = float("-inf")
            if self.best is None or value > self.best:
                self.best, self.best_step = float(value), state.global_step
                self.state_dict = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

        def restore(self, model) -> None:
            if self.state_dict is not None:
                model.load_state_dict(self.state_dict)

    return KeepBestWeights()


def eval_every(preset: GluePreset, train_rows: int, batch_size: int) -> int:
    """Steps between evaluations: ``min(eval_steps, steps per epoch, train rows // 10)`` (the
    NeoBERT code's rule), or once per epoch when ``eval_steps`` is not set.

    Example:
        >>> eval_every(load_glue_preset("paper"), train_rows=2490, batch_size=2)
        249
    """
    per_epoch = max(1, math.ceil(train_rows / batch_size))
    if preset.eval_steps is None:
        return per_epoch
    return max(1, min(preset.eval_steps, per_epoch, train_rows // 10 or 1))


def tokenize_splits(data: GlueData, tokenizer: PreTrainedTokenizerBase, max_length: int) -> dict[str, Any]:
    """Each split tokenized (pairs as pairs, truncated to ``max_length``), labels as ``labels``."""
    pair = data.task.is_pair

    def encode(batch: dict[str, list]) -> dict[str, Any]:
        texts = (batch["sentence1"], batch["sentence2"]) if pair else (batch["sentence1"],)
        return tokenizer(*texts, truncation=True, max_length=max_length)

    encoded = {}
    for split, dataset in data.splits.items():
        drop = [c for c in dataset.column_names if c not in ("label", "idx")]
        # an explicit fingerprint: hashing the closure (and the tokenizer in it) costs seconds per split
        identity = f"{data.source}|{split}|{dataset.num_rows}|{tokenizer.name_or_path}|{max_length}"
        fingerprint = value_digest(identity, 32)
        encoded[split] = dataset.map(encode, batched=True, remove_columns=drop,
                                     new_fingerprint=fingerprint).rename_column("label", "labels")
    return encoded


def training_arguments(preset: GluePreset, trial: Trial, task: GlueTask, train_rows: int, work_dir: Path,
                       device: str) -> TrainingArguments:
    """The ``TrainingArguments`` of a trial (public so a plain-Trainer comparison can reuse the schedule)."""
    from transformers import TrainingArguments

    from neobert_embed.contrastive.trainer import device_flags

    every = eval_every(preset, train_rows, trial.batch_size)
    return TrainingArguments(
        output_dir=str(work_dir), num_train_epochs=preset.epochs, per_device_train_batch_size=trial.batch_size,
        per_device_eval_batch_size=preset.eval_batch_size, learning_rate=trial.learning_rate,
        weight_decay=trial.weight_decay, lr_scheduler_type=preset.lr_scheduler, warmup_steps=preset.warmup_ratio,
        seed=trial.seed, eval_strategy="steps", eval_steps=every, save_strategy="no", logging_steps=every,
        metric_for_best_model=task.selection_metric, greater_is_better=True, report_to="none",
        disable_tqdm=True, **device_flags(preset.precision, device))


_ANNOUNCED: set[str] = set()


def _announced_precision(preset: GluePreset, device: str) -> str:
    """The trial's precision with its reason (``bf16 autocast: avx512_bf16``), recorded in each trial's
    result and shown once per process (``auto`` depends on the machine, so the run says what it used)."""
    from neobert_embed.training_precision import chosen_precision

    chosen = chosen_precision(preset.precision, device)
    if chosen.label not in _ANNOUNCED:
        _ANNOUNCED.add(chosen.label)
        logger.info(chosen.announcement)
    return chosen.label


def _usable_length(model: PreTrainedModel, preset: GluePreset) -> int:
    usable = usable_max_length(model.config)
    return min(preset.max_length, usable) if preset.max_length else usable


def run_trial(model: str, data: GlueData, trial: Trial, preset: GluePreset, work_dir: str | Path,
              device: str = "cpu", start_from: str | Path | None = None, predict_test: bool = False,
              keep_model: str | Path | None = None) -> dict[str, Any]:
    """Fine-tune and evaluate one trial; return its result (scores on validation, history, timing).

    Args:
        model: what ``--model`` named (registry key, hub id, HF or SentenceTransformer dir).
        data: the task's splits (:func:`~neobert_embed.glue.data.load_glue_data`).
        trial: the grid point.
        preset: shared settings (epochs, evaluation, early stopping, schedule, lengths).
        work_dir: scratch directory for the trainer (removed afterwards).
        device: ``cpu`` or ``cuda`` (the runner pins each worker to one GPU).
        start_from: a fine-tuned model of another task (MNLI → RTE); its head is replaced.
        predict_test: also predict the test splits (GLUE-server files are written by the runner).
        keep_model: directory holding the best model of this task so far; replaced (under a file
            lock, atomically) when this trial beats it — the start of transfer targets.

    Example:
        >>> run_trial("bert", data, Trial("stsb", 32, 2e-5, 0.01, 0), preset, "runs/.work")["scores"]
        {'pearson': 0.87, 'spearman': 0.86}
    """
    import torch
    from transformers import EarlyStoppingCallback, Trainer, set_seed
    from transformers.data.data_collator import DataCollatorWithPadding
    from transformers.trainer_callback import PrinterCallback

    from neobert_embed.contrastive.trainer import KeepSpecialTokenIds
    from neobert_embed.divergence import StopOnNonFinite

    task = data.task
    work_dir = Path(work_dir)
    set_seed(trial.seed)  # the new head's initialisation depends on it
    classifier, tokenizer = load_classifier(str(start_from) if start_from else backbone_path(model), task,
                                            reset_head=start_from is not None)
    max_length = _usable_length(classifier, preset)
    encoded = tokenize_splits(data, tokenizer, max_length)
    validation = [(prefix, encoded[split]) for prefix, split in task.validation_splits]
    first_prefix, first_validation = validation[0]

    def metrics(prediction: EvalPrediction) -> dict[str, float]:
        logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        return compute_metrics(task, predictions_from_logits(task, logits), prediction.label_ids, first_prefix)

    args = training_arguments(preset, trial, task, encoded["train"].num_rows, work_dir, device)
    precision = _announced_precision(preset, device)
    keeper = _keep_best_callback(task.selection_metric)
    callbacks = [keeper]
    if preset.early_stopping_patience:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=preset.early_stopping_patience))
    trainer = Trainer(model=classifier, args=args, train_dataset=encoded["train"], eval_dataset=first_validation,
                      processing_class=tokenizer, data_collator=DataCollatorWithPadding(tokenizer),
                      compute_metrics=metrics, callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)  # the runner reports progress; stdout stays clean for --json
    trainer.add_callback(KeepSpecialTokenIds(classifier.config))  # RoBERTa: positions depend on pad_token_id
    trainer.add_callback(StopOnNonFinite())  # a NaN/inf loss or gradient stops the trial, never trains on
    started = time.perf_counter()
    try:
        with _batch_layout(classifier, preset):
            output = trainer.train()
            train_seconds = time.perf_counter() - started
            keeper.restore(trainer.model)
            scores: dict[str, float] = {}
            for prefix, dataset in validation:
                predicted = trainer.predict(dataset, metric_key_prefix="final")
                scores.update(compute_metrics(task, predictions_from_logits(task, predicted.predictions),
                                              predicted.label_ids, prefix))
            tests = {}
            if predict_test:
                for split in data.test_splits:
                    logits = trainer.predict(encoded[split].remove_columns("labels")).predictions
                    tests[split] = {"idx": [int(i) for i in encoded[split]["idx"]],
                                    "prediction": predictions_from_logits(task, logits).tolist()}
        result = {
            "task": task.name, "trial": asdict(trial), "key": trial.key, "config_key": trial.config_key,
            "model": model, "start_from": str(start_from) if start_from else None, "data": data.source,
            "scores": scores, "best_step": keeper.best_step, "steps": trainer.state.global_step,
            "history": keeper.history, "eval_every": args.eval_steps, "max_length": max_length,
            "train_rows": encoded["train"].num_rows, "train_loss": output.training_loss,
            "train_seconds": round(train_seconds, 2),
            "train_examples_per_s": round(output.metrics.get("train_samples_per_second", 0.0), 2),
            "device": device, "torch_threads": torch.get_num_threads(), "precision": precision,
            "unpadded": preset.unpadded,
            "test_predictions": tests,
        }
        if keep_model is not None and is_main_process():
            _keep_if_best(trainer.model, tokenizer, Path(keep_model), result)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return result


def _batch_layout(classifier: PreTrainedModel, preset: GluePreset) -> contextlib.AbstractContextManager:
    """``preset.unpadded`` (off by default): the encoder runs each batch on its real tokens, one flat stream
    (:func:`~neobert_embed.modeling.flat_attention.unpadded_encoder`; the head reads each text's first
    token as before); else padded batches, as transformers' Trainer runs them."""
    from neobert_embed.modeling.flat_attention import unpadded_encoder

    return unpadded_encoder(classifier) if preset.unpadded else contextlib.nullcontext()


def _keep_if_best(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path, result: dict[str, Any]) -> None:
    """Save this trial's model as ``directory`` if it beats the one there. Trials run in parallel: the
    folder's writer lock (the one every output has) makes compare-and-replace one step, so a better
    model is never replaced by a worse one that finished later."""
    from neobert_embed.files import atomic_directory
    from neobert_embed.glue.tasks import TASKS
    from neobert_embed.locks import writer_lock

    selection = TASKS[result["task"]].selection_metric
    with writer_lock(directory, command=f"neobert-embed glue (keeping the best {result['task']} model)"):
        if BEST_TRIAL.exists(directory):
            previous = BEST_TRIAL.validate(directory, TrialScores)
            previous.check_metric(BEST_TRIAL.path(directory), selection, BEST_TRIAL.fix)
            if previous.scores[selection] >= result["scores"][selection]:
                return
        with atomic_directory(directory) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            BEST_TRIAL.write(tmp, {"key": result["key"], "scores": result["scores"]})
