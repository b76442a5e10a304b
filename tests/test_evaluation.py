"""Uniform MTEB evaluation: local tasks of every type, mteb_task copies, resume, failures, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_models import build_tiny_model
from typer.testing import CliRunner

from neobert_embed.cli import app
from neobert_embed.errors import UserInputError
from neobert_embed.evaluation import EvaluationRecipe, load_task_dir, load_task_dirs, run_mteb, write_summary
from neobert_embed.evaluation.local_tasks import check_task_data
from neobert_embed.runs import Interrupted

ANIMALS = ("cat", "dog", "horse", "bird", "fish", "cow")
COLORS = ("red", "blue", "green", "black")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def make_task(root: Path, name: str, spec: dict, files: dict[str, list[dict] | str]) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "task.json").write_text(json.dumps(spec), encoding="utf-8")
    for relative, content in files.items():
        path = directory / relative
        if isinstance(content, str):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
        else:
            write_jsonl(path, content)
    return directory


def sts_rows() -> list[dict]:
    return [{"sentence1": f"the {c} {a}", "sentence2": f"a {c} {b}", "score": 5.0 if a == b else (i % 5)}
            for i, (c, a, b) in enumerate((c, a, b) for c in COLORS for a in ANIMALS for b in ANIMALS[:2])]


def labelled_texts(start: int = 0) -> list[dict]:
    return [{"text": f"the {c} {a} number {start + i}", "label": a}
            for i, (c, a) in enumerate((c, a) for c in COLORS for a in ANIMALS)]


def beir_files(reranking: bool = False) -> dict:
    """Queries equal to their relevant document's text: a perfect ranking for any encoder."""
    corpus = [{"_id": f"d{i}", "title": "", "text": f"the {c} {a} sleeps"} for i, (c, a) in
              enumerate((c, a) for c in COLORS for a in ANIMALS)]
    queries = [{"_id": f"q{i}", "text": corpus[i]["text"]} for i in range(0, len(corpus), 3)]
    qrels = "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(0, len(corpus), 3))
    files = {"corpus.jsonl": corpus, "queries.jsonl": queries, "qrels/test.tsv": qrels}
    if reranking:
        files["candidates.jsonl"] = [{"query-id": q["_id"], "candidates": [f"d{int(q['_id'][1:])}", "d1", "d2"]}
                                     for q in queries]
    return files


def all_task_types(root: Path) -> Path:
    tasks = root / "tasks"
    make_task(tasks, "sts", {"name": "LocalSTS", "type": "STS", "min_score": 0, "max_score": 5},
              {"test.jsonl": sts_rows()})
    make_task(tasks, "pairs", {"name": "LocalPairs", "type": "PairClassification"},
              {"test.jsonl": [{**row, "label": int(row["score"] == 5.0)} for row in sts_rows()]})
    make_task(tasks, "classes", {"name": "LocalClasses", "type": "Classification"},
              {"train.jsonl": labelled_texts(), "test.jsonl": labelled_texts(100)})
    make_task(tasks, "clusters", {"name": "LocalClusters", "type": "Clustering"}, {"test.jsonl": labelled_texts()})
    make_task(tasks, "retrieval", {"name": "LocalRetrieval", "type": "Retrieval"}, beir_files())
    make_task(tasks, "instructed", {"name": "LocalInstructed", "type": "Retrieval",
                                    "instruction": "Given a description, find the same description"},
              beir_files())
    make_task(tasks, "rerank", {"name": "LocalRerank", "type": "Reranking"}, beir_files(reranking=True))
    return tasks


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    return build_tiny_model("bert", tmp_path_factory.mktemp("models") / "tiny-bert")


TINY_RECIPE = EvaluationRecipe(max_length=32, batch_size=16)
UNIFORM = {"recipe": TINY_RECIPE, "protocol": "uniform"}


