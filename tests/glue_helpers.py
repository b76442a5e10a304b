"""Small GLUE task directories for tests: tiny synthetic ones, and subsets of the real data."""

from __future__ import annotations

import json
import random
from pathlib import Path

LEFT = ["a cat sat on the mat", "the dog ran home", "it rains in spring", "birds fly high", "he reads a book"]
RIGHT = ["a cat sat on the mat", "a dog runs home", "the sun is out", "planes fly high", "she writes a letter"]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def synthetic_rows(task: str, n: int, seed: int, labelled: bool = True) -> list[dict]:
    """Pairs whose label depends on whether the two sentences are the same (learnable, tiny)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.choice(LEFT), rng.choice(RIGHT)
        same = a == b or rng.random() < 0.3
        b = a if same else b
        row = {"sentence1": a, "sentence2": b}
        if task == "cola" or task == "sst2":
            row = {"sentence1": a}
        if labelled:
            row["label"] = {"stsb": 4.0 + rng.random() if same else rng.random() * 2,
                            "mnli": 0 if same else rng.choice([1, 2])}.get(task, int(same))
        else:
            row["idx"] = i
        rows.append(row)
    return rows


def tiny_task_dir(root: Path, task: str, train: int = 48, validation: int = 24, test: int = 0) -> Path:
    """A local task directory for ``task`` with synthetic rows."""
    directory = root / task
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "task.json").write_text(json.dumps({"glue_task": task}), encoding="utf-8")
    write_jsonl(directory / "train.jsonl", synthetic_rows(task, train, 0))
    splits = ["validation_matched", "validation_mismatched"] if task == "mnli" else ["validation"]
    for i, split in enumerate(splits):
        write_jsonl(directory / f"{split}.jsonl", synthetic_rows(task, validation, 1 + i))
    if test:
        write_jsonl(directory / "test.jsonl", synthetic_rows(task, test, 9, labelled=False))
    return directory


# A two-configuration grid of one seed and one short epoch, with MNLI → RTE transfer: seconds per task.
TINY_GRID = """\
batch_size: [8, 16]
learning_rate: [1.0e-4]
weight_decay: [0.01]
seeds: [0]
epochs: 1
eval_steps: 2
early_stopping_patience: 2
max_length: 32
transfer: {rte: mnli}
"""
