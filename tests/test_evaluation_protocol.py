"""The ``model`` protocol reproduces plain mteb; ``uniform`` is the paper's recipe, labelled as such.

Local copies of two registered tasks that define prompts (Banking77Classification: a task
prompt; SciFact: a query prompt) are evaluated with a tiny SentenceTransformer that has saved
prompts and one that has none. The default command must give exactly what ``mteb.evaluate`` gives
with mteb's own ``SentenceTransformerEncoderWrapper`` on the same data and task class.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_models import build_tiny_model
from typer.testing import CliRunner

from neobert_embed.cli import app
from neobert_embed.errors import UserInputError
from neobert_embed.evaluation import EvaluationRecipe, run_mteb, write_summary

ANIMALS = ("cat", "dog", "horse", "bird", "fish", "cow")
COLORS = ("red", "blue", "green", "black")
SAVED_PROMPTS = {"query": "query: ", "document": "passage: ",
                 "Banking77Classification": "Classify the banking intent: "}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def labelled(offset: int) -> list[dict]:
    return [{"text": f"my {c} {a} card number {offset + i} was charged twice", "label": a}
            for i, (c, a) in enumerate((c, a) for c in COLORS * 3 for a in ANIMALS)]


CORPUS = [{"_id": f"d{i}", "title": f"study {a}", "text": f"the {c} {a} sleeps in the {c} house"}
          for i, (c, a) in enumerate((c, a) for c in COLORS for a in ANIMALS)]
QUERIES = [{"_id": f"q{i}", "text": f"does a {c} {a} sleep?"}
           for i, (c, a) in enumerate((c, a) for c in COLORS for a in ANIMALS) if i % 3 == 0]


def registered_copies(root: Path) -> Path:
    """Local copies of Banking77Classification and SciFact (task.json names the registered task)."""
    banking = root / "banking77"
    banking.mkdir(parents=True)
    (banking / "task.json").write_text(json.dumps({"mteb_task": "Banking77Classification"}))
    write_jsonl(banking / "train.jsonl", labelled(0))
    write_jsonl(banking / "test.jsonl", labelled(1000))
    scifact = root / "scifact"
    scifact.mkdir()
    (scifact / "task.json").write_text(json.dumps({"mteb_task": "SciFact"}))
    write_jsonl(scifact / "corpus.jsonl", CORPUS)
    write_jsonl(scifact / "queries.jsonl", QUERIES)
    (scifact / "qrels").mkdir()
    (scifact / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q['_id']}\td{q['_id'][1:]}\t1\n" for q in QUERIES))
    return root


def official_tasks() -> dict:
    """The registered task classes holding the same data, built with datasets directly (no toolkit code)."""
    import mteb
    from datasets import Dataset, DatasetDict

    banking = type(mteb.get_task("Banking77Classification"))()
    banking.dataset = {"default": DatasetDict({"train": Dataset.from_list(labelled(0)),
                                               "test": Dataset.from_list(labelled(1000))})}
    banking.data_loaded = True
    scifact = type(mteb.get_task("SciFact"))()
    scifact.dataset = {"default": {"test": {
        "corpus": Dataset.from_dict({"id": [d["_id"] for d in CORPUS], "title": [d["title"] for d in CORPUS],
                                     "text": [d["text"] for d in CORPUS]}),
        "queries": Dataset.from_dict({"id": [q["_id"] for q in QUERIES], "text": [q["text"] for q in QUERIES]}),
        "relevant_docs": {q["_id"]: {f"d{q['_id'][1:]}": 1} for q in QUERIES},
        "top_ranked": None}}}
    scifact.data_loaded = True
    return {"Banking77Classification": banking, "SciFact": scifact}


def direct_mteb_scores(model_dir: Path, **wrapper_kwargs) -> dict[str, float]:
    """Plain ``mteb.evaluate`` with mteb's SentenceTransformer wrapper around the saved model."""
    import mteb
    from sentence_transformers import SentenceTransformer

    wrapper = mteb.SentenceTransformerEncoderWrapper(SentenceTransformer(str(model_dir)), **wrapper_kwargs)
    scores = {}
    for name, task in official_tasks().items():
        result = mteb.evaluate(wrapper, task, cache=None, show_progress_bar=False, co2_tracker=False)
        scores[name] = float(result.task_results[0].get_score())
    return scores


