"""One record-source layer: the same corpus in every format gives the same result in every command
that reads records (encode, index build, train-contrastive, pretrain prepare), and a bad record is
reported with its file and line (or row) whatever the format.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from contrastive_helpers import ANIMALS, COLORS, TINY_RECIPE, one_torch_thread
from safety_helpers import run_main
from tiny_models import build_tiny_model

_one_thread = pytest.fixture(autouse=True)(one_torch_thread)

RECORDS = [{"_id": f"d{i}", "text": f"the {color} {animal} sleeps in the sun",
            "anchor": f"where is the {color} {animal}", "positive": f"the {color} {animal} sleeps in the sun"}
           for i, (color, animal) in enumerate(zip(COLORS + COLORS[:4], ANIMALS + ANIMALS[4:][::-1], strict=True))]
FORMATS = ("ndjson", "json-list", "json-object", "csv", "parquet", "txt", "directory", "saved")
RECORD_FORMATS = tuple(f for f in FORMATS if f != "txt")  # a .txt line holds only a text


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _csv(path: Path, records: list[dict]) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    return path


def write_format(root: Path, fmt: str, records: list[dict] = RECORDS) -> Path:
    """``records`` written as ``fmt`` under ``root``; returns the path a command is given."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    if fmt in ("jsonl", "ndjson"):
        return _jsonl(root / f"corpus.{fmt}", records)
    if fmt == "json-list":
        (root / "list.json").write_text(json.dumps(records, indent=1), encoding="utf-8")
        return root / "list.json"
    if fmt == "json-object":
        (root / "object.json").write_text(json.dumps({"data": records}), encoding="utf-8")
        return root / "object.json"
    if fmt == "csv":
        return _csv(root / "corpus.csv", records)
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(records), root / "corpus.parquet")
        return root / "corpus.parquet"
    if fmt == "txt":
        (root / "corpus.txt").write_text("".join(r["text"] + "\n" for r in records), encoding="utf-8")
        return root / "corpus.txt"
    if fmt == "directory":  # files of two formats, read in name order
        (root / "parts" / "b").mkdir(parents=True)
        _jsonl(root / "parts" / "a.jsonl", records[:5])
        _csv(root / "parts" / "b" / "rest.csv", records[5:])
        return root / "parts"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(records)}).save_to_disk(str(root / "saved"))
    return root / "saved"


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    """The same records in every format (the reference is JSON lines)."""
    root = tmp_path_factory.mktemp("sources")
    return {fmt: write_format(root, fmt) for fmt in ("jsonl", *FORMATS)}


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    return build_tiny_model("bert", tmp_path_factory.mktemp("model") / "bert")


def _encode(model: Path, source: Path, output: Path, capsys, *options: str) -> np.ndarray:
    code, _, err = run_main(["encode", "--model", model, "--input", source, "--output", output,
                             "--precision", "fp32", *options], capsys)  # the format, not the precision, under test
    assert code == 0, err
    return np.load(output)


@pytest.fixture(scope="module")
def reference_vectors(tiny_bert, corpora, tmp_path_factory) -> np.ndarray:
    from neobert_embed.encoding import read_texts
    from neobert_embed.sentence import load_sentence_model

    vectors = load_sentence_model(str(tiny_bert)).encode(read_texts(corpora["jsonl"]), convert_to_numpy=True)
    assert vectors.shape == (len(RECORDS), 32)
    return vectors


@pytest.mark.parametrize("fmt", ("jsonl", *FORMATS))
def test_encode_reads_every_format(fmt, corpora, tiny_bert, reference_vectors, tmp_path, capsys):
    vectors = _encode(tiny_bert, corpora[fmt], tmp_path / "v.npy", capsys)
    np.testing.assert_allclose(vectors, reference_vectors, atol=1e-6)


