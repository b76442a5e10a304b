"""Each way of losing a user's data that was reported, reproduced exactly: nothing is lost now.

Two concurrent ``index add`` runs; ``pretrain export``, ``demo --fresh`` and ``train-contrastive
--overwrite`` into a directory holding a user's file; ``encode`` with output == input; int8 codes
of overlapping texts encoded in two files; ``index add --row-ids`` twice.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safety_helpers import REPO, build_prompted_bert, cli_env, run_main, snapshot, write_jsonl

from neobert_embed.index import add_documents, build_index, read_manifest
from neobert_embed.locks import lock_path, writer_lock

TOPICS = ("cats", "dogs", "oil prices", "stock markets", "football", "rain")


def _texts(n: int, offset: int = 0) -> list[str]:
    return [f"note {i} about {TOPICS[i % len(TOPICS)]} with {i * 7 % 13} details" for i in range(offset, offset + n)]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_prompted_bert(tmp_path_factory.mktemp("models"))


def _ids(index_dir: Path) -> list[str]:
    with sqlite3.connect(index_dir / "documents.sqlite") as db:
        return [row[0] for row in db.execute("SELECT doc_id FROM documents WHERE deleted = 0 ORDER BY row")]


def _foreign_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "thesis.tex").write_text("three years of work", encoding="utf-8")
    return path


# 1. lost update -------------------------------------------------------------------------------


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def test_two_concurrent_index_adds_keep_both_corpora(model, tmp_path, capsys):
    index = tmp_path / "index"
    base = write_jsonl(tmp_path / "base.jsonl", [{"_id": f"d{i}", "text": t} for i, t in enumerate(_texts(30))])
    build_index(model, base, index, index_type="flat", show_progress=False)
    corpora = [write_jsonl(tmp_path / f"{name}.jsonl", [{"_id": f"{name}{i}", "text": t}
                                                        for i, t in enumerate(_texts(30, offset))])
               for name, offset in (("a", 100), ("b", 200))]
    # Hold the index's writer lock while both start, so their writes are guaranteed to overlap.
    with writer_lock(index, command="test holding the lock"):
        logs = [tmp_path / f"add-{i}.err" for i in range(2)]
        procs = [subprocess.Popen([sys.executable, "-m", "neobert_embed.cli", "index", "add", str(index),
                                   "--corpus", str(corpus)], stdout=subprocess.PIPE, stderr=log.open("w"),
                                  env=cli_env(), text=True)
                 for corpus, log in zip(corpora, logs, strict=True)]
        _wait_for(lambda: all("waiting for" in log.read_text() for log in logs), 400, "both adds to wait")
        assert "test holding the lock" in logs[0].read_text()
        code, _, err = run_main(["index", "add", index, "--corpus", corpora[0], "--no-wait"], capsys)
        assert code == 2 and "is being written by pid" in err and len(err.strip().splitlines()) == 1
    for proc in procs:
        assert proc.wait(timeout=600) == 0, proc.stderr
    manifest = read_manifest(index)
    ids = _ids(index)
    assert manifest.documents == len(ids) == 90 and manifest.vectors == 90
    assert {f"a{i}" for i in range(30)} | {f"b{i}" for i in range(30)} <= set(ids)
    assert sorted(manifest.sources[1:]) == sorted(map(str, corpora))


def test_a_crashed_writer_is_detected_and_its_debris_cleared(model, tmp_path, capsys):
    index = tmp_path / "index"
    base = write_jsonl(tmp_path / "base.jsonl", [{"_id": f"d{i}", "text": t} for i, t in enumerate(_texts(20))])
    build_index(model, base, index, index_type="flat", show_progress=False)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    note = lock_path(index).with_name(lock_path(index).name + ".json")
    note.write_text(json.dumps({"pid": int(dead.stdout), "host": "h", "command": "index add", "since": "2026"}))
    debris = tmp_path / ".index.x1y2.tmp"
    debris.mkdir()
    (debris / "index.faiss").write_bytes(b"half written")
    more = write_jsonl(tmp_path / "more.jsonl", [{"_id": "new", "text": "fresh news"}])
    seen = []
    manifest = add_documents(index, more, show_progress=False)
    assert manifest.documents == 21 and not debris.exists() and not note.exists()
    with writer_lock(index, command="x", on_stale=seen.append):
        pass
    assert seen == []  # a clean exit leaves no stale note


# 2. directories wiped ----------------------------------------------------------------------------


def test_pretrain_export_into_a_foreign_directory_deletes_nothing(tmp_path, capsys):
    from pretraining_helpers import single_thread, tiny_recipe, write_docstring_corpus

    from neobert_embed.pretraining import prepare_corpus, pretrain
    from neobert_embed.pretraining.recipe import parse_pretrain_recipe

    raw = write_docstring_corpus(tmp_path / "docs.jsonl", limit=120)
    prepared = prepare_corpus(raw, tmp_path / "prepared", tokenizer="train", vocab_size=300, progress=False)
    with single_thread():
        pretrain(parse_pretrain_recipe(tiny_recipe(max_steps=2)), prepared.path, tmp_path / "run", progress=False)
    target = _foreign_dir(tmp_path / "models")
    before = snapshot(target)
    code, _, err = run_main(["pretrain", "export", tmp_path / "run", "--output", target], capsys)
    assert code == 2 and "thesis.tex" in err and "nothing was deleted" in err
    assert snapshot(target) == before
    code, _, _ = run_main(["pretrain", "export", tmp_path / "run", "--output", tmp_path / "exported"], capsys)
    assert code == 0 and (tmp_path / "exported" / "export.json").is_file()
    code, _, _ = run_main(["pretrain", "export", tmp_path / "run", "--output", tmp_path / "exported"], capsys)
    assert code == 0  # its own earlier export is replaced


def test_demo_fresh_refuses_a_directory_it_did_not_make(tmp_path, capsys):
    target = _foreign_dir(tmp_path / "work")
    before = snapshot(target)
    code, _, err = run_main(["demo", "--fresh", "--quick", "--output", target], capsys)
    assert code == 2 and "stages.json" in err and "nothing was deleted" in err
    assert snapshot(target) == before


def test_train_contrastive_overwrite_keeps_a_foreign_directory(model, tmp_path, capsys):
    from contrastive_helpers import TINY_RECIPE, paraphrase_rows

    data = write_jsonl(tmp_path / "pairs.jsonl", paraphrase_rows())
    target = _foreign_dir(tmp_path / "run")
    before = snapshot(target)
    code, _, err = run_main(["train-contrastive", "--model", model, "--data", f"p={data}", "--recipe",
                             TINY_RECIPE, "--output", target, "--overwrite"], capsys)
    assert code == 2 and "run.json" in err and "nothing was deleted" in err
    assert snapshot(target) == before


def test_train_contrastive_validation_failure_leaves_no_run_behind(model, tmp_path, capsys):
    from contrastive_helpers import TINY_RECIPE

    rows = [{"query": f"question {i}", "document": "the same answer"} for i in range(40)]
    data = write_jsonl(tmp_path / "dupes.jsonl", rows)
    output = tmp_path / "run"
    args = ["train-contrastive", "--model", model, "--data", f"p={data}", "--recipe", TINY_RECIPE,
            "--max-steps", "2", "--output", output]
    code, _, err = run_main(args, capsys)
    assert code == 2 and "cannot fill a single batch" in err
    assert not output.exists()  # a rerun with fixed data is not blocked


# 3. files overwritten ----------------------------------------------------------------------------


def test_encode_refuses_to_write_over_its_input_or_a_foreign_file(model, tmp_path, capsys):
    texts = tmp_path / "t.txt"
    texts.write_text("\n".join(_texts(5)) + "\n", encoding="utf-8")
    before = snapshot(texts)
    code, _, err = run_main(["encode", "--model", model, "--input", texts, "--output", texts], capsys)
    assert code == 2 and "also an input" in err and snapshot(texts) == before
    code, _, err = run_main(["encode", "--model", model, "--input", texts, "--output", texts, "--overwrite"],
                            capsys)
    assert code == 2 and snapshot(texts) == before
    foreign = tmp_path / "vectors.npy"
    np.save(foreign, np.arange(4))
    kept = snapshot(foreign)
    for extra in ([], ["--overwrite"]):
        code, _, err = run_main(["encode", "--model", model, "--input", texts, "--output", foreign, *extra],
                                capsys)
        assert code == 2 and snapshot(foreign) == kept, err
    out = tmp_path / "mine.npy"
    assert run_main(["encode", "--model", model, "--input", texts, "--output", out], capsys)[0] == 0
    assert run_main(["encode", "--model", model, "--input", texts, "--output", out], capsys)[0] == 2
    assert run_main(["encode", "--model", model, "--input", texts, "--output", out, "--overwrite"], capsys)[0] == 0
    umask_mode = 0o666 & ~_umask()
    assert out.stat().st_mode & 0o777 == umask_mode  # the user's umask, not 0600


def _umask() -> int:
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# 4. int8 vectors that don't compare ---------------------------------------------------------------


def test_int8_codes_of_the_same_text_match_across_files_with_the_saved_calibration(model, tmp_path, capsys):
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("\n".join(_texts(40)) + "\n", encoding="utf-8")
    second.write_text("\n".join(_texts(40, offset=20) + ["zzz unrelated outlier " * 20]) + "\n", encoding="utf-8")
    # batch size 1: a text's float vector is then bit-identical in any file (no padding differences)
    encode = ["encode", "--model", model, "--store-precision", "int8", "--json", "--batch-size", "1"]
    code, out, _ = run_main([*encode, "--input", first, "--output", tmp_path / "first.npy"], capsys)
    assert code == 0 and json.loads(out)["calibration"] == str(tmp_path / "first.npy.json")
    sidecar = json.loads((tmp_path / "first.npy.json").read_text())
    assert sidecar["calibration"]["precision"] == "int8" and len(sidecar["calibration"]["ranges"][0]) == 32
    code, _, _ = run_main([*encode, "--input", second, "--output", tmp_path / "second.npy", "--calibration",
                           tmp_path / "first.npy.json"], capsys)
    assert code == 0
    a, b = np.load(tmp_path / "first.npy"), np.load(tmp_path / "second.npy")
    assert a.dtype == np.int8 and np.array_equal(a[20:40], b[:20])  # lines 21-40 of first = 1-20 of second
    code, _, _ = run_main([*encode, "--input", second, "--output", tmp_path / "own.npy"], capsys)
    own = np.load(tmp_path / "own.npy")[:20].astype(int)
    assert np.abs(own - a[20:40]).max() > 1  # its own ranges: the reported mismatch
    # Batched encoding pads differently per file; float rounding may then move a value across a
    # bucket boundary, never further.
    batched = ["encode", "--model", model, "--store-precision", "int8", "--batch-size", "16"]
    run_main([*batched, "--input", first, "--output", tmp_path / "f16.npy"], capsys)
    run_main([*batched, "--input", second, "--output", tmp_path / "s16.npy", "--calibration",
              tmp_path / "f16.npy.json"], capsys)
    drift = np.abs(np.load(tmp_path / "f16.npy")[20:40].astype(int) - np.load(tmp_path / "s16.npy")[:20])
    assert drift.max() <= 1
    code, _, err = run_main(["encode", "--model", model, "--store-precision", "binary", "--input", second,
                             "--output", tmp_path / "bin.npy", "--calibration", tmp_path / "first.npy.json"],
                            capsys)
    assert code == 2 and "--store-precision int8" in err


def test_encode_with_a_calibration_computes_at_the_precision_its_vectors_came_from(model, tmp_path, capsys):
    """Two runs of ``auto`` may choose two precisions (a tiny model sits near the bar on a CPU with bf16
    units), and codes of one text then differ by a step: a calibration carries its vectors' precision."""
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("\n".join(_texts(30)) + "\n", encoding="utf-8")
    second.write_text("\n".join(_texts(30, offset=10)) + "\n", encoding="utf-8")
    encode = ["encode", "--model", model, "--store-precision", "int8", "--json", "--batch-size", "1"]
    assert run_main([*encode, "--input", first, "--output", tmp_path / "first.npy", "--precision", "bf16"],
                    capsys)[0] == 0
    code, _, err = run_main([*encode, "--input", second, "--output", tmp_path / "second.npy", "--calibration",
                             tmp_path / "first.npy.json"], capsys)
    assert code == 0 and "precision bf16 (the calibration's own" in err
    compute = json.loads((tmp_path / "second.npy.json").read_text())["compute"]
    assert compute["precision"] == "bf16" and compute["requested"] == "calibration"
    a, b = np.load(tmp_path / "first.npy"), np.load(tmp_path / "second.npy")
    assert np.array_equal(a[10:30], b[:20])
    # --precision still decides when given
    assert run_main([*encode, "--input", second, "--output", tmp_path / "fp32.npy", "--calibration",
                     tmp_path / "first.npy.json", "--precision", "fp32"], capsys)[0] == 0
    assert json.loads((tmp_path / "fp32.npy.json").read_text())["compute"]["requested"] == "fp32"
    # a calibration file of its own records no compute precision: auto, as without one
    sidecar = json.loads((tmp_path / "first.npy.json").read_text())
    (tmp_path / "plain.json").write_text(json.dumps(sidecar["calibration"]), encoding="utf-8")
    assert run_main([*encode, "--input", second, "--output", tmp_path / "plain.npy", "--calibration",
                     tmp_path / "plain.json"], capsys)[0] == 0
    assert json.loads((tmp_path / "plain.npy.json").read_text())["compute"]["requested"] == "auto"
    # an exported graph computes as saved: the recorded bf16 does not apply there (and is no error)
    assert run_main(["export", model, "--format", "onnx", "--output", tmp_path / "onnx"], capsys)[0] == 0
    assert run_main([*encode[:2], tmp_path / "onnx", *encode[3:], "--backend", "onnx", "--input", second,
                     "--output", tmp_path / "onnx.npy", "--calibration", tmp_path / "first.npy.json"], capsys)[0] == 0
    assert json.loads((tmp_path / "onnx.npy.json").read_text())["compute"]["precision"] == "fp32"
    # a damaged record is one line naming the file and the key, before the model loads
    sidecar["compute"]["precision"] = "int4"
    (tmp_path / "damaged.npy.json").write_text(json.dumps(sidecar), encoding="utf-8")
    code, _, err = run_main([*encode, "--input", second, "--output", tmp_path / "damaged_out.npy",
                             "--calibration", tmp_path / "damaged.npy.json"], capsys)
    assert code == 2 and "damaged.npy.json" in err and "compute" in err and "precision" in err