@pytest.fixture(scope="module")
def sentence_models(tmp_path_factory) -> dict[str, Path]:
    """Two saved SentenceTransformers over one tiny BERT: with saved prompts (and length 24) and without."""
    from neobert_embed.sentence import load_sentence_model

    root = tmp_path_factory.mktemp("st")
    backbone = build_tiny_model("bert", root / "backbone")
    prompted = load_sentence_model(str(backbone), max_seq_length=24, prompts=SAVED_PROMPTS)
    prompted.save(str(root / "prompted"))
    plain = load_sentence_model(str(backbone), max_seq_length=64)
    plain.save(str(root / "plain"))
    return {"prompted": root / "prompted", "plain": root / "plain"}


def result_metadata(report, task: str) -> dict:
    return json.loads((Path(report.results_dir) / f"{task}.json").read_text())["neobert_embed"]


@pytest.mark.parametrize("kind", [pytest.param("prompted", marks=pytest.mark.slow), "plain"])
def test_default_protocol_equals_plain_mteb_and_uniform_differs(tmp_path, sentence_models, kind):
    model = sentence_models[kind]
    tasks = registered_copies(tmp_path / "tasks")
    result = CliRunner().invoke(app, ["mteb", "--model", str(model), "--task-dir", str(tasks),
                                      "--output", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["protocol"] == "model" and report["failures"] == {}
    assert "protocol_model" in report["results_dir"]
    direct = direct_mteb_scores(model)
    assert report["scores"] == pytest.approx(direct, abs=1e-6)
    assert "Banking77Classification.v2" in " ".join(report["notices"])  # superseded: said once, in the report

    saved = json.loads((Path(report["results_dir"]) / "SciFact.json").read_text())["neobert_embed"]
    banking = json.loads((Path(report["results_dir"]) / "Banking77Classification.json").read_text())["neobert_embed"]
    assert saved["protocol"] == "model"
    if kind == "prompted":
        assert saved["prompts"] == {"query": "query: ", "document": "passage: "}
        assert banking["prompts"] == {"text": "Classify the banking intent: "}
        assert saved["max_seq_length"] == 24
    else:
        assert saved["prompts"] == {"query": None, "document": None} and banking["prompts"] == {"text": None}
        assert saved["max_seq_length"] == 64

    uniform = run_mteb(model, task_dirs=[tasks], output=tmp_path / "out", protocol="uniform",
                       recipe=EvaluationRecipe(max_length=16), show_progress=False)
    assert uniform.protocol == "uniform" and "protocol_uniform" in uniform.results_dir
    assert uniform.scores["SciFact"] != pytest.approx(direct["SciFact"], abs=1e-6)
    assert result_metadata(uniform, "SciFact")["prompts"]["query"].startswith("Instruct: Given a scientific claim")
    assert (tmp_path / "out" / "summary.md").read_text().startswith("# MTEB summary — protocol: uniform")
    assert (tmp_path / "out" / "summary.csv").read_text().splitlines()[1].startswith("uniform,")

    rerun = CliRunner().invoke(app, ["mteb", "--model", str(model), "--task-dir", str(tasks),
                                     "--output", str(tmp_path / "out"), "--json"])
    again = json.loads(rerun.stdout)
    assert {o["status"] for o in again["outcomes"]} == {"cached"}  # uniform results never replaced these
    assert again["scores"] == pytest.approx(direct, abs=1e-6)
    assert (tmp_path / "out" / "summary.md").read_text().startswith("# MTEB summary — protocol: model")


def test_mixing_protocols_in_one_summary_is_refused(tmp_path):
    from neobert_embed.evaluation.run import EvaluationReport, TaskOutcome

    outcome = [TaskOutcome("S1", "STS", "done", "m", 0.5)]
    model = EvaluationReport("a", "a", "r1", "", "", list(outcome), protocol="model")
    uniform = EvaluationReport("b", "b", "r2", "x", "", list(outcome), protocol="uniform")
    with pytest.raises(UserInputError, match="mixing evaluation protocols"):
        write_summary([model, uniform], tmp_path)
    assert not (tmp_path / "summary.md").exists()


def test_recipe_options_need_the_uniform_protocol(tmp_path, sentence_models):
    result = CliRunner().invoke(app, ["mteb", "--model", str(sentence_models["plain"]), "--tasks", "SciFact",
                                      "--output", str(tmp_path), "--no-instructions"])
    assert result.exit_code != 0 and "--protocol uniform" in str(result.exception)
    bad = CliRunner().invoke(app, ["mteb", "--model", "x", "--output", str(tmp_path), "--protocol", "paper"])
    assert "--protocol 'paper'" in str(bad.exception)


def test_list_benchmarks_prints_every_registered_benchmark_with_task_counts():
    import mteb

    result = CliRunner().invoke(app, ["mteb", "--list-benchmarks"])
    assert result.exit_code == 0, result.output
    lines = {line.rsplit(None, 2)[0].strip(): int(line.rsplit(None, 2)[1]) for line in result.stdout.splitlines()}
    assert lines["MTEB(eng, v2)"] == 41 and lines["MTEB(eng, v1)"] == 56
    assert len(lines) == len(mteb.get_benchmarks())


@pytest.mark.slow
def test_a_train_contrastive_model_is_evaluated_with_the_instructions_it_was_trained_with(tmp_path):
    from contrastive_helpers import TINY_RECIPE, paraphrase_rows
    from contrastive_helpers import write_jsonl as write_rows

    from neobert_embed.contrastive import load_contrastive_recipe, train_contrastive

    instructions = {"query": "Represent the claim for retrieval: ", "document": "Represent the evidence: "}
    recipe = load_contrastive_recipe(TINY_RECIPE, max_steps=2, query_instruction=instructions["query"],
                                     document_instruction=instructions["document"])
    data = write_rows(tmp_path / "pairs.jsonl", paraphrase_rows(negatives=0, extra=False))
    trained = train_contrastive(model=str(build_tiny_model("bert", tmp_path / "bert")), data={"pets": str(data)},
                                output=tmp_path / "trained", recipe=recipe)
    saved = json.loads((trained / "config_sentence_transformers.json").read_text())["prompts"]
    assert {side: saved[side] for side in instructions} == instructions

    tasks = registered_copies(tmp_path / "tasks")
    report = run_mteb(trained, task_dirs=[tasks / "scifact"], output=tmp_path / "out", show_progress=False)
    direct = direct_mteb_scores(trained, model_prompts=instructions)["SciFact"]
    assert report.protocol == "model"
    assert report.scores["SciFact"] == pytest.approx(direct, abs=1e-6)
    assert result_metadata(report, "SciFact")["prompts"] == instructions
    bare = direct_mteb_scores(trained, model_prompts={"query": "", "document": ""})["SciFact"]
    assert bare != pytest.approx(direct, abs=1e-6)  # the instructions matter, so the check can fail


def test_a_model_mteb_knows_by_name_goes_through_mteb_get_model(tmp_path, sentence_models, monkeypatch):
    import mteb
    from sentence_transformers import SentenceTransformer

    name = "sentence-transformers/all-MiniLM-L6-v2"
    assert mteb.get_model_meta(name).loader is not None
    calls = []

    def fake_get_model(model_name, revision=None, device=None, **kwargs):  # the hub is offline here
        calls.append(model_name)
        return mteb.SentenceTransformerEncoderWrapper(SentenceTransformer(str(sentence_models["plain"])))

    monkeypatch.setattr(mteb, "get_model", fake_get_model)
    tasks = registered_copies(tmp_path / "tasks")
    report = run_mteb(name, task_dirs=[tasks / "scifact"], output=tmp_path / "out", show_progress=False)
    assert calls == [name] and report.failures == {}
    assert Path(report.results_dir).parts[-4] == "sentence-transformers__all-MiniLM-L6-v2"
    assert report.scores["SciFact"] == pytest.approx(direct_mteb_scores(sentence_models["plain"])["SciFact"],
                                                     abs=1e-6)


def test_benchmarks_mteb_registers_are_accepted_by_name():
    from neobert_embed.evaluation import select_tasks

    assert len(select_tasks(benchmark="MTEB(eng, v2)")) == 41
    assert len(select_tasks(benchmark="MTEB(eng, v1)")) == 56
    assert len(select_tasks()) == 41  # the default: mteb's current English benchmark
    with pytest.raises(UserInputError, match="--list-benchmarks"):
        select_tasks(benchmark="MTEB(eng, v9)")


def test_saved_prompts_are_the_instructions_every_dataset_trained_with(caplog):
    from neobert_embed.contrastive.recipe import ContrastiveRecipe, DataSource
    from neobert_embed.contrastive.train import trained_prompts

    recipe = ContrastiveRecipe(query_instruction="recipe q: ")
    same = {"a": DataSource(path="a.jsonl", query_instruction="q: "),
            "b": DataSource(path="b.jsonl", query_instruction="q: ", document_instruction="")}
    assert trained_prompts(same, recipe) == {"query": "q: ", "document": ""}
    mixed = {"a": DataSource(path="a.jsonl", query_instruction="q: "), "b": DataSource(path="b.jsonl")}
    assert trained_prompts(mixed, recipe) == {"query": "recipe q: ", "document": ""}
    assert "different query instructions" in caplog.text
