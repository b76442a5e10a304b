"""load_sentence_model, text validation and the `encode` command."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time

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


ENCODE_TEXTS = ["first line", "", "third line after a blank one"]


@pytest.fixture(scope="module")
def neobert_fp32(tiny_dirs) -> np.ndarray:
    """fp32 vectors of ENCODE_TEXTS straight from the model: no command, no stored format."""
    return load_sentence_model(str(tiny_dirs["neobert"])).encode(ENCODE_TEXTS, convert_to_numpy=True)


def _decoded(matrix: np.ndarray, precision: str, sidecar: dict) -> np.ndarray:
    """Float vectors back from stored codes, by the formats' definitions (written out here, not the library's)."""
    if precision == "int8":  # code = floor((x - min) / step) - 128 with step = (max - min) / 255: bucket midpoints
        low, high = np.asarray(sidecar["calibration"]["ranges"], dtype=np.float64)
        return low + (matrix.astype(np.float64) + 128 + 0.5) * (high - low) / 255
    return matrix.astype(np.float64)


@pytest.mark.parametrize(("precision", "dtype", "width", "cosine_floor"),
                         [("float32", np.float32, 32, 0.999999), ("float16", np.float16, 32, 0.99999),
                          ("int8", np.int8, 32, 0.999), ("binary", np.int8, 4, None)])
def test_encode_command_stores_each_precision_true_to_fp32(tiny_dirs, neobert_fp32, tmp_path, precision, dtype,
                                                            width, cosine_floor):
    """Stored values against the model's fp32 vectors: float16 keeps 11 significant bits (cosine
    >= 0.99999), int8 is within half a bucket of every value (cosine >= 0.999 for 256 buckets per
    dimension), binary holds exactly the fp32 signs."""
    source = tmp_path / "texts.txt"
    source.write_text("".join(text + "\n" for text in ENCODE_TEXTS))
    out = tmp_path / "emb.npy"
    started = time.perf_counter()
    result = runner.invoke(app, ["encode", "--model", str(tiny_dirs["neobert"]), "--input", str(source),
                                 "--output", str(out), "--store-precision", precision, "--precision", "fp32",
                                 "--json", "--blank", "keep"])
    wall = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    matrix = np.load(out)
    assert matrix.shape == (3, width) and matrix.dtype == dtype  # the blank line keeps its row
    reference = neobert_fp32.astype(np.float64)
    if precision == "binary":  # packed sign bits, shifted by -128 into int8
        bits = np.unpackbits((matrix.astype(np.int16) + 128).astype(np.uint8), axis=1).astype(bool)
        np.testing.assert_array_equal(bits, reference > 0)
    else:
        sidecar = json.loads((tmp_path / "emb.npy.json").read_text())
        decoded = _decoded(matrix, precision, sidecar)
        if precision == "int8":
            low, high = np.asarray(sidecar["calibration"]["ranges"], dtype=np.float64)
            assert np.all(np.abs(decoded - reference) <= (high - low) / 510 + 1e-6)
        cosines = (decoded * reference).sum(1) / np.linalg.norm(decoded, axis=1) / np.linalg.norm(reference, axis=1)
        assert cosines.min() >= cosine_floor, cosines
    # the speed figure: the texts over the measured seconds (rounded to 1 ms), inside the command's wall time
    seconds, rate = report["seconds"], report["texts_per_second"]
    assert report["texts"] == 3 and 0 <= seconds <= wall
    assert 3 / (seconds + 5e-4) - 0.05 <= rate <= 3 / max(seconds - 5e-4, 1e-9) + 0.05, (seconds, rate)


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
