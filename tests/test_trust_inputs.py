"""Fault suite of issue 49 (strict inputs, one writer per output): what the toolkit reads from files
and what it does when two jobs meet. Each case failed on the code before the issue (0d927b1).

Classes: names from files never become paths; one writer per output; training stops on non-finite
values and recipes are as strict as the flags; one strict qrels reader; the server notices a
vanished index, warns when exposed without a key, and times out slow connections.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from contrastive_helpers import TINY_RECIPE, one_torch_thread, paraphrase_rows, read_metrics, write_jsonl
from index_helpers import tiny_bert_with_prompts, write_corpus
from safety_helpers import REPO, cli_env, run_main
from tiny_models import build_tiny_model
from transformers import TrainerCallback

from neobert_embed.errors import UserInputError

_one_thread = pytest.fixture(autouse=True)(one_torch_thread)


def one_line_refusal(code: int, err: str, *needles: str) -> None:
    """Exit status 2 and one error line holding every needle (no traceback)."""
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert any(all(needle in line for needle in needles) for line in lines), err


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    return build_tiny_model("bert", tmp_path_factory.mktemp("models") / "bert")


@pytest.fixture(scope="module")
def prompted_bert(tmp_path_factory) -> Path:
    return tiny_bert_with_prompts(tmp_path_factory.mktemp("prompted"))


# 1. names read from files never become paths ------------------------------------------------------

STS_ROWS = [{"sentence1": f"the {c} cat", "sentence2": f"a {c} cat", "score": float(i % 5)}
            for i, c in enumerate(("red", "blue", "green", "black", "white", "pink"))]


@pytest.mark.parametrize("spec", [
    {"name": "../../../../../../X", "type": "STS"},  # results/<model>/<revision>/experiments/<protocol>/: out of --output
    {"name": "../X", "type": "STS"},
    {"name": "..", "type": "STS"},
    {"name": ".hidden", "type": "STS"},
    {"name": "LocalSTS", "type": "STS", "eval_split": "../../outside"},
], ids=["deep-traversal", "parent", "dot-dot", "hidden", "split-traversal"])
def test_a_name_from_task_json_never_becomes_a_path(spec, tmp_path, tiny_bert, capsys):
    work = tmp_path / "a" / "b" / "c" / "d"
    task = work / "task"
    task.mkdir(parents=True)
    (task / "task.json").write_text(json.dumps(spec), encoding="utf-8")
    split = spec.get("eval_split", "test")
    write_jsonl(task / "test.jsonl", STS_ROWS)
    if split != "test":
        write_jsonl(task / f"{split}.jsonl", STS_ROWS)
    before = {p for p in tmp_path.rglob("*")}
    output = work / "out"
    code, _, err = run_main(["mteb", "--model", tiny_bert, "--task-dir", task, "--output", output], capsys)
    run_log = output.with_name(output.name + ".log")  # the command's own log, beside its output by design
    written_outside = sorted(str(p) for p in set(tmp_path.rglob("*")) - before
                             if not p.is_relative_to(output) and p != run_log)
    assert written_outside == []
    one_line_refusal(code, err, "task.json", "key")


def test_a_file_an_index_manifest_lists_stays_inside_the_index(tmp_path, small_index, capsys):
    import shutil

    from neobert_embed.files import FilePin

    index = tmp_path / "idx"
    shutil.copytree(small_index, index)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not part of the index")
    manifest = json.loads((index / "manifest.json").read_text(encoding="utf-8"))
    pin = FilePin.of(outside)
    manifest["files"]["../outside.bin"] = {"size": pin.size, "sha256": pin.sha256}
    (index / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    code, _, err = run_main(["index", "verify", index], capsys)
    one_line_refusal(code, err, "manifest.json", "../outside.bin")


def test_a_module_folder_from_modules_json_stays_inside_the_model(tmp_path, prompted_bert, capsys):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(prompted_bert, model)
    modules = json.loads((model / "modules.json").read_text(encoding="utf-8"))
    pooling = next(entry for entry in modules if entry["path"])
    shutil.move(model / pooling["path"], tmp_path / "pooling")  # beside the model, not in it
    pooling["path"] = "../pooling"
    (model / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    texts = tmp_path / "t.txt"
    texts.write_text("one\n", encoding="utf-8")
    code, _, err = run_main(["encode", "--model", model, "--input", texts, "--output", tmp_path / "v.npy"], capsys)
    one_line_refusal(code, err, "modules.json", "../pooling")


# 2. one writer per output -------------------------------------------------------------------------

HOLD_AND_PUBLISH = """
import sys, time
import numpy as np
from neobert_embed.encoding import ENCODE_WRITER
from neobert_embed.locks import writer_lock
from neobert_embed.outputs import published_file
out = sys.argv[1]
with writer_lock(out, command=ENCODE_WRITER):
    print("held", flush=True)
    time.sleep(2.0)
    with published_file(out, ENCODE_WRITER, model="other", texts=3) as staged, open(staged.path, "wb") as handle:
        np.save(handle, np.full((3, 4), 7.0, dtype=np.float32), allow_pickle=False)
