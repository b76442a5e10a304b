"""Each command inspects its model's files once: the preflight's verdict is the value its loader takes.

Why: inspecting a model re-reads every settings file and every weights header; before, ``index build`` and
``index add`` inspected it in their preflight and again in the loader (issue 48, item 4).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_models import build_tiny_model
from typer.testing import CliRunner

import neobert_embed.model_files as model_files
from neobert_embed.cli import app


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    return build_tiny_model("bert", tmp_path_factory.mktemp("once") / "bert", seed=5)


@pytest.fixture
def inspections(monkeypatch) -> list[str]:
    """The model sources whose files were inspected, one entry per inspection."""
    seen: list[str] = []
    original = model_files._check_files

    def counted(name_or_path):
        seen.append(str(name_or_path))
        return original(name_or_path)

    monkeypatch.setattr(model_files, "_check_files", counted)
    return seen


def _corpus(path: Path, first: int, count: int) -> Path:
    rows = [{"_id": f"d{i}", "text": f"note {i} about the weather and {i % 7} other things"}
            for i in range(first, first + count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_encode_inspects_the_model_once(tiny_bert, tmp_path, inspections):
    texts = tmp_path / "texts.txt"
    texts.write_text("a cat\na dog on a mat\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["encode", "--model", str(tiny_bert), "--input", str(texts),
                                      "--output", str(tmp_path / "v.npy"), "--precision", "fp32"])
    assert result.exit_code == 0, result.output
    assert inspections == [str(tiny_bert)]


def test_index_build_and_add_inspect_the_model_once_each(tiny_bert, tmp_path, inspections):
    index_dir = tmp_path / "index"
    runner = CliRunner()
    built = runner.invoke(app, ["index", "build", "--model", str(tiny_bert), "--corpus",
                                str(_corpus(tmp_path / "a.jsonl", 0, 12)), "--output", str(index_dir),
                                "--precision", "fp32"])
    assert built.exit_code == 0, built.output
    assert inspections == [str(tiny_bert)]
    inspections.clear()
    added = runner.invoke(app, ["index", "add", str(index_dir), "--corpus", str(_corpus(tmp_path / "b.jsonl", 12, 3)),
                                "--model", str(tiny_bert)])
    assert added.exit_code == 0, added.output
    assert inspections == [str(tiny_bert)]


def test_train_contrastive_inspects_the_model_once(tiny_bert, tmp_path, inspections):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"anchor": f"question {i} about rain", "positive": f"answer {i} on rain"})
                             + "\n" for i in range(8)), encoding="utf-8")
    result = CliRunner().invoke(app, ["train-contrastive", "--model", str(tiny_bert), "--data", f"pairs={pairs}",
                                      "--output", str(tmp_path / "run"), "--max-steps", "1", "--batch-size", "4"])
    assert result.exit_code == 0, result.output
    assert inspections.count(str(tiny_bert)) == 1


@pytest.mark.parametrize("protocol", ["model", "uniform"])
def test_mteb_inspects_the_model_once(tiny_bert, tmp_path, inspections, protocol):
    task = tmp_path / "tasks" / "sts"
    task.mkdir(parents=True)
    (task / "task.json").write_text(json.dumps({"name": "TinySTS", "type": "STS"}), encoding="utf-8")
    rows = [{"sentence1": f"the {c} cat", "sentence2": f"a {c} {a}", "score": float(i % 5)}
            for i, (c, a) in enumerate((c, a) for c in ("red", "blue", "green") for a in ("cat", "dog", "owl"))]
    (task / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    result = CliRunner().invoke(app, ["mteb", "--model", str(tiny_bert), "--task-dir", str(task.parent),
                                      "--output", str(tmp_path / "out"), "--protocol", protocol])
    assert result.exit_code == 0, result.output
    assert inspections == [str(tiny_bert)]