def _index_hits(tiny_bert: Path, corpus: Path, output: Path, capsys) -> list[tuple[str, str, float]]:
    from neobert_embed.index import open_index

    code, _, err = run_main(["index", "build", "--model", tiny_bert, "--corpus", corpus, "--output", output,
                             "--precision", "fp32"], capsys)
    assert code == 0, err
    with open_index(output) as index:
        hits = index.search([RECORDS[3]["anchor"]], k=len(RECORDS))[0]
    return [(h.doc_id, h.text, round(h.score, 5)) for h in hits]


@pytest.fixture(scope="module")
def reference() -> dict:
    """Results on the JSON-lines corpus, computed once by the first test that needs each."""
    return {}


@pytest.mark.parametrize("fmt", FORMATS)
def test_index_build_reads_every_format(fmt, corpora, tiny_bert, reference, tmp_path, capsys):
    if "index" not in reference:
        reference["index"] = _index_hits(tiny_bert, corpora["jsonl"], tmp_path / "reference", capsys)
        assert sorted(h[0] for h in reference["index"]) == sorted(r["_id"] for r in RECORDS)
    reference_hits = reference["index"]
    hits = _index_hits(tiny_bert, corpora[fmt], tmp_path / "index", capsys)
    if fmt == "txt":  # no ids in a text file: documents are numbered by row
        by_row = {r["_id"]: str(i) for i, r in enumerate(RECORDS, start=1)}
        reference_hits = [(by_row[doc_id], text, score) for doc_id, text, score in reference_hits]
    assert hits == reference_hits