# 5. replace that destroys --------------------------------------------------------------------------


def test_index_add_row_ids_twice_continues_numbering(model, tmp_path, capsys):
    index = tmp_path / "index"
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(_texts(10)) + "\n", encoding="utf-8")
    assert run_main(["index", "build", "--model", model, "--corpus", corpus, "--output", index,
                     "--index-type", "flat"], capsys)[0] == 0
    original = dict(zip(_ids(index), _texts(10), strict=True))
    batch = tmp_path / "more.jsonl"
    write_jsonl(batch, [{"text": t} for t in _texts(5, offset=50)])
    for _ in range(2):
        code, _, err = run_main(["index", "add", index, "--corpus", batch, "--row-ids"], capsys)
        assert code == 0, err
    ids = _ids(index)
    assert ids == [str(i) for i in range(1, 21)]
    with sqlite3.connect(index / "documents.sqlite") as db:
        kept = dict(db.execute("SELECT doc_id, text FROM documents WHERE row < 10").fetchall())
    assert kept == original  # the original documents are untouched
    before = snapshot(index)
    code, _, err = run_main(["index", "add", index, "--corpus", batch, "--row-ids", "--on-duplicate", "replace"],
                            capsys)
    assert code == 2 and "never name an indexed document" in err and snapshot(index) == before
    clash = write_jsonl(tmp_path / "clash.jsonl", [{"_id": "3", "text": "another document"}])
    code, _, err = run_main(["index", "add", index, "--corpus", clash], capsys)
    assert code == 2 and "row number" in err and "--on-duplicate replace" not in err


