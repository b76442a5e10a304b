"""Synthetic contrastive data for the tests: positives paraphrase the query, never copy it."""

from __future__ import annotations

import json
import random
from pathlib import Path

COLORS = ("red", "blue", "green", "yellow", "black", "white", "pink", "brown")
ANIMALS = ("cat", "dog", "horse", "bird", "fish", "cow", "lion", "bear")
TINY_RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "contrastive-tiny.yaml"


def paraphrase_rows(negatives: int = 1, seed: int = 0, extra: bool = True) -> list[dict]:
    """64 (query, positive, negatives) rows: "the red cat" ↔ "a cat whose colour is red"."""
    rng = random.Random(seed)
    rows = []
    for color in COLORS:
        for animal in ANIMALS:
            row = {"query": f"the {color} {animal}", "document": f"a {animal} whose colour is {color}"}
            for i in range(1, negatives + 1):
                other = rng.choice([c for c in COLORS if c != color])
                row[f"negative_{i}"] = f"a {animal} whose colour is {other} ({i})"
            if extra:
                row["id"] = len(rows)
            rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def stsb_spearman(model, path: Path) -> float:
    """Spearman correlation between gold scores and cosine similarities (STS-B style jsonl)."""
    import numpy as np
    from scipy.stats import spearmanr

    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    left = model.encode([r["sentence1"] for r in rows], batch_size=128, normalize_embeddings=True)
    right = model.encode([r["sentence2"] for r in rows], batch_size=128, normalize_embeddings=True)
    return float(spearmanr([r["score"] for r in rows], np.sum(left * right, axis=1)).statistic)


def one_torch_thread():
    """Run a test with one intra-op thread, then restore the previous count.

    Why: the suite shares 2 cores with other jobs; with 2 OpenMP threads per process a training step
    of MiniLM measured 6x slower under that contention than with one (threads spin at barriers).
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
