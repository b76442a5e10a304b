"""Long documents: ``index build --passages`` indexes every token and ranks documents by their best passage.

The real all-MiniLM-L6-v2 reads 32 tokens here (``max_seq_length=32``), so a document of a few
sentences is already longer than its window, and a fact stated at its end lies past it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from index_helpers import auto_without_candidates  # noqa: F401  (fixture: fp32 builds, comparable)

from neobert_embed.index import add_documents, build_index, open_index
from neobert_embed.index.manifest import read_manifest
from neobert_embed.index.passages import token_windows
from neobert_embed.index.store import DocumentStore
from neobert_embed.runs import Interrupted

WINDOW = 32
NEEDLE = "The secret launch code that opens the bank vault is zebra seven."
QUERY = "what is the secret launch code of the vault?"
OPENINGS = [
    "Security guards change the codes of the bank vault every week.",
    "The launch of the new rocket was delayed because of a secret fault.",
    "Bank robbers tried to open the vault with a stolen code last night.",
    "Engineers keep launch codes for satellites in a locked safe.",
    "A locksmith explained how vault doors are opened by a secret code.",
]
COOKING = ("Slice the onions thinly and fry them slowly in butter until they turn golden brown. "
           "Add the garlic, a pinch of salt and the tomatoes, then simmer the sauce for twenty minutes. ")


def _corpus(path: Path) -> Path:
    """Decoys that open on the query's words (found by a truncated index), and one cooking text whose only
    mention of the code is its last sentence, past the 32-token window."""
    rows = [{"_id": f"decoy{i}", "title": "", "text": opening + " " + COOKING} for i, opening in enumerate(OPENINGS)]
    rows.append({"_id": "needle", "title": "Dinner", "text": COOKING * 2 + NEEDLE})
    rows.append({"_id": "short", "title": "", "text": "A cat sat on the mat."})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("long")
    corpus = _corpus(root / "corpus.jsonl")
    common = dict(max_seq_length=WINDOW, compute_precision="fp32", show_progress=False)
    build_index(minilm_path, corpus, root / "truncated", **common)
    build_index(minilm_path, corpus, root / "passages", passages=True, **common)
    return {"corpus": corpus, "truncated": root / "truncated", "passages": root / "passages", "root": root}


def _ranked(index_dir: Path, k: int = 10) -> list:
    with open_index(index_dir) as index:
        return index.search([QUERY], k=k)[0]


def test_a_match_past_the_window_is_found_with_passages_only(built: dict[str, Path]) -> None:
    truncated = [hit.doc_id for hit in _ranked(built["truncated"])]
    with_passages = [hit.doc_id for hit in _ranked(built["passages"])]
    assert with_passages[0] == "needle"
    assert truncated.index("needle") >= len(OPENINGS)  # every decoy above it: its window holds only cooking


def test_ranks_are_by_document_and_k_counts_documents(built: dict[str, Path]) -> None:
    manifest = read_manifest(built["passages"])
    assert manifest.documents == len(OPENINGS) + 2 and manifest.vectors > manifest.documents
    hits = _ranked(built["passages"], k=3)
    assert len(hits) == 3 and len({hit.doc_id for hit in hits}) == 3
    assert [hit.rank for hit in hits] == [1, 2, 3]
    every = _ranked(built["passages"], k=100)  # k beyond the documents: each document once
    assert sorted(hit.doc_id for hit in every) == sorted([f"decoy{i}" for i in range(len(OPENINGS))]
                                                         + ["needle", "short"])
    with open_index(built["passages"]) as index:  # a document's score is its best passage's
        query = index.encoder.encode([QUERY], "query")[0]
        vectors = index.faiss_index.reconstruct_n(0, index.manifest.vectors)
        documents_of = index.store.passage_documents()
        rows = {doc.doc_id: doc.row for doc in index.store.documents_between(0, manifest.documents)}
        for hit in every:
            best = float((vectors[documents_of == rows[hit.doc_id]] @ query).max())
            assert hit.score == pytest.approx(best, abs=1e-5)


def test_spans_point_into_the_documents_text(built: dict[str, Path]) -> None:
    top = _ranked(built["passages"], k=1)[0]
    assert top.span is not None and "zebra seven" in top.text[top.span[0]:top.span[1]]
    with DocumentStore(built["passages"] / "documents.sqlite", read_only=True) as store:
        documents = store.documents_between(0, store.total_rows())
        spans = store.passages(range(store.vector_count()))
    for document in documents:
        own = [(start, end) for row, start, end in spans if row == document.row]
        assert own[0][0] == 0 and own[-1][1] == len(document.text.rstrip())  # every character is in a passage
        for (start, end), (next_start, _) in zip(own, own[1:], strict=False):
            assert 0 <= start < end <= len(document.text) and next_start < end  # passages overlap
    assert {len([s for s in spans if s[0] == d.row]) > 1 for d in documents if d.doc_id != "short"} == {True}


def test_without_passages_nothing_is_split_and_hits_have_no_span(built: dict[str, Path]) -> None:
    assert "passages" not in json.loads((built["truncated"] / "manifest.json").read_text())
    with DocumentStore(built["truncated"] / "documents.sqlite", read_only=True) as store:
        assert not store.has_passages()
    assert all(hit.span is None for hit in _ranked(built["truncated"]))


def test_index_add_carries_passages(built: dict[str, Path], tmp_path: Path, minilm_path: Path) -> None:
    import shutil

    index_dir = tmp_path / "index"
    shutil.copytree(built["passages"], index_dir)
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"_id": "late", "text": COOKING * 2 + "The password of the submarine hatch is "
                                                                       "purple otter."}) + "\n", encoding="utf-8")
    manifest = add_documents(index_dir, more, show_progress=False)
    assert manifest.passages is not None and manifest.documents == len(OPENINGS) + 3
    with open_index(index_dir) as index:
        top = index.search(["what is the password of the submarine hatch?"], k=1)[0][0]
    assert top.doc_id == "late" and "purple otter" in top.text[top.span[0]:top.span[1]]


def test_resume_carries_passages(built: dict[str, Path], tmp_path: Path, minilm_path: Path) -> None:
    def stop_after_first(done) -> None:
        if done.chunk == 0:
            raise KeyboardInterrupt

    common = dict(max_seq_length=WINDOW, compute_precision="fp32", show_progress=False, chunk_size=3, passages=True)
    with pytest.raises(Interrupted):
        build_index(minilm_path, built["corpus"], tmp_path / "resumed", on_chunk=stop_after_first, **common)
    build_index(minilm_path, built["corpus"], tmp_path / "resumed", resume=True, **common)
    build_index(minilm_path, built["corpus"], tmp_path / "whole", **common)
    with DocumentStore(tmp_path / "resumed" / "documents.sqlite", read_only=True) as resumed, \
            DocumentStore(tmp_path / "whole" / "documents.sqlite", read_only=True) as whole:
        assert resumed.passages(range(resumed.vector_count())) == whole.passages(range(whole.vector_count()))
    assert [(h.doc_id, h.span) for h in _ranked(tmp_path / "resumed")] == \
        [(h.doc_id, h.span) for h in _ranked(tmp_path / "whole")]
    assert _ranked(tmp_path / "resumed")[0].doc_id == "needle"


def test_token_windows_cover_every_token_with_the_stated_overlap() -> None:
    assert token_windows(5, 8, 6) == [(0, 5)]
    assert token_windows(20, 8, 6) == [(0, 8), (6, 14), (12, 20)]
    windows = token_windows(1000, 254, 191)
    assert windows[0][0] == 0 and windows[-1][1] == 1000
    assert all(end - start == 254 for start, end in windows)
    assert all(b[0] < a[1] for a, b in zip(windows, windows[1:], strict=False))


def test_word_windows_start_at_words_cover_every_token_and_never_repeat() -> None:
    starts = np.array([1, 1, 1, 0, 1, 1, 0, 0, 1, 1], dtype=bool)
    assert token_windows(10, 4, 3, starts) == [(0, 4), (2, 6), (5, 9), (8, 10)]
    assert token_windows(20, 8, 6, np.ones(20, dtype=bool)) == token_windows(20, 8, 6)
    rng = np.random.default_rng(0)
    for _ in range(3000):
        n, window = int(rng.integers(1, 80)), int(rng.integers(1, 24))
        stride = int(rng.integers(1, window + 1))
        starts = rng.random(n) < 0.5
        windows = token_windows(n, window, stride, starts)
        assert windows[0][0] == 0 and windows[-1][1] == n and len(set(windows)) == len(windows)
        assert all(0 < end - start <= window for start, end in windows)
        for (start, end), (next_start, next_end) in zip(windows, windows[1:], strict=False):
            assert start < next_start <= end < next_end  # every token covered, in order
            # a start inside a word only where the word is longer than the stride
            assert starts[next_start] or not starts[start + 1:next_start + 1].any()


def test_stride_needs_passages_and_fits_the_window(built: dict[str, Path], tmp_path: Path, minilm_path: Path) -> None:
    from neobert_embed.errors import UserInputError

    with pytest.raises(UserInputError, match="--stride"):
        build_index(minilm_path, built["corpus"], tmp_path / "a", stride=8, show_progress=False)
    with pytest.raises(UserInputError, match="--stride must be between 1 and the passage window"):
        build_index(minilm_path, built["corpus"], tmp_path / "b", passages=True, stride=500,
                    max_seq_length=WINDOW, compute_precision="fp32", show_progress=False)
    assert np.array_equal(token_windows(3, 2, 2), [(0, 2), (1, 3)])


def test_without_passages_the_warning_counts_what_was_cut(built: dict[str, Path], tmp_path: Path,
                                                           minilm_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="neobert_embed.index.build"):
        build_index(minilm_path, built["corpus"], tmp_path / "cut", max_seq_length=WINDOW, compute_precision="fp32",
                    show_progress=False)
    line = next(record.getMessage() for record in caplog.records if "--passages" in record.getMessage())
    # every document but the short one is cut; the tokens past the window are counted and the flag named
    assert line.startswith(f"{len(OPENINGS) + 1} of {len(OPENINGS) + 2} documents are longer than the model's "
                           f"window ({WINDOW} tokens)")
    lost = int(line.split("cut there: ")[1].split(" tokens")[0].replace(",", ""))
    with DocumentStore(built["passages"] / "documents.sqlite", read_only=True) as store:
        spans = store.passages(range(store.vector_count()))
    # the tokens past each document's window ([CLS] and [SEP] take 2 of its WINDOW), titles joined as mteb does
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path))
    rows = [json.loads(row) for row in built["corpus"].read_text(encoding="utf-8").splitlines()]
    texts = [f"{row['title']} {row['text']}" if row["title"] else row["text"] for row in rows]
    past = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) - (WINDOW - 2) for text in texts]
    assert lost == sum(max(0, tokens) for tokens in past)
    assert len(spans) > len(OPENINGS) + 2


# --- long-context tasks ---------------------------------------------------------------------------

def _synth(output: Path, minilm_path: Path, shared_data: Path, **options) -> Path:
    from neobert_embed.evaluation.long_context import write_synthetic_task

    settings = dict(lengths=[64, 300], documents=4, seed=0) | options
    return write_synthetic_task(settings.pop("kind", "passkey"), shared_data / "ag_news" / "test.jsonl", output,
                                tokenizer=minilm_path, **settings)


def _files(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file() and path.name != "synthesis.json"}


@pytest.mark.parametrize("kind", ["passkey", "needle"])
def test_synthetic_tasks_are_deterministic(kind: str, tmp_path: Path, minilm_path: Path, shared_data: Path) -> None:
    from transformers import AutoTokenizer

    first = _files(_synth(tmp_path / "a", minilm_path, shared_data, kind=kind))
    assert first == _files(_synth(tmp_path / "b", minilm_path, shared_data, kind=kind))
    assert first != _files(_synth(tmp_path / "c", minilm_path, shared_data, kind=kind, seed=1))
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path))
    for length in (64, 300):
        split = tmp_path / "a" / f"test_{length}"
        corpus = [json.loads(line) for line in (split / "corpus.jsonl").read_text().splitlines()]
        queries = [json.loads(line) for line in (split / "queries.jsonl").read_text().splitlines()]
        assert len(corpus) == len(queries) == 4
        assert all(abs(len(tokenizer(doc["text"])["input_ids"]) - length) <= 2 for doc in corpus)
        subject = "pass key of " if kind == "passkey" else "best thing to do in "
        for doc, query in zip(corpus, queries, strict=True):  # each document states its own fact, once
            name = query["text"].split(subject)[1].rstrip("?")
            assert doc["text"].count(name) == (2 if kind == "passkey" else 1)


def test_synthetic_task_runs_as_a_local_mteb_task_and_longembed_copies_load(tmp_path: Path, minilm_path: Path,
                                                                             shared_data: Path) -> None:
    import shutil

    from neobert_embed.evaluation.local_tasks import load_task_dir

    task = load_task_dir(_synth(tmp_path / "synth", minilm_path, shared_data))
    assert task.metadata.main_score == "ndcg_at_1" and task.metadata.eval_splits == ["test_64", "test_300"]
    task.load_data()
    assert len(task.dataset["default"]["test_300"]["corpus"]) == 4
    copy = tmp_path / "LEMBPasskeyRetrieval"  # a local copy of LongEmbed's passkey task, two of its lengths
    for split in ("test_64", "test_300"):
        shutil.copytree(tmp_path / "synth" / split, copy / split)
    (copy / "task.json").write_text(json.dumps({"mteb_task": "LEMBPasskeyRetrieval",
                                                "eval_splits": ["test_64", "test_300"]}))
    official = load_task_dir(copy)
    official.load_data()
    assert official.metadata.name == "LEMBPasskeyRetrieval" and official.metadata.main_score == "ndcg_at_1"
    assert set(official.dataset["default"]) == {"test_64", "test_300"}


def test_serve_search_ranks_documents_and_names_the_passage(built: dict[str, Path], minilm_path: Path) -> None:
    from fastapi.testclient import TestClient

    from neobert_embed.serve.app import create_app
    from neobert_embed.serve.settings import ServeSettings

    settings = ServeSettings(model=str(minilm_path), indexes=[str(built["passages"])], precision="fp32")
    with TestClient(create_app(settings)) as client:
        response = client.post("/search", json={"query": QUERY, "k": 3})
    assert response.status_code == 200, response.text
    hits = response.json()["results"][0]["hits"]
    assert len(hits) == 3 and len({hit["id"] for hit in hits}) == 3 and hits[0]["id"] == "needle"
    start, end = hits[0]["span"]
    assert "zebra seven" in hits[0]["text"][start:end]


def test_scores_by_length_table_and_plot(tmp_path: Path, minilm_path: Path, shared_data: Path) -> None:
    from neobert_embed.evaluation.long_context import scores_by_length

    task = _synth(tmp_path / "synth", minilm_path, shared_data, lengths=[64, 200], documents=3)
    rows = scores_by_length([minilm_path], [task], tmp_path / "out")
    assert sorted((row.length, row.passages) for row in rows) == [(64, False), (64, True), (200, False), (200, True)]
    assert all(0 <= row.score <= 1 and row.metric == "ndcg_at_1" for row in rows)
    by_mode = {(row.length, row.passages): row.vectors for row in rows}
    assert by_mode[(200, True)] == by_mode[(200, False)] == 3  # MiniLM reads 256 tokens: nothing to split at 200
    table = (tmp_path / "out" / "by_length.md").read_text()
    assert "| model | truncated |" in table and "| model | passages |" in table
    assert (tmp_path / "out" / "by_length.png").read_bytes()[:4] == b"\x89PNG"


WORDPIECE_TEXT = ("Photosynthesis unbelievably transcontinental cryptocurrencies hyperparameterization "
                  "antidisestablishmentarianism, electroencephalography and otorhinolaryngology baffled "
                  "Zyxwvut's quizzaciously flabbergasted ornithologists near Llanfairpwllgwyngyll. ")


def test_passages_start_at_a_word_and_are_their_texts_tokens(tmp_path: Path, minilm_path: Path) -> None:
    """Windows of a WordPiece model never open on a ``##`` piece: each passage's tokens are its text's own
    (tokenized alone), and its vector is the vector of its text encoded as a plain text."""
    from transformers import AutoTokenizer

    corpus = tmp_path / "corpus.jsonl"
    rows = [{"_id": f"d{i}", "title": "", "text": WORDPIECE_TEXT * (2 + i)} for i in range(4)]
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    build_index(minilm_path, corpus, tmp_path / "index", passages=True, max_seq_length=WINDOW,
                compute_precision="fp32", show_progress=False)
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    with open_index(tmp_path / "index") as index:
        documents = {d.row: d.text for d in index.store.documents_between(0, index.manifest.documents)}
        spans = index.store.passages(range(index.manifest.vectors))
        vectors = index.faiss_index.reconstruct_n(0, index.manifest.vectors)
        texts = [documents[row][start:end] for row, start, end in spans]
        plain = index.encoder.encode(texts, "document")
    assert len(spans) > 3 * len(rows)
    for (row, start, end), text in zip(spans, texts, strict=True):
        whole = tokenizer(documents[row], add_special_tokens=False, return_offsets_mapping=True)
        inside = [i for i, (a, b) in zip(whole["input_ids"], whole["offset_mapping"], strict=True)
                  if start <= a and b <= end and b > a]
        alone = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert not tokenizer.convert_ids_to_tokens(inside[0]).startswith("##"), (row, start, text[:20])
        assert start == 0 or documents[row][start - 1].isspace()
        assert inside == alone, (row, start, text[:20])
    cosines = (vectors * plain).sum(axis=1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(plain, axis=1)
    assert cosines.min() > 0.9999
