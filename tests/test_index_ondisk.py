"""Indexes larger than memory: IVF-PQ with exact re-ranking, and --on-disk lists merged from shards."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from index_helpers import tiny_bert_with_prompts, write_corpus
from typer.testing import CliRunner

from neobert_embed.cli import app
from neobert_embed.errors import UserInputError
from neobert_embed.index import add_documents, build_index, open_index, read_manifest
from neobert_embed.index.tuning import exact_neighbours, recall_at_k

WORDS = ("cats", "dogs", "oil", "stocks", "football", "rain", "tea", "trains", "music", "maps", "bread", "snow")
N_DOCS = 1000


def _text(i: int) -> str:
    return f"{WORDS[i % 12]} {WORDS[i * 5 % 11]} {WORDS[i * 7 % 12]} note {i % 97} of {i % 13} about {WORDS[i % 7]}"


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    return tiny_bert_with_prompts(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", [_text(i) for i in range(N_DOCS)])


def _recall_and_ids(index_dir: Path, queries: np.ndarray, exact: np.ndarray) -> tuple[float, np.ndarray]:
    with open_index(index_dir) as index:
        _, ids = index.search_vectors(queries, 10)
    return recall_at_k(ids, exact, 10), ids


def test_on_disk_ivfpq_in_four_shards_searches_like_the_in_memory_one(tiny_bert, corpus, tmp_path):
    from sentence_transformers import SentenceTransformer

    memory = tmp_path / "memory"
    build_index(tiny_bert, corpus, memory, index_type="ivfpq", chunk_size=250, show_progress=False,
                compute_precision="fp32")  # compared with fp32 sentence-transformers vectors below
    started = time.perf_counter()
    result = CliRunner().invoke(app, ["index", "build", "--model", str(tiny_bert), "--corpus", str(corpus),
                                      "--output", str(tmp_path / "disk"), "--index-type", "ivfpq",
                                      "--chunk-size", "250", "--on-disk", "--precision", "fp32"])
    wall = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    assert "lists on disk" in result.output and "trained on" in result.output
    disk = tmp_path / "moved"
    (tmp_path / "disk").rename(disk)                       # the lists file is found next to index.faiss
    manifest = read_manifest(disk)
    assert manifest.on_disk and manifest.rerank_k_factor and manifest.factory == read_manifest(memory).factory
    assert manifest.train_vectors == N_DOCS and 0 <= manifest.train_seconds <= wall  # training is part of the build
    assert sorted(p.name for p in disk.iterdir()) == ["documents.sqlite", "index.faiss", "index.ivfdata",
                                                      "manifest.json", "vectors.f16.npy"]
    assert (disk / "index.faiss").stat().st_size < (disk / "index.ivfdata").stat().st_size

    model = SentenceTransformer(str(tiny_bert), device="cpu")
    vectors = model.encode(["passage: " + _text(i) for i in range(N_DOCS)], normalize_embeddings=True)
    queries = model.encode([f"query: {WORDS[i % 12]} {WORDS[i % 5]} note {i}" for i in range(60)],
                           normalize_embeddings=True)
    exact = exact_neighbours(queries, [(0, vectors)], 10)
    recall_memory, ids_memory = _recall_and_ids(memory, queries, exact)
    recall_disk, ids_disk = _recall_and_ids(disk, queries, exact)
    assert abs(recall_disk - recall_memory) <= 1e-6
    np.testing.assert_array_equal(ids_disk, ids_memory)
    with open_index(memory) as index:                        # the same IVF-PQ without exact re-ranking
        _, raw_ids = index.faiss_index.reranked_base.search(queries, 10)
    assert recall_memory > recall_at_k(raw_ids, exact, 10) + 0.1

    with pytest.raises(UserInputError, match="--on-disk index is built once"):
        add_documents(disk, corpus)

    assert set(manifest.files) == {"index.faiss", "documents.sqlite", "index.ivfdata", "vectors.f16.npy"}
    verified = CliRunner().invoke(app, ["index", "verify", str(disk)])
    assert verified.exit_code == 0, verified.output
    with open(disk / "index.ivfdata", "r+b") as lists:        # a truncated lists file: one line, not a crash
        lists.truncate(lists.seek(0, 2) // 2)
    with pytest.raises(UserInputError, match="index.ivfdata: .* bytes, but .* were recorded in the manifest"):
        open_index(disk)
    assert CliRunner().invoke(app, ["index", "verify", str(disk)]).exit_code == 1


def test_add_to_a_reranked_index_keeps_checksums_and_float16_vectors(tiny_bert, corpus, tmp_path):
    index_dir = tmp_path / "pq"
    build_index(tiny_bert, corpus, index_dir, index_type="ivfpq", chunk_size=250, show_progress=False)
    extra = tmp_path / "late.jsonl"
    extra.write_text('{"_id": "late0", "text": "late note about tea"}\n'
                     '{"_id": "late1", "text": "late note about snow"}\n', encoding="utf-8")
    manifest = add_documents(index_dir, extra, show_progress=False)
    assert manifest.rerank_k_factor and "vectors.f16.npy" in manifest.files
    assert len(np.load(index_dir / "vectors.f16.npy", mmap_mode="r")) == N_DOCS + 2
    verified = CliRunner().invoke(app, ["index", "verify", str(index_dir)])
    assert verified.exit_code == 0, verified.output


def test_on_disk_refuses_indexes_without_inverted_lists(tiny_bert, corpus, tmp_path):
    with pytest.raises(UserInputError, match="--on-disk needs an IVF index"):
        build_index(tiny_bert, corpus, tmp_path / "x", index_type="hnsw", on_disk=True, show_progress=False)


def test_rerank_vectors_appear_whole_or_not_at_all(tmp_path):
    from neobert_embed.index.rerank import write_rerank_vectors

    path, vectors = tmp_path / "vectors.f16.npy", np.arange(24, dtype=np.float32).reshape(6, 4)
    write_rerank_vectors(path, [(0, vectors[:4]), (4, vectors[4:])], 6, 4)
    np.testing.assert_array_equal(np.load(path), vectors.astype(np.float16))
    with pytest.raises(ValueError, match="wrote 4 vectors, expected 6"):  # a stream cut short
        write_rerank_vectors(path, [(0, vectors[:4] + 1)], 6, 4)
    np.testing.assert_array_equal(np.load(path), vectors.astype(np.float16))  # the complete earlier file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vectors.f16.npy"]  # no temporary file left
