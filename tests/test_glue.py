"""neobert-embed glue on tiny random models: grid, ordering, resume, metrics, architectures, bad input."""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from contrastive_helpers import one_torch_thread
from glue_helpers import TINY_GRID, tiny_task_dir, write_jsonl
from tiny_models import build_tiny_model
from typer.testing import CliRunner

from neobert_embed.cli import app
from neobert_embed.errors import UserInputError
from neobert_embed.glue import trial as trial_module
from neobert_embed.glue.presets import expand_trials, load_glue_preset
from neobert_embed.glue.run import run_glue
from neobert_embed.glue.tasks import TASKS, compute_metrics
from neobert_embed.glue.trial import eval_every
from neobert_embed.runs import Interrupted

runner = CliRunner()
_one_thread = pytest.fixture(autouse=True)(one_torch_thread)



@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue-models")
    return {arch: build_tiny_model(arch, root / arch) for arch in ("bert", "roberta", "modernbert", "neobert")}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue-tasks")
    return {task: tiny_task_dir(root, task, test=10 if task == "rte" else 0) for task in ("rte", "mnli", "stsb")}


def _grid(tmp_path: Path, text: str = TINY_GRID) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# ---- presets -------------------------------------------------------------------------------

def test_paper_grid_expands_to_60_trials_per_task_with_mnli_first():
    preset = load_glue_preset("paper")
    assert (preset.epochs, preset.early_stopping_patience, preset.warmup_ratio, preset.lr_scheduler) == \
        (10, 15, 0.06, "linear")
    order = ["rte", "cola", "mrpc", "stsb", "mnli", "qnli", "sst2", "qqp"]
    trials = expand_trials(preset, order)
    assert len(trials) == 8 * 60
    expected = set(itertools.product([2, 4, 8, 16, 32], [5e-6, 6e-6, 8e-6, 1e-5, 2e-5, 3e-5], [1e-2, 1e-5]))
    for task in order:
        mine = [t for t in trials if t.task == task]
        assert {(t.batch_size, t.learning_rate, t.weight_decay) for t in mine} == expected
        assert len({t.key for t in mine}) == 60
    positions = {task: [i for i, t in enumerate(trials) if t.task == task] for task in order}
    for target in ("rte", "mrpc", "stsb", "qnli"):
        assert min(positions[target]) > max(positions["mnli"]), f"{target} must run after every MNLI trial"
        assert {t.transfer_from for t in trials if t.task == target} == {"mnli"}
    for plain in ("cola", "sst2", "qqp", "mnli"):
        assert {t.transfer_from for t in trials if t.task == plain} == {None}
    # without MNLI in this run (and none finished before), RTE starts from the backbone
    assert {t.transfer_from for t in expand_trials(preset, ["rte"])} == {None}
    assert {t.transfer_from for t in expand_trials(preset, ["rte"], available={"mnli"})} == {"mnli"}


def test_paper_evaluation_interval_follows_the_official_rule():
    paper = load_glue_preset("paper")
    assert eval_every(paper, train_rows=2490, batch_size=32) == 78      # once per epoch (78 steps)
    assert eval_every(paper, train_rows=2490, batch_size=2) == 249      # train rows // 10
    assert eval_every(paper, train_rows=392_702, batch_size=8) == 1000  # eval_steps
    assert eval_every(load_glue_preset("quick"), train_rows=100, batch_size=32) == 4


# ---- metrics -------------------------------------------------------------------------------

# Expected values are worked out by hand (small cases) or by the textbook formulas written out in
# numpy (random cases), never by the library calls the code makes.

def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks; tied values share the mean of the ranks they span (Spearman's definition)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    for value in np.unique(x):
        ranks[x == value] = ranks[x == value].mean()
    return ranks


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))


def _binary_counts(pred: np.ndarray, gold: np.ndarray) -> tuple[int, int, int, int]:
    """(TP, FP, FN, TN) with label 1 the positive class (MRPC's "equivalent", QQP's "duplicate")."""
    return (int(((pred == 1) & (gold == 1)).sum()), int(((pred == 1) & (gold == 0)).sum()),
            int(((pred == 0) & (gold == 1)).sum()), int(((pred == 0) & (gold == 0)).sum()))


