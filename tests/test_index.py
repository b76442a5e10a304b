"""FAISS indexing through its public API and CLI: exactness, resume, add, model checks, corpus errors."""

from __future__ import annotations

import json
import shlex
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from index_helpers import auto_without_candidates  # noqa: F401  (module-wide: one precision for compared builds)
from tiny_models import build_tiny_model
from typer.testing import CliRunner

from neobert_embed.cli import app
from neobert_embed.errors import UserInputError
from neobert_embed.index import add_documents, build_index, open_index, read_manifest
from neobert_embed.index.encoder import IndexEncoder
from neobert_embed.index.tuning import RECALL_TARGET
from neobert_embed.runs import Interrupted

TOPICS = ("cats", "dogs", "oil prices", "stock markets", "football", "rain")


def _texts(n: int, offset: int = 0) -> list[str]:
    return [f"note {i} about {TOPICS[i % len(TOPICS)]} with {i * 7 % 13} details and {i % 5} more"
            for i in range(offset, offset + n)]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


PROMPTS = {"query": "query: ", "document": "passage: "}


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    """A tiny BERT saved as a SentenceTransformer that carries query/document prompts."""
    from neobert_embed.sentence import load_sentence_model

    directory = tmp_path_factory.mktemp("models")
    plain = build_tiny_model("bert", directory / "plain", seed=0)
    load_sentence_model(str(plain), prompts=PROMPTS).save(str(directory / "bert"))
    return directory / "bert"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rows = [{"_id": f"d{i}", "text": text} for i, text in enumerate(_texts(120))]
    return _write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", rows)


@pytest.fixture(scope="module")
def flat_index(tiny_bert, corpus, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("indexes") / "flat"
    build_index(tiny_bert, corpus, output, index_type="flat", chunk_size=32, show_progress=False)
    return output


@pytest.fixture(scope="module")
def fp32_model(tiny_bert):
    """The tiny BERT in plain sentence-transformers, fp32: the reference the indexes are checked against."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(tiny_bert), device="cpu")


@pytest.fixture(scope="module")
def fp32_documents(fp32_model) -> np.ndarray:
    return fp32_model.encode([PROMPTS["document"] + t for t in _texts(120)], normalize_embeddings=True)


def _store_rows(index_dir: Path) -> list[tuple]:
    with sqlite3.connect(index_dir / "documents.sqlite") as db:
        return db.execute("SELECT row, doc_id, title, text, line, deleted FROM documents ORDER BY row").fetchall()


def _index_bytes(index_dir: Path) -> bytes:
    return (index_dir / "index.faiss").read_bytes()


def test_exact_top10_equals_numpy_brute_force(fp32_model, fp32_documents, flat_index):
    """Top-10 of the flat index == brute force over embeddings made with the model's own prompts."""
    model, documents = fp32_model, fp32_documents
    queries = ["cats with details", "oil prices today", "note 7 about football", "more rain"]
    query_vectors = model.encode([PROMPTS["query"] + q for q in queries], normalize_embeddings=True)
    expected_scores = query_vectors @ documents.T
    assert read_manifest(flat_index).prompts == PROMPTS
    with open_index(flat_index) as index:
        results = index.search(queries, k=10)
    for hits, scores in zip(results, expected_scores, strict=True):
        expected = np.argsort(-scores, kind="stable")[:10]
        assert [h.doc_id for h in hits] == [f"d{i}" for i in expected]
        np.testing.assert_allclose([h.score for h in hits], scores[expected], rtol=1e-5, atol=1e-5)
        assert [h.rank for h in hits] == list(range(1, 11))


def test_a_resumed_auto_build_keeps_the_precision_its_first_chunks_were_encoded_at(tiny_bert, corpus, tmp_path):
    """Chunks encoded at one precision are never joined by chunks of another: ``auto`` on resume takes the
    recorded precision instead of measuring again (this machine's ``auto`` would take fp32 here)."""
    output = tmp_path / "index"

    def stop_after_first_chunk(done):
        if done.chunk == 0:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted):
        build_index(tiny_bert, corpus, output, index_type="flat", chunk_size=16, show_progress=False,
                    compute_precision="int8", on_chunk=stop_after_first_chunk)
    manifest = build_index(tiny_bert, corpus, output, index_type="flat", chunk_size=16, show_progress=False,
                           resume=True)
    assert manifest.documents == 120
    assert read_manifest(output).compute_precision == "int8"


