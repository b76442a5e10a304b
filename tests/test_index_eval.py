"""`index eval` through an exact index equals mteb's own retrieval evaluation of the same model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from neobert_embed.cli import app
from neobert_embed.index import build_index, evaluate_index

ANIMALS = ("cat", "dog", "horse", "parrot", "goat", "rabbit", "tiger", "whale")
FOODS = ("fish", "bones", "hay", "seeds", "grass", "carrots", "meat", "plankton")
PLACES = ("kitchen", "garden", "barn", "cage", "field", "hutch", "jungle", "ocean")
REPORTED = ("ndcg_at_10", "recall_at_10", "recall_at_100", "mrr_at_10", "map_at_10", "precision_at_10",
            "ndcg_at_1", "recall_at_1000")


def _write_task(directory: Path) -> Path:
    """A small BEIR task: each animal has relevant documents; distractors mention other animals."""
    (directory / "qrels").mkdir(parents=True)
    corpus, qrels = [], ["query-id\tcorpus-id\tscore"]
    for a, animal in enumerate(ANIMALS):
        for j in range(4):
            doc_id = f"d{a}-{j}"
            corpus.append({"_id": doc_id, "title": f"The {animal}" if j % 2 else "",
                           "text": f"The {animal} eats {FOODS[(a + j) % 8]} in the {PLACES[(a + 2 * j) % 8]}."})
            qrels.append(f"q{a}\t{doc_id}\t{2 if j == 0 else 1}")
    queries = [{"_id": f"q{a}", "text": f"What does a {animal} like to eat?"} for a, animal in enumerate(ANIMALS)]
    queries.append({"_id": "unjudged", "text": "a query without judgements is not scored"})
    for name, rows in (("corpus.jsonl", corpus), ("queries.jsonl", queries)):
        (directory / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (directory / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n", encoding="utf-8")
    return directory


def _mteb_scores(model_path: Path, task_dir: Path) -> dict:
    import mteb
    from datasets import Dataset
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.task_metadata import TaskMetadata
    from sentence_transformers import SentenceTransformer

    from neobert_embed.beir import read_beir_task

    task_data = read_beir_task(task_dir)

    class LocalRetrieval(AbsTaskRetrieval):
        metadata = TaskMetadata(
            name="LocalAnimalRetrieval", description="Animals and their food.", reference=None,
            dataset={"path": str(task_dir), "revision": "local"}, type="Retrieval", category="t2t",
            modalities=["text"], eval_splits=["test"], eval_langs=["eng-Latn"], main_score="ndcg_at_10",
            date=None, domains=None, task_subtypes=None, license=None, annotations_creators=None,
            dialect=None, sample_creation=None, bibtex_citation=None)

        def load_data(self, num_proc=None, **kwargs) -> None:
            self.dataset = {"default": {"test": {
                "corpus": Dataset.from_list([{"id": k, **v} for k, v in task_data.corpus.items()]),
                "queries": Dataset.from_list([{"id": k, "text": v} for k, v in task_data.queries.items()]),
                "relevant_docs": task_data.qrels, "top_ranked": None}}}
            self.data_loaded = True

    model = SentenceTransformer(str(model_path), device="cpu")
    result = mteb.evaluate(model, tasks=[LocalRetrieval()], cache=None, show_progress_bar=False)
    return result.task_results[0].scores["test"][0]


def test_index_eval_equals_mteb_retrieval_evaluation(minilm_path, tmp_path):
    task_dir = _write_task(tmp_path / "task")
    index_dir = tmp_path / "index"
    build_index(minilm_path, task_dir / "corpus.jsonl", index_dir, title_field="title", index_type="flat",
                show_progress=False)
    ours = evaluate_index(index_dir, task_dir)
    reference = _mteb_scores(minilm_path, task_dir)
    assert ours["queries"] == 8
    assert (ours["split"], ours["index_type"], ours["search_params"], ours["store_precision"]) == \
        ("test", "flat", {}, "float32"), "how the figures were obtained"
    assert 0.2 < reference["ndcg_at_10"] < 1.0, "the task must not be trivial for the comparison to mean much"
    for key in REPORTED:
        assert ours[key] == pytest.approx(reference[key], abs=1e-6), key

    result = CliRunner().invoke(app, ["index", "eval", str(index_dir), "--task-dir", str(task_dir), "--json"])
    assert result.exit_code == 0, result.output
    assert "split test: 8 judged queries" in " ".join(result.stderr.split()), result.stderr
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert last["ndcg_at_10"] == pytest.approx(reference["ndcg_at_10"], abs=1e-6)
    assert last["recall_at_10"] == pytest.approx(reference["recall_at_10"], abs=1e-6)


def test_index_eval_reports_task_errors_with_file(minilm_path, tmp_path):
    from neobert_embed.errors import UserInputError

    task_dir = _write_task(tmp_path / "task")
    build_index(minilm_path, task_dir / "corpus.jsonl", tmp_path / "index", show_progress=False)
    (task_dir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\n", encoding="utf-8")
    with pytest.raises(UserInputError, match=r"test\.tsv:2: expected 3 tab-separated fields"):
        evaluate_index(tmp_path / "index", task_dir)