def test_metrics_of_small_cases_worked_out_by_hand():
    # 10 pairs: TP 4 (rows 0-3), FP 1 (row 4), FN 2 (rows 5-6), TN 3 (rows 7-9)
    pred, gold = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 1, 1, 0, 0, 0]
    mrpc = compute_metrics("mrpc", pred, gold)
    assert mrpc == pytest.approx({"accuracy": 7 / 10, "f1": 2 * 4 / (2 * 4 + 1 + 2)}, abs=1e-12)  # F1 8/11
    assert compute_metrics("qqp", pred, gold) == pytest.approx({"f1": 8 / 11, "accuracy": 0.7}, abs=1e-12)
    # MCC = (TP·TN - FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (12 - 2) / sqrt(5·6·4·5)
    assert compute_metrics("cola", pred, gold) == pytest.approx({"matthews": 10 / np.sqrt(600)}, abs=1e-12)
    assert compute_metrics("cola", [1, 1, 1, 1], [1, 0, 1, 0]) == {"matthews": 0.0}  # one class predicted: 0
    assert compute_metrics("rte", pred, gold) == pytest.approx({"accuracy": 0.7}, abs=1e-12)
    three = compute_metrics("mnli", [0, 1, 2, 2, 1, 0], [0, 1, 2, 1, 1, 2], prefix="mismatched_")
    assert three == pytest.approx({"mismatched_accuracy": 4 / 6}, abs=1e-12)
    # STS-B: Pearson of (1..5) and (2, 4, 5, 4, 5) = 6 / sqrt(10 · 6); Spearman with the tied gold
    # scores at average ranks (1, 2.5, 4.5, 2.5, 4.5): 7 / sqrt(10 · 9)
    stsb = compute_metrics("stsb", [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 4.0, 5.0, 4.0, 5.0])
    assert stsb == pytest.approx({"pearson": 6 / np.sqrt(60), "spearman": 7 / np.sqrt(90)}, abs=1e-12)


@pytest.mark.parametrize("task", list(TASKS))
def test_each_task_metric_matches_its_formula_written_out(task):
    rng = np.random.default_rng(7)
    spec = TASKS[task]
    if spec.is_regression:  # gold on STS-B's 0.2 grid (ties, as in the real data), noisy predictions
        gold = np.round(rng.uniform(0, 5, 50) * 5) / 5
        pred = np.round(gold + rng.normal(0, 1.5, 50), 1)
        expected = {"pearson": _pearson(pred, gold), "spearman": _pearson(_average_ranks(pred), _average_ranks(gold))}
    else:
        gold = rng.integers(0, spec.num_labels, 50)
        pred = np.where(rng.random(50) < 0.7, gold, rng.integers(0, spec.num_labels, 50))
        expected = {"accuracy": float(np.mean(pred == gold))}
        tp, fp, fn, tn = _binary_counts(pred, gold)
        if task == "cola":
            expected = {"matthews": (tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))}
        if task in ("mrpc", "qqp"):
            expected["f1"] = 2 * tp / (2 * tp + fp + fn)
    prefix = "matched_" if task == "mnli" else ""
    got = compute_metrics(task, pred.tolist(), gold.tolist(), prefix=prefix)
    assert got == pytest.approx({prefix + k: v for k, v in expected.items()}, abs=1e-12)
    assert set(got) <= set(spec.metrics) | {"matched_accuracy"}
    assert spec.selection_metric in got or task == "mnli"


# ---- runs on tiny models -------------------------------------------------------------------