# integrity ----------------------------------------------------------------------------------------


def test_manifest_checksums_and_index_verify(model, tmp_path, capsys):
    index = tmp_path / "index"
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"_id": f"d{i}", "text": t} for i, t in enumerate(_texts(12))])
    build_index(model, corpus, index, index_type="flat", show_progress=False)
    manifest = read_manifest(index)
    assert set(manifest.files) == {"index.faiss", "documents.sqlite"}
    code, out, _ = run_main(["index", "verify", index, "--json"], capsys)
    assert code == 0 and json.loads(out)["ok"] is True
    data = bytearray((index / "index.faiss").read_bytes())
    data[-5] ^= 0xFF  # same size, different content: only the checksum can tell
    (index / "index.faiss").write_bytes(bytes(data))
    code, out, _ = run_main(["index", "verify", index, "--json"], capsys)
    report = json.loads(out)
    assert code == 1 and not report["ok"] and "index.faiss: checksum differs" in report["problems"][0]


# checks before the expensive work, machine-readable output ----------------------------------------


def test_encoded_chunks_are_reused_when_only_the_index_type_changes(model, tmp_path, monkeypatch):
    from neobert_embed.index.encoder import IndexEncoder
    from neobert_embed.runs import Interrupted

    corpus = write_jsonl(tmp_path / "c.jsonl", [{"_id": f"d{i}", "text": t} for i, t in enumerate(_texts(40))])
    output = tmp_path / "index"

    def stop_after_last_chunk(done):
        if done.chunk == done.n_chunks - 1:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted):
        build_index(model, corpus, output, index_type="flat", chunk_size=16, show_progress=False,
                    on_chunk=stop_after_last_chunk)

    def no_encoding(*args, **kwargs):
        raise AssertionError("the resumed build encoded again")

    monkeypatch.setattr(IndexEncoder, "encode_in_length_order", no_encoding)
    manifest = build_index(model, corpus, output, resume=True, factory="HNSW8", chunk_size=16,
                           show_progress=False)
    assert manifest.factory == "HNSW8" and manifest.documents == 40


