"""`neobert-embed convert`: official checkpoint → this package's format, strict key check."""

from __future__ import annotations

import json

import pytest
import torch
from official_checkpoint import HIDDEN, official_config, official_weights, write_official_checkpoint
from transformers import AutoModelForMaskedLM, AutoTokenizer
from typer.testing import CliRunner

from neobert_embed.cli import app
from neobert_embed.errors import UserInputError

runner = CliRunner()


def convert(*args: str):
    return runner.invoke(app, ["convert", *map(str, args)])


def test_convert_official_checkpoint(tmp_path):
    source = write_official_checkpoint(tmp_path / "official", tokenizer=True)
    result = convert(source, "--output", tmp_path / "converted")
    assert result.exit_code == 0, result.output
    assert "all keys and shapes matched" in " ".join(result.output.split())
    out = tmp_path / "converted"
    config = json.loads((out / "config.json").read_text())
    assert "auto_map" not in config and "trust_remote_code" not in config and "max_length" not in config
    assert config["architectures"] == ["NeoBERTForMaskedLM"] and config["max_position_embeddings"] == 64
    original, info = AutoModelForMaskedLM.from_pretrained(source, output_loading_info=True)
    converted = AutoModelForMaskedLM.from_pretrained(out)
    ids = torch.tensor([[101, 7592, 2088, 102]]) % 1000
    with torch.no_grad():
        assert torch.equal(original(ids).logits, converted(ids).logits)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.model_max_length == 64 and tokenizer("hello")["input_ids"][0] == 101


def test_existing_output_needs_overwrite(tmp_path):
    source = write_official_checkpoint(tmp_path / "official", tokenizer=True)
    (tmp_path / "converted").mkdir()
    result = convert(source, "--output", tmp_path / "converted")
    assert isinstance(result.exception, UserInputError) and "--overwrite" in str(result.exception)
    assert convert(source, "--output", tmp_path / "converted", "--overwrite").exit_code == 0


def test_key_problems_are_named_and_nothing_is_written(tmp_path):
    weights = official_weights()
    weights["model.transformer_encoder.0.ffn.w3.weight"] = torch.zeros(HIDDEN, 7)
    del weights["model.layer_norm.weight"]
    weights["model.pooler.weight"] = torch.zeros(3)
    source = write_official_checkpoint(tmp_path / "bad", weights, tokenizer=True)
    result = convert(source, "--output", tmp_path / "converted")
    message = str(result.exception)
    assert isinstance(result.exception, UserInputError)
    assert "missing keys (1): model.layer_norm.weight" in message
    assert "unexpected keys (1): model.pooler.weight" in message
    assert "model.transformer_encoder.0.ffn.w3.weight: checkpoint (64, 7) vs config (64, 72)" in message
    assert not (tmp_path / "converted").exists()


def test_bad_config_and_missing_tokenizer_are_clear(tmp_path):
    source = write_official_checkpoint(tmp_path / "odd", config=official_config(num_attention_heads=3))
    result = convert(source, "--output", tmp_path / "out")
    assert isinstance(result.exception, UserInputError)
    assert "config.json" in str(result.exception) and "divisible by num_attention_heads" in str(result.exception)
    source = write_official_checkpoint(tmp_path / "no-tokenizer")
    result = convert(source, "--output", tmp_path / "out")
    assert isinstance(result.exception, UserInputError) and "--tokenizer" in str(result.exception)
    missing = convert(tmp_path / "does-not-exist", "--output", tmp_path / "out")
    assert isinstance(missing.exception, UserInputError) and "not a local directory" in str(missing.exception)


def test_cli_exit_code_and_one_line_error(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(sys.executable).parent / "neobert-embed"
    proc = subprocess.run([str(script), "convert", str(tmp_path / "nowhere"), "--output", str(tmp_path / "o")],
                          capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "error:" in proc.stderr and "Traceback" not in proc.stderr


def test_a_tokenizer_with_ids_beyond_the_vocabulary_is_refused(tmp_path):
    small = 1000  # the tokenizer (bert-base-uncased) has 30,522 tokens: ids past 1,000 have no embedding
    weights = {name: tensor[:small] if name in ("model.encoder.weight", "decoder.weight", "decoder.bias") else tensor
               for name, tensor in official_weights().items()}
    source = write_official_checkpoint(tmp_path / "small", weights, official_config(vocab_size=small), tokenizer=True)
    result = convert(source, "--output", tmp_path / "converted")
    assert isinstance(result.exception, UserInputError), result.output
    assert "30,522 tokens" in str(result.exception) and "vocab_size is 1,000" in str(result.exception)
    assert not (tmp_path / "converted").exists()


@pytest.mark.parametrize("index", ["[]", '{"weight_map": ', '{"metadata": {}}'], ids=["array", "cut short", "no map"])
def test_a_damaged_shard_index_is_one_located_error(tmp_path, index):
    """A sharded checkpoint's model.safetensors.index.json is read as a record: the wrong top level
    (an AttributeError traceback before), a cut-short file or no weight_map name the file."""
    source = write_official_checkpoint(tmp_path / "sharded", tokenizer=True)
    (source / "model.safetensors.index.json").write_text(index, encoding="utf-8")
    result = convert(source, "--output", tmp_path / "out")
    assert isinstance(result.exception, UserInputError), result.exception
    assert "model.safetensors.index.json" in str(result.exception)
    assert not (tmp_path / "out").exists()
