"""The encoding pipeline (:mod:`neobert_embed.inference.pipeline`): every text tokenized once, ahead of the
model; batches by length and tokens; the serial path's vectors in input order; batches side by side on a
multi-core CPU with one intra-op thread each; calls where a row could depend on other rows left to
sentence-transformers."""

from __future__ import annotations

import copy
import threading

import numpy as np
import pytest
import torch

from neobert_embed.encoding import encode_texts
from neobert_embed.inference import pipeline as pipeline_module
from neobert_embed.inference.fast_tokenizer import FastTokenizer
from neobert_embed.inference.pipeline import (
    PROBE_TEXTS,
    SIDE_BY_SIDE,
    DirectTokenizer,
    EncodePipeline,
    encode,
    engine_of,
    plan_batches,
    tokenize_with_preprocess,
)
from neobert_embed.inference.runtime import (
    AUTO_SAMPLE,
    AUTO_SAMPLE_GPU,
    AUTO_SAMPLE_MAX,
    cosine_to,
    load_inference_model,
    spreads_on,
    trial_texts,
)
from neobert_embed.machine import FEATURES_VARIABLE, Machine

TEXTS = [("word " * (1 + (i * 7) % 40)).strip() + f" {i}" for i in range(70)]  # 3 batches of 32 at most


@pytest.fixture
def two_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def minilm(minilm_path):
    previous = torch.get_num_threads()
    torch.set_num_threads(2)  # loaded with more than one thread: batches side by side
    try:
        loaded = load_inference_model(str(minilm_path), "fp32")
    finally:
        torch.set_num_threads(previous)
    assert engine_of(loaded.model).side_by_side and loaded.choice.layout.endswith(SIDE_BY_SIDE)
    return loaded.model


@pytest.fixture
def seen(minilm) -> list[tuple[int, int]]:
    """(thread id, intra-op threads) of every forward pass of the model's first module during a test."""
    calls: list[tuple[int, int]] = []
    hook = minilm[0].register_forward_pre_hook(
        lambda module, args: calls.append((threading.get_ident(), torch.get_num_threads())))
    yield calls
    hook.remove()


