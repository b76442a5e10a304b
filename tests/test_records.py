"""Records: one declaration per kind, one way to write and read them, a located error for a damaged one.

The commands' own damaged-record cases (run.json, stages.json, a manifest, a trial result...) are in
test_fault_injection.py and test_hostile_inputs.py; here is the mechanism they share, and the check
that no module names a record file outside ``records.py``.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from neobert_embed.errors import UserInputError
from neobert_embed.outputs import DirectoryState, check_output_directory
from neobert_embed.records import (
    CHECKPOINT_MANIFEST,
    CORPUS_MANIFEST,
    DEMO_JOURNAL,
    INDEX_MANIFEST,
    PREPARE_STATE,
    RECORDS,
    RUN,
)

PACKAGE = Path(__file__).resolve().parents[1] / "neobert_embed"


def _example(record):
    return [{"name": "corpus"}] if record.shape is list else {"model": "bert", "steps": [1, 2]}


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: f"{r.holds} ({r.name})")
def test_every_record_round_trips_and_a_damaged_one_is_a_located_error(tmp_path, record):
    assert record.read(tmp_path) is None and not record.exists(tmp_path)
    path = record.write(tmp_path, _example(record))
    assert path == tmp_path / record.name and record.read(tmp_path) == _example(record)
    assert not [p for p in tmp_path.iterdir() if p != path]  # written through a temporary sibling, renamed
    path.write_text(path.read_text()[:-6], encoding="utf-8")  # cut short, as by a full disk
    with pytest.raises(UserInputError) as damaged:
        record.read(tmp_path)
    message = str(damaged.value)
    assert message.startswith(f"{path}:") and f"damaged {record.holds}" in message and record.fix in message
    assert "\n" not in message
    path.write_text("[1]" if record.shape is dict else "{}", encoding="utf-8")  # valid JSON, wrong shape
    with pytest.raises(UserInputError, match=rf"^{path}: damaged {record.holds} \(a JSON (object|array) was "
                                             r"expected, got (array|object)\)"):
        record.read(tmp_path)
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(UserInputError, match=rf"^{path}: damaged {record.holds} \(not UTF-8"):
        record.read(tmp_path)


def test_records_are_named_once_and_each_name_says_one_thing():
    names = [name for record in RECORDS for name in record.names]
    current = {record.name: record for record in RECORDS}
    assert set(names) == set(current) | {"manifest.json"}
    # summary.json is a training summary in a model directory and the demo's summary in its own; manifest.json is
    # the index manifest, and an older name of two pretraining records, read in directories those commands own
    shared = {name for name in current if [r.name for r in RECORDS].count(name) > 1}
    assert shared == {"summary.json"}


def test_no_module_names_a_record_file_outside_records():
    """File names of records are string constants in records.py only (docstrings and messages aside)."""
    names = {name for record in RECORDS for name in record.names}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "records.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                      and node.body and isinstance(node.body[0], ast.Expr)}
        found += [f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings]
    assert not found, "declare record files in neobert_embed/records.py: " + ", ".join(found)


@pytest.mark.parametrize("record", [CORPUS_MANIFEST, CHECKPOINT_MANIFEST], ids=lambda r: r.name)
def test_records_written_under_an_older_name_are_still_read_and_owned(tmp_path, record):
    (tmp_path / "manifest.json").write_text('{"shards": ["a.arrow"]}', encoding="utf-8")
    assert record.exists(tmp_path) and record.read(tmp_path) == {"shards": ["a.arrow"]}
    assert check_output_directory(tmp_path, record=record) is DirectoryState.OWNED
    record.write(tmp_path, {"shards": ["b.arrow"]})  # a new write uses the current name, which wins
    assert record.path(tmp_path).name == record.name and record.read(tmp_path) == {"shards": ["b.arrow"]}


def test_an_index_manifest_is_not_taken_for_an_older_corpus_manifest(tmp_path):
    """``manifest.json`` was the prepared corpus's record and is an index's now: an index folder
    must be foreign to ``pretrain prepare``, never its own output to replace."""
    (tmp_path / "manifest.json").write_text('{"factory": "Flat", "documents": 3}', encoding="utf-8")
    (tmp_path / "index.faiss").write_bytes(b"x")
    assert not CORPUS_MANIFEST.exists(tmp_path) and CORPUS_MANIFEST.read(tmp_path) is None
    with pytest.raises(UserInputError, match="no corpus.json or prepare.json, so it is not a prepared corpus"):
        check_output_directory(tmp_path, record=(CORPUS_MANIFEST, PREPARE_STATE), what="prepared corpus")
    (tmp_path / "manifest.json").write_text("{not json", encoding="utf-8")  # unreadable: not taken for ours either
    assert not CORPUS_MANIFEST.exists(tmp_path)


class _Settings(BaseModel):
    model: str
    steps: int


def test_a_typed_record_names_the_bad_key_and_what_to_do(tmp_path):
    RUN.write(tmp_path, {"model": "bert", "steps": "many"})
    with pytest.raises(UserInputError, match=r"run.json:3: key 'steps': .*integer.*; resume with a copy of it"):
        RUN.validate(tmp_path, _Settings)
    RUN.write(tmp_path, {"model": "bert", "steps": 3})
    assert RUN.validate(tmp_path, _Settings) == _Settings(model="bert", steps=3)


def test_the_demo_journal_is_a_list_and_an_index_manifest_an_object(tmp_path):
    DEMO_JOURNAL.write(tmp_path, [])
    assert DEMO_JOURNAL.read(tmp_path) == []
    INDEX_MANIFEST.write(tmp_path, {"format_version": 1})
    assert INDEX_MANIFEST.read(tmp_path) == {"format_version": 1}


def test_one_settings_digest_keeps_every_key_older_versions_wrote(tmp_path):
    """Results caches, GLUE's tokenised-data cache and resume guards key on files.value_digest; the keys
    must be the ones earlier versions wrote (else every cached score and resumable run is orphaned)."""
    import hashlib

    from neobert_embed.evaluation.recipe import EvaluationRecipe
    from neobert_embed.files import value_digest
    from neobert_embed.sources import fingerprint

    settings = {"precision": "fp32", "max_seq_length": 256, "prompts": {"query": "q: "}}
    assert value_digest(settings, 12) == hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    assert value_digest(dict(reversed(settings.items())), 12) == value_digest(settings, 12)
    recipe = EvaluationRecipe()
    expected = recipe.model_dump(exclude={"batch_size"})
    assert recipe.fingerprint() == hashlib.sha256(json.dumps(expected, sort_keys=True).encode()).hexdigest()[:12]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a"}\n', encoding="utf-8")
    # issue 49 changed a source's id on purpose from size and mtime to its content's SHA-256 (a resume must
    # notice a same-size edit); caches keyed on the old id are recomputed once, runs resume by data_content
    content = hashlib.sha256(corpus.read_bytes()).hexdigest()
    key = "\n".join(["split:train", f"{corpus.resolve()}:{content}"])
    assert fingerprint(str(corpus), "train") == hashlib.sha256(key.encode()).hexdigest()[:16]


def test_a_checkpoint_manifest_of_another_shape_is_a_corrupt_checkpoint_not_a_traceback(tmp_path):
    from neobert_embed.pretraining.checkpoint import CorruptCheckpoint, verify_checkpoint

    (tmp_path / "manifest.json").write_text('{"factory": "Flat"}', encoding="utf-8")  # an index's, say
    with pytest.raises(CorruptCheckpoint, match="entry 'factory' is not"):
        verify_checkpoint(tmp_path)


def test_pretrain_prepare_refuses_an_index_folder_and_leaves_it_whole(tmp_path):
    from typer.testing import CliRunner

    from neobert_embed.cli import app

    index = tmp_path / "idx"
    index.mkdir()
    (index / "manifest.json").write_text('{"factory": "Flat", "documents": 3}', encoding="utf-8")
    (index / "index.faiss").write_bytes(b"vectors")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world\nsecond document\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["pretrain", "prepare", "--corpus", str(corpus), "--output", str(index),
                                      "--tokenizer", "train", "--vocab-size", "100"])
    message = result.output + str(result.exception)
    assert result.exit_code != 0 and "not a prepared corpus written by neobert-embed" in message, message
    assert sorted(p.name for p in index.iterdir()) == ["index.faiss", "manifest.json"]
    assert (index / "index.faiss").read_bytes() == b"vectors"


def test_one_command_never_replaces_another_command_s_export(tmp_path):
    """``export`` and ``pretrain export`` both record ``export.json``; the writer in it decides."""
    from neobert_embed.pretraining.export import export_checkpoint

    onnx_export = tmp_path / "model-onnx"
    (onnx_export / "onnx").mkdir(parents=True)
    (onnx_export / "onnx" / "model.onnx").write_bytes(b"graph")
    (onnx_export / "export.json").write_text(json.dumps({"writer": "neobert-embed export", "written": ["onnx"]}),
                                              encoding="utf-8")
    with pytest.raises(UserInputError, match="written by 'neobert-embed export', not by neobert-embed pretrain export"):
        export_checkpoint(tmp_path / "no-such-run", onnx_export)
    assert (onnx_export / "onnx" / "model.onnx").read_bytes() == b"graph"


@pytest.mark.parametrize("content", [b'{"pid": 12', b"[1, 2]", b"\xff\xfe not utf-8", None],
                         ids=["cut short", "an array", "not UTF-8", "missing"])
def test_a_damaged_hint_file_is_simply_absent(tmp_path, content):
    """Sidecars, lock holders' notes, an output's list of what it wrote and a tiny model's config are
    hints: a damaged one reads as absent (files.read_json_object_or_none), never as an error."""
    from neobert_embed.demo.records import TINY, tiny_name
    from neobert_embed.locks import read_holder
    from neobert_embed.outputs import claimed_entries, read_sidecar, sidecar_path

    target = tmp_path / "out"
    hints = [sidecar_path(tmp_path / "vectors.npy"), tmp_path / ".out.lock.json", target / "manifest.json",
             tmp_path / "model" / "config.json"]
    for hint in hints:
        hint.parent.mkdir(parents=True, exist_ok=True)
        if content is not None:
            hint.write_bytes(content)
    assert read_sidecar(tmp_path / "vectors.npy") is None
    assert read_holder(target) is None
    assert claimed_entries(target, "manifest.json") == {"manifest.json"}
    assert tiny_name(tmp_path / "model") == TINY
    (tmp_path / "model" / "config.json").write_text('{"num_hidden_layers": 2, "hidden_size": 128}')
    assert tiny_name(tmp_path / "model") == f"{TINY} (2×128)"
