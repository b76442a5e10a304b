"""Every kind of spec file reports its mistakes as ``file:line: key``, through the commands that read it.

Each case fails while reading the spec, before any model, corpus or task data is loaded, so the
whole file runs in seconds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from neobert_embed.cli import app
from neobert_embed.errors import UserInputError
from neobert_embed.index.manifest import IndexManifest, write_manifest
from neobert_embed.recipes import Spec, read_spec

runner = CliRunner()

PRETRAIN_MODEL = "model:\n  hidden_size: 32\n  num_hidden_layers: 2\n  num_attention_heads: 2\n  intermediate_size: 64\n"


def _error(args: list[str]) -> str:
    """The one-line UserInputError a command raised (the CLI prints it and exits 2)."""
    result = runner.invoke(app, [str(a) for a in args])
    assert isinstance(result.exception, UserInputError), result.output
    message = str(result.exception)
    assert "\n" not in message
    return message


def _assert_located(message: str, path: Path, line: int, text: str) -> None:
    """``message`` names the file, the line and the key (``text`` holds the dotted key)."""
    assert re.search(re.escape(f"{path}:{line}: ") + r"[^;]*" + re.escape(text), message), message


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _contrastive(recipe: Path, tmp_path: Path, *extra: str) -> list:
    return ["train-contrastive", "--recipe", recipe, "--data", f"x={tmp_path / 'x.jsonl'}",
            "--output", tmp_path / "run", *extra]


def test_contrastive_recipe_errors_name_file_line_and_nested_key(tmp_path):
    recipe = _write(tmp_path / "c.yaml", "max_steps: 10\ntemperature: -1\ndata:\n  pairs:\n"
                                         "    path: pairs.jsonl\n    splitt: train\n")
    message = _error(_contrastive(recipe, tmp_path))
    _assert_located(message, recipe, 2, "key 'temperature': Input should be greater than 0")
    _assert_located(message, recipe, 6, "unknown key 'data.pairs.splitt' (known keys: path, subset, split")
    assert not (tmp_path / "run").exists()


def test_a_bad_override_is_named_as_such(tmp_path):
    from neobert_embed.contrastive.recipe import ContrastiveRecipe
    from neobert_embed.recipes import read_spec

    recipe = _write(tmp_path / "c.yaml", "max_steps: 10\ntemperature: 0.05\n")
    with pytest.raises(UserInputError) as refused:  # the Python API: the override, not the file, is named
        read_spec(recipe).validate(ContrastiveRecipe, {"temperature": -1})
    assert str(refused.value).startswith("override: key 'temperature': Input should be greater than 0"), refused
    result = runner.invoke(app, _contrastive(recipe, tmp_path, "--temperature", "-1"))  # the CLI: its flag
    assert result.exit_code == 2 and "--temperature" in result.output and "(0, 10]" in result.output


def test_pretraining_recipe_error_names_file_line_and_section_key(tmp_path):
    recipe = _write(tmp_path / "p.yaml", PRETRAIN_MODEL + "training:\n  max_steps: zero\nmaskng: {rate: 0.2}\n")
    message = _error(["pretrain", "--recipe", recipe, "--corpus", tmp_path / "c.jsonl", "--output", tmp_path / "r"])
    _assert_located(message, recipe, 7, "key 'training.max_steps': Input should be a valid integer")
    _assert_located(message, recipe, 8, "unknown key 'maskng' (known keys: model, tokenizer, data, masking")


def test_pretraining_cross_key_error_points_at_its_section(tmp_path):
    recipe = _write(tmp_path / "p.yaml", "data: {seq_length: 64}\nmodel:\n  hidden_size: 32\n")
    message = _error(["pretrain", "--recipe", recipe, "--corpus", tmp_path / "c.jsonl", "--output", tmp_path / "r"])
    _assert_located(message, recipe, 2, "key 'model': a new model needs model.num_hidden_layers")


def test_evaluation_recipe_error_names_file_line_and_key(tmp_path):
    recipe = _write(tmp_path / "eval.yaml", "max_length: 128\noverrides:\n  STS12:\n    query: [a, b]\n")
    message = _error(["mteb", "--model", tmp_path / "no-model", "--output", tmp_path / "out",
                      "--protocol", "uniform", "--recipe", recipe, "--tasks", "STS12"])
    _assert_located(message, recipe, 4, "key 'overrides.STS12.query': Input should be a valid string")


def test_glue_preset_error_names_file_line_and_key(tmp_path):
    grid = _write(tmp_path / "grid.yaml", "batch_size: [8]\nepochs: 1\ntransfer:\n  rte: snli\n")
    message = _error(["glue", "--model", tmp_path / "no-model", "--tasks", "rte", "--output", tmp_path / "out",
                      "--preset", grid])
    _assert_located(message, grid, 3, "key 'transfer': unknown GLUE task 'snli'")
    assert not (tmp_path / "out").exists()


def _task_dir(tmp_path: Path, text: str) -> Path:
    directory = tmp_path / "tasks" / "my-sts"
    directory.mkdir(parents=True)
    _write(directory / "task.json", text)
    return directory


def test_local_task_json_error_names_file_line_and_key(tmp_path):
    task = _task_dir(tmp_path, '{\n  "name": "MySTS",\n  "type": "STS",\n  "min_score": "low",\n'
                               '  "instructions": "x"\n}\n')
    message = _error(["mteb", "--model", tmp_path / "no-model", "--output", tmp_path / "out", "--task-dir", task])
    _assert_located(message, task / "task.json", 4, "key 'min_score': Input should be a valid number")
    _assert_located(message, task / "task.json", 5, "unknown key 'instructions' (known keys: mteb_task, name")


def test_local_task_json_syntax_error_names_the_line(tmp_path):
    task = _task_dir(tmp_path, '{\n  "name": "MySTS",\n  "type": "STS"\n  "min_score": 0\n}\n')
    message = _error(["mteb", "--model", tmp_path / "no-model", "--output", tmp_path / "out", "--task-dir", task])
    assert message.startswith(f"{task / 'task.json'}:4: invalid JSON (Expecting ',' delimiter"), message


def _manifest(directory: Path) -> Path:
    write_manifest(directory, IndexManifest(
        model="m", model_fingerprint="f" * 12, dimension=8, similarity="cosine", normalized=True,
        max_seq_length=128, index_type="flat", factory="Flat", precision="float32", documents=3, vectors=3))
    return directory / "manifest.json"


def test_tampered_index_manifest_names_file_line_and_key(tmp_path):
    manifest = _manifest(tmp_path / "index")
    text = manifest.read_text()
    manifest.write_text(text.replace('"dimension": 8', '"dimension": "eight"').replace('"vectors"', '"vectorz"'))
    lines = manifest.read_text().splitlines()
    dimension = 1 + next(i for i, line in enumerate(lines) if '"dimension"' in line)
    vectors = 1 + next(i for i, line in enumerate(lines) if '"vectorz"' in line)
    message = _error(["index", "verify", tmp_path / "index"])
    _assert_located(message, manifest, dimension, "key 'dimension': Input should be a valid integer")
    _assert_located(message, manifest, vectors, "unknown key 'vectorz'")
    assert message.endswith("rebuild the index with `neobert-embed index build`")


@pytest.mark.parametrize(("text", "line"), [(PRETRAIN_MODEL + "training: {max_steps: [1}\n", 6),
                                            (PRETRAIN_MODEL + "training:\n\tmax_steps: 3\n", 7)])
def test_yaml_syntax_error_names_the_line(tmp_path, text, line):
    recipe = _write(tmp_path / "p.yaml", text)
    message = _error(["pretrain", "--recipe", recipe, "--corpus", tmp_path / "c.jsonl", "--output", tmp_path / "r"])
    assert message.startswith(f"{recipe}:{line}: invalid YAML: "), message


def test_a_recipe_that_is_not_a_mapping_or_not_utf8_is_refused(tmp_path):
    recipe = _write(tmp_path / "c.yaml", "- max_steps: 10\n")
    assert _error(_contrastive(recipe, tmp_path)) == f"{recipe}: a recipe is a mapping of keys to values, got list"
    recipe.write_bytes(b"max_steps: 10\ntemperature: \xff\n")
    assert "not valid UTF-8" in _error(_contrastive(recipe, tmp_path))


def test_json_lines_survive_tabs_one_line_files_and_escapes(tmp_path):
    spec = _write(tmp_path / "t.json", '{\n\t"a": {\n\t\t"b\\/c": [1,\n\t\t\t2]},\n\t"d": "x\\ty", "e": {}\n}')
    lines = read_spec(spec).lines
    assert lines == {("a",): 2, ("a", "b/c"): 3, ("a", "b/c", 0): 3, ("a", "b/c", 1): 4, ("d",): 5, ("e",): 5}
    assert read_spec(_write(tmp_path / "m.json", json.dumps({"a": {"b": 1}}))).lines == {("a",): 1, ("a", "b"): 1}


def test_yaml_aliases_do_not_multiply_work(tmp_path):
    text = "a: &a [1, 2]\n" + "".join(f"l{i}: &l{i} [*{'a' if i == 0 else f'l{i - 1}'}, *{'a' if i == 0 else f'l{i - 1}'}]\n"
                                      for i in range(40))
    spec = read_spec(_write(tmp_path / "bomb.yaml", text))
    assert len(spec.lines) < 200 and spec.lines[("l39",)] == 41


def test_bundled_defaults_resolve_through_recipe_path(tmp_path, monkeypatch):
    import neobert_embed.paths as paths
    from neobert_embed.contrastive import load_contrastive_recipe
    from neobert_embed.glue.presets import load_glue_preset

    share = tmp_path / "share"
    share.mkdir()
    _write(share / "contrastive.yaml", "max_steps: 7\n")
    _write(share / "glue-quick.yaml", "epochs: 2\nseeds: [0, 1]\n")
    monkeypatch.setattr(paths, "RECIPE_DIRS", (tmp_path / "no-checkout", share))
    assert load_contrastive_recipe(None).max_steps == 7
    assert load_glue_preset("quick").seeds == [0, 1]
    with pytest.raises(UserInputError, match="bundled recipe 'glue-paper.yaml' not found"):
        load_glue_preset("paper")


def test_every_spec_model_refuses_unknown_keys():
    from neobert_embed.contrastive.recipe import ContrastiveRecipe
    from neobert_embed.evaluation.local_tasks import TaskSpec
    from neobert_embed.evaluation.recipe import EvaluationRecipe
    from neobert_embed.glue.presets import GluePreset
    from neobert_embed.pretraining.recipe import PretrainRecipe

    for model in (ContrastiveRecipe, PretrainRecipe, EvaluationRecipe, GluePreset, TaskSpec, IndexManifest):
        with pytest.raises(UserInputError, match=r"unknown key 'bogus'"):
            Spec("test", {}).validate(model, {"bogus": 1})


def test_the_installed_command_prints_one_located_line_and_exits_2(tmp_path):
    recipe = _write(tmp_path / "p.yaml", PRETRAIN_MODEL + "maskng: {rate: 0.2}\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "neobert_embed.cli", "pretrain", "--recipe", str(recipe),
                           "--corpus", str(tmp_path / "c.jsonl"), "--output", str(tmp_path / "r")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    printed = " ".join((done.stdout + done.stderr).split())  # the console may wrap long lines
    assert f"error: {recipe}:6: unknown key 'maskng'" in printed, printed


def test_a_mapping_from_the_command_line_is_checked_by_the_same_reader(tmp_path):
    message = _error(["train-contrastive", "--model", "bert", "--data", f"bad name={tmp_path / 'x.jsonl'}",
                      "--output", tmp_path / "run"])
    assert message == "--data: key 'data': dataset name 'bad name' must be letters, digits, '_', '.' or '-'"