def plain_encode(model, *args, **kwargs):
    """sentence-transformers' own encode, one batch after another, tokenizing each batch itself."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer.encode(model, *args, **kwargs)


def test_the_pipeline_gives_sentence_transformers_vectors_in_input_order(minilm, two_threads):
    plain = plain_encode(minilm, TEXTS, batch_size=32, prompt="query: ", normalize_embeddings=True)
    plain_tensor = plain_encode(minilm, TEXTS, batch_size=32, convert_to_tensor=True)
    piped = minilm.encode(TEXTS, batch_size=32, prompt="query: ", normalize_embeddings=True)
    assert piped.shape == plain.shape and piped.dtype == plain.dtype
    assert cosine_to(plain, piped).min() > 0.999999
    np.testing.assert_allclose(piped, plain, atol=1e-5)
    as_tensor = minilm.encode(TEXTS, batch_size=32, convert_to_tensor=True)
    assert isinstance(as_tensor, torch.Tensor) and torch.allclose(as_tensor, plain_tensor, atol=1e-5)
    as_list = minilm.encode(TEXTS, batch_size=32, convert_to_numpy=False)
    assert len(as_list) == len(TEXTS) and torch.allclose(torch.stack(as_list), plain_tensor, atol=1e-5)


def test_every_text_is_tokenized_once(minilm, monkeypatch):
    """One tokenizer call per chunk of texts, each text in exactly one call; the truncation count comes
    from the same call (the toolkit used to tokenize every text twice). Through ``preprocess`` here (no
    direct tokenizer); the direct one's single pass is the next test's."""
    monkeypatch.setattr(FastTokenizer, "of", classmethod(lambda cls, tokenizer, limit: None))
    monkeypatch.setattr(minilm, "direct_tokenizer", DirectTokenizer(minilm))  # decided without a Rust tokenizer
    calls: list[list[str]] = []
    tokenizer_class = type(minilm.tokenizer)
    real_call = tokenizer_class.__call__

    def counting(self, text=None, *args, **kwargs):
        if isinstance(text, list):
            calls.append(list(text))
        return real_call(self, text, *args, **kwargs)

    monkeypatch.setattr(tokenizer_class, "__call__", counting)
    monkeypatch.setattr(pipeline_module, "CHUNK_TEXTS", 16)  # 5 chunks, tokenized ahead on a worker thread
    texts = [*TEXTS[:69], "word " * 600]  # the last text is cut at max_seq_length
    warnings: list[str] = []
    monkeypatch.setattr("neobert_embed.encoding.logger.warning", lambda msg, *a: warnings.append(msg % a))
    vectors = encode_texts(minilm, texts, batch_size=8)
    tokenized = [text for call in calls for text in call]
    assert sorted(tokenized) == sorted(texts) and len(calls) == 5
    assert warnings == ["1 of 70 texts are longer than max_seq_length=256 tokens and were truncated"]
    np.testing.assert_allclose(vectors, plain_encode(minilm, texts, batch_size=8), atol=1e-5)


def test_the_rust_tokenizer_is_checked_once_on_the_probe_set_then_tokenizes_every_text(minilm, monkeypatch):
    """The direct tokenizer is checked against ``preprocess`` on a fixed probe set when the engine is made (the
    model's prompts), and a prompt not known then on its first use only; past that, the model's Rust
    tokenizer tokenizes every text, once, whatever the call's size; the vectors are sentence-transformers'."""
    through_preprocess: list[str] = []
    real_call = type(minilm.tokenizer).__call__
    monkeypatch.setattr(type(minilm.tokenizer), "__call__", lambda self, text=None, *a, **k: (
        through_preprocess.extend(text), real_call(self, text, *a, **k))[1])
    direct: list[str] = []
    real_tokenize = FastTokenizer.tokenize
    monkeypatch.setattr(FastTokenizer, "tokenize", lambda self, texts: (direct.extend(texts),
                                                                        real_tokenize(self, texts))[1])
    fresh = DirectTokenizer(minilm)
    monkeypatch.setattr(minilm, "direct_tokenizer", fresh)
    engine = engine_of(minilm)
    probes = len(PROBE_TEXTS) + 1  # and an overlong text
    assert set(fresh.agreements) == {None, *minilm.prompts.values()} and None not in fresh.agreements.values()
    assert len(through_preprocess) == probes * len(fresh.agreements)
    through_preprocess.clear()
    direct.clear()
    monkeypatch.setattr(pipeline_module, "CHUNK_TEXTS", 48)
    texts = [*TEXTS, *(text + " again" for text in TEXTS), "word " * 600]  # 141 texts, 3 chunks, 1 cut
    vectors = encode(engine, texts, batch_size=8, prompt="query: ")
    assert len(through_preprocess) == probes and "query: " in engine.direct.agreements  # checked on first use
    assert sorted(direct[probes:]) == sorted("query: " + text for text in texts)
    encode(engine, TEXTS[:1], prompt="query: ")
    assert len(through_preprocess) == probes and direct[-1:] == ["query: " + TEXTS[0]]  # a one-text call: direct
    np.testing.assert_allclose(vectors, plain_encode(minilm, texts, batch_size=8, prompt="query: "), atol=1e-5)


@pytest.mark.parametrize("limit", [16, 300])
def test_a_direct_tokenizer_that_disagrees_with_preprocess_is_not_used(minilm, monkeypatch, limit):
    """Cut at 16 tokens it differs on the probe's texts; at 300 (the model reads 256) only on texts longer than
    any in a call, which the probe's overlong text shows."""
    real_of = FastTokenizer.of
    monkeypatch.setattr(FastTokenizer, "of", classmethod(lambda cls, tokenizer, _: real_of(tokenizer, limit)))
    texts = TEXTS * 2  # 4 to 42 tokens
    direct = DirectTokenizer(minilm)
    tokenized, reference = direct.tokenize(minilm, texts, None), tokenize_with_preprocess(minilm, texts)
    assert set(direct.agreements.values()) == {None}
    assert tokenized.lengths.max() > 16 and np.array_equal(tokenized.lengths, reference.lengths)
    assert all(np.array_equal(tokenized.values[key], values) for key, values in reference.values.items())


def test_chunks_tokenized_ahead_keep_input_order_and_bound_the_queue(minilm, monkeypatch):
    monkeypatch.setattr(pipeline_module, "CHUNK_TEXTS", 7)
    tokenizing_threads: set[int] = set()
    real_tokenize = DirectTokenizer.tokenize

    def spy(*args, **kwargs):
        tokenizing_threads.add(threading.get_ident())
        return real_tokenize(*args, **kwargs)

    monkeypatch.setattr(DirectTokenizer, "tokenize", spy)
    done: list[int] = []
    vectors = encode(engine_of(minilm), TEXTS, batch_size=4, advance=done.append)
    assert done == [7] * 10 and tokenizing_threads and threading.get_ident() not in tokenizing_threads
    np.testing.assert_allclose(vectors, plain_encode(minilm, TEXTS, batch_size=4), atol=1e-5)


def test_a_tokenizer_failure_reaches_the_caller(minilm, monkeypatch):
    monkeypatch.setattr(pipeline_module, "CHUNK_TEXTS", 7)
    monkeypatch.setattr(DirectTokenizer, "tokenize", lambda *a, **k: (_ for _ in ()).throw(ValueError("boom")))
    with pytest.raises(ValueError, match="boom"):
        encode(engine_of(minilm), TEXTS, batch_size=4)


def test_tokenize_marks_truncated_texts_and_keeps_what_encode_reads(minilm):
    texts = ["a cat", "word " * 600, ""]
    tokenized = engine_of(minilm).tokenize(texts, "query: ")
    reference = minilm.preprocess(texts, prompt="query: ")
    assert tokenized.truncated == 1 and tokenized.lengths.tolist() == reference["attention_mask"].sum(1).tolist()
    assert tokenized.shared == {"modality": "text", "prompt_length": reference["prompt_length"]}
    batch = tokenized.batch([1, 0])
    assert batch["input_ids"].shape == (2, 256)
    assert (batch["input_ids"] == reference["input_ids"][[1, 0]].numpy()).all()


@pytest.mark.parametrize(("side", "pad_token"), [("right", None), ("left", "[UNK]")])
def test_a_batch_is_padded_as_the_tokenizer_pads_it(minilm, side, pad_token):
    """Texts are held unpadded (padding a whole call and making it one tensor was most of the cost of
    tokenizing); a batch made from them is what ``preprocess`` returns for those texts, on either side
    and with a pad id that is not 0."""
    tokenizer = minilm.tokenizer
    saved = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = side
    if pad_token is not None:
        tokenizer.pad_token = pad_token
    try:
        texts = ["a cat", "word " * 600, "", "a much longer sentence about a dog on a mat"]
        tokenized = engine_of(minilm).tokenize(texts, "query: ")
        assert len(tokenized.values["input_ids"]) == tokenized.lengths.sum()  # nothing padded ahead
        rows = [3, 0, 2]
        batch = tokenized.batch(rows)
        reference = minilm.preprocess([texts[row] for row in rows], prompt="query: ")
    finally:
        tokenizer.padding_side, tokenizer.pad_token = saved
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        np.testing.assert_array_equal(batch[key], reference[key].numpy(), err_msg=key)
    assert batch["prompt_length"] == reference["prompt_length"]


@pytest.mark.parametrize(("lengths", "options", "expected"), [
    ([3, 9, 4, 9], {"max_tokens": 20}, [[1, 3], [2, 0]]),           # longest first, ties in input order
    ([3, 9, 4, 9], {"max_texts": 3}, [[1, 3, 2], [0]]),
    ([3, 9, 4, 9], {}, [[1, 3, 2, 0]]),
    ([30, 2, 2, 2], {"max_tokens": 100, "min_fill": 0.5}, [[0], [1, 2, 3]]),  # no short text padded to 30
    ([50, 1], {"max_tokens": 10}, [[0], [1]]),                       # a text over the budget still runs
])
def test_plan_batches(lengths, options, expected):
    assert [batch.tolist() for batch in plan_batches(lengths, **options)] == expected


def test_batches_on_a_gpu_are_cut_by_tokens_not_texts(minilm, monkeypatch):
    pipeline = EncodePipeline(minilm, max_batch_tokens=64)
    monkeypatch.setattr(EncodePipeline, "on_gpu", property(lambda self: True))
    tokenized = pipeline.tokenize(TEXTS, None)
    batches = pipeline.plan(tokenized, batch_size=32)
    for rows in batches:
        assert len(rows) == 1 or len(rows) * tokenized.lengths[rows].max() <= 64
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(TEXTS)))