def test_every_local_task_type_is_scored_by_mteb(tmp_path, tiny_bert):
    tasks = all_task_types(tmp_path)
    report = run_mteb(tiny_bert, task_dirs=[tasks], output=tmp_path / "out", **UNIFORM,
                      show_progress=False)
    assert report.failures == {}
    assert {o.task: o.main_score for o in report.outcomes} == {
        "LocalSTS": "cosine_spearman", "LocalPairs": "max_ap", "LocalClasses": "accuracy",
        "LocalClusters": "v_measure", "LocalRetrieval": "ndcg_at_10", "LocalRerank": "map_at_1000",
        "LocalInstructed": "ndcg_at_10"}
    # each query is the exact text of its only relevant document: mteb's metrics must be perfect
    assert report.scores["LocalRetrieval"] == pytest.approx(1.0)
    assert report.scores["LocalRerank"] == pytest.approx(1.0)
    # the task's instruction is prefixed to queries only, so they no longer equal their documents
    assert report.scores["LocalInstructed"] < 0.99
    assert all(-1.0 <= s <= 1.0 for s in report.scores.values())  # NaN fails too
    results = Path(report.results_dir)
    assert results.parts[-4:-2] == ("tiny-bert", report.revision)
    saved = json.loads((results / "LocalSTS.json").read_text())
    assert saved["task_name"] == "LocalSTS" and saved["dataset_revision"].startswith("local-")
    table = (tmp_path / "out" / "summary.md").read_text()
    assert "| Model | Class. | Clust. | PairClass. | Rerank. | Retr. | STS | Summ. | Avg. |" in table
    assert "*" not in table.split("## Per task")[0].split("|---|")[-1]  # complete: no incomplete mark
    assert "| LocalSTS | STS | cosine_spearman on test |" in table, "each score says its metric and split"

    rerun = run_mteb(tiny_bert, task_dirs=[tasks], output=tmp_path / "out", **UNIFORM,
                     show_progress=False)
    assert {o.status for o in rerun.outcomes} == {"cached"}
    assert rerun.scores == pytest.approx(report.scores, abs=1e-6)

    other = build_tiny_model("bert", tmp_path / "elsewhere" / "tiny-bert", seed=1)
    second = run_mteb(other, task_dirs=[tasks / "sts"], output=tmp_path / "out", **UNIFORM,
                      show_progress=False)
    assert second.name == report.name and second.revision != report.revision
    assert (results / "LocalSTS.json").is_file() and (Path(second.results_dir) / "LocalSTS.json").is_file()


def test_recipe_instructions_come_from_the_task():
    import mteb
    from mteb.types import PromptType

    recipe = EvaluationRecipe()
    scifact = mteb.get_task("SciFact").metadata
    assert recipe.instruction(scifact, PromptType.query) == (
        "Instruct: Given a scientific claim, retrieve documents that support or refute the claim\nQuery: ")
    assert recipe.instruction(scifact, PromptType.document) == ""
    assert recipe.instruction(mteb.get_task("STSBenchmark").metadata, None) == ""
    assert EvaluationRecipe(instructions="none").instruction(scifact, PromptType.query) == ""
    custom = EvaluationRecipe(overrides={"STSBenchmark": {"query": "Find similar text"}})
    assert custom.instruction(mteb.get_task("STSBenchmark").metadata, None) == (
        "Instruct: Find similar text\nQuery: ")
    assert custom.fingerprint() != recipe.fingerprint()
    assert EvaluationRecipe(batch_size=8).fingerprint() == recipe.fingerprint()


def test_mteb_task_directory_matches_the_registered_task_class(tmp_path, tiny_bert):
    import mteb
    from datasets import Dataset, DatasetDict

    from neobert_embed.evaluation.encoder import UniformEncoder, model_identity

    rows = sts_rows()
    copy = make_task(tmp_path, "stsb", {"mteb_task": "STSBenchmark"}, {"test.jsonl": rows})
    local = load_task_dir(copy)
    official_class = type(mteb.get_task("STSBenchmark"))
    assert isinstance(local, official_class)
    assert local.metadata.name == "STSBenchmark" and local.metadata.main_score == "cosine_spearman"

    report = run_mteb(tiny_bert, task_dirs=[copy], output=tmp_path / "out", **UNIFORM,
                      show_progress=False)
    official = official_class()
    official.dataset = {"default": DatasetDict({"test": Dataset.from_list(
        [{"sentence1": r["sentence1"], "sentence2": r["sentence2"], "score": r["score"]} for r in rows])})}
    official.data_loaded = True
    encoder = UniformEncoder.load(model_identity(tiny_bert), TINY_RECIPE)
    direct = mteb.evaluate(encoder, official, cache=None, show_progress_bar=False)
    assert report.scores["STSBenchmark"] == pytest.approx(direct.task_results[0].get_score(), abs=1e-6)
    saved = json.loads((Path(report.results_dir) / "STSBenchmark.json").read_text())
    assert saved["task_name"] == "STSBenchmark"