"""


def test_two_encodes_to_one_output_never_both_succeed(tmp_path, prompted_bert, capsys):
    """A second ``encode`` to an output another writer is finishing waits for it, then refuses to replace
    what it published (no --overwrite): before, both exited 0 and the later one won silently."""
    texts = tmp_path / "t.txt"
    texts.write_text("one\ntwo\n", encoding="utf-8")
    out = tmp_path / "v.npy"
    other = subprocess.Popen([sys.executable, "-c", HOLD_AND_PUBLISH, str(out)], stdout=subprocess.PIPE, text=True,
                             env=cli_env())
    try:
        assert other.stdout.readline().strip() == "held"
        code, _, err = run_main(["encode", "--model", prompted_bert, "--input", texts, "--output", out], capsys)
    finally:
        other.wait(60)
    assert other.returncode == 0
    assert np.load(out).shape == (3, 4)  # the other writer's finished output is intact
    one_line_refusal(code, err, str(out), "--overwrite")


def test_a_killed_encodes_temporary_files_are_removed_by_the_next_run(tmp_path, prompted_bert, capsys):
    texts = tmp_path / "t.txt"
    texts.write_text("one\ntwo\n", encoding="utf-8")
    out = tmp_path / "v.npy"
    debris = [tmp_path / ".v.npy.k2j1ab9z.tmp", tmp_path / ".v.npy.json.k2j1ab9z.tmp"]
    neighbour = tmp_path / ".v.npy.x.k2j1ab9z.tmp"  # another output's (v.npy.x) temporary file
    for path in [*debris, neighbour]:
        path.write_bytes(b"half written")
    code, _, err = run_main(["encode", "--model", prompted_bert, "--input", texts, "--output", out], capsys)
    assert code == 0, err
    assert [p.name for p in debris if p.exists()] == []
    assert neighbour.exists()


def test_clearing_a_directorys_debris_never_touches_another_outputs(tmp_path):
    from neobert_embed.files import remove_debris

    mine, theirs = tmp_path / ".run.k2j1ab9z.tmp", tmp_path / ".run.v2.k2j1ab9z.tmp"
    mine.mkdir()
    theirs.mkdir()  # the temporary directory of a live writer of runs/run.v2
    remove_debris(tmp_path / "run")
    assert not mine.exists() and theirs.exists()


# 3. training stops on non-finite values; recipes are as strict as the flags -------------------------

def _recipe(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(body, encoding="utf-8")
    return path


BASE = "max_steps: 2\nprecision: fp32\nmax_length: 16\ntext_budget: 8\nsave_steps: 100\n"


@pytest.mark.parametrize("body, key", [
    ("max_steps: true\nprecision: fp32\nmax_length: 16\ntext_budget: 8\n", "max_steps"),
    (BASE + "seed: -5\n", "seed"),
    (BASE + "learning_rate: 1.0e30\n", "learning_rate"),
    (BASE + "temperature: 1.0e9\n", "temperature"),
    (BASE + "max_steps: 3\n", "max_steps"),
    (BASE + "logging_steps: true\n", "logging_steps"),
    (BASE + "matryoshka_dims: [true, 8]\n", "matryoshka_dims"),
    (BASE + "seed: 99999999999\n", "seed"),
], ids=["bool-max-steps", "negative-seed", "huge-lr", "huge-temperature", "duplicate-key", "bool-logging-steps",
        "bool-in-list", "seed-beyond-numpy"])
def test_a_recipe_value_the_flag_would_refuse_is_refused(body, key, tmp_path, tiny_bert, capsys):
    data = write_jsonl(tmp_path / "pairs.jsonl", [{"anchor": r["query"], "positive": r["document"]}
                                                   for r in paraphrase_rows(negatives=0, extra=False)][:16])
    recipe = _recipe(tmp_path, body)
    code, _, err = run_main(["train-contrastive", "--model", tiny_bert, "--data", f"p={data}", "--recipe", recipe,
                             "--output", tmp_path / "run"], capsys)
    one_line_refusal(code, err, str(recipe), key)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("loader, text", [
    ("pretrain", "training:\n  seed: -1\n"),
    ("pretrain", "training:\n  max_steps: true\n"),
    ("pretrain", "training:\n  micro_batch_size: true\n"),
    ("glue", "learning_rate: [5.0]\n"),
    ("glue", "epochs: 3\nepochs: 4\n"),
], ids=["pretrain-negative-seed", "pretrain-bool-steps", "pretrain-bool-batch", "glue-huge-lr", "glue-duplicate"])
def test_every_recipe_reader_is_as_strict(loader, text, tmp_path):
    from neobert_embed.glue.presets import load_glue_preset
    from neobert_embed.pretraining.recipe import load_pretrain_recipe

    base = (REPO / "recipes" / "pretrain-tiny.yaml").read_text(encoding="utf-8") if loader == "pretrain" else ""
    path = tmp_path / "recipe.yaml"
    path.write_text(_merged(base, text) if base else text, encoding="utf-8")
    load = load_pretrain_recipe if loader == "pretrain" else load_glue_preset
    with pytest.raises(UserInputError, match=r"recipe\.yaml:\d+: key"):
        load(path)


def _merged(base: str, extra: str) -> str:
    """``base`` YAML with the keys of the one-section ``extra`` set inside its section."""
    import yaml

    data = yaml.safe_load(base)
    for section, values in yaml.safe_load(extra).items():
        data.setdefault(section, {}).update(values)
    return yaml.safe_dump(data)


class PoisonAt(TrainerCallback):
    """Make the weights NaN at the start of ``step`` (1-based), as a diverged update would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step + 1 == self.step:
            next(model.parameters()).data.fill_(float("nan"))