def test_each_batch_runs_on_its_own_thread_with_one_intra_op_thread(minilm, two_threads, seen):
    caller = threading.get_ident()
    minilm.encode(TEXTS, batch_size=16)  # 5 batches over 2 workers
    assert len(seen) == 5
    assert {threads for _, threads in seen} == {1}
    assert caller not in {ident for ident, _ in seen} and len({ident for ident, _ in seen}) == 2
    assert torch.get_num_threads() == 2  # restored for the caller


@pytest.mark.parametrize("kwargs", [
    {"precision": "int8"},                 # calibrated on the whole call: rows depend on each other
    {"output_value": "token_embeddings"},
    {},                                    # with one thread there is nothing to spread
])
def test_calls_that_could_change_or_gain_nothing_run_in_the_caller(minilm, two_threads, seen, kwargs):
    if not kwargs:
        torch.set_num_threads(1)
    minilm.encode(TEXTS, batch_size=16, **kwargs)
    assert {ident for ident, _ in seen} == {threading.get_ident()}


def test_one_batch_or_a_single_text_runs_in_the_caller(minilm, two_threads, seen):
    minilm.encode(TEXTS[:32], batch_size=32)
    minilm.encode("one text")
    assert {ident for ident, _ in seen} == {threading.get_ident()} and len(seen) == 2


