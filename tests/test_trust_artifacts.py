"""Fault suite, round 4 (issue 49, classes 1 and 2): every artifact the toolkit reads is verified before
use, and nothing it reads runs code.

Each case damages or edits one artifact the way a bad disk, a careless edit or a hostile user would, then
runs the command that reads it. The property: a refusal is exit 2 and ONE line on stderr naming the file
and what to do (no traceback), before any output is written; a damaged resumable artifact (a shard, the
newest checkpoint) is replaced by a good one, with a warning; a pickle payload never runs. Every case
failed on the code before this suite (commit 0d927b1): the table is in the closing note of issue 49.

The models are tiny BERTs built from configs, the export an ONNX one; the whole file runs in ~2 minutes
on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safety_helpers import fault_world, run_main, snapshot, write_jsonl

pytest.importorskip("onnxruntime")


def refused(result: tuple[int, str, str], *words: str) -> str:
    """The one error line of a refused command (exit 2, no traceback), holding ``words``."""
    code, _, err = result
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2, f"exit {code}: {err[-2000:]}"
    assert len(lines) == 1 and lines[0].startswith("error:"), err[-2000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def succeeded(result: tuple[int, str, str]) -> str:
    code, out, err = result
    assert code == 0, err[-2000:]
    return out + err


# --- the world: a prompted tiny BERT, an index built with it, its ONNX export -------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    from neobert_embed.inference.export import export_model

    root = tmp_path_factory.mktemp("trust")
    paths = fault_world(root)
    export_model(paths["model"], root / "export", "onnx")
    return {**paths, "export": root / "export"}


@pytest.fixture(scope="module")
def other_export(tmp_path_factory) -> Path:
    """The export of another model of the same architecture (same graph size, other weights)."""
    from tiny_models import build_tiny_model

    from neobert_embed.inference.export import export_model
    from neobert_embed.sentence import load_sentence_model

    root = tmp_path_factory.mktemp("other")
    load_sentence_model(str(build_tiny_model("bert", root / "plain", seed=1))).save(str(root / "st"))
    export_model(root / "st", root / "export", "onnx")
    return root / "export"


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def _edit_json(path: Path, change: Callable[[dict], None]) -> None:
    value = json.loads(path.read_text(encoding="utf-8"))
    change(value)
    path.write_text(json.dumps(value, indent=2), encoding="utf-8")


def _nan_weights(graph: Path) -> None:
    """Overwrite the largest weight tensor of an ONNX graph with NaN, in place (same size)."""
    import onnx

    largest = max(onnx.load(str(graph)).graph.initializer, key=lambda t: len(t.raw_data))
    data = bytearray(graph.read_bytes())
    start = data.find(largest.raw_data)
    assert start > 0
    data[start:start + len(largest.raw_data)] = np.full(len(largest.raw_data) // 4, np.nan, np.float32).tobytes()
    graph.write_bytes(bytes(data))


def _no_lowercase(directory: Path) -> None:
    def change(tokenizer: dict) -> None:
        tokenizer["normalizer"]["lowercase"] = False
    _edit_json(directory / "tokenizer.json", change)


def _cls_pooling(directory: Path) -> None:
    _edit_json(directory / "1_Pooling" / "config.json", lambda c: c.update(pooling_mode="cls"))


def _add_normalize(directory: Path) -> None:
    def change(modules: list) -> None:
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": "2_Normalize",
                        "type": "sentence_transformers.sentence_transformer.modules.Normalize"})
    _edit_json(directory / "modules.json", change)
    (directory / "2_Normalize").mkdir()


EXPORT_EDITS: dict[str, tuple[Callable[[Path, dict], None], tuple[str, ...]]] = {
    "graph weights NaN (same size)": (lambda e, w: _nan_weights(e / "onnx" / "model.onnx"), ("model.onnx",)),
    "another model's graph under the export record": (
        lambda e, w: shutil.copyfile(w["other"] / "onnx" / "model.onnx", e / "onnx" / "model.onnx"), ("model.onnx",)),
    "pooling mean -> cls": (lambda e, w: _cls_pooling(e), ("1_Pooling/config.json",)),
    "tokenizer lower-casing removed": (lambda e, w: _no_lowercase(e), ("tokenizer.json",)),
    "do_lower_case switched on": (lambda e, w: _edit_json(e / "sentence_bert_config.json",
                                                          lambda c: c.update(do_lower_case=True)),
                                  ("sentence_bert_config.json",)),
    "prompts edited": (lambda e, w: _edit_json(e / "config_sentence_transformers.json",
                                               lambda c: c["prompts"].update(query="search: ")),
                       ("config_sentence_transformers.json",)),
    "Normalize module appended": (lambda e, w: _add_normalize(e), ("modules.json",)),
    "tokenizer_config.json deleted": (lambda e, w: (e / "tokenizer_config.json").unlink(),
                                      ("tokenizer_config.json", "missing")),
    "an export without pins (older version)": (lambda e, w: _edit_json(e / "export.json", lambda r: r.pop("pins", None)),
                                               ("export.json", "export the model again")),
}


@pytest.mark.parametrize("case", list(EXPORT_EDITS))
def test_an_edited_or_damaged_export_is_refused_by_encode(case, world, other_export, tmp_path, capsys):
    edit, words = EXPORT_EDITS[case]
    export = _copy(world["export"], tmp_path / "export")
    edit(export, {**world, "other": other_export})
    out = tmp_path / "out.npy"
    refused(run_main(["encode", "--model", export, "--backend", "onnx", "--input", world["texts"],
                      "--output", out], capsys), *words)
    assert not out.exists()


def test_an_int8_graph_the_export_did_not_write_is_refused(world, tmp_path, capsys):
    export = _copy(world["export"], tmp_path / "export")
    shutil.copyfile(export / "onnx" / "model.onnx", export / "onnx" / "model_qint8_avx512_vnni.onnx")
    refused(run_main(["encode", "--model", export, "--backend", "onnx", "--precision", "int8", "--input",
                      world["texts"], "--output", tmp_path / "out.npy"], capsys),
            "model_qint8_avx512_vnni.onnx", "export the model again")


def test_an_edited_export_is_refused_by_the_torch_backend_too(world, tmp_path, capsys):
    export = _copy(world["export"], tmp_path / "export")
    _cls_pooling(export)
    refused(run_main(["encode", "--model", export, "--backend", "torch", "--input", world["texts"],
                      "--output", tmp_path / "out.npy"], capsys), "1_Pooling/config.json")


def test_an_index_built_with_a_model_accepts_its_export_but_not_an_edited_one(world, tmp_path, capsys):
    """The positive half passes on the old code too; the edited export was searched there (exit 0)."""
    succeeded(run_main(["index", "search", world["index"], "doc 3", "--model", world["export"]], capsys))
    export = _copy(world["export"], tmp_path / "export")
    _cls_pooling(export)
    refused(run_main(["index", "search", world["index"], "doc 3", "--model", export], capsys),
            "1_Pooling/config.json")


def test_index_add_refuses_an_edited_export_and_leaves_the_index_as_it_was(world, tmp_path, capsys):
    index, export = _copy(world["index"], tmp_path / "index"), _copy(world["export"], tmp_path / "export")
    _no_lowercase(export)
    before = snapshot(index)
    refused(run_main(["index", "add", index, "--corpus", world["new_docs"], "--model", export], capsys),
            "tokenizer.json")
    assert snapshot(index) == before


# --- the fingerprint an index checks covers pooling, normalization and the tokenizer ------------------

MODEL_EDITS = {"pooling mean -> cls": _cls_pooling,
               "tokenizer lower-casing switched off": lambda model: _edit_json(  # transformers builds from this
                   model / "tokenizer_config.json", lambda c: c.update(do_lower_case=False)),
               "Normalize module appended": _add_normalize}


@pytest.mark.parametrize("case", list(MODEL_EDITS))
def test_an_index_refuses_its_model_once_its_settings_changed(case, world, tmp_path, capsys):
    model = _copy(world["model"], tmp_path / "model")
    MODEL_EDITS[case](model)
    refused(run_main(["index", "search", world["index"], "doc 3", "--model", model], capsys),
            "fingerprint", "rebuild the index")


# --- a damaged index is never searched, and `add` never re-records its checksums ----------------------


def _zero_vectors(index: Path) -> None:
    """Zero the stored vectors of a flat ``index.faiss`` in place (same size)."""
    path = index / "index.faiss"
    data = bytearray(path.read_bytes())
    data[-30 * 32 * 4:] = bytes(30 * 32 * 4)
    path.write_bytes(bytes(data))


def _edit_stored_text(index: Path) -> None:
    path = index / "documents.sqlite"
    data = path.read_bytes()
    assert b"doc 5 on topic" in data
    path.write_bytes(data.replace(b"doc 5 on topic", b"DOC 9 ON TOPIC"))


INDEX_DAMAGE = {"index.faiss vectors zeroed (same size)": (_zero_vectors, "index.faiss"),
                "a stored text changed (same size)": (_edit_stored_text, "documents.sqlite")}


@pytest.mark.parametrize("case", list(INDEX_DAMAGE))
def test_a_damaged_index_is_not_searched(case, world, tmp_path, capsys):
    damage, name = INDEX_DAMAGE[case]
    index = _copy(world["index"], tmp_path / "index")
    damage(index)
    refused(run_main(["index", "search", index, "doc 3"], capsys), name, "index verify")


def test_index_add_does_not_launder_a_damaged_index(world, tmp_path, capsys):
    index = _copy(world["index"], tmp_path / "index")
    _zero_vectors(index)
    before = snapshot(index)
    refused(run_main(["index", "add", index, "--corpus", world["new_docs"]], capsys), "index.faiss")
    assert snapshot(index) == before
    code, _, _ = run_main(["index", "verify", index], capsys)
    assert code == 1  # still flagged: the checksums were not re-recorded over the damage


def test_serve_refuses_a_damaged_index_before_loading_the_model(world, tmp_path):
    from neobert_embed.errors import UserInputError
    from neobert_embed.serve.app import build_state
    from neobert_embed.serve.settings import ServeSettings

    index = _copy(world["index"], tmp_path / "index")
    _zero_vectors(index)
    with pytest.raises(UserInputError, match="index.faiss"):
        build_state(ServeSettings(model=str(world["model"]), indexes=[str(index)]))


# --- index build --resume: shards verified, the corpus identified by its content ----------------------


def _interrupted_build(world: dict[str, Path], output: Path) -> Path:
    from neobert_embed.index import build_index
    from neobert_embed.runs import Interrupted

    def stop(done):
        if done.chunk == 2:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted):
        build_index(world["model"], world["corpus"], output, index_type="flat", chunk_size=8, show_progress=False,
                    compute_precision="fp32", on_chunk=stop)
    return output.with_name(f".{output.name}.partial") / "shards"


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:200])


def _flip_shard(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-64:] = np.full(16, 7.0, np.float32).tobytes()
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _flip_shard], ids=["truncated shard", "changed shard (same size)"])
def test_build_resume_encodes_a_damaged_shard_again(damage, world, tmp_path):
    from neobert_embed.index import build_index, open_index

    output = tmp_path / "index"
    shards = _interrupted_build(world, output)
    damage(shards / "chunk-000001.npy")
    with warnings.catch_warnings():
        build_index(world["model"], world["corpus"], output, index_type="flat", chunk_size=8, show_progress=False,
                    compute_precision="fp32", resume=True)
    with open_index(output) as resumed, open_index(world["index"]) as reference:
        vectors = resumed.faiss_index.reconstruct_n(0, 30)
        np.testing.assert_allclose(vectors, reference.faiss_index.reconstruct_n(0, 30), atol=1e-5)


def test_build_resume_refuses_a_corpus_whose_content_changed(world, tmp_path):
    from neobert_embed.errors import UserInputError
    from neobert_embed.index import build_index

    corpus = tmp_path / "corpus.jsonl"
    shutil.copyfile(world["corpus"], corpus)
    output = tmp_path / "index"
    _interrupted_build({**world, "corpus": corpus}, output)
    stat = corpus.stat()
    corpus.write_bytes(corpus.read_bytes().replace(b"doc 1 ", b"doc 7 "))  # same size
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same modification time
    with pytest.raises(UserInputError, match="corpus_fingerprint"):
        build_index(world["model"], corpus, output, index_type="flat", chunk_size=8, show_progress=False,
                    compute_precision="fp32", resume=True)


# --- remote code is refused in one line ----------------------------------------------------------------


def _remote_model(world: dict[str, Path], target: Path) -> Path:
    model = _copy(world["model"], target)
    _edit_json(model / "config.json", lambda c: c.update(model_type="my-own-bert",
                                                         auto_map={"AutoModel": "modeling_mine.MyBert"}))
    (model / "modeling_mine.py").write_text(f"open({str(target / 'RAN')!r}, 'w')\n", encoding="utf-8")
    return model


def _remote_tokenizer(world: dict[str, Path], target: Path) -> Path:
    model = _copy(world["model"], target)
    _edit_json(model / "tokenizer_config.json", lambda c: c.update(
        tokenizer_class="MyTokenizer", auto_map={"AutoTokenizer": ["tokenization_mine.MyTokenizer", None]}))
    (model / "tokenization_mine.py").write_text(f"open({str(target / 'RAN')!r}, 'w')\n", encoding="utf-8")
    return model


def _remote_module(world: dict[str, Path], target: Path) -> Path:
    model = _copy(world["model"], target)

    def change(modules: list) -> None:
        modules[1]["type"] = "my_pooling.MyPooling"
    _edit_json(model / "modules.json", change)
    (model / "my_pooling.py").write_text(f"open({str(target / 'RAN')!r}, 'w')\n", encoding="utf-8")
    return model


@pytest.mark.parametrize(("make", "name"), [(_remote_model, "config.json"), (_remote_tokenizer, "tokenizer_config.json"),
                                            (_remote_module, "modules.json")],
                         ids=["config auto_map", "tokenizer auto_map", "a module of its own"])
def test_a_model_with_remote_code_is_refused_in_one_line(make, name, world, tmp_path, capsys):
    model = make(world, tmp_path / "remote")
    refused(run_main(["encode", "--model", model, "--input", world["texts"], "--output", tmp_path / "o.npy"],
                     capsys), name, "never runs code")
    assert not (tmp_path / "remote" / "RAN").exists()


# --- pretraining checkpoints: nothing unpickled runs, damaged newest falls back, data by content ------


class Payload:
    """Pickles as a call of ``open(marker, "w")``: what an attacker's file would run on load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.fixture(scope="module")