def test_bert_roberta_modernbert_neobert_each_run_one_trial(tmp_path, models):
    # the test split repeats the validation rows (unlabelled), so the reported validation accuracy can be
    # recomputed by hand from the submitted predictions of the same model
    rte = tiny_task_dir(tmp_path / "tasks", "rte")
    validation = [json.loads(line) for line in (rte / "validation.jsonl").read_text().splitlines()]
    write_jsonl(rte / "test.jsonl", [{"sentence1": r["sentence1"], "sentence2": r["sentence2"], "idx": i}
                                     for i, r in enumerate(validation)])
    gold = np.array([r["label"] for r in validation])
    out = tmp_path / "out"
    args = ["glue", "--task-dir", str(rte), "--output", str(out), "--preset", "quick",
            "--epochs", "1", "--max-length", "32", "--predict-test", "--json"]
    for path in models.values():
        args += ["--model", str(path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["models"]) == set(models) and report["trials"] == {"run": 4, "skipped": 0}
    assert report["scores"] == report["models"]["bert"]
    for arch in models:
        accuracy = report["models"][arch]["rte"]["accuracy"]
        trial = json.loads(next((out / "trials" / arch / "rte").glob("*.json")).read_text())
        assert trial["scores"]["accuracy"] == accuracy and trial["steps"] == 2  # 48 rows, batches of 32, 1 epoch
        assert trial["max_length"] == 32 and trial["history"]
        tsv = (out / "submission" / arch / "RTE.tsv").read_text().splitlines()
        assert tsv[0] == "index\tprediction" and len(tsv) == 1 + len(validation)
        predicted = dict(line.split("\t") for line in tsv[1:])
        ids = np.array([TASKS["rte"].labels.index(predicted[str(i)]) for i in range(len(validation))])
        assert accuracy == pytest.approx(float(np.mean(ids == gold)), abs=1e-12), arch
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["model"] for r in rows] == list(models)
    assert all(float(r["RTE"]) == pytest.approx(100 * report["models"][r["model"]]["rte"]["accuracy"], abs=1e-3)
               for r in rows)
    summary = (out / "summary.md").read_text()
    assert "| RTE | Avg. |" in summary
    assert "nothing was selected on validation" in summary and "optimistic" not in summary  # quick: one config
    assert (out / "glue.png").read_bytes()[:4] == b"\x89PNG"
    assert not (out / ".work").exists()


def test_mnli_runs_first_and_rte_starts_from_its_best_model(tmp_path, models, tasks):
    out = tmp_path / "out"
    result = run_glue([str(models["bert"])], out, task_dirs=[tasks["rte"], tasks["mnli"]], preset=_grid(tmp_path),
                      progress=False)
    mnli = [json.loads(p.read_text()) for p in (out / "trials" / "bert" / "mnli").glob("*.json")]
    rte = [json.loads(p.read_text()) for p in (out / "trials" / "bert" / "rte").glob("*.json")]
    assert len(mnli) == 2 and len(rte) == 2
    best = json.loads((out / "models" / "bert" / "mnli" / "best.json").read_text())
    assert best["scores"]["matched_accuracy"] == max(t["scores"]["matched_accuracy"] for t in mnli)
    assert all(t["start_from"] == str(out / "models" / "bert" / "mnli") for t in rte)
    assert all(t["key"].endswith("-from-mnli-seed0") for t in rte)
    assert all(t["start_from"] is None for t in mnli)
    assert set(result.scores["bert"]["mnli"]) == {"matched_accuracy", "mismatched_accuracy"}
    config = json.loads((out / "models" / "bert" / "mnli" / "config.json").read_text())
    assert config["num_labels"] == 3 if "num_labels" in config else len(config["id2label"]) == 3