def test_train_contrastive_json_stdout_is_only_json(model, tmp_path):
    from contrastive_helpers import TINY_RECIPE, paraphrase_rows

    data = write_jsonl(tmp_path / "pairs.jsonl", paraphrase_rows())
    done = subprocess.run([sys.executable, "-m", "neobert_embed.cli", "train-contrastive", "--model", str(model),
                           "--data", f"p={data}", "--recipe", str(TINY_RECIPE), "--max-steps", "2", "--output",
                           str(tmp_path / "run"), "--json"], capture_output=True, text=True, env=cli_env(),
                          timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)  # the whole of stdout parses
    assert summary["steps"] == 2 and summary["output"] == str(tmp_path / "run")


def test_run_directories_take_the_writer_lock(model, tmp_path, capsys):
    from contrastive_helpers import TINY_RECIPE, paraphrase_rows
    from glue_helpers import tiny_task_dir

    data = write_jsonl(tmp_path / "pairs.jsonl", paraphrase_rows())
    run, pretraining = tmp_path / "run", tmp_path / "pretrain"
    commands = {
        run: ["train-contrastive", "--model", model, "--data", f"p={data}", "--recipe", TINY_RECIPE, "--output", run],
        pretraining: ["pretrain", "--recipe", REPO / "recipes" / "pretrain-tiny.yaml", "--corpus", data, "--output", pretraining],
        tmp_path / "demo": ["demo", "--quick", "--output", tmp_path / "demo"],
        tmp_path / "prepared": ["pretrain", "prepare", "--corpus", data, "--text-field", "query", "--tokenizer",
                                model, "--output", tmp_path / "prepared"],
        tmp_path / "glue": ["glue", "--model", model, "--task-dir", tiny_task_dir(tmp_path, "stsb"), "--output",
                            tmp_path / "glue"],
    }
    for target, args in commands.items():
        with writer_lock(target, command="another writer"):
            code, _, err = run_main([*args, "--no-wait"], capsys)
        assert code == 2 and "being written by" in err and "another writer" in err, err
        assert not target.exists()