def pretrain_run(tmp_path_factory) -> dict[str, Path]:
    """A tiny pretraining run on a raw corpus, stopped after step 4 with checkpoints at steps 2 and 4."""
    from pretraining_helpers import single_thread, tiny_recipe, write_docstring_corpus

    from neobert_embed.pretraining import pretrain
    from neobert_embed.pretraining.recipe import parse_pretrain_recipe

    root = tmp_path_factory.mktemp("pretrain")
    corpus = write_docstring_corpus(root / "corpus.jsonl", 120)
    recipe = parse_pretrain_recipe({**tiny_recipe(max_steps=6), "tokenizer": {"source": "train", "vocab_size": 300}})
    with single_thread():
        pretrain(recipe, corpus, root / "run", stop_after_steps=4, progress=False)
    return {"root": root, "corpus": corpus, "run": root / "run", "recipe": recipe}


def _poisoned_run(pretrain_run: dict[str, Path], target: Path, file: str) -> tuple[Path, Path]:
    """A copy of the run whose newest checkpoint's ``file`` carries a payload, re-hashed in its manifest
    (whoever can write the file can write the manifest)."""
    import torch

    from neobert_embed.pretraining.checkpoint import _write_manifest

    shutil.copytree(pretrain_run["root"], target)
    run, marker = target / "run", target / "RAN"
    newest = run / "checkpoints" / "step-00000004"
    state = torch.load(newest / file, weights_only=False)
    state["extra"] = Payload(marker)
    torch.save(state, newest / file)
    _write_manifest(newest)
    return run, marker