@pytest.mark.parametrize(("spec", "files", "culprit", "words"), [
    ({"name": "X", "type": "Regression"}, {}, "task.json", "type"),
    ({"name": "X", "type": "STS", "colour": 1}, {}, "task.json", "colour"),
    ({"name": "X", "type": "Classification", "min_score": 0}, {}, "task.json", "min_score"),
    ({"mteb_task": "NoSuchTask"}, {}, "task.json", "NoSuchTask"),
    ({"name": "X", "type": "STS"}, {}, "test.jsonl", "not found"),
    ({"name": "X", "type": "STS"}, {"test.jsonl": ""}, "test.jsonl", "empty"),
    ({"name": "X", "type": "STS"}, {"test.jsonl": [{"sentence1": "a", "score": 1}]}, "test.jsonl:1", "sentence2"),
    ({"name": "X", "type": "Classification"}, {"test.jsonl": labelled_texts()}, "train.jsonl", "not found"),
    ({"name": "X", "type": "Retrieval"}, {**beir_files(), "qrels/test.tsv": "q\td\ts\nq0\tnope\t1\n"},
     "qrels/test.tsv", "nope"),
    ({"name": "X", "type": "Retrieval"}, {**beir_files(), "corpus.jsonl": [{"_id": "d0", "text": "a"},
                                                                            {"_id": "d0", "text": "b"}]},
     "corpus.jsonl:2", "duplicate"),
    ({"name": "X", "type": "Reranking"}, {**beir_files(), "candidates.jsonl": [{"query-id": "q0",
                                                                                "candidates": ["zz"]}]},
     "candidates.jsonl:1", "zz"),
])
def test_bad_task_input_names_the_file(tmp_path, spec, files, culprit, words):
    directory = make_task(tmp_path, "bad", spec, files)
    with pytest.raises(UserInputError) as caught:
        check_task_data(load_task_dir(directory))
    message = str(caught.value)
    assert str(directory / culprit) in message and words in message


