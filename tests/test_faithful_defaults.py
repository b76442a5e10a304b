"""Every command that encodes uses the model's own length and prompts by default, and says so.

The real all-MiniLM-L6-v2 is the model under test: its authors set ``max_seq_length`` 256 while its
position embeddings allow 512, so a default that silently used the position limit would show.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from neobert_embed.cli import app

LONG = " ".join(f"word{i % 50} of a very long scientific abstract" for i in range(120))
CORPUS = [{"_id": "d1", "title": "Paris", "text": "The capital of France is a large city."},
          {"_id": "d2", "title": "", "text": "A document without any title."},
          {"_id": "d3", "title": "Long", "text": LONG}]


@pytest.fixture(scope="module")
def minilm(minilm_path):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_path), device="cpu")
    assert model.max_seq_length == 256 and model[0].auto_model.config.max_position_embeddings == 512
    return model


def encode(model, texts: list[str], length: int = 256) -> np.ndarray:
    previous, model.max_seq_length = model.max_seq_length, length
    try:
        return model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    finally:
        model.max_seq_length = previous


def indexed_vectors(index_dir: Path) -> np.ndarray:
    import faiss

    index = faiss.read_index(str(index_dir / "index.faiss"))
    return index.reconstruct_n(0, index.ntotal)


def test_index_build_joins_titles_like_mteb_and_truncates_at_the_models_length(minilm_path, minilm, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in CORPUS), encoding="utf-8")
    # fp32: the vectors are compared to plain fp32 encodes at 1e-5 (the default, auto, may pick bf16)
    result = CliRunner().invoke(app, ["index", "build", "--model", str(minilm_path), "--corpus", str(corpus),
                                      "--output", str(tmp_path / "index"), "--index-type", "flat",
                                      "--precision", "fp32"])
    assert result.exit_code == 0, result.output
    assert "max_seq_length 256" in result.stderr and "title=title" in result.stderr
    vectors = indexed_vectors(tmp_path / "index")
    expected = encode(minilm, [f"{d['title']} {d['text']}".strip() for d in CORPUS])  # mteb's _corpus_to_dict
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    assert not np.allclose(vectors[2], encode(minilm, [CORPUS[2]["text"]], length=512)[0], atol=1e-3)
    assert json.loads((tmp_path / "index" / "manifest.json").read_text())["max_seq_length"] == 256

    untitled = CliRunner().invoke(app, ["index", "build", "--model", str(minilm_path), "--corpus", str(corpus),
                                        "--output", str(tmp_path / "untitled"), "--index-type", "flat",
                                        "--title-field", "", "--precision", "fp32"])
    assert untitled.exit_code == 0, untitled.output
    assert "no title" in untitled.stderr
    np.testing.assert_allclose(indexed_vectors(tmp_path / "untitled"), encode(minilm, [d["text"] for d in CORPUS]),
                               atol=1e-5)

    search = CliRunner().invoke(app, ["index", "search", str(tmp_path / "index"), "capital of France", "--json"])
    assert search.exit_code == 0, search.output
    assert "max_seq_length 256; no query prompt" in search.stderr
    assert json.loads(search.stdout.splitlines()[0])["hits"][0]["id"] == "d1"


def test_encode_uses_the_models_length_and_prompts_and_says_so(minilm_path, minilm, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text(f"a short text\n{LONG}\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["encode", "--model", str(minilm_path), "--input", str(texts),
                                      "--output", str(tmp_path / "out.npy"), "--json", "--precision", "fp32"])
    assert result.exit_code == 0, result.output
    assert re.search(r"used: precision fp32 \(asked for\); un-padded BertModel layers(; batches side by side, one "
                     r"per thread)?; max_seq_length 256; no document prompt", result.stderr), result.stderr
    report = json.loads(result.stdout)
    assert report["max_seq_length"] == 256 and report["prompt"] is None
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), minilm.encode(["a short text", LONG]), atol=1e-5)

    longer = CliRunner().invoke(app, ["encode", "--model", str(minilm_path), "--input", str(texts),
                                      "--output", str(tmp_path / "long.npy"), "--max-length", "512"])
    assert longer.exit_code == 0 and "max_seq_length 512" in longer.stderr
    unknown = CliRunner().invoke(app, ["encode", "--model", str(minilm_path), "--input", str(texts),
                                       "--output", str(tmp_path / "x.npy"), "--prompt-name", "classification"])
    assert unknown.exit_code != 0 and "no such prompt" in str(unknown.exception)


def test_mine_negatives_says_what_it_encodes_with(minilm_path, tmp_path):
    from contrastive_helpers import paraphrase_rows, write_jsonl

    data = write_jsonl(tmp_path / "pairs.jsonl", paraphrase_rows(negatives=0, extra=False))
    result = CliRunner().invoke(app, ["mine-negatives", "--model", str(minilm_path), "--data", str(data),
                                      "--output", str(tmp_path / "mined.jsonl"), "--num-negatives", "1"])
    assert result.exit_code == 0, result.output
    assert "; max_seq_length 256; no query prompt; no document prompt; field 'anchor/positive'" in result.stderr
    assert "used: precision " in result.stderr  # default auto: the precision it chose, and why


@pytest.fixture(scope="module")
def prompted_minilm(minilm, tmp_path_factory):
    """all-MiniLM-L6-v2 saved with a query prompt and a default prompt (as e5/bge-style models ship)."""
    directory = tmp_path_factory.mktemp("prompted") / "minilm-prompted"
    previous = dict(minilm.prompts), minilm.default_prompt_name
    minilm.prompts, minilm.default_prompt_name = {"query": "query: ", "passage": "passage: "}, "passage"
    try:
        minilm.save(str(directory))
    finally:
        minilm.prompts, minilm.default_prompt_name = previous
    return directory


def test_one_prompt_rule_for_every_command_and_the_server(prompted_minilm, minilm, tmp_path):
    """A side's own prompt (sentence-transformers 5 saves 'document': '' with every model, which is none),
    else the model's default prompt, else none; '' is none; an unknown name the user typed is an error;
    encode, index build and serve apply the same rule as sentence-transformers' encode."""
    from sentence_transformers import SentenceTransformer

    from neobert_embed.errors import UserInputError
    from neobert_embed.inference.runtime import load_inference_model
    from neobert_embed.sentence import resolve_prompt
    from neobert_embed.serve.engine import Embedder

    model = SentenceTransformer(str(prompted_minilm), device="cpu")
    assert model.prompts == {"query": "query: ", "document": "", "passage": "passage: "}
    assert [resolve_prompt(model, name) for name in ("query", "document", None, "", "title")] == \
        ["query: ", "", "passage: ", "", "passage: "]
    with pytest.raises(UserInputError, match=r"--prompt-name 'title': the model has no such prompt \(saved "
                                             r"prompts: document, passage, query\)"):
        resolve_prompt(model, "title", required="--prompt-name")

    texts = tmp_path / "texts.txt"
    texts.write_text("a short text\nanother one\n", encoding="utf-8")
    runs = {name: CliRunner().invoke(app, ["encode", "--model", str(prompted_minilm), "--input", str(texts),
                                           "--output", str(tmp_path / f"{name!r}.npy"), "--precision", "fp32",
                                           *(["--prompt-name", name] if name is not None else [])])
            for name in (None, "query", "", "title")}
    unknown = runs.pop("title")  # a name the user typed and the model lacks
    assert unknown.exit_code != 0 and "no such prompt" in str(unknown.exception)
    assert all(result.exit_code == 0 for result in runs.values()), [r.output for r in runs.values()]
    assert "; no document prompt\n" in runs[None].stderr  # its empty document prompt, as encode_document applies
    assert "prompt 'query' = 'query: '" in runs["query"].stderr and "; no prompt\n" in runs[""].stderr
    plain = ["a short text", "another one"]
    np.testing.assert_allclose(np.load(tmp_path / "None.npy"), model.encode_document(plain), atol=1e-5)
    for name, prefix in ((None, ""), ("query", "query: "), ("", "")):
        np.testing.assert_allclose(np.load(tmp_path / f"{name!r}.npy"),
                                   minilm.encode([prefix + text for text in plain]), atol=1e-5)

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in CORPUS[:2]), encoding="utf-8")
    built = CliRunner().invoke(app, ["index", "build", "--model", str(prompted_minilm), "--corpus", str(corpus),
                                     "--output", str(tmp_path / "index"), "--precision", "fp32"])
    assert built.exit_code == 0, built.output
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text())
    assert manifest["prompts"] == {"query": "query: ", "document": ""}  # what was applied to each side, recorded
    assert "; no document prompt" in built.stderr

    engine = Embedder(load_inference_model(str(prompted_minilm), "fp32"))
    assert engine.prompt_for(None) == "passage: " and engine.prompt_for("query") == "query: "
    with pytest.raises(UserInputError, match="prompt_name 'nope': the model has no such prompt"):
        engine.prompt_for("nope")