@pytest.mark.parametrize("file", ["engine.pt", "rng-rank0.pt"])
def test_pretrain_resume_never_runs_a_pickled_payload(file, pretrain_run, tmp_path):
    from pretraining_helpers import single_thread

    from neobert_embed.pretraining import pretrain

    run, marker = _poisoned_run(pretrain_run, tmp_path / "copy", file)
    with single_thread(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = pretrain(pretrain_run["recipe"], pretrain_run["corpus"], run, resume=True, progress=False)
    assert not marker.exists()
    assert result.step == 6
    assert any(file in str(w.message) for w in caught)  # it says what it did not load


def test_pretrain_export_never_runs_a_pickled_payload(pretrain_run, tmp_path, capsys):
    run, marker = _poisoned_run(pretrain_run, tmp_path / "copy", "engine.pt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = run_main(["pretrain", "export", run, "--output", tmp_path / "hf"], capsys)
    assert not marker.exists()
    assert code == 0, err  # from the checkpoint before, said in a warning
    assert any("step-00000004" in str(w.message) for w in caught)


def test_pretrain_resume_refuses_a_corpus_whose_content_changed(pretrain_run, tmp_path):
    from neobert_embed.errors import UserInputError
    from neobert_embed.pretraining import pretrain

    shutil.copytree(pretrain_run["root"] / "run", tmp_path / "run")
    corpus = pretrain_run["corpus"]  # the run records it by its absolute path
    original, stat = corpus.read_bytes(), corpus.stat()
    try:
        corpus.write_bytes(original.replace(b"e", b"E", 40))  # same size
        os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same modification time
        with pytest.raises(UserInputError, match="data_content.*corpus.jsonl"):
            pretrain(pretrain_run["recipe"], corpus, tmp_path / "run", resume=True, progress=False)
    finally:
        corpus.write_bytes(original)
        os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns))


