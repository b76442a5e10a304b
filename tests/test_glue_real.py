"""neobert-embed glue on real data with the real all-MiniLM-L6-v2, against a plain transformers.Trainer.

STS-B: the first 400 rows of the real train split, scored on the first 200 dev pairs.
MRPC: the first 200 rows of the MSR train file, scored on the first 200 rows of the MSR test file
(the GLUE dev split is a subset of MSR train that ../shared/data does not mark, so MSR test
stands in). Both: the quick preset (one configuration, one seed) at 2 epochs, max length 64,
batch 16, learning rate 2e-4 (small budget, small model), seed 0 — the same in the plain Trainer,
precision included (the preset's ``auto``: bf16 autocast on a CPU with bf16 matrix units, else fp32).
Torch keeps its default two threads here: the suite runs alone on CI's two cores, and one thread
made this pair 452 s instead of 257 s. Measured on an idle AVX2 machine: 268 s at 480/400 rows and lr 1e-4,
188 s at 800/320 rows, 114 s now (lr 2e-4 learns STS-B from half the rows); both runs still agree to 1e-6
(STS-B Pearson 0.78887; MRPC accuracy 0.730, majority class 0.670).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from glue_helpers import write_jsonl
from typer.testing import CliRunner

from neobert_embed.cli import app
from neobert_embed.contrastive.trainer import device_flags
from neobert_embed.glue.presets import load_glue_preset
from neobert_embed.training_precision import chosen_precision

runner = CliRunner()

TRAIN_ROWS = {"stsb": 400, "mrpc": 200}  # at lr 1e-4 STS-B needed ~800 rows to learn in 2 epochs (480: Pearson 0.45)
DEV_ROWS, EPOCHS, MAX_LENGTH, BATCH, LR = 200, 2, 64, 16, 2e-4


def _rows(path: Path, limit: int | None, label: str) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [{"sentence1": r["sentence1"], "sentence2": r["sentence2"], "label": r[label]} for r in rows[:limit]]


def _task_dir(root: Path, task: str, train: list[dict], validation: list[dict]) -> Path:
    directory = root / task
    directory.mkdir()
    (directory / "task.json").write_text(json.dumps({"glue_task": task}))
    write_jsonl(directory / "train.jsonl", train)
    write_jsonl(directory / "validation.jsonl", validation)
    return directory


def _plain_trainer(model_path: Path, task: str, train: list[dict], validation: list[dict], out: Path) -> dict:
    """The textbook Trainer recipe (per-epoch evaluation, best epoch kept) with the preset's settings."""
    from datasets import Dataset
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    preset = load_glue_preset("quick", epochs=EPOCHS, max_length=MAX_LENGTH, batch_size=[BATCH], learning_rate=[LR])
    regression = task == "stsb"
    set_seed(preset.seeds[0])
    model = AutoModelForSequenceClassification.from_pretrained(str(model_path), num_labels=1 if regression else 2)
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))

    def encode(rows):
        data = Dataset.from_list(rows).map(
            lambda b: tokenizer(b["sentence1"], b["sentence2"], truncation=True, max_length=MAX_LENGTH), batched=True)
        return data.remove_columns(["sentence1", "sentence2"]).rename_column("label", "labels")

    def metrics(prediction):
        logits, gold = prediction.predictions, prediction.label_ids
        if regression:
            return {"pearson": pearsonr(logits.reshape(-1), gold)[0], "spearman": spearmanr(logits.reshape(-1), gold)[0]}
        predicted = logits.argmax(-1)
        return {"accuracy": accuracy_score(gold, predicted), "f1": f1_score(gold, predicted)}

    train_set = encode(train)
    if regression:
        train_set = train_set.cast_column("labels", __import__("datasets").Value("float32"))
    args = TrainingArguments(
        output_dir=str(out), num_train_epochs=EPOCHS, per_device_train_batch_size=preset.batch_size[0],
        per_device_eval_batch_size=preset.eval_batch_size, learning_rate=preset.learning_rate[0],
        weight_decay=preset.weight_decay[0], lr_scheduler_type="linear", warmup_steps=preset.warmup_ratio,
        seed=preset.seeds[0], eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True,
        metric_for_best_model="pearson" if regression else "accuracy", save_total_limit=1, report_to="none",
        use_cpu=True, disable_tqdm=True, bf16=chosen_precision(preset.precision, "cpu").bf16,
        optim=device_flags(preset.precision, "cpu")["optim"])  # the same AdamW kernel: fused and foreach round apart
    trainer = Trainer(model=model, args=args, train_dataset=train_set, eval_dataset=encode(validation),
                      processing_class=tokenizer, data_collator=DataCollatorWithPadding(tokenizer),
                      compute_metrics=metrics)
    trainer.train()
    return {k.removeprefix("eval_"): float(v) for k, v in trainer.evaluate().items()
            if k.removeprefix("eval_") in ("pearson", "spearman", "accuracy", "f1")}


def _glue(model_path: Path, task_dir: Path, out: Path) -> dict:
    result = runner.invoke(app, ["glue", "--model", str(model_path), "--task-dir", str(task_dir), "--output", str(out),
                                 "--preset", "quick", "--seeds", "1", "--epochs", str(EPOCHS),
                                 "--max-length", str(MAX_LENGTH), "--batch-size", str(BATCH), "--lr", str(LR),
                                 "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["scores"]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["stsb", "mrpc"])
def test_minilm_quick_preset_matches_a_plain_trainer_run(task, tmp_path, shared_data, minilm_path):
    if task == "stsb":
        train = _rows(shared_data / "stsb" / "train.jsonl", TRAIN_ROWS[task], "score")
        validation = _rows(shared_data / "stsb" / "dev.jsonl", DEV_ROWS, "score")
    else:
        train = _rows(shared_data / "mrpc" / "train.jsonl", TRAIN_ROWS[task], "label")
        validation = _rows(shared_data / "mrpc" / "test.jsonl", DEV_ROWS, "label")
    ours = _glue(minilm_path, _task_dir(tmp_path, task, train, validation), tmp_path / "out")[task]
    plain = _plain_trainer(minilm_path, task, train, validation, tmp_path / "plain")
    print(f"\n{task}: neobert-embed glue {ours}; plain Trainer {plain}")
    main = "pearson" if task == "stsb" else "accuracy"
    assert ours[main] == pytest.approx(plain[main], abs=0.01)
    for metric in plain:
        assert np.isclose(ours[metric], plain[metric], atol=0.02), metric
    if task == "stsb":
        assert ours["pearson"] > 0.5  # it learned the task
    else:
        majority = max(np.mean([r["label"] for r in validation]), 1 - np.mean([r["label"] for r in validation]))
        assert ours["accuracy"] > majority, f"no better than always answering the majority class ({majority:.3f})"