def _train(tiny_bert: Path, data: Path, output: Path, capsys) -> list[float]:
    code, _, err = run_main(["train-contrastive", "--model", tiny_bert, "--recipe", TINY_RECIPE, "--max-steps", "2",
                             "--data", f"pets={data}", "--output", output], capsys)
    assert code == 0, err
    return [json.loads(line)["loss"] for line in (output / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("fmt", RECORD_FORMATS)
def test_train_contrastive_reads_every_format(fmt, corpora, tiny_bert, reference, tmp_path, capsys):
    if "losses" not in reference:
        reference["losses"] = _train(tiny_bert, corpora["jsonl"], tmp_path / "reference", capsys)
        assert len(reference["losses"]) == 2 and all(np.isfinite(reference["losses"]))
    losses = _train(tiny_bert, corpora[fmt], tmp_path / "run", capsys)
    np.testing.assert_allclose(losses, reference["losses"], rtol=1e-5)  # same examples, batches, losses


@pytest.mark.parametrize("fmt", ("jsonl", *FORMATS))
def test_pretrain_prepare_reads_every_format(fmt, corpora, minilm_path, tmp_path, capsys):
    output = tmp_path / "prepared"
    code, _, err = run_main(["pretrain", "prepare", "--corpus", corpora[fmt], "--output", output,
                             "--tokenizer", minilm_path], capsys)
    assert code == 0, err
    manifest = json.loads((output / "corpus.json").read_text())
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(str(minilm_path))([r["text"] for r in RECORDS])["input_ids"]
    assert manifest["num_documents"] == len(RECORDS)
    assert manifest["num_tokens"] == sum(map(len, expected))


def _bad_sources(root: Path) -> list[tuple[list[str], Path, str]]:
    """(command, source, error): each source holds one bad record, the error must name where."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad_text = [*RECORDS[:2], {**RECORDS[2], "text": 7}]
    (root / "dir").mkdir()
    write_format(root, "jsonl", RECORDS[:3]).rename(root / "dir" / "a.jsonl")
    _jsonl(root / "dir" / "b.ndjson", [RECORDS[3], {"_id": "x"}])
    (root / "broken.ndjson").write_text('{"text": "ok"}\n{"text": "no end"\n', encoding="utf-8")
    (root / "wide.csv").write_text("_id,text\nd0,fine\nd1,one,too many\n", encoding="utf-8")
    pq.write_table(pa.table({"_id": ["a", "b"], "text": [1, 2]}), root / "numbers.parquet")
    (root / "saved-bad").mkdir()
    saved = write_format(root / "saved-bad", "saved", [{**r, "_id": r["_id"] if i != 4 else ""}
                                                        for i, r in enumerate(RECORDS)])
    encode = ["encode", "--model", "MODEL", "--output", root / "out.npy", "--input"]
    index = ["index", "build", "--model", "MODEL", "--output", root / "index", "--corpus"]
    prepare = ["pretrain", "prepare", "--tokenizer", "TOKENIZER", "--output", root / "prepared", "--corpus"]
    train = ["train-contrastive", "--model", "MODEL", "--recipe", TINY_RECIPE, "--output", root / "run", "--data"]
    return [
        (encode, write_format(root, "json-list", bad_text), r"list\.json:3: field 'text' is int, not a string"),
        (encode, root / "wide.csv", r"wide\.csv:3: 3 values but the header names 2 columns"),
        (index, root / "dir", r"b\.ndjson:2: text field 'text' is missing"),
        (index, saved, r"saved\[train\]:5: id field '_id' is empty"),
        (prepare, root / "broken.ndjson", r"broken\.ndjson:2: invalid JSON"),
        (prepare, root / "numbers.parquet", r"numbers\.parquet:1: field 'text' must be a string, got int"),
        (train, write_format(root, "csv", [*RECORDS[:3], {**RECORDS[3], "positive": ""}]),
         r"corpus\.csv:5: column 'positive' is empty"),
        (train, write_format(root, "txt"), r"corpus\.txt .*no query column"),
    ]


def test_bad_records_are_named_by_file_and_line(tiny_bert, minilm_path, tmp_path, capsys):
    for command, source, message in _bad_sources(tmp_path):
        args = [{"MODEL": tiny_bert, "TOKENIZER": minilm_path}.get(str(a), a) for a in command]
        value = f"x={source}" if command[0] == "train-contrastive" else source
        code, _, err = run_main([*args, value], capsys)
        assert code == 2, (command[0], source, err)
        assert "Traceback" not in err and re.search(message, " ".join(err.split())), (message, err)


def test_a_text_file_is_read_under_the_commands_text_field(tiny_bert, minilm_path, tmp_path, capsys):
    """A .txt line is the document whatever --text-field names (the pretrain recipes say ``content``)."""
    corpus = write_format(tmp_path, "txt")
    code, _, err = run_main(["pretrain", "prepare", "--corpus", corpus, "--output", tmp_path / "prepared",
                             "--tokenizer", minilm_path, "--text-field", "content"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "prepared" / "corpus.json").read_text())["num_documents"] == len(RECORDS)
    from neobert_embed.index import open_index

    code, _, err = run_main(["index", "build", "--model", tiny_bert, "--corpus", corpus, "--output", tmp_path / "index",
                             "--text-field", "body"], capsys)
    assert code == 0, err
    with open_index(tmp_path / "index") as index:
        assert index.search([RECORDS[3]["text"]], k=1)[0][0].text == RECORDS[3]["text"]
    assert _encode(tiny_bert, corpus, tmp_path / "v.npy", capsys, "--field", "sentence").shape == (len(RECORDS), 32)


def test_fingerprint_counts_only_the_files_that_are_read(tmp_path):
    """A hidden file or a file of no known format changes nothing read, so a --resume stays allowed."""
    from neobert_embed.sources import fingerprint, iter_records

    corpus = write_format(tmp_path, "directory")
    before = fingerprint(corpus)
    (corpus / ".DS_Store").write_bytes(b"\x00\x01")
    (corpus / "b" / "LICENSE").write_text("MIT\n", encoding="utf-8")
    (corpus / ".cache").mkdir()
    (corpus / ".cache" / "old.jsonl").write_text('{"text": "stale"}\n', encoding="utf-8")
    assert fingerprint(corpus) == before
    assert [r["_id"] for _, r in iter_records(corpus)] == [r["_id"] for r in RECORDS]
    _jsonl(corpus / "c.jsonl", RECORDS[:1])  # a new record file is new data
    assert fingerprint(corpus) != before
    saved = write_format(tmp_path, "saved")
    before = fingerprint(saved)
    (saved / ".DS_Store").write_bytes(b"\x00")
    assert fingerprint(saved) == before
    arrow = next(saved.rglob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes() + b"\x00")  # a dataset's data files count whatever their suffix
    assert fingerprint(saved) != before


def test_json_lines_saved_as_json_are_streamed(tmp_path):
    """A .json file of JSON lines yields its first record before the rest is read (a bad byte far
    down is reported when reached, with its line); lists and objects spread over lines parse whole."""
    from neobert_embed.errors import UserInputError
    from neobert_embed.sources import iter_records

    lines = tmp_path / "lines.json"
    lines.write_bytes(b"\n" + "".join(json.dumps(r) + "\n" for r in RECORDS[:3]).encode() + b'{"text": "\xff"}\n')
    records = iter_records(lines)
    where, first = next(records)
    assert (str(where), first) == (f"{lines}:2", RECORDS[0])
    with pytest.raises(UserInputError, match=r"lines\.json:5: not valid UTF-8"):
        list(records)
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps({"data": RECORDS}, indent=2), encoding="utf-8")
    one = tmp_path / "one.json"
    one.write_text(json.dumps(RECORDS[0]) + "\n\n", encoding="utf-8")
    assert [r for _, r in iter_records(pretty)] == RECORDS
    assert [(w.number, r) for w, r in iter_records(one)] == [(1, RECORDS[0])]
    broken = tmp_path / "broken.json"
    broken.write_text('[{"text": "a"},\n {"text": }]', encoding="utf-8")
    with pytest.raises(UserInputError, match=r"broken\.json:2: invalid JSON"):
        list(iter_records(broken))


def test_byte_order_marks_and_long_csv_cells(tmp_path):
    """Files saved by Excel or Notepad start with a UTF-8 byte-order mark: it is not part of the
    first column's name or the first text; a csv cell may hold a document longer than 128 KiB."""
    from neobert_embed.sources import iter_records

    long_text = "word " * 40_000  # 200 KB
    records = [{"text": long_text, "_id": "d0"}, *({"text": r["text"], "_id": r["_id"]} for r in RECORDS[1:3])]
    sources = {fmt: write_format(tmp_path, fmt, records) for fmt in ("csv", "jsonl", "json-list", "txt")}
    sources["lines.json"] = _jsonl(tmp_path / "lines.json", records)
    for name, path in sources.items():
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
        read = [record for _, record in iter_records(path)]
        expected = [{"text": r["text"]} for r in records] if name == "txt" else records
        assert read == expected, name


def test_parquet_columns_are_read_only_when_asked(minilm_path, tmp_path, capsys):
    """pretrain reads only its text column of a parquet corpus; a missing column still lists those there are."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from neobert_embed.sources import iter_records

    path = tmp_path / "wide.parquet"
    pq.write_table(pa.Table.from_pylist([{**r, "content": r["text"]} for r in RECORDS]), path)
    assert [r for _, r in iter_records(path, columns=["content"])] == [{"content": r["text"]} for r in RECORDS]
    assert [r for _, r in iter_records(path, columns=["body"])] == [{**r, "content": r["text"]} for r in RECORDS]
    assert [r for _, r in iter_records(write_format(tmp_path, "csv"), columns=["text"])] == RECORDS  # parquet only
    code, _, err = run_main(["pretrain", "prepare", "--corpus", path, "--output", tmp_path / "prepared",
                             "--tokenizer", minilm_path, "--text-field", "content"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "prepared" / "corpus.json").read_text())["num_documents"] == len(RECORDS)
    code, _, err = run_main(["pretrain", "prepare", "--corpus", path, "--output", tmp_path / "again",
                             "--tokenizer", minilm_path, "--text-field", "body"], capsys)
    assert code == 2 and re.search(r"wide\.parquet:1: field 'body' is missing \(keys: \['_id', 'anchor'", err), err