@pytest.mark.parametrize("kept_as", ["hidden", "legacy"])
def test_interrupted_build_resumes_to_the_same_index_and_store(tiny_bert, corpus, tmp_path, kept_as):
    reference = tmp_path / "reference"
    build_index(tiny_bert, corpus, reference, factory="IVF4,Flat", chunk_size=16, show_progress=False)

    output = tmp_path / "resumed"
    seen: list[int] = []

    def stop_after_third_chunk(done):
        seen.append(done.chunk)
        if done.chunk == 2:
            raise KeyboardInterrupt

    partial = output.with_name(".resumed.partial")
    with pytest.raises(Interrupted, match=f"48 of 120 documents encoded; finished chunks are kept in {partial}"):
        build_index(tiny_bert, corpus, output, factory="IVF4,Flat", chunk_size=16, show_progress=False,
                    on_chunk=stop_after_third_chunk)
    assert sorted(p.name for p in (partial / "shards").glob("*.npy")) == [
        "chunk-000000.npy", "chunk-000001.npy", "chunk-000002.npy"]
    assert not output.exists()
    with pytest.raises(UserInputError, match="--resume"):
        build_index(tiny_bert, corpus, output, factory="IVF4,Flat", chunk_size=16, show_progress=False)
    if kept_as == "legacy":  # interrupted by an earlier version, which built in the visible OUTPUT.partial
        partial.rename(output.with_name("resumed.partial"))

    resumed_chunks: list[int] = []
    manifest = build_index(tiny_bert, corpus, output, factory="IVF4,Flat", chunk_size=16, resume=True,
                           show_progress=False, on_chunk=lambda done: resumed_chunks.append(done.chunk))
    assert resumed_chunks == [3, 4, 5, 6, 7]
    assert not partial.exists() and not output.with_name("resumed.partial").exists()
    assert manifest.documents == 120 and manifest.factory == "IVF4,Flat"
    assert _index_bytes(output) == _index_bytes(reference)
    assert _store_rows(output) == _store_rows(reference)
    assert read_manifest(output).search_params == read_manifest(reference).search_params


def test_resume_refuses_changed_options(tiny_bert, corpus, tmp_path):
    output = tmp_path / "index"

    def stop(done):
        raise KeyboardInterrupt

    with pytest.raises(Interrupted):
        build_index(tiny_bert, corpus, output, chunk_size=16, show_progress=False, on_chunk=stop)
    with pytest.raises(UserInputError, match=r"chunk_size \(16 → 32\) changed"):
        build_index(tiny_bert, corpus, output, chunk_size=32, resume=True, show_progress=False)


def test_cli_ctrl_c_prints_resume_command_that_finishes_the_build(tiny_bert, corpus, tmp_path, monkeypatch):
    calls = {"n": 0}
    original = IndexEncoder.encode_in_length_order

    def interrupt_on_third_chunk(self, texts, kind, advance=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self, texts, kind, advance)

    monkeypatch.setattr(IndexEncoder, "encode_in_length_order", interrupt_on_third_chunk)
    output = tmp_path / "cli-index"
    runner = CliRunner()
    result = runner.invoke(app, ["index", "build", "--model", str(tiny_bert), "--corpus", str(corpus),
                                 "--output", str(output), "--chunk-size", "40"])
    assert result.exit_code == 130, result.output
    assert "80 of 120 documents encoded" in result.output
    command = result.output.split("Resume with:")[1].strip()
    words = shlex.split(command)
    assert words[:3] == ["neobert-embed", "index", "build"] and words[-1] == "--resume"
    monkeypatch.setattr(IndexEncoder, "encode_in_length_order", original)
    resumed = runner.invoke(app, words[1:])
    assert resumed.exit_code == 0, resumed.output
    assert read_manifest(output).documents == 120


