"""Real data: 50 SNLI steps from the real all-MiniLM-L6-v2 keep its STS-B dev quality."""

from __future__ import annotations

import json

import pytest
from contrastive_helpers import stsb_spearman

from neobert_embed.contrastive import load_contrastive_recipe, train_contrastive
from neobert_embed.sentence import load_sentence_model

SPEARMAN_BEFORE = 0.8672  # mteb 2.26 STSBenchmarkDev, real all-MiniLM-L6-v2 (shared data README)



@pytest.mark.slow
def test_snli_finetune_keeps_stsb_spearman(shared_data, minilm_path, tmp_path):
    recipe = load_contrastive_recipe(None, max_steps=50, text_budget=30, max_length=64, save_steps=1000)
    out = train_contrastive(model=str(minilm_path), data={"snli": str(shared_data / "snli_pairs" / "triplets.jsonl")},
                            output=tmp_path / "minilm-snli", recipe=recipe)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 50 and summary["datasets"] == {"snli": 6503}
    after = stsb_spearman(load_sentence_model(str(out)), shared_data / "tasks" / "stsb-dev" / "test.jsonl")
    print(f"STS-B dev Spearman: before {SPEARMAN_BEFORE}, after {after:.4f}")
    assert after >= SPEARMAN_BEFORE - 0.02
