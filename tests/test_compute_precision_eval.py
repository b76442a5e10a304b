"""``--precision`` on mteb, compare and mine-negatives is the compute precision, recorded with the scores.

The real all-MiniLM-L6-v2 on the first 600 pairs of the local STS-B dev task (the whole split's fp32
reference, 0.8672, is checked in test_evaluation_reference.py; 600 pairs keep this test at a third of
the time): bf16 autocast must stay within 0.002 of the same run in fp32, and every record of the run
(mteb's result file, summary.md, summary.csv, the ``used:`` line) must say the scores are bf16.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from safety_helpers import run_main
from typer.testing import CliRunner

from neobert_embed.cli import app

SUBSET_PAIRS = 600


@pytest.fixture(scope="module")
def stsb_dev(shared_data) -> Path:
    task = shared_data / "tasks" / "stsb-dev"
    if not (task / "task.json").is_file():
        pytest.skip(f"no local STS-B dev task at {task}")
    return task


@pytest.fixture(scope="module")
def stsb_subset(stsb_dev, tmp_path_factory) -> Path:
    task = tmp_path_factory.mktemp("stsb-subset") / "stsb-dev-600"
    task.mkdir()
    (task / "task.json").write_text((stsb_dev / "task.json").read_text(encoding="utf-8"), encoding="utf-8")
    rows = (stsb_dev / "test.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:SUBSET_PAIRS]
    (task / "test.jsonl").write_text("".join(rows), encoding="utf-8")
    return task


def test_mteb_bf16_stays_within_0002_of_fp32_and_every_record_says_bf16(minilm_path, stsb_subset, tmp_path):
    output = tmp_path / "out"
    fp32 = CliRunner().invoke(app, ["mteb", "--model", str(minilm_path), "--task-dir", str(stsb_subset), "--output",
                                    str(tmp_path / "fp32"), "--json"])
    assert fp32.exit_code == 0, fp32.output
    fp32_score = json.loads(fp32.stdout)["scores"]["STSBenchmarkDev"]
    assert 0.80 < fp32_score < 0.95, "all-MiniLM-L6-v2 scores 0.8672 on the whole split"
    args = ["mteb", "--model", str(minilm_path), "--task-dir", str(stsb_subset), "--output", str(output),
            "--precision", "bf16"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["scores"]["STSBenchmarkDev"] == pytest.approx(fp32_score, abs=0.002)
    assert report["scores"]["STSBenchmarkDev"] != fp32_score, "bf16 must really compute in bf16"
    assert report["settings"]["compute_precision"]["precision"] == "bf16"
    assert "compute_precision_bf16" in report["results_dir"]  # never mixed with the fp32 results

    saved = json.loads(Path(report["outcomes"][0]["result_file"]).read_text(encoding="utf-8"))
    recorded = saved["neobert_embed"]["compute_precision"]
    assert (recorded["precision"], recorded["requested"], recorded["reason"]) == ("bf16", "bf16", "asked for")
    assert saved["neobert_embed"]["overrides"] == {"compute_precision": "bf16"}

    summary = (output / "summary.md").read_text(encoding="utf-8")
    assert f"- {report['name']}: bf16 (asked for) on " in summary
    row = next(csv.DictReader((output / "summary.csv").open(encoding="utf-8")))
    assert (row["precision"], row["precision_reason"]) == ("bf16", "asked for")

    rerun = CliRunner().invoke(app, args)  # cached: the record comes back from the result file
    assert rerun.exit_code == 0, rerun.output
    assert rerun.stdout.startswith("used: precision bf16 (asked for); protocol model;")
    assert " cached " in rerun.stdout


def test_default_mteb_precision_is_fp32_and_says_why(stsb_dev):
    """The default stays fp32 (published scores), loaded as before; the record names it and why."""
    from neobert_embed.evaluation.local_tasks import load_task_dirs
    from neobert_embed.evaluation.protocol import DEFAULT_PRECISION_REASON, sample_texts
    from neobert_embed.evaluation.recipe import EvaluationRecipe

    assert "fp32" in DEFAULT_PRECISION_REASON
    assert EvaluationRecipe().precision == "fp32"
    bf16 = EvaluationRecipe(precision="bf16")  # bf16 meant bf16 weights before: its results are stored apart now
    assert bf16.fingerprint() != _plain_fingerprint(bf16)
    assert EvaluationRecipe().fingerprint() == _plain_fingerprint(EvaluationRecipe())  # fp32 results reused
    task = load_task_dirs([stsb_dev])[0]
    task.load_data()
    texts = sample_texts(task)
    assert texts and all(isinstance(text, str) and text.strip() for text in texts)


def _plain_fingerprint(recipe) -> str:
    """The fingerprint as computed before compute precisions (the plain dump)."""
    import hashlib

    settings = recipe.model_dump(exclude={"batch_size"})
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode("utf-8")).hexdigest()[:12]


@pytest.mark.parametrize("command", [
    ["mteb", "--model", "{model}", "--task-dir", "{tmp}", "--output", "{tmp}/out"],
    ["compare", "--models", "{model}", "--output", "{tmp}/out"],
    ["mine-negatives", "--model", "{model}", "--data", "{tmp}/pairs.jsonl", "--output", "{tmp}/out/mined.jsonl"],
], ids=lambda c: c[0])
def test_bogus_precision_exits_2_naming_the_flag_before_loading_a_model(command, minilm_path, tmp_path, capsys,
                                                                       monkeypatch):
    import neobert_embed.inference.runtime as runtime
    import neobert_embed.sentence as sentence

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before --precision was checked")

    monkeypatch.setattr(runtime, "load_inference_model", no_model)
    monkeypatch.setattr(sentence, "load_sentence_model", no_model)
    (tmp_path / "pairs.jsonl").write_text('{"query": "a", "document": "b"}\n', encoding="utf-8")
    args = [part.format(model=minilm_path, tmp=tmp_path) for part in command]
    code, out, err = run_main([*args, "--precision", "bogus"], capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--precision" in lines[0] and "bogus" in lines[0], err
    assert not (tmp_path / "out").exists()


def test_mine_negatives_defaults_to_auto_and_records_the_choice(minilm_path, tmp_path):
    from contrastive_helpers import paraphrase_rows, write_jsonl

    data = write_jsonl(tmp_path / "pairs.jsonl", paraphrase_rows(negatives=0, extra=False))
    output = tmp_path / "mined.jsonl"
    result = CliRunner().invoke(app, ["mine-negatives", "--model", str(minilm_path), "--data", str(data),
                                      "--output", str(output), "--num-negatives", "1"])
    assert result.exit_code == 0, result.output
    choice = json.loads((tmp_path / "mined.jsonl.json").read_text(encoding="utf-8"))["precision"]
    assert choice["requested"] == "auto" and choice["precision"] in ("fp32", "bf16", "fp16", "int8")
    assert f"used: precision {choice['precision']} (" in result.stderr
    assert sum(1 for _ in output.open(encoding="utf-8")) > 0