def test_add_is_searchable_and_duplicates_are_refused_or_replaced(tiny_bert, corpus, tmp_path):
    index_dir = tmp_path / "index"
    build_index(tiny_bert, corpus, index_dir, chunk_size=64, show_progress=False)
    new_text = "a completely new note about volcanoes erupting"
    more = _write_jsonl(tmp_path / "more.jsonl", [{"_id": "new1", "text": new_text},
                                                   {"_id": "new2", "text": "second added note on tides"}])
    runner = CliRunner()
    result = runner.invoke(app, ["index", "add", str(index_dir), "--corpus", str(more)])
    assert result.exit_code == 0, result.output
    with open_index(index_dir) as index:
        assert index.search([new_text], k=1)[0][0].doc_id == "new1"
        assert index.manifest.documents == 122

    clash = _write_jsonl(tmp_path / "clash.jsonl", [{"_id": "new3", "text": "fine"},
                                                     {"_id": "d5", "text": "replacement text for d5"}])
    before = _index_bytes(index_dir)
    with pytest.raises(UserInputError, match=r"clash\.jsonl:2: duplicate id 'd5' .*corpus\.jsonl:6.*"
                                             r"--on-duplicate replace"):
        add_documents(index_dir, clash, show_progress=False)
    assert _index_bytes(index_dir) == before, "a refused add must leave the index untouched"

    manifest = add_documents(index_dir, clash, on_duplicate="replace", show_progress=False)
    assert manifest.documents == 123 and manifest.vectors == 124 and manifest.replaced == 1
    with open_index(index_dir) as index:
        hits = index.search(["replacement text for d5", _texts(6)[5]], k=124)
    assert hits[0][0].doc_id == "d5" and hits[0][0].text == "replacement text for d5"
    for ranked in hits:
        assert [h.doc_id for h in ranked].count("d5") == 1
        assert len(ranked) == 123


def test_add_refuses_ids_repeated_inside_the_new_file(flat_index, tmp_path):
    twice = _write_jsonl(tmp_path / "twice.jsonl", [{"_id": "x", "text": "one"}, {"_id": "x", "text": "two"}])
    with pytest.raises(UserInputError, match=r"twice\.jsonl:2: duplicate id 'x' \(first at line 1\)"):
        add_documents(flat_index, twice, on_duplicate="replace", show_progress=False)


def test_search_with_a_different_model_is_refused(flat_index, tmp_path):
    other = build_tiny_model("bert", tmp_path / "other", seed=1)
    with pytest.raises(UserInputError, match="built with model .* but the model given is .*not comparable"):
        open_index(flat_index, model=other)
    wider = build_tiny_model("bert", tmp_path / "wider", seed=0, hidden=48)
    result = CliRunner().invoke(app, ["index", "search", str(flat_index), "cats", "--model", str(wider)])
    assert isinstance(result.exception, UserInputError)
    assert "48-d" in str(result.exception) and "32-d" in str(result.exception)


def test_search_cli_table_json_and_query_file(flat_index, tmp_path):
    runner = CliRunner()
    with open_index(flat_index) as index:
        best = index.search(["note 3 about stock markets"], k=1)[0][0]
    table = runner.invoke(app, ["index", "search", str(flat_index), "note 3 about stock markets", "--k", "3"])
    assert table.exit_code == 0, table.output
    assert "rank" in table.stdout and "snippet" in table.stdout
    assert f"│ 1    │ {best.score:.4f} │ {best.doc_id} " in table.stdout
    queries = tmp_path / "queries.txt"
    queries.write_text("cats\n\nrain and details\n", encoding="utf-8")
    lines = runner.invoke(app, ["index", "search", str(flat_index), "--queries", str(queries), "--json",
                                "--k", "2"]).stdout.strip().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["query"] for r in records] == ["cats", "rain and details"]
    assert all(len(r["hits"]) == 2 and set(r["hits"][0]) == {"rank", "score", "id", "title", "text"}
               for r in records)


def _bad_corpus_cases(tmp_path: Path) -> list[tuple[Path, dict, str]]:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    dupes = _write_jsonl(tmp_path / "dupes.jsonl", [{"_id": "a", "text": "x"}, {"_id": "b", "text": "y"},
                                                    {"_id": "a", "text": "z"}])
    missing = _write_jsonl(tmp_path / "missing.jsonl", [{"_id": "a", "text": "x"}, {"_id": "b", "body": "y"}])
    bad_utf8 = tmp_path / "bad.jsonl"
    bad_utf8.write_bytes(b'{"_id": "a", "text": "ok"}\n{"_id": "b", "text": "caf\xe9"}\n')
    bad_txt = tmp_path / "bad.txt"
    bad_txt.write_bytes(b"first line\nsecond line\nthird \xff line\n")
    no_id = _write_jsonl(tmp_path / "noid.jsonl", [{"text": "x"}])
    return [
        (empty, {}, r"empty\.jsonl: the corpus is empty"),
        (dupes, {}, r"dupes\.jsonl:3: duplicate id 'a' \(first at line 1\)"),
        (missing, {}, r"missing\.jsonl:2: text field 'text' is missing \(fields present: _id, body\)"),
        (bad_utf8, {}, r"bad\.jsonl:2: not valid UTF-8"),
        (bad_txt, {}, r"bad\.txt:3: not valid UTF-8"),
        (no_id, {}, r"noid\.jsonl:1: id field '_id' is missing .*--row-ids"),
    ]


