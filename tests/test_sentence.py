"""load_sentence_model, text validation and the `encode` command."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import numpy as np
import pytest
from tiny_models import build_tiny_model
from typer.testing import CliRunner

from neobert_embed import load_sentence_model
from neobert_embed.cli import app
from neobert_embed.encoding import check_texts, encode_texts
from neobert_embed.errors import UserInputError

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {arch: build_tiny_model(arch, root / arch) for arch in ("bert", "roberta", "neobert")}


def test_max_seq_length_comes_from_the_model_not_the_tokenizer(tiny_dirs):
    assert load_sentence_model(str(tiny_dirs["bert"])).max_seq_length == 128
    assert load_sentence_model(str(tiny_dirs["roberta"])).max_seq_length == 128  # 130 slots - pad offset
    assert load_sentence_model(str(tiny_dirs["bert"]), max_seq_length=16).max_seq_length == 16



def test_roberta_position_offset_comes_from_the_backbone_table(tiny_dirs, monkeypatch):
    import neobert_embed.backbones as backbones

    roberta = load_sentence_model(str(tiny_dirs["roberta"]))
    long_text = " ".join(["word"] * 400)
    assert roberta.tokenize([long_text])["input_ids"].shape[1] == 128
    assert roberta.encode([long_text]).shape == (1, 32)  # 128 tokens fit positions 2..129 of 130
    monkeypatch.setattr(backbones, "POSITIONS_AFTER_PAD", frozenset())  # the table is the one source
    assert load_sentence_model(str(tiny_dirs["roberta"])).max_seq_length == 130
    assert load_sentence_model(str(tiny_dirs["bert"])).max_seq_length == 128

def test_neobert_uses_its_full_context(tmp_path):
    path = build_tiny_model("neobert", tmp_path / "neo")
    config = json.loads((path / "config.json").read_text())
    config["max_length"] = 4096
    config.pop("max_position_embeddings", None)
    (path / "config.json").write_text(json.dumps(config))
    model = load_sentence_model(str(path))
    assert model.max_seq_length == 4096
    assert model.tokenizer.model_max_length >= 128  # tokenizer default does not cap the model


def test_saved_model_reloads_in_a_fresh_process(tiny_dirs, tmp_path):
    model = load_sentence_model(str(tiny_dirs["neobert"]), prompts={"query": "query: "})
    texts = ["a cat sits on the mat", "short", ""]
    expected = model.encode(texts)
    model.save(str(tmp_path / "st"))
    script = (
        "import sys, json, numpy as np\n"
        "import neobert_embed\n"
        "from sentence_transformers import SentenceTransformer\n"
        "m = SentenceTransformer(sys.argv[1])\n"
        "print(json.dumps({'emb': m.encode(json.loads(sys.argv[2])).tolist(), 'prompts': m.prompts,"
        " 'len': m.max_seq_length}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "st"), json.dumps(texts)],
                         capture_output=True, text=True, check=True, env={"HF_HUB_OFFLINE": "1",
                                                                          "PATH": "/usr/bin:/bin"})
    result = json.loads(out.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(np.array(result["emb"]), expected, atol=1e-5)
    assert result["prompts"]["query"] == "query: "
    assert result["len"] == model.max_seq_length


def test_unknown_backbone_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserInputError, match="cannot load model 'no-such-org/no-such-model'"):
        load_sentence_model("no-such-org/no-such-model")


def test_empty_and_whitespace_texts_encode_as_cls_sep(tiny_dirs):
    model = load_sentence_model(str(tiny_dirs["neobert"]))
    assert model.tokenizer(["", "   \t "])["input_ids"] == [[101, 102], [101, 102]]
    vectors = encode_texts(model, ["", "   ", "x"])
    np.testing.assert_allclose(vectors[0], vectors[1], atol=1e-6)
    assert np.isfinite(vectors).all()


def test_non_string_input_names_the_index():
    with pytest.raises(TypeError, match=r"texts\[2\] is NoneType"):
        check_texts(["a", "b", None])
    with pytest.raises(TypeError, match="not one string"):
        check_texts("a single string")


def test_long_text_is_truncated_with_one_warning(tiny_dirs, caplog):
    model = load_sentence_model(str(tiny_dirs["bert"]), max_seq_length=16)
    long_text = "word " * 200
    with caplog.at_level(logging.WARNING, logger="neobert_embed.encoding"):
        vectors = encode_texts(model, [long_text, long_text, "short"])
    warnings = [r for r in caplog.records if "truncated" in r.getMessage()]
    assert len(warnings) == 1 and "2 of 3 texts" in warnings[0].getMessage()
    cut = " ".join(["word"] * 14)  # 16 tokens with [CLS] and [SEP]
    np.testing.assert_allclose(vectors[0], encode_texts(model, [cut])[0], atol=1e-5)


@pytest.mark.parametrize(("precision", "dtype", "width"),
                         [("float32", np.float32, 32), ("float16", np.float16, 32), ("int8", np.int8, 32),
                          ("binary", np.int8, 4)])
def test_encode_command_writes_each_precision(tiny_dirs, tmp_path, precision, dtype, width):
    source = tmp_path / "texts.txt"
    source.write_text("first line\n\nthird line after a blank one\n")
    out = tmp_path / "emb.npy"
    result = runner.invoke(app, ["encode", "--model", str(tiny_dirs["neobert"]), "--input", str(source),
                                 "--output", str(out), "--store-precision", precision, "--json", "--blank", "keep"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    matrix = np.load(out)
    assert matrix.shape == (3, width) and matrix.dtype == dtype  # the blank line keeps its row
    assert report["texts"] == 3 and report["texts_per_second"] > 0


def test_encode_command_reads_jsonl_field_and_names_bad_lines(tiny_dirs, tmp_path):
    good = tmp_path / "docs.jsonl"
    good.write_text('{"body": "alpha"}\n{"body": "beta"}\n')
    out = tmp_path / "e.npy"
    ok = runner.invoke(app, ["encode", "-m", str(tiny_dirs["bert"]), "-i", str(good), "-o", str(out),
                             "--field", "body"])
    assert ok.exit_code == 0 and np.load(out).shape == (2, 32)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    result = subprocess.run([sys.executable, "-m", "neobert_embed.cli", "encode", "-m", str(tiny_dirs["bert"]),
                             "-i", str(bad), "-o", str(tmp_path / "x.npy")], capture_output=True, text=True)
    assert result.returncode == 2
    assert f"{bad}:2: not valid UTF-8" in result.stderr
    missing = runner.invoke(app, ["encode", "-m", str(tiny_dirs["bert"]), "-i", str(good), "-o",
                                  str(tmp_path / "e2.npy")])  # a fresh output: an existing one is refused
    assert isinstance(missing.exception, UserInputError) and f"{good}:1: field 'text' is missing" in str(
        missing.exception)
    assert not (tmp_path / "x.npy").exists()
