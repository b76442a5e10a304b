"""Every record a command reads back, damaged: exit status 2, an ``error:`` line naming the file and
what to do, no traceback, and the output left exactly as it was.

Why a table of its own: ``test_fault_injection.py`` damages the records a command reads *before*
it runs (manifests, run records, model files). These are the records a command reads back *after*
an earlier run finished part of the work: a GLUE trial's result and a kept best model's
``best.json``, a contrastive checkpoint's ``trainer_state.json`` and a finished run's
``summary.json``, a pretraining checkpoint's manifest, a prepared corpus's ``corpus.json``, an
interrupted index build's state. Each is damaged the ways files get damaged (cut short by a full
disk, edited by hand: the wrong JSON type, a key missing or of the wrong type), and each used to
end in a ``KeyError``/``TypeError`` traceback, or in silently wrong work (an emptied checkpoint
manifest switched its integrity check off; a trainer state without its step restarted training
at step 0 on the checkpoint's weights).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from contrastive_helpers import one_torch_thread
from glue_helpers import TINY_GRID, tiny_task_dir
from pretraining_helpers import tiny_recipe
from safety_helpers import main_status, run_main, small_inputs, snapshot

_one_thread = pytest.fixture(autouse=True)(one_torch_thread)



@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> dict[str, Path]:
    """One finished (or interrupted) output of each command whose records are read back."""
    import yaml

    from neobert_embed.index import build_index

    inputs = small_inputs(tmp_path_factory.mktemp("records"))
    root, model = inputs["root"], inputs["model"]
    grid = root / "grid.yaml"
    grid.write_text(TINY_GRID, encoding="utf-8")
    tasks = [tiny_task_dir(root / "glue-tasks", task) for task in ("mnli", "rte")]
    glue = ["glue", "--model", model, *(a for t in tasks for a in ("--task-dir", t)), "--preset", grid]
    assert main_status([*glue, "--output", root / "glue"]) == 0
    contrastive = ["train-contrastive", "--model", model, "--data", f"p={inputs['pairs']}", "--recipe",
                   inputs["recipe"], "--max-steps", "10"]
    assert main_status([*contrastive, "--output", root / "contrastive"]) == 0  # checkpoint-10 kept
    prepared = ["pretrain", "prepare", "--corpus", inputs["texts"], "--text-field", "text", "--tokenizer", model]
    assert main_status([*prepared, "--output", root / "prepared"]) == 0
    recipe = root / "pretrain.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe(max_steps=2)), encoding="utf-8")
    pretrain = ["pretrain", "--recipe", recipe, "--corpus", root / "prepared"]
    assert main_status([*pretrain, "--output", root / "pretrain"]) == 0

    def stop(done):
        raise KeyboardInterrupt

    build = ["index", "build", "--model", model, "--corpus", inputs["corpus"], "--chunk-size", "8"]
    with pytest.raises(KeyboardInterrupt):
        build_index(model, inputs["corpus"], root / "index", chunk_size=8, show_progress=False, on_chunk=stop)
    return {**inputs, "commands": {"glue": glue, "contrastive": contrastive, "prepared": prepared,
                                   "pretrain": pretrain, "index": build}}


@dataclass(frozen=True)
class Damage:
    """Copy the output ``output`` (a name in the fixture's root, with ``extra`` beside it), write
    ``content`` over its ``record`` (relative; a glob), and rerun ``command`` (+ ``args``) into the copy."""

    name: str
    output: str
    record: str
    content: str | Callable[[dict], str]
    command: str
    args: tuple[str, ...] = ()
    expect: tuple[str, ...] = ()
    before: Callable[[Path], None] | None = None


def _without(key: str) -> Callable[[dict], str]:
    return lambda data: json.dumps({k: v for k, v in data.items() if k != key})


def _with(key: str, value: object) -> Callable[[dict], str]:
    return lambda data: json.dumps({**data, key: value})


def _unfinished(output: Path) -> None:
    """Make a finished contrastive run look interrupted after its last checkpoint."""
    (output / "summary.json").unlink()


def _rerun_one_mnli_trial(output: Path) -> None:
    """Delete one MNLI trial, so the rerun trains it and compares it with the kept best model."""
    next((output / "trials" / "bert" / "mnli").glob("*.json")).unlink()


CUT = '{"key": "x", "sco'
CASES = [
    Damage("glue trial result cut short", "glue", "trials/*/rte/*.json", CUT, "glue", expect=("trial result",)),
    Damage("glue trial result not an object", "glue", "trials/*/rte/*.json", "[]", "glue"),
    Damage("glue trial result without config_key", "glue", "trials/*/rte/*.json", _without("config_key"), "glue",
           expect=("config_key",)),
    Damage("glue trial result without the selection metric", "glue", "trials/*/rte/*.json",
           _with("scores", {"f1": 0.5}), "glue", expect=("accuracy",)),
    Damage("glue trial result with text scores", "glue", "trials/*/rte/*.json", _with("scores", {"accuracy": "hi"}),
           "glue", expect=("scores.accuracy",)),
    Damage("glue best.json empty", "glue", "models/*/mnli/best.json", "{}", "glue", expect=("scores",),
           before=_rerun_one_mnli_trial),
    Damage("glue best.json without the metric", "glue", "models/*/mnli/best.json", '{"key": "k", "scores": {}}',
           "glue", expect=("matched_accuracy",), before=_rerun_one_mnli_trial),
    Damage("contrastive checkpoint state cut short", "contrastive", "checkpoints/checkpoint-10/trainer_state.json",
           CUT, "contrastive", ("--resume",), expect=("damaged",), before=_unfinished),
    Damage("contrastive checkpoint state empty", "contrastive", "checkpoints/checkpoint-10/trainer_state.json", "{}",
           "contrastive", ("--resume",), expect=("global_step",), before=_unfinished),
    Damage("contrastive checkpoint state without its step", "contrastive",
           "checkpoints/checkpoint-10/trainer_state.json", _without("global_step"), "contrastive", ("--resume",),
           expect=("global_step",), before=_unfinished),
    Damage("contrastive summary empty", "contrastive", "summary.json", "{}", "contrastive", ("--resume",),
           expect=("steps",)),
    Damage("pretrain checkpoint manifest emptied", "pretrain", "checkpoints/step-*/checkpoint.json", "{}",
           "pretrain", ("--resume",), expect=("corrupt", "does not list")),
    Damage("prepared corpus without shards", "prepared", "corpus.json", _with("shards", []), "pretrain",
           expect=("shards",)),
    Damage("index build state with a bad precision", "index", "build_state.json", _with("compute_precision", "int3"),
           "index", ("--resume",), expect=("compute_precision", "int3")),
]


def _files(directory: Path) -> dict[str, object]:
    return {str(path.relative_to(directory)): snapshot(path) for path in directory.rglob("*")
            if path.is_file() and not path.name.endswith(".lock")}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_damaged_record_read_back_is_one_located_error(case, finished, tmp_path, capsys):
    from neobert_embed.runs import partial_directory

    root = finished["root"]
    source = partial_directory(root / case.output) if case.output == "index" else root / case.output
    copy = tmp_path / "out"
    shutil.copytree(source, partial_directory(copy) if case.output == "index" else copy)
    work = partial_directory(copy) if case.output == "index" else copy
    record = next(work.glob(case.record))
    data = json.loads(record.read_text(encoding="utf-8"))
    record.write_text(case.content(data) if callable(case.content) else case.content, encoding="utf-8")
    if case.before:
        case.before(copy)
    target = copy if case.command != "pretrain" or case.output == "pretrain" else tmp_path / "new-run"
    args = [*finished["commands"][case.command], *case.args]
    if case.output == "prepared":
        args[args.index(root / "prepared")] = copy
    before = _files(work)
    code, out, err = run_main([*args, "--output", target], capsys)
    lines = [line for line in err.splitlines() if line.strip() and "━" not in line]
    assert code == 2 and "Traceback" not in out + err, err[-3000:]
    assert lines[-1].startswith("error: ") and record.name in lines[-1], err[-3000:]
    assert all(word.lower() in lines[-1].lower() for word in case.expect), lines[-1]
    assert _files(work) == before  # a refused rerun changes no file (it may leave its writer lock)