def test_interrupted_grid_resumes_and_runs_only_missing_trials(tmp_path, models, tasks, monkeypatch):
    real = trial_module.run_trial
    calls = []

    def interrupted_on_third(*args, **kwargs):
        calls.append(args[2].key)
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C during the third trial
        return real(*args, **kwargs)

    grid = _grid(tmp_path, TINY_GRID.replace("seeds: [0]", "seeds: [0, 1]").replace("transfer: {rte: mnli}",
                                                                                     "transfer: {}"))
    out = tmp_path / "out"
    monkeypatch.setattr(trial_module, "run_trial", interrupted_on_third)
    with pytest.raises(Interrupted, match="2 of 4 trials are finished"):
        run_glue([str(models["neobert"])], out, task_dirs=[tasks["stsb"]], preset=grid, progress=False)
    finished = sorted(p.stem for p in (out / "trials" / "neobert" / "stsb").glob("*.json"))
    assert finished == sorted(calls[:2])

    calls.clear()
    result = run_glue([str(models["neobert"])], out, task_dirs=[tasks["stsb"]], preset=grid, progress=False)
    assert (result.trials_run, result.trials_skipped) == (2, 2)
    assert sorted(calls) == sorted({"bs8-lr0.0001-wd0.01-seed0", "bs8-lr0.0001-wd0.01-seed1",
                                    "bs16-lr0.0001-wd0.01-seed0", "bs16-lr0.0001-wd0.01-seed1"} - set(finished))
    choice = result.choices["neobert"]["stsb"]
    assert (choice.trials, choice.configs, choice.seeds) == (4, 2, 2)
    assert "chosen **on validation**" in (out / "summary.md").read_text()  # a grid: selected, optimistic
    assert choice.spread["pearson"]["min"] <= choice.scores["pearson"] <= choice.spread["pearson"]["max"]

    calls.clear()  # a third run has nothing left to do
    assert run_glue([str(models["neobert"])], out, task_dirs=[tasks["stsb"]], preset=grid,
                    progress=False).trials_run == 0 and not calls
    with pytest.raises(UserInputError, match=r"preset\.epochs \(1\.0 → 2\.0\)"):
        run_glue([str(models["neobert"])], out, task_dirs=[tasks["stsb"]],
                 preset=load_glue_preset(grid, epochs=2), progress=False)