def test_cli_reports_failures_continues_and_marks_incomplete(tmp_path, tiny_bert):
    tasks = tmp_path / "tasks"
    make_task(tasks, "good", {"name": "GoodSTS", "type": "STS"}, {"test.jsonl": sts_rows()})
    make_task(tasks, "broken", {"name": "BrokenSTS", "type": "STS"}, {"test.jsonl": "{not json\n"})
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["mteb", "--model", str(tiny_bert), "--task-dir", str(tasks), "--output",
                                      str(out), "--protocol", "uniform", "--max-length", "32", "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    assert set(report["scores"]) == {"GoodSTS"}
    assert "broken/test.jsonl:1" in report["failures"]["BrokenSTS"]
    assert "BrokenSTS" in result.stderr
    table = (out / "summary.md").read_text()
    assert "* (1/2)" in table and "BrokenSTS | STS | cosine_spearman on test | missing" in table
    row = (out / "summary.csv").read_text().splitlines()[1]
    assert ",false,BrokenSTS," in row


def test_offline_hub_task_fails_at_once_pointing_to_task_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = CliRunner().invoke(app, ["mteb", "--model", "bert", "--tasks", "STSBenchmark", "--output",
                                      str(tmp_path)])
    assert result.exit_code == 1
    assert "STSBenchmark" in result.stderr and "--task-dir" in result.stderr



def test_a_hub_task_whose_revision_starts_with_local_is_still_a_hub_task(tmp_path, monkeypatch):
    """Local means built from a directory (``LocalTask``), not a revision that looks like ours."""
    import mteb

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    real_get_tasks = mteb.get_tasks

    def local_looking(*args, **kwargs):
        tasks = list(real_get_tasks(*args, **kwargs))
        for task in tasks:
            task.metadata = task.metadata.model_copy(
                update={"dataset": {**task.metadata.dataset, "revision": "local-0123456789ab"}})
        return tasks

    monkeypatch.setattr(mteb, "get_tasks", local_looking)
    report = run_mteb("bert", tasks=["STSBenchmark"], output=tmp_path, show_progress=False, summary=False)
    assert "HF_HUB_OFFLINE" in report.failures["STSBenchmark"]
    assert "--task-dir" in report.failures["STSBenchmark"]

def test_interrupt_keeps_finished_tasks_and_rerun_resumes(tmp_path, tiny_bert, monkeypatch):
    import mteb

    tasks = tmp_path / "tasks"
    make_task(tasks, "a", {"name": "FirstSTS", "type": "STS"}, {"test.jsonl": sts_rows()})
    make_task(tasks, "b", {"name": "SecondSTS", "type": "STS"}, {"test.jsonl": sts_rows()[:12]})
    real_evaluate = mteb.evaluate

    def interrupted(model, task, **kwargs):
        if task.metadata.name == "SecondSTS":
            raise KeyboardInterrupt
        return real_evaluate(model, task, **kwargs)

    monkeypatch.setattr(mteb, "evaluate", interrupted)
    with pytest.raises(Interrupted, match="1 of 2 tasks are finished") as stopped:
        run_mteb(tiny_bert, task_dirs=[tasks], output=tmp_path / "out", **UNIFORM, show_progress=False)
    assert stopped.value.resume_args == ()  # resumed by rerunning the same command
    monkeypatch.setattr(mteb, "evaluate", real_evaluate)
    assert "FirstSTS" in (tmp_path / "out" / "summary.md").read_text()
    resumed = run_mteb(tiny_bert, task_dirs=[tasks], output=tmp_path / "out", **UNIFORM,
                       show_progress=False)
    assert [(o.task, o.status) for o in resumed.outcomes] == [("FirstSTS", "cached"), ("SecondSTS", "done")]


@pytest.mark.parametrize("damage", ['{"task_name": "FirstSTS", "scores": {"te', "[]", '{"task_name": "FirstSTS"}',
                                    "neobert_embed"], ids=["cut short", "not an object", "missing keys",
                                                           "our key of the wrong shape"])
def test_a_damaged_result_of_a_finished_task_is_a_located_error(tmp_path, tiny_bert, damage, capsys):
    from safety_helpers import run_main

    tasks = tmp_path / "tasks"
    make_task(tasks, "a", {"name": "FirstSTS", "type": "STS"}, {"test.jsonl": sts_rows()[:12]})
    report = run_mteb(tiny_bert, task_dirs=[tasks], output=tmp_path / "out", show_progress=False)
    result = Path(report.outcomes[0].result_file)
    if damage == "neobert_embed":  # mteb's part intact, the settings this toolkit adds are a string
        damage = json.dumps({**json.loads(result.read_text(encoding="utf-8")), "neobert_embed": "fp32"})
    result.write_text(damage, encoding="utf-8")
    code, _, err = run_main(["mteb", "--model", tiny_bert, "--task-dir", tasks, "--output", tmp_path / "out"],
                            capsys)
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert str(result) in err and "delete it to evaluate FirstSTS again" in err
    assert ("key 'neobert_embed'" if "neobert_embed" in damage else "damaged mteb result") in err
    assert result.read_text(encoding="utf-8") == damage  # left for the user to look at


def test_summary_never_averages_silently_over_fewer_tasks(tmp_path):
    from neobert_embed.evaluation.run import EvaluationReport, TaskOutcome

    full = EvaluationReport("a", "a", "r1", "x", "", [TaskOutcome("S1", "STS", "done", "m", 0.5),
                                                      TaskOutcome("S2", "STS", "done", "m", 0.7)])
    partial = EvaluationReport("b", "b", "r2", "x", "", [TaskOutcome("S1", "STS", "done", "m", 0.9),
                                                         TaskOutcome("S2", "STS", "failed", "m", error="x")])
    md, csv_path = write_summary([full, partial], tmp_path)
    lines = md.read_text().splitlines()
    assert "| a | — | — | — | — | — | 60.00 | — | 60.00 |" in lines
    assert "| b | — | — | — | — | — | 90.00* (1/2) | — | 90.00* (1/2) |" in lines
    assert "- b: S2" in lines
    rows = csv_path.read_text().splitlines()
    assert rows[1].startswith("model,a,r1,,,,,,60.0000,,60.0000,2,2,true,")
    assert rows[2].startswith("model,b,r2,,,,,,90.0000,,90.0000,1,2,false,S2,")


def test_task_selection_and_recipe_errors(tmp_path):
    from neobert_embed.evaluation import select_tasks
    from neobert_embed.evaluation.recipe import load_evaluation_recipe

    copy = make_task(tmp_path / "copies", "stsb", {"mteb_task": "STSBenchmark"}, {"test.jsonl": sts_rows()})
    chosen = select_tasks(benchmark="MTEB(eng, v1)", task_types=["STS"], task_dirs=[copy.parent])
    names = [t.metadata.name for t in chosen]
    assert "STS12" in names and "SciFact" not in names
    assert chosen[names.index("STSBenchmark")].metadata.dataset["revision"].startswith("local-")
    with pytest.raises(UserInputError, match="Regression"):
        select_tasks(task_types=["Regression"])
    with pytest.raises(UserInputError, match="NoSuchTask"):
        select_tasks(tasks=["NoSuchTask"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_length: 512\nnormalise: true\n")
    with pytest.raises(UserInputError, match=r"bad\.yaml.*normalise"):
        load_evaluation_recipe(bad)
    assert load_evaluation_recipe(None, max_length=256).max_length == 256
    with pytest.raises(UserInputError, match="precision"):
        load_evaluation_recipe(None, precision="fp8")
    with pytest.raises(UserInputError, match="not in benchmark"):
        select_tasks(benchmark="MTEB(eng, v1)", tasks=["STSBenchmark", "TRECCoarse"])
    with pytest.raises(UserInputError, match="no-such-model"):
        run_mteb("org/no-such-model", task_dirs=[copy], output=tmp_path / "out", show_progress=False)
    assert [t.metadata.name for t in load_task_dirs([copy])] == ["STSBenchmark"]


def test_mteb_task_copy_of_a_multilingual_task_takes_its_english_subset(tmp_path):
    copy = make_task(tmp_path, "sts17", {"mteb_task": "STS17"}, {"test.jsonl": sts_rows()})
    task = load_task_dir(copy)
    assert task.hf_subsets == ["en-en"] and list(task.eval_splits) == ["test"]
    check_task_data(task)
    assert task.dataset["en-en"]["test"].num_rows == len(sts_rows())
    other = make_task(tmp_path, "sts17-de", {"mteb_task": "STS17", "hf_subset": "zz-zz"}, {"test.jsonl": sts_rows()})
    with pytest.raises(UserInputError, match="hf_subset"):
        load_task_dir(other)


def test_default_evaluation_recipe_is_found_where_a_wheel_installs_it(tmp_path, monkeypatch):
    """An installed copy reads recipes/mteb-eval.yaml from <prefix>/share, not the class defaults."""
    import neobert_embed.paths as paths
    from neobert_embed.evaluation.recipe import load_evaluation_recipe

    share = tmp_path / "share" / "neobert-embed" / "recipes"
    share.mkdir(parents=True)
    (share / "mteb-eval.yaml").write_text("max_length: 77\n")
    monkeypatch.setattr(paths, "RECIPE_DIRS", (tmp_path / "no-checkout", share))
    assert load_evaluation_recipe(None).max_length == 77
    monkeypatch.setattr(paths, "RECIPE_DIRS", (tmp_path / "no-checkout",))
    with pytest.raises(UserInputError, match="bundled recipe 'mteb-eval.yaml' not found"):
        load_evaluation_recipe(None)