# --- train-contrastive: a damaged newest checkpoint falls back, data identified by content ------------


@pytest.fixture(scope="module")
def contrastive_run(tmp_path_factory, world) -> dict[str, Path]:
    """A tiny contrastive run stopped (Ctrl-C) after step 4, with checkpoints at steps 2 and 4."""
    from contrastive_helpers import TINY_RECIPE
    from transformers import TrainerCallback

    from neobert_embed.contrastive import load_contrastive_recipe, train_contrastive
    from neobert_embed.runs import Interrupted

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 4:
                signal.raise_signal(signal.SIGINT)

    root = tmp_path_factory.mktemp("contrastive")
    data = write_jsonl(root / "pairs.jsonl", [{"query": f"q {i}", "document": f"answer {i}"} for i in range(24)])
    recipe = load_contrastive_recipe(TINY_RECIPE, max_steps=6, save_steps=2, save_total_limit=3)
    with pytest.raises(Interrupted):
        train_contrastive(model=str(world["model"]), data={"p": str(data)}, output=root / "run", recipe=recipe,
                          callbacks=[StopAt()])
    return {"root": root, "run": root / "run", "data": data}


@pytest.mark.parametrize("file", ["optimizer.pt", "model.safetensors"])
def test_contrastive_resume_falls_back_from_a_truncated_newest_checkpoint(file, contrastive_run, tmp_path, caplog):
    from neobert_embed.contrastive import train_contrastive

    run = _copy(contrastive_run["run"], tmp_path / "run")
    _truncate(run / "checkpoints" / "checkpoint-4" / file)
    train_contrastive(output=run, resume=True)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"].endswith("checkpoint-2")
    assert any("checkpoint-4" in record.getMessage() for record in caplog.records)


def test_contrastive_resume_refuses_data_whose_content_changed(contrastive_run, tmp_path):
    from neobert_embed.contrastive import train_contrastive
    from neobert_embed.errors import UserInputError

    run = _copy(contrastive_run["run"], tmp_path / "run")
    data = contrastive_run["data"]
    original, stat = data.read_bytes(), data.stat()
    try:
        data.write_bytes(original.replace(b"answer 1\"", b"answer 9\""))  # same size
        os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        with pytest.raises(UserInputError, match="data_content.*pairs.jsonl"):
            train_contrastive(output=run, resume=True)
    finally:
        data.write_bytes(original)