@pytest.mark.parametrize("poison, last_good", [(1, "none"), (4, "checkpoint-3")], ids=["first-step", "after-a-save"])
def test_training_stops_at_the_first_non_finite_step(poison, last_good, tmp_path, tiny_bert):
    from neobert_embed.contrastive import load_contrastive_recipe, train_contrastive

    data = write_jsonl(tmp_path / "pairs.jsonl", [{"anchor": r["query"], "positive": r["document"]}
                                                   for r in paraphrase_rows(negatives=0, extra=False)][:24])
    recipe = load_contrastive_recipe(TINY_RECIPE, max_steps=6, save_steps=3, text_budget=8, max_length=16)
    run = tmp_path / "run"
    with pytest.raises(UserInputError) as stopped:
        train_contrastive(model=str(tiny_bert), data={"p": str(data)}, output=run, recipe=recipe,
                          callbacks=[PoisonAt(poison)])
    message = str(stopped.value)
    assert "\n" not in message and f"step {poison}" in message and "learning rate" in message
    assert last_good in message
    losses = [row["loss"] for row in (read_metrics(run) if (run / "metrics.jsonl").exists() else [])]
    assert all(np.isfinite(loss) and loss != 0.0 for loss in losses)
    kept = sorted(p.name for p in (run / "checkpoints").glob("checkpoint-*")) if run.exists() else []
    assert kept == ([] if last_good == "none" else [last_good])


# 4. strict judgements: one reader for index eval and mteb -----------------------------------------

CORPUS = ["red cats purr", "blue dogs bark", "green birds sing", "black fish swim", "white cows moo", "pink pigs oink"]
QUERIES = [{"_id": "q1", "text": "a cat"}, {"_id": "q2", "text": "a dog"}]
HEADER = "query-id\tcorpus-id\tscore\n"
QRELS = {
    "half-grade": HEADER + "q1\td0\t0.5\nq2\td1\t1\n",
    "infinite-grade": HEADER + "q1\td0\tinf\nq2\td1\t1\n",
    "fractional-grade": HEADER + "q1\td0\t2.7\nq2\td1\t1\n",
    "conflicting-duplicate": HEADER + "q1\td0\t1\nq2\td1\t1\nq1\td0\t0\n",
    "no-header": "q1\td0\t1\nq2\td1\t1\n",
    "absent-document": HEADER + "q1\td0\t1\nq2\tnot-indexed\t1\n",
}
MESSAGES = {"half-grade": "integer", "infinite-grade": "integer", "fractional-grade": "integer",
            "conflicting-duplicate": "again", "no-header": "header", "absent-document": "not-indexed"}


@pytest.fixture(scope="module")
def small_index(tmp_path_factory, prompted_bert) -> Path:
    from neobert_embed.index import build_index

    root = tmp_path_factory.mktemp("index")
    corpus = write_corpus(root / "corpus.jsonl", CORPUS)
    build_index(str(prompted_bert), corpus, root / "idx", index_type="flat", compute_precision="fp32",
                show_progress=False)
    return root / "idx"