@pytest.mark.slow
def test_parallel_trials_one_per_device(tmp_path, models, tasks):
    out = tmp_path / "out"
    result = runner.invoke(app, ["glue", "--model", str(models["bert"]), "--task-dir", str(tasks["stsb"]),
                                 "--output", str(out), "--preset", str(_grid(tmp_path, TINY_GRID)),
                                 "--devices", "cpu,cpu", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["trials"]["run"] == 2 and set(report["scores"]["stsb"]) == {"pearson", "spearman"}
    assert len(list((out / "trials" / "bert" / "stsb").glob("*.json"))) == 2


# ---- bad input -----------------------------------------------------------------------------

def _broken(tmp_path: Path, task: str, split: str, rows: list[dict] | None) -> Path:
    directory = tiny_task_dir(tmp_path / "tasks", task)
    if rows is not None:
        write_jsonl(directory / f"{split}.jsonl", rows)
    return directory


@pytest.mark.parametrize(("case", "message"), [
    ("unknown-task-json", r"task.json:1: key 'glue_task': unknown GLUE task 'wnli'"),
    ("task-json-without-task", r"task.json: key 'glue_task': Field required; .*e.g. {\"glue_task\": \"stsb\"}"),
    ("label-outside", r"train.jsonl:2: label 2 is not one of RTE's classes"),
    ("missing-sentence2", r"validation.jsonl:3: field 'sentence2' is missing; RTE \(a sentence-pair task\)"),
    ("empty-split", r"validation.jsonl: the split is empty"),
    ("stsb-text-label", r"train.jsonl:1: label 'high' is not a number"),
])
def test_bad_task_data_names_file_and_line_and_writes_nothing(case, message, tmp_path, models):
    good = {"sentence1": "a b", "sentence2": "c d", "label": 1}
    if case == "unknown-task-json":
        directory = _broken(tmp_path, "rte", "train", None)
        (directory / "task.json").write_text('{"glue_task": "wnli"}')
    elif case == "task-json-without-task":
        directory = _broken(tmp_path, "rte", "train", None)
        (directory / "task.json").write_text('{"source": "GLUE"}')
    elif case == "label-outside":
        directory = _broken(tmp_path, "rte", "train", [good, {**good, "label": 2}])
    elif case == "missing-sentence2":
        directory = _broken(tmp_path, "rte", "validation", [good, good, {"sentence1": "x", "label": 0}])
    elif case == "empty-split":
        directory = _broken(tmp_path, "rte", "validation", [])
    else:
        directory = _broken(tmp_path, "stsb", "train", [{**good, "label": "high"}])
    out = tmp_path / "out"
    result = runner.invoke(app, ["glue", "--model", str(models["bert"]), "--task-dir", str(directory),
                                 "--output", str(out)])
    assert result.exit_code != 0
    assert isinstance(result.exception, UserInputError)
    import re

    assert re.search(message, str(result.exception)), str(result.exception)
    assert not out.exists()


def test_unknown_hub_task_and_unknown_preset_key_write_nothing(tmp_path, models):
    out = tmp_path / "out"
    result = runner.invoke(app, ["glue", "--model", str(models["bert"]), "--tasks", "stsb,wnli", "--output", str(out)])
    assert isinstance(result.exception, UserInputError) and "unknown GLUE task 'wnli'" in str(result.exception)
    grid = _grid(tmp_path, "batch_size: [8]\nepochs: 1\nlearning_rat: [1.0e-5]\n")
    result = runner.invoke(app, ["glue", "--model", str(models["bert"]), "--task-dir", str(tmp_path),
                                 "--output", str(out), "--preset", str(grid)])
    assert isinstance(result.exception, UserInputError)
    assert str(result.exception).startswith(f"{grid}:3: unknown key 'learning_rat'")
    bad_value = _grid(tmp_path, "batch_size: [8]\ntransfer: {rte: snli}\n")
    with pytest.raises(UserInputError, match=r"grid.yaml:2: key 'transfer': .*unknown GLUE task 'snli'"):
        load_glue_preset(bad_value)
    assert not out.exists()


def test_missing_model_fails_before_writing(tmp_path, tasks):
    out = tmp_path / "out"
    result = runner.invoke(app, ["glue", "--model", str(tmp_path / "no-such-model"), "--task-dir", str(tasks["rte"]),
                                 "--output", str(out)])
    assert isinstance(result.exception, UserInputError) and "cannot load model" in str(result.exception)
    assert not out.exists()


def test_best_configuration_is_the_best_median_and_nan_never_wins():
    from neobert_embed.glue.selection import select_best

    def trial(config, seed, pearson):
        return {"config_key": config, "key": f"{config}-seed{seed}", "scores": {"pearson": pearson, "spearman": 0.5}}

    results = [trial("a", 0, 0.9), trial("a", 1, 0.1), trial("a", 2, 0.2),   # median 0.2 despite one lucky 0.9
               trial("b", 0, 0.5), trial("b", 1, 0.6), trial("b", 2, 0.4),   # median 0.5
               trial("c", 0, float("nan"))]
    choice = select_best(results, "pearson")
    assert (choice.config_key, choice.scores["pearson"], choice.seeds, choice.configs) == ("b", 0.5, 3, 3)
    assert choice.spread["pearson"]["min"] == 0.4 and choice.spread["pearson"]["max"] == 0.6


@pytest.mark.parametrize("devices", ["cuda:99", "cpu,,cpu", "tpu"])
def test_devices_this_machine_lacks_are_refused_before_any_work(tmp_path, models, tasks, devices):
    """``glue --devices`` and ``index build --devices`` share one parser that checks every entry."""
    out = tmp_path / "out"
    result = runner.invoke(app, ["glue", "--model", str(models["bert"]), "--task-dir", str(tasks["stsb"]),
                                 "--output", str(out), "--devices", devices])
    message = result.output + str(result.exception)
    assert result.exit_code != 0 and "--devices" in message and devices.split(",")[0] in message, message
    assert not out.exists()  # not even the run's log
    with pytest.raises(UserInputError, match="--devices"):
        run_glue([str(models["bert"])], out, task_dirs=[tasks["stsb"]], devices=devices.split(","), progress=False)
    assert not out.exists()
