"""The pieces of the recipe: α-sampler, InfoNCE equality, recipe validation, column handling."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from contrastive_helpers import TINY_RECIPE, one_torch_thread, paraphrase_rows, write_jsonl
from datasets import Dataset
from tiny_models import build_tiny_model
from torch.utils.data import ConcatDataset

from neobert_embed.contrastive import ContrastiveRecipe, load_contrastive_recipe
from neobert_embed.contrastive.data import load_examples
from neobert_embed.contrastive.loss import build_contrastive_loss
from neobert_embed.contrastive.recipe import DataSource
from neobert_embed.contrastive.sampler import AlphaBatchSampler, no_duplicates_sampler
from neobert_embed.errors import UserInputError
from neobert_embed.sentence import load_sentence_model

REPO = Path(__file__).resolve().parents[1]

_one_thread = pytest.fixture(autouse=True)(one_torch_thread)


def _dataset(name: str, rows: int, negatives: int, duplicates_every: int = 0) -> Dataset:
    columns = {"anchor": [f"{name} query {i}" for i in range(rows)],
               "positive": [f"{name} doc {i % duplicates_every if duplicates_every else i}" for i in range(rows)]}
    for k in range(1, negatives + 1):
        columns[f"negative_{k}"] = [f"{name} neg {k} {i}" for i in range(rows)]
    return Dataset.from_dict(columns)


def _alpha_sampler(sets, recipe, num_batches, seed=0):
    samplers = [no_duplicates_sampler(d, recipe.batch_examples(len(d.column_names)), seed=seed, position=i)
                for i, d in enumerate(sets)]
    return AlphaBatchSampler(ConcatDataset(sets), samplers, seed=seed, alpha=recipe.alpha, num_batches=num_batches)


def test_alpha_sampler_frequencies_homogeneous_batches_and_no_duplicate_texts():
    sets = [_dataset("a", 2000, 0, duplicates_every=700), _dataset("b", 500, 1), _dataset("c", 60, 2)]
    recipe = ContrastiveRecipe(text_budget=12, alpha=0.5)
    sampler = _alpha_sampler(sets, recipe, num_batches=10_000)
    bounds = np.cumsum([0] + [len(d) for d in sets])
    counts: Counter = Counter()
    texts = [[v for row in d.to_list() for v in [tuple(row.values())]] for d in sets]
    for batch in sampler:
        owner = np.searchsorted(bounds, batch, side="right") - 1
        assert len(set(owner)) == 1, "a batch mixes datasets"
        source = int(owner[0])
        counts[source] += 1
        assert len(batch) == recipe.batch_examples(len(sets[source].column_names))  # 6, 4, 3 examples
        batch_texts = [t for i in batch for t in texts[source][i - bounds[source]]]
        assert len(batch_texts) == len(set(batch_texts)), "a text repeats inside a batch"
    expected = np.array([2000, 500, 60], dtype=float) ** 0.5
    expected /= expected.sum()
    observed = np.array([counts[i] for i in range(3)]) / 10_000
    assert np.abs(observed - expected).max() < 0.02, (observed, expected)


def test_alpha_sampler_gives_all_ranks_of_a_step_one_dataset():
    sets = [_dataset("a", 300, 1), _dataset("b", 300, 0)]
    samplers = [no_duplicates_sampler(d, 4, seed=0, position=i) for i, d in enumerate(sets)]
    stream = list(AlphaBatchSampler(ConcatDataset(sets), samplers, alpha=1.0, num_batches=400, batches_per_draw=4))
    owners = [[index >= 300 for index in batch] for batch in stream]
    for step in range(0, 400, 4):  # the 4 batches of one step go to 4 ranks
        assert len({o for batch in owners[step:step + 4] for o in batch}) == 1
    assert 0.4 < np.mean([batch[0] for batch in owners]) < 0.6


def test_alpha_sampler_stream_is_a_function_of_the_seed():
    sets = [_dataset("a", 300, 1), _dataset("b", 100, 0)]
    recipe = ContrastiveRecipe(text_budget=8, alpha=1.0)
    first = list(_alpha_sampler(sets, recipe, 200))
    assert first == list(_alpha_sampler(sets, recipe, 200))  # a resumed run replays it exactly
    assert first != list(_alpha_sampler(sets, recipe, 200, seed=1))
    assert len(first) == 200  # small datasets are cycled with a fresh shuffle


def _independent_infonce(q, docs, temperature, symmetric=False):
    """Cross-entropy of cos(q_i, ·)/τ over every positive and hard negative of the batch."""
    q = F.normalize(q, dim=-1)
    candidates = F.normalize(torch.cat(docs), dim=-1)  # positives first, then each negative column
    target = torch.arange(len(q))
    loss = F.cross_entropy(q @ candidates.T / temperature, target)
    if symmetric:
        positives = F.normalize(docs[0], dim=-1)
        loss = (loss + F.cross_entropy(positives @ q.T / temperature, target)) / 2
    return loss


@pytest.fixture(scope="module")
def float64_model(tmp_path_factory):
    model = load_sentence_model(str(build_tiny_model("bert", tmp_path_factory.mktemp("m") / "bert")))
    return model.double().eval()


BATCH = [("the red cat", "a cat whose colour is red", "a cat whose colour is blue", "a red fish"),
         ("the blue dog", "a dog whose colour is blue", "a dog whose colour is green", "a blue bird"),
         ("the green cow", "a cow whose colour is green", "a cow whose colour is pink", "a green lion"),
         ("the white bear", "a bear whose colour is white", "a bear whose colour is black", "a white horse")]


@pytest.mark.parametrize("options", [{}, {"symmetric": True}, {"cached": True, "mini_batch_size": 3},
                                     {"temperature": 0.05}, {"matryoshka_dims": [32, 8]}])
def test_loss_equals_independent_infonce_with_hard_negatives(float64_model, options):
    recipe = ContrastiveRecipe(**options)
    loss_fn = build_contrastive_loss(float64_model, recipe)
    columns = list(zip(*BATCH, strict=True))  # anchor, positive, negative_1, negative_2
    features = [float64_model.preprocess(list(texts)) for texts in columns]
    value = loss_fn(features, labels=None).detach()
    with torch.no_grad():
        embeddings = [float64_model(dict(f))["sentence_embedding"] for f in features]
    dims = recipe.matryoshka_dims or [embeddings[0].shape[1]]
    expected = sum(_independent_infonce(embeddings[0][:, :d], [e[:, :d] for e in embeddings[1:]],
                                        recipe.temperature, recipe.symmetric) for d in dims)
    assert abs(float(value) - float(expected)) <= 1e-6


def test_paper_recipe_file_matches_the_paper():
    recipe = load_contrastive_recipe(REPO / "recipes" / "contrastive.yaml")
    assert (recipe.max_steps, recipe.learning_rate, recipe.betas, recipe.weight_decay) == (2000, 1e-4, (0.9, 0.95),
                                                                                          0.01)
    assert (recipe.lr_scheduler, recipe.max_grad_norm, recipe.max_length) == ("cosine", 1.0, 1024)
    assert (recipe.temperature, recipe.alpha, recipe.text_budget) == (0.07, 0.5, 128)
    assert 0.05 <= recipe.warmup_ratio <= 0.10
    assert recipe == ContrastiveRecipe()  # the defaults are the paper's recipe
    assert load_contrastive_recipe(TINY_RECIPE).max_steps == 20


@pytest.mark.parametrize(("text", "overrides", "message"), [
    ("temprature: 0.1\n", {}, r"unknown key 'temprature'"),
    ("batch_size: 32\n", {}, r"exactly one of 'text_budget'"),
    ("mini_batch_size: 8\n", {}, r"'mini_batch_size' only applies"),
    ("temperature: -1\n", {}, r"key 'temperature'"),
    ("data: {bad name: x.jsonl}\n", {}, r"dataset name 'bad name'"),
    ("", {"tempreature": 0.1}, r"override: unknown key 'tempreature'"),
    ("max_steps: [\n", {}, r"recipe\.yaml:\d+: invalid YAML"),
])
def test_recipe_errors_name_the_key(tmp_path, text, overrides, message):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(UserInputError, match=message):
        load_contrastive_recipe(path, **overrides)


def test_overrides_swap_batching_mode_and_data_paths_resolve_against_the_recipe(tmp_path):
    write_jsonl(tmp_path / "t.jsonl", paraphrase_rows())
    (tmp_path / "r.yaml").write_text("text_budget: 64\ndata: {t: t.jsonl, hub: org/name}\n")
    recipe = load_contrastive_recipe(tmp_path / "r.yaml", batch_size=16)
    assert (recipe.text_budget, recipe.batch_size, recipe.batch_examples(3)) == (None, 16, 16)
    assert recipe.data["t"].path == str(tmp_path / "t.jsonl") and recipe.data["hub"].path == "org/name"


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet", "saved"])
def test_column_aliases_and_formats_normalize_to_anchor_positive_negatives(tmp_path, fmt, caplog):
    rows = [{"question": f"q{i}", "answer": f"a{i}", "negative_2": f"n2 {i}", "negative_1": f"n1 {i}", "score": i}
            for i in range(5)]
    path = tmp_path / f"data.{fmt}"
    frame = Dataset.from_list(rows)
    if fmt == "jsonl":
        write_jsonl(path, rows)
    elif fmt == "csv":
        frame.to_csv(str(path), index=False)
    elif fmt == "parquet":
        frame.to_parquet(str(path))
    else:
        frame.save_to_disk(str(path))
    ds = load_examples("x", DataSource(path=str(path)))
    assert ds.column_names == ["anchor", "positive", "negative_1", "negative_2"]
    assert ds[0] == {"anchor": "q0", "positive": "a0", "negative_1": "n1 0", "negative_2": "n2 0"}
    assert "ignoring column(s) ['score']" in caplog.text


def test_negative_lists_and_ambiguous_columns(tmp_path):
    write_jsonl(tmp_path / "lists.jsonl", [{"query": "q", "document": "d", "negatives": ["x", "y"]},
                                           {"query": "r", "document": "e", "negatives": ["z"]}])
    with pytest.raises(UserInputError, match=r"lists\.jsonl:2: 1 negatives, but .*lists\.jsonl:1 has 2"):
        load_examples("l", DataSource(path=str(tmp_path / "lists.jsonl")))
    write_jsonl(tmp_path / "two.jsonl", [{"query": "q", "anchor": "a", "positive": "p"}])
    with pytest.raises(UserInputError, match=r"several query columns \['anchor', 'query'\]"):
        load_examples("t", DataSource(path=str(tmp_path / "two.jsonl")))
    (tmp_path / "bad.csv").write_text("query,positive\nq1,\n")
    with pytest.raises(UserInputError, match=r"bad\.csv:2: column 'positive'"):
        load_examples("c", DataSource(path=str(tmp_path / "bad.csv")))
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(UserInputError, match=r"no query column; .*found columns: \['text'\]"):
        load_examples("x", DataSource(path=str(tmp_path / "x.txt")))


def test_rows_are_checked_again_when_their_columns_change(tmp_path):
    rows = [{"query": f"q{i}", "document": f"d{i}", "negative_1": f"n{i}"} for i in range(3)]
    reordered = rows + [{"negative_1": "n3", "document": "d3", "query": "q3"}, dict(rows[0], query="q4")]
    ds = load_examples("r", DataSource(path=str(write_jsonl(tmp_path / "reordered.jsonl", reordered))))
    assert ds["anchor"] == ["q0", "q1", "q2", "q3", "q4"] and ds["negative_1"][3] == "n3"
    mixed = rows + [dict(rows[0], negatives=["x"])]  # same query/document, a second form of negatives on line 4
    with pytest.raises(UserInputError, match=r"mixed\.jsonl:4: negatives given in several forms"):
        load_examples("m", DataSource(path=str(write_jsonl(tmp_path / "mixed.jsonl", mixed))))