def _sts_task(root: Path) -> Path:
    """A local mteb STS task of 12 pairs."""
    task = root / "sts"
    task.mkdir(parents=True)
    (task / "task.json").write_text(json.dumps({"name": "LocalSTS", "type": "STS", "min_score": 0, "max_score": 5}))
    rows = [{"sentence1": _texts(1, i)[0], "sentence2": _texts(1, i + j)[0], "score": float(5 - j)}
            for i in range(6) for j in (0, 3)]
    write_jsonl(task / "test.jsonl", rows)
    return task


def test_every_directory_writer_fails_at_once_with_no_wait_while_another_writes(model, tmp_path, capsys):
    """The commands the first lock round left out: export, convert, pretrain export and compare."""
    commands = {
        tmp_path / "onnx": ["export", model, "--format", "onnx", "--output", tmp_path / "onnx"],
        tmp_path / "converted": ["convert", tmp_path / "official", "--output", tmp_path / "converted"],
        tmp_path / "exported": ["pretrain", "export", tmp_path / "run", "--output", tmp_path / "exported"],
        tmp_path / "compare": ["compare", "--models", model, "--task-dir", _sts_task(tmp_path), "--output",
                               tmp_path / "compare"],
    }
    for target, args in commands.items():
        with writer_lock(target, command="another writer"):
            code, _, err = run_main([*args, "--no-wait"], capsys)
        assert code == 2 and "being written by" in err and "another writer" in err, (args[0], err)
        assert not target.exists()


def test_mteb_evaluations_of_one_model_take_turns_and_of_two_models_run_side_by_side(model, tmp_path, capsys):
    from neobert_embed.evaluation.run import plan_evaluation

    task, results = _sts_task(tmp_path), tmp_path / "mteb"
    other = tmp_path / "other-bert"
    shutil.copytree(model, other)
    with plan_evaluation(model, output=results, task_dirs=[task]).claimed(command="another writer"):
        code, _, err = run_main(["mteb", "--model", model, "--task-dir", task, "--output", results, "--no-wait"],
                                capsys)
        assert code == 2 and "being written by" in err and "another writer" in err, err
        assert not (results / "results").exists()
        code, out, err = run_main(["mteb", "--model", other, "--task-dir", task, "--output", results, "--no-wait"],
                                  capsys)
        assert code == 0, err
    assert "LocalSTS" in out and "done" in out
    assert [path.relative_to(results / "results").parts[0]
            for path in (results / "results").glob("*/*/*/*/LocalSTS.json")] == ["other-bert"]
    code, out, err = run_main(["mteb", "--model", model, "--task-dir", task, "--output", results, "--no-wait"],
                              capsys)
    assert code == 0 and "done" in out, err