def _beir_task(directory: Path, qrels: str, with_task_json: bool) -> Path:
    directory.mkdir(parents=True)
    write_corpus(directory / "corpus.jsonl", CORPUS)
    write_jsonl(directory / "queries.jsonl", QUERIES)
    (directory / "qrels").mkdir()
    (directory / "qrels" / "test.tsv").write_text(qrels, encoding="utf-8")
    if with_task_json:
        (directory / "task.json").write_text(json.dumps({"name": "LocalRetrieval", "type": "Retrieval"}))
    return directory


@pytest.mark.parametrize("case", list(QRELS))
def test_index_eval_reads_judgements_strictly(case, tmp_path, small_index, capsys):
    task = _beir_task(tmp_path / "task", QRELS[case], with_task_json=False)
    code, out, err = run_main(["index", "eval", small_index, "--task-dir", task], capsys)
    one_line_refusal(code, err, "test.tsv", MESSAGES[case])


@pytest.mark.parametrize("case", [c for c in QRELS if c != "absent-document"])  # mteb refused that one already
def test_mteb_local_tasks_read_judgements_alike(case, tmp_path):
    from neobert_embed.evaluation.local_tasks import check_task_data, load_task_dir

    task = _beir_task(tmp_path / "task", QRELS[case], with_task_json=True)
    with pytest.raises(UserInputError, match=MESSAGES[case]) as refused:
        check_task_data(load_task_dir(task))
    assert "test.tsv" in str(refused.value) and "\n" not in str(refused.value)


# 5. server -----------------------------------------------------------------------------------------

def test_an_index_that_disappears_is_refused_with_503_and_reported(tmp_path, small_index, prompted_bert, caplog):
    import shutil

    from fastapi.testclient import TestClient

    from neobert_embed.serve.app import create_app
    from neobert_embed.serve.settings import ServeSettings

    served = tmp_path / "news"
    shutil.copytree(small_index, served)
    app = create_app(ServeSettings(model=str(prompted_bert), indexes=[str(served)], precision="fp32"))
    with TestClient(app) as client:
        assert client.post("/search", json={"query": "a cat", "k": 2}).status_code == 200
        shutil.rmtree(served)
        with caplog.at_level(logging.ERROR):
            refused = client.post("/search", json={"query": "a cat", "k": 2})
        health = client.get("/health").json()
    assert refused.status_code == 503 and "disappeared" in refused.json()["error"]["message"]
    assert any("disappeared" in record.getMessage() for record in caplog.records)
    assert health["status"] != "ok" and "news" in json.dumps(health.get("unavailable_indexes"))


@pytest.mark.parametrize("host, api_key, warned", [("0.0.0.0", None, True), ("::", None, True),
                                                    ("127.0.0.1", None, False), ("0.0.0.0", "s3cret", False)],
                         ids=["any-v4", "any-v6", "loopback", "with-key"])
def test_serve_warns_when_exposed_without_a_key_and_bounds_connections(host, api_key, warned, tiny_bert,
                                                                       monkeypatch, capsys):
    import uvicorn

    from neobert_embed.serve import settings

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: calls.append(kwargs))  # nothing is bound
    monkeypatch.setattr(settings, "check_port_free", lambda *args: None)
    args = ["serve", "--model", tiny_bert, "--host", host, "--precision", "fp32"]
    code, out, err = run_main(args + (["--api-key", api_key] if api_key else []), capsys)
    assert code == 0, err
    said = out + err
    assert ("without an API key" in said) is warned, said
    limits = calls[0]
    assert limits.get("timeout_keep_alive") and limits.get("h11_max_incomplete_event_size")
    assert isinstance(limits.get("http"), type)  # the protocol with a request deadline


def _connection_closed_within(url: str, seconds: float, send: bytes) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=seconds + 5) as sock:
        if send:
            sock.sendall(send)
        started = time.monotonic()
        sock.settimeout(0.2)
        while time.monotonic() - started < seconds:
            try:
                if sock.recv(1024) == b"":
                    return True
            except TimeoutError:
                if send:
                    sock.sendall(b"X")  # dribble: one byte of header at a time
            except OSError:
                return True
    return False


@pytest.mark.parametrize("send", [b"", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "], ids=["silent", "dribbling"])
def test_slow_or_silent_connections_are_closed(send):
    import threading

    import uvicorn
    from fastapi import FastAPI
    from serve_helpers import free_port

    from neobert_embed.serve.connections import connection_limits

    app = FastAPI()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           **connection_limits(read_seconds=0.5)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        assert _connection_closed_within(f"http://127.0.0.1:{port}", 4.0, send)
    finally:
        server.should_exit = True
        thread.join(10)