def test_an_unknown_argument_is_sentence_transformers_error(minilm, two_threads):
    with pytest.raises(ValueError, match="additional keyword arguments"):
        minilm.encode(TEXTS, batch_size=16, no_such_argument=1)
    assert torch.get_num_threads() == 2


def test_a_copy_runs_its_own_pipeline(minilm, two_threads):
    clone = copy.deepcopy(minilm)
    assert engine_of(clone).model is clone and engine_of(clone).side_by_side and "encode" not in vars(clone)
    assert clone.direct_tokenizer is not minilm.direct_tokenizer
    with torch.no_grad():
        for parameter in clone.parameters():
            parameter.mul_(0.5)
    assert cosine_to(minilm.encode(TEXTS), clone.encode(TEXTS)).min() < 0.999  # the copy's own weights ran


@pytest.mark.parametrize(("machine", "precision", "spreads"), [
    (Machine("cpu", "AVX2 EPYC", (), threads=2), "fp32", True),
    (Machine("cpu", "AVX2 EPYC", (), threads=1), "fp32", False),   # one thread: nothing to spread over
    (Machine("cpu", "AVX2 EPYC", (), threads=2), "int8", True),    # int8 runs fp32 products there
    (Machine("cpu", "AMX Xeon", ("amx_bf16", "amx_int8"), threads=16), "bf16", True),
    (Machine("cpu", "AMX Xeon", ("amx_bf16", "amx_int8"), threads=16), "int8", False),  # _int_mm: slower spread
    (Machine("cuda", "NVIDIA H200", threads=16, gpu_bf16=True), "bf16", False),
])
def test_which_models_run_batches_side_by_side(machine, precision, spreads):
    assert spreads_on(machine, precision) is spreads


def test_auto_times_a_gpu_on_a_realistic_batch_and_a_cpu_on_enough_text():
    """A CPU's sample holds AUTO_SAMPLE texts, more (repeated, up to AUTO_SAMPLE_MAX) while they are too
    little text to time stably; a GPU's is a few of the pipeline's token-budgeted batches."""
    gpu = Machine("cuda", "NVIDIA H200", threads=16, gpu_bf16=True)
    cpu = Machine("cpu", "AMX Xeon", ("amx_bf16",), threads=2)
    sample = [f"text {i}" for i in range(100)]
    paragraphs = ["word " * 400 + str(i) for i in range(100)]  # 2,000 characters each
    assert len(trial_texts(paragraphs, cpu)) == AUTO_SAMPLE == 32
    short = trial_texts(sample, cpu)
    assert len(short) == AUTO_SAMPLE_MAX and set(short) == set(sample)
    on_gpu = trial_texts(sample, gpu)
    assert len(on_gpu) == AUTO_SAMPLE_GPU >= 2048 and set(on_gpu) == set(sample)


def test_int8_on_int8_units_loads_without_side_by_side_batches(minilm_path, monkeypatch, two_threads):
    monkeypatch.setenv(FEATURES_VARIABLE, "avx512_vnni")
    loaded = load_inference_model(str(minilm_path), "int8")
    assert not engine_of(loaded.model).side_by_side and SIDE_BY_SIDE not in loaded.choice.description


def test_the_record_names_the_threads_the_model_was_loaded_with(minilm_path):
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = load_inference_model(str(minilm_path), "fp32")
        torch.set_num_threads(2)
        two = load_inference_model(str(minilm_path), "fp32")
    finally:
        torch.set_num_threads(previous)
    assert one.choice.machine.endswith(", 1 threads") and two.choice.machine.endswith(", 2 threads")
    assert not engine_of(one.model).side_by_side and SIDE_BY_SIDE not in one.choice.description
    assert engine_of(two.model).side_by_side and one.choice.layout + "; " + SIDE_BY_SIDE == two.choice.layout