def test_bad_corpora_give_errors_naming_file_and_line(tiny_bert, tmp_path):
    for path, options, message in _bad_corpus_cases(tmp_path):
        with pytest.raises(UserInputError, match=message):
            build_index(tiny_bert, path, tmp_path / f"out-{path.stem}", show_progress=False, **options)
        assert not (tmp_path / f"out-{path.stem}").exists()


def test_parquet_txt_and_saved_dataset_corpora(tiny_bert, tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = _texts(20)
    pq.write_table(pa.table({"body": texts, "headline": [f"h{i}" for i in range(20)]}), tmp_path / "c.parquet")
    manifest = build_index(tiny_bert, tmp_path / "c.parquet", tmp_path / "pq", text_field="body",
                           title_field="headline", row_ids=True, show_progress=False)
    assert manifest.documents == 20
    with open_index(tmp_path / "pq") as index:
        hit = index.search(["h4 " + texts[4]], k=1)[0][0]
    assert (hit.doc_id, hit.title, hit.text) == ("5", "h4", texts[4])

    (tmp_path / "c.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert build_index(tiny_bert, tmp_path / "c.txt", tmp_path / "txt", show_progress=False).documents == 20

    datasets.Dataset.from_dict({"id": [f"r{i}" for i in range(20)], "text": texts}).save_to_disk(
        str(tmp_path / "saved"))
    manifest = build_index(tiny_bert, tmp_path / "saved", tmp_path / "hf", id_field="id", show_progress=False)
    with open_index(tmp_path / "hf") as index:
        assert index.search([texts[7]], k=1)[0][0].doc_id == "r7"

    pq.write_table(pa.table({"body": texts[:3], "id": ["a", "b", "c"]}), tmp_path / "bad.parquet")
    with pytest.raises(UserInputError, match=r"bad\.parquet:1: text field 'text' is missing"):
        build_index(tiny_bert, tmp_path / "bad.parquet", tmp_path / "bad", id_field="id", show_progress=False)


# recall@10 against fp32 exact search (numpy) and cosine of the decoded stored vectors to fp32, per
# stored precision. float16 keeps 11 significant bits and int8 256 buckets per dimension over the
# trained range, so both decode to within 1e-4 of fp32 in cosine (measured: 1e-7 and 4e-7). Their
# recall floors allow swaps at rank 10 among this corpus's near-tied templated documents (measured
# 0.98 and 0.97); the approximate structures must reach their calibration target (RECALL_TARGET). Binary
# stores exactly the fp32 signs (checked bit for bit) and must return exactly the 10 nearest codes
# by Hamming distance (computed here from the fp32 signs); 32 sign bits only estimate the cosine
# ranking, so against fp32 exact search its floor is twice chance (10 of 120; measured 0.21).
STORED = {  # (index type, stored precision): (factory, recall@10 floor, cosine floor or None)
    ("auto", "float32"): ("Flat", 1.0, 0.99999),
    ("flat", "float16"): ("SQfp16", 0.95, 0.9999),
    ("flat", "int8"): ("SQ8", 0.9, 0.9999),
    ("flat", "binary"): ("BFlat", 2 * 10 / 120, None),
    ("hnsw", "float32"): ("HNSW32", 0.95, 0.99999),
    ("hnsw", "int8"): ("HNSW32,SQ8", 0.9, 0.9999),
    ("ivf", "float16"): ("IVF2,SQfp16", 0.95, 0.9999),
}


def _stored_vectors(index) -> np.ndarray:
    """Every stored vector (binary: the packed codes) decoded by FAISS, in row order."""
    import faiss

    ivf = faiss.try_extract_index_ivf(index) if isinstance(index, faiss.Index) else None
    if ivf is not None:
        ivf.make_direct_map()
    return index.reconstruct_n(0, index.ntotal)


def test_index_types_store_each_precision_true_to_fp32(tiny_bert, corpus, fp32_model, fp32_documents, tmp_path):
    documents = fp32_documents
    queries = fp32_model.encode([PROMPTS["query"] + t for t in _texts(30, offset=500)], normalize_embeddings=True)
    exact = [{f"d{i}" for i in row} for row in np.argsort(-(queries @ documents.T), axis=1, kind="stable")[:, :10]]
    for (index_type, precision), (factory, recall_floor, cosine_floor) in STORED.items():
        output = tmp_path / f"{index_type}-{precision}"
        manifest = build_index(tiny_bert, corpus, output, index_type=index_type, precision=precision,
                               show_progress=False, compute_precision="fp32")
        assert manifest.factory == factory
        if manifest.calibration.parameter is not None and precision != "int8":  # int8 codes cap recall: floor below
            assert manifest.calibration.recall_at_10 >= RECALL_TARGET
        with open_index(output) as index:
            hits = index.hits(queries, k=10)  # the same fp32 query vectors for every index
            stored = _stored_vectors(index.faiss_index)
        found = [[h.doc_id for h in row] for row in hits]
        assert all(len(set(row)) == 10 for row in found)
        recall = np.mean([len(set(row) & truth) / 10 for row, truth in zip(found, exact, strict=True)])
        assert recall >= recall_floor, (index_type, precision, recall)
        if precision == "binary":
            clear = np.abs(documents) > 1e-4  # a sign within fp32 rounding of 0 may go either way
            assert np.array_equal(np.unpackbits(stored, axis=1).astype(bool)[clear], (documents > 0)[clear])
            hamming = ((queries[:, None, :] > 0) != (documents[None, :, :] > 0)).sum(-1)
            for row, distances in zip(hits, hamming, strict=True):  # score = 1 - 2 * hamming / 32
                assert sorted(round((1 - h.score) * 16) for h in row) == sorted(distances)[:10]
        else:
            cosines = (stored * documents).sum(1) / np.linalg.norm(stored, axis=1) / np.linalg.norm(documents, axis=1)
            assert cosines.min() >= cosine_floor, (index_type, precision, cosines.min())


def test_auto_is_exact_then_ivf_with_faiss_guideline_lists(tiny_bert, corpus, tmp_path, monkeypatch):
    from neobert_embed.index import factory

    spec = factory.choose_index_spec("auto", 1_000_000, 384)
    assert (spec.factory, spec.tuned_parameter, spec.train_size) == ("IVF4096,Flat", "nprobe", 40 * 4096)
    assert factory.choose_index_spec("auto", 99_999, 384).factory == "Flat"
    assert factory.choose_index_spec("auto", 1_000_000, 384, precision="binary").factory == "BHNSW32"
    assert factory.choose_index_spec("ivfpq", 1_000_000, 384).factory == "IVF1024,PQ48x8"   # sqrt(n) for codes
    big_custom = factory.choose_index_spec("auto", 10**8, 384, factory="IVF262144,Flat")
    assert big_custom.train_size == 40 * 262_144     # not 4096 lists' worth: faiss needs a point per list
    monkeypatch.setattr(factory, "EXACT_SEARCH_LIMIT", 100)   # the corpus's 120 documents count as "large"
    manifest = build_index(tiny_bert, corpus, tmp_path / "auto", show_progress=False)
    assert (manifest.index_type, manifest.factory) == ("ivf", "IVF2,Flat")
    assert manifest.calibration.parameter == "nprobe" and manifest.calibration.recall_at_10 >= RECALL_TARGET


@pytest.mark.parametrize(("options", "message"), [
    ({"index_type": "ivfpq", "precision": "int8"}, "--store-precision does not apply to --index-type ivfpq"),
    ({"index_type": "hnsw", "factory": "HNSW16"}, "either --index-type or --factory"),
    ({"factory": "IVF4,Flat", "precision": "float16"}, "--store-precision cannot be combined with --factory"),
    ({"index_type": "ivf", "precision": "binary"}, "--store-precision binary works with"),
    ({"index_type": "annoy"}, "--index-type 'annoy' is unknown"),
    ({"index_type": "ivfpq"}, "ivfpq needs at least 624 vectors to train its codebooks, the corpus has 120"),
    ({"factory": "NotAnIndex"}, "--factory 'NotAnIndex' is not a valid FAISS factory string"),
])
def test_incompatible_options_are_refused(tiny_bert, corpus, tmp_path, options, message):
    with pytest.raises(UserInputError, match=message):
        build_index(tiny_bert, corpus, tmp_path / "x", show_progress=False, **options)


def test_existing_index_is_not_overwritten_without_asking(tiny_bert, corpus, flat_index, tmp_path):
    with pytest.raises(UserInputError, match="already holds an index"):
        build_index(tiny_bert, corpus, flat_index, show_progress=False)


def test_a_misspelt_option_is_refused_by_the_signature(tiny_bert, corpus, tmp_path):
    with pytest.raises(TypeError, match="chunk_sise"):
        build_index(tiny_bert, corpus, tmp_path / "x", show_progress=False, chunk_sise=4)
