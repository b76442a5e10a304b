"""Batches side by side on a multi-core CPU (:mod:`neobert_embed.inference.parallel`): the same vectors in
input order, every batch on its own thread with one intra-op thread, nothing changed where a row
could depend on other rows, and the thread count restored whatever happens."""

from __future__ import annotations

import copy
import threading

import numpy as np
import pytest
import torch

from neobert_embed.inference.parallel import gather_batches, spread_batches, spreads_batches
from neobert_embed.inference.runtime import SPREAD_LAYOUT, cosine_to, load_inference_model, spreads_on
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
    torch.set_num_threads(2)  # loaded with more than one thread: it spreads
    try:
        loaded = load_inference_model(str(minilm_path), "fp32")
    finally:
        torch.set_num_threads(previous)
    assert spreads_batches(loaded.model) and loaded.choice.layout.endswith(SPREAD_LAYOUT)
    return loaded.model


@pytest.fixture
def seen(minilm) -> list[tuple[int, int]]:
    """(thread id, intra-op threads) of every forward pass of the model's first module during a test."""
    calls: list[tuple[int, int]] = []
    hook = minilm[0].register_forward_pre_hook(
        lambda module, args: calls.append((threading.get_ident(), torch.get_num_threads())))
    yield calls
    hook.remove()


def test_spread_batches_give_the_same_vectors_in_input_order(minilm, two_threads):
    gather_batches(minilm)
    try:
        plain = minilm.encode(TEXTS, batch_size=32, prompt="query: ", normalize_embeddings=True)
        plain_tensor = minilm.encode(TEXTS, batch_size=32, convert_to_tensor=True)
    finally:
        spread_batches(minilm)
    spread = minilm.encode(TEXTS, batch_size=32, prompt="query: ", normalize_embeddings=True)
    assert spread.shape == plain.shape and spread.dtype == plain.dtype
    assert cosine_to(plain, spread).min() > 0.999999
    np.testing.assert_allclose(spread, plain, atol=1e-5)
    as_tensor = minilm.encode(TEXTS, batch_size=32, convert_to_tensor=True)
    assert isinstance(as_tensor, torch.Tensor) and torch.allclose(as_tensor, plain_tensor, atol=1e-5)
    as_list = minilm.encode(TEXTS, batch_size=32, convert_to_numpy=False)
    assert len(as_list) == len(TEXTS) and torch.allclose(torch.stack(as_list), plain_tensor, atol=1e-5)


def test_encode_query_and_encode_document_spread_too(minilm, two_threads, seen):
    gather_batches(minilm)
    try:
        plain = minilm.encode_query(TEXTS, batch_size=16)
    finally:
        spread_batches(minilm)
    before = len(seen)
    np.testing.assert_allclose(minilm.encode_query(TEXTS, batch_size=16), plain, atol=1e-5)
    minilm.encode_document(TEXTS, batch_size=16)
    assert threading.get_ident() not in {ident for ident, _ in seen[before:]}


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
def test_calls_that_could_change_or_gain_nothing_run_unchanged_in_the_caller(minilm, two_threads, seen, kwargs):
    if not kwargs:
        torch.set_num_threads(1)
    minilm.encode(TEXTS, batch_size=16, **kwargs)
    assert {ident for ident, _ in seen} == {threading.get_ident()}


def test_one_batch_or_a_single_text_runs_in_the_caller(minilm, two_threads, seen):
    minilm.encode(TEXTS[:32], batch_size=32)
    minilm.encode("one text")
    assert {ident for ident, _ in seen} == {threading.get_ident()} and len(seen) == 2


def test_a_failing_batch_raises_in_the_caller_and_restores_the_threads(minilm, two_threads):
    with pytest.raises(ValueError, match="additional keyword arguments"):
        minilm.encode(TEXTS, batch_size=16, no_such_argument=1)
    assert torch.get_num_threads() == 2


def test_a_copy_spreads_its_own_batches(minilm, two_threads):
    clone = copy.deepcopy(minilm)
    assert spreads_batches(clone) and clone.encode.__self__ is clone
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
def test_which_models_spread_their_batches(machine, precision, spreads):
    assert spreads_on(machine, precision) is spreads


def test_int8_on_int8_units_loads_without_spreading(minilm_path, monkeypatch, two_threads):
    monkeypatch.setenv(FEATURES_VARIABLE, "avx512_vnni")
    loaded = load_inference_model(str(minilm_path), "int8")
    assert not spreads_batches(loaded.model) and SPREAD_LAYOUT not in loaded.choice.description


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
    assert not spreads_batches(one.model) and SPREAD_LAYOUT not in one.choice.description
    assert spreads_batches(two.model) and one.choice.layout + "; " + SPREAD_LAYOUT == two.choice.layout
