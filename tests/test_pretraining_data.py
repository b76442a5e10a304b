"""Pretraining data path: masking statistics, packing, recipes, schedule, corpus preparation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pretraining_helpers import tiny_recipe, write_docstring_corpus

from neobert_embed.errors import UserInputError
from neobert_embed.pretraining import load_pretrain_recipe, prepare_corpus
from neobert_embed.pretraining.masking import mask_tokens
from neobert_embed.pretraining.packing import DocumentStream, LengthMixture, Piece, collate_rows
from neobert_embed.pretraining.recipe import parse_pretrain_recipe
from neobert_embed.pretraining.schedule import WarmupCosineFactor

SPECIAL = [0, 100, 101, 102, 103]


def _ids(rows=400, length=512, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30000, (rows, length), generator=gen)
    ids[:, 0], ids[:, -1], ids[:, 200:210] = 101, 102, 0  # [CLS] … [SEP], a run of padding
    ids[::7, 50] = 100  # [UNK]
    return ids


@pytest.mark.parametrize("mode", ["mask_all", "bert"])
def test_masking_rate_and_special_tokens(mode):
    ids = _ids()
    masked, labels = mask_tokens(ids, rate=0.2, mode=mode, mask_id=103, special_ids=SPECIAL,
                                 vocab_size=30522, generator=torch.Generator().manual_seed(1))
    maskable = ~torch.isin(ids, torch.tensor(SPECIAL))
    selected = labels != -100
    assert abs(selected.sum().item() / maskable.sum().item() - 0.2) < 0.01
    assert not (selected & ~maskable).any(), "a special token was selected"
    assert torch.equal(masked[~maskable], ids[~maskable]), "a special token was changed"
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(masked[~selected], ids[~selected]), "an unselected token was changed"
    share_mask = (masked[selected] == 103).float().mean().item()
    if mode == "mask_all":
        assert share_mask == 1.0
    else:
        unchanged = (masked[selected] == ids[selected]).float().mean().item()
        replaced = 1 - share_mask - unchanged
        assert abs(share_mask - 0.8) < 0.01 and abs(unchanged - 0.1) < 0.01 and abs(replaced - 0.1) < 0.01
        randoms = masked[selected & (masked != 103) & (masked != ids)]
        assert not torch.isin(randoms, torch.tensor(SPECIAL)).any()


def test_masking_is_a_function_of_the_seed():
    ids = _ids(rows=4)
    first = mask_tokens(ids, rate=0.2, mode="bert", mask_id=103, special_ids=SPECIAL, vocab_size=30522,
                        generator=torch.Generator().manual_seed(5))
    again = mask_tokens(ids, rate=0.2, mode="bert", mask_id=103, special_ids=SPECIAL, vocab_size=30522,
                        generator=torch.Generator().manual_seed(5))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


class _ArrayCorpus:
    """Documents as arrays (what the packer reads from a prepared corpus)."""

    def __init__(self, lengths, seed=0):
        rng = np.random.default_rng(seed)
        self.docs = [rng.integers(5, 1000, size=n).astype(np.int32) for n in lengths]
        self.lengths = np.array(lengths, dtype=np.int64)

    def tokens(self, doc, start, stop):
        return self.docs[doc][start:stop]


def test_packing_fills_rows_and_keeps_every_token_once():
    lengths = [3, 70, 12, 200, 5, 64, 9, 130, 1, 33]  # documents longer than a row are split
    corpus = _ArrayCorpus(lengths)
    stream = DocumentStream(corpus.lengths, seed=0)
    rows, seen, budget = [], {d: [] for d in range(len(lengths))}, sum(lengths)
    while stream.position.epoch == 0:
        rows.append(stream.next_row(64, packed=True))
    for piece in (p for row in rows for p in row):  # the last row already holds epoch-1 pieces
        if budget > 0:
            seen[piece.doc].append((piece.start, piece.stop))
            budget -= piece.length
    for doc, length in enumerate(lengths):  # epoch 0 pieces tile every document exactly once
        covered = [t for start, stop in sorted(seen[doc]) for t in range(start, stop)]
        assert covered == list(range(length)), f"document {doc} lost or repeated tokens"
    full_rows = rows[:-1]
    assert all(sum(p.length for p in row) == 64 for row in full_rows)
    batch = collate_rows(corpus, rows[:4], 64, pad_id=0)
    assert batch["attention_mask"].float().mean() >= 0.95
    flat_ids = batch["input_ids"].reshape(-1)
    bounds = batch["cu_seqlens"].tolist()
    assert bounds[0] == 0 and bounds[-1] == 4 * 64
    pieces = [p for row in rows[:4] for p in row]
    for piece, start in zip(pieces, bounds, strict=False):
        assert torch.equal(flat_ids[start:start + piece.length],
                           torch.from_numpy(corpus.tokens(piece.doc, piece.start, piece.stop)).long())
        assert batch["position_ids"].reshape(-1)[start:start + piece.length].tolist() == list(range(piece.length))


def test_padded_rows_and_stream_resumes_from_its_position():
    corpus = _ArrayCorpus([10, 150, 20])
    stream = DocumentStream(corpus.lengths, seed=3)
    rows = [stream.next_row(64, packed=False) for _ in range(3)]
    assert all(len(row) == 1 and row[0].length <= 64 for row in rows)
    batch = collate_rows(corpus, [[Piece(0, 0, 10)]], 16, pad_id=0)
    assert batch["attention_mask"].sum() == 10 and batch["cu_seqlens"].tolist() == [0, 10, 16]
    first = DocumentStream(corpus.lengths, seed=3)
    ahead = [first.next_row(64, packed=True) for _ in range(5)]
    resumed = DocumentStream(corpus.lengths, seed=3)
    [resumed.next_row(64, packed=True) for _ in range(2)]
    again = DocumentStream(corpus.lengths, seed=3, position=resumed.position)
    assert [again.next_row(64, packed=True) for _ in range(3)] == ahead[2:]


def test_length_mixture_favours_long_documents():
    lengths = np.array([10] * 900 + [1000] * 100)
    mixture = LengthMixture((100, None), (0.2, 0.8))
    order = DocumentStream(lengths, seed=0, mixture=mixture).order(0)
    assert abs((lengths[order] == 1000).mean() - 0.8) < 0.05
    assert (lengths[DocumentStream(lengths, seed=0).order(0)] == 1000).mean() == 0.1


def test_packing_keeps_documents_apart_in_neobert():
    from neobert_embed.modeling import NeoBERTConfig, NeoBERTModel

    torch.manual_seed(0)
    model = NeoBERTModel(NeoBERTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, vocab_size=200, max_length=64)).eval()
    corpus = _ArrayCorpus([20, 30, 14], seed=1)
    other = _ArrayCorpus([20, 30, 14], seed=2)
    other.docs[0] = corpus.docs[0]  # same document A; B and C differ
    row = [[Piece(0, 0, 20), Piece(1, 0, 30), Piece(2, 0, 14)]]
    outputs = []
    for source in (corpus, other):
        batch = collate_rows(source, row, 64, pad_id=0)
        batch["input_ids"] %= 200
        with torch.no_grad():
            outputs.append(model(**batch).last_hidden_state[0])
    assert torch.allclose(outputs[0][:20], outputs[1][:20], atol=1e-6), "document A saw its neighbours"
    assert not torch.allclose(outputs[0][20:50], outputs[1][20:50], atol=1e-3)
    with torch.no_grad():  # without boundaries the same row does leak: the check above can fail
        leaked = [model(collate_rows(s, row, 64, 0)["input_ids"] % 200).last_hidden_state[0, :20]
                  for s in (corpus, other)]
    assert not torch.allclose(leaked[0], leaked[1], atol=1e-3)


def test_schedule_warmup_cosine_floor():
    factor = WarmupCosineFactor(warmup_steps=2000, total_steps=1_000_000)
    assert factor(0) == pytest.approx(1 / 2000) and factor(1999) == 1.0
    assert factor(2000) == 1.0
    assert factor(451_000) == pytest.approx(0.55, abs=1e-3)  # halfway through the cosine
    assert factor(900_000) == pytest.approx(0.1) and factor(999_999) == pytest.approx(0.1)


def test_shipped_recipes_load():
    stage1 = load_pretrain_recipe("recipes/pretrain-stage1.yaml")
    stage2 = load_pretrain_recipe("recipes/pretrain-stage2.yaml")
    tiny = load_pretrain_recipe("recipes/pretrain-tiny.yaml")
    assert (stage1.data.seq_length, stage1.training.max_steps) == (1024, 1_000_000)
    assert stage1.optimizer.lr == 6e-4 and stage1.optimizer.betas == (0.9, 0.95)
    assert stage1.schedule.warmup_steps == 2000 and stage1.masking.rate == 0.2
    assert (stage2.data.seq_length, stage2.training.max_steps) == (4096, 50_000)
    assert stage2.model.init_from and stage2.data.length_mixture[-1].weight > stage2.data.length_mixture[0].weight
    assert tiny.tokenizer.source == "train"


@pytest.mark.parametrize("patch, key", [
    ({"training": {"max_step": 5}}, "unknown key 'training.max_step'"),
    ({"model": {"init_from": "x", "hidden_size": 8}}, "remove model.hidden_size"),
    ({"tokenizer": {"source": "train"}}, "tokenizer.vocab_size"),
    ({"training": {"engine": "torch", "zero_stage": 2}}, "training.zero_stage"),
    ({"model": {"attention_backend": "padded"}}, "data.packing"),
    ({"data": {"seq_length": 128}}, "data.seq_length (128) exceeds model.max_length"),
    ({"masking": {"mode": "random"}}, "masking.mode"),
])
def test_recipe_errors_name_the_key(patch, key):
    data = tiny_recipe()
    for section, values in patch.items():
        data[section] = {**data.get(section, {}), **values}
    if "init_from" in patch.get("model", {}):
        data["model"] = {"init_from": "x", "hidden_size": 8}
    with pytest.raises(UserInputError, match=key.replace("(", r"\(").replace(")", r"\)")):
        parse_pretrain_recipe(data, "r.yaml")


def test_recipe_file_unknown_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: {hidden_size: 32}\nmaskng: {rate: 0.2}\n")
    with pytest.raises(UserInputError, match=r"bad.yaml:2: unknown key 'maskng'"):
        load_pretrain_recipe(path)


def test_prepare_trains_vocab_writes_datasets_shards_and_resumes(tmp_path):
    corpus = write_docstring_corpus(tmp_path / "docs.jsonl", limit=120)
    out = tmp_path / "prepared"
    prepared = prepare_corpus(corpus, out, tokenizer="train", vocab_size=300, shard_documents=50,
                              progress=False)
    assert prepared.num_documents == 120 and prepared.num_tokens == int(prepared.lengths.sum())
    tokenizer = prepared.tokenizer
    first = json.loads(corpus.read_text().splitlines()[0])["text"]
    assert prepared.tokens(0, 0, prepared.lengths[0]).tolist() == tokenizer(first)["input_ids"]
    import datasets

    shard = datasets.Dataset.from_file(str(out / "shards" / "000000.arrow"))
    assert shard.num_rows == 50 and shard[0]["input_ids"] == tokenizer(first)["input_ids"]
    (out / "corpus.json").unlink()  # an interrupted run: finished shards are kept and reused
    (out / "shards" / "000002.arrow").unlink()
    before = (out / "shards" / "000000.arrow").stat().st_mtime_ns
    again = prepare_corpus(corpus, out, tokenizer="train", vocab_size=300, shard_documents=50, progress=False)
    assert (out / "shards" / "000000.arrow").stat().st_mtime_ns == before
    assert np.array_equal(again.lengths, prepared.lengths)
    (out / "corpus.json").unlink()
    with pytest.raises(UserInputError, match=r"rerunning prepare must continue the same run, but "
                       r"shard_documents \(50 → 60\), vocab_size \(300 → 400\) changed"):
        prepare_corpus(corpus, out, tokenizer="train", vocab_size=400, shard_documents=60, progress=False)


def test_prepare_txt_and_parquet_with_existing_tokenizer(tmp_path, minilm_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.txt").write_text("The first document.\n\nA second, longer document here.\n")
    txt = prepare_corpus(tmp_path / "a.txt", tmp_path / "p1", tokenizer=str(minilm_path), progress=False)
    assert txt.num_documents == 2 and txt.tokens(0, 0, 1).tolist() == [101]
    pq.write_table(pa.table({"body": ["one doc", "two docs"]}), tmp_path / "c.parquet")
    par = prepare_corpus(tmp_path / "c.parquet", tmp_path / "p2", tokenizer=str(minilm_path),
                         text_field="body", progress=False)
    assert par.num_documents == 2
    with pytest.raises(UserInputError, match=r"c\.parquet:1: field 'text' is missing"):
        prepare_corpus(tmp_path / "c.parquet", tmp_path / "p3", tokenizer=str(minilm_path), progress=False)


def test_prepare_bad_corpora(tmp_path, minilm_path):
    (tmp_path / "empty.txt").write_text("\n  \n")
    with pytest.raises(UserInputError, match="holds no documents"):
        prepare_corpus(tmp_path / "empty.txt", tmp_path / "o1", tokenizer=str(minilm_path), progress=False)
    assert not (tmp_path / "o1").exists()  # nothing claimed: fixing the file and rerunning just works
    (tmp_path / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    with pytest.raises(UserInputError, match=r"image.txt:1: not valid UTF-8"):
        prepare_corpus(tmp_path / "image.txt", tmp_path / "o2", tokenizer=str(minilm_path), progress=False)
    (tmp_path / "nul.txt").write_bytes(b"text\x00with nul\n")
    with pytest.raises(UserInputError, match=r"nul.txt:1: contains NUL bytes"):
        prepare_corpus(tmp_path / "nul.txt", tmp_path / "o3", tokenizer=str(minilm_path), progress=False)
    (tmp_path / "d.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(UserInputError, match=r"d.jsonl:2: field 'text' is missing"):
        prepare_corpus(tmp_path / "d.jsonl", tmp_path / "o4", tokenizer=str(minilm_path), progress=False)
    with pytest.raises(UserInputError, match="not loadable as a Hugging Face dataset"):
        prepare_corpus("no-such/dataset-xyz", tmp_path / "o5", tokenizer=str(minilm_path), progress=False)
