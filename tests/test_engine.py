"""One inference engine (issue 48): what used to differ between the torch path, the light runtime and the
server, each checked through its public entry point. Every test here fails on the code before the change."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
from tiny_models import build_tiny_model

from neobert_embed.errors import UserInputError

SHORT = ["a cat", "the dog on the mat", "hello world"]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    return build_tiny_model("bert", tmp_path_factory.mktemp("engine") / "bert", seed=3)


@pytest.fixture(scope="module")
def tiny_onnx(tiny_bert, tmp_path_factory) -> Path:
    from neobert_embed.inference.export import export_model

    output = tmp_path_factory.mktemp("engine") / "bert-onnx"
    export_model(tiny_bert, output, "onnx")
    return output


def test_the_light_runtime_warns_on_truncated_texts(tiny_onnx, caplog):
    """``encode`` of an export counts the texts it cut and warns, as the torch path does (one loop)."""
    from neobert_embed.encoding import encode_texts
    from neobert_embed.inference.light import load_light_model

    light = load_light_model(tiny_onnx, "onnx", threads=1)
    light.max_seq_length = 16
    with caplog.at_level(logging.WARNING, logger="neobert_embed.encoding"):
        vectors = encode_texts(light, [SHORT[0], "word " * 100, SHORT[1]], batch_size=2)
    assert vectors.shape == (3, light.get_embedding_dimension())
    assert "1 of 3 texts are longer than max_seq_length=16 tokens and were truncated" in caplog.text


def test_the_light_runtime_stops_on_a_non_finite_vector(tiny_onnx):
    """A graph that yields NaN (fp16 overflow, damaged weights) stops the job naming the row."""
    from neobert_embed.inference.light import load_light_model

    light = load_light_model(tiny_onnx, "onnx", threads=1)
    real = light.runner

    class Overflowing:
        input_names = real.input_names

        def __call__(self, features):
            hidden = np.array(real(features), dtype=np.float32)
            hidden[features["input_ids"].shape[0] - 1] = np.nan  # the batch's last row
            return hidden

    light.runner = Overflowing()
    with pytest.raises(UserInputError, match=r"input row \d+ .*NaN or Inf"):
        light.encode(SHORT, batch_size=8)


@pytest.fixture(scope="module")
def served(tiny_bert):
    from fastapi.testclient import TestClient

    from neobert_embed.serve.app import create_app
    from neobert_embed.serve.settings import ServeSettings

    app = create_app(ServeSettings(model=str(tiny_bert), precision="fp32"))
    with TestClient(app) as client:
        yield app, client


def test_serve_tokenizes_a_request_once_with_the_fast_tokenizer(served, monkeypatch):
    """After the first request (the direct tokenizer's probe), a small request is tokenized once, by the
    model's Rust tokenizer: no count-then-forward double work, no slow path for small batches."""
    from neobert_embed.inference.fast_tokenizer import FastTokenizer

    app, client = served
    assert client.post("/embed", json={"inputs": SHORT}).status_code == 200  # probes the direct tokenizer
    state = app.app.state.server
    through_preprocess: list[list[str]] = []
    real_call = type(state.engine.model.tokenizer).__call__
    monkeypatch.setattr(type(state.engine.model.tokenizer), "__call__", lambda self, text=None, *a, **k: (
        through_preprocess.append(list(text)), real_call(self, text, *a, **k))[1])
    direct: list[list[str]] = []
    real_tokenize = FastTokenizer.tokenize
    monkeypatch.setattr(FastTokenizer, "tokenize", lambda self, texts: (direct.append(list(texts)),
                                                                        real_tokenize(self, texts))[1])
    response = client.post("/embed", json={"inputs": SHORT[:2]})
    assert response.status_code == 200 and len(response.json()) == 2
    assert direct == [SHORT[:2]] and through_preprocess == []
    expected = state.engine.model.encode(SHORT[:2], convert_to_numpy=True, normalize_embeddings=True)  # TEI's default
    np.testing.assert_allclose(np.array(response.json()), expected, atol=1e-5)


def test_the_server_budget_counts_real_tokens_for_an_unpadded_bert(served):
    """BERT runs un-padded here, so its batches are filled by real tokens (as TEI's), not padded ones."""
    app, _ = served
    state = app.app.state.server
    assert state.engine.unpads and not state.batcher.padded and state.batcher.min_fill == 0.0


def _count_rust_tokenizer_calls(holder: object, calls: list[str]) -> None:
    """Wrap every ``tokenizers.Tokenizer`` that ``holder`` keeps, so each ``encode*`` call is recorded."""
    from tokenizers import Tokenizer

    class Counting:
        def __init__(self, inner: Tokenizer) -> None:
            self._inner = inner

        def __getattr__(self, name: str):
            value = getattr(self._inner, name)
            if not name.startswith("encode"):
                return value
            return lambda *args, **kwargs: (calls.append(name), value(*args, **kwargs))[1]

    wrapped = {name: Counting(value) for name, value in vars(holder).items() if isinstance(value, Tokenizer)}
    assert wrapped, f"no Rust tokenizer found in {type(holder).__name__}"
    vars(holder).update(wrapped)


def test_an_export_is_served_by_the_same_engine_tokenizing_a_request_once(tiny_onnx):
    """``serve --backend onnx`` runs the one server engine: a request is tokenized once by the export's Rust
    tokenizer (no count-then-embed double work), a too-long text gets the same 413, and the vectors are the
    light runtime's ``encode``."""
    from fastapi.testclient import TestClient

    from neobert_embed.inference.light import load_light_model
    from neobert_embed.serve.app import create_app
    from neobert_embed.serve.settings import ServeSettings

    app = create_app(ServeSettings(model=str(tiny_onnx), backend="onnx", max_input_tokens=16))
    calls: list[str] = []
    with TestClient(app) as client:
        assert client.post("/embed", json={"inputs": SHORT}).status_code == 200  # warm
        _count_rust_tokenizer_calls(app.app.state.server.engine.model.tokenizer, calls)
        response = client.post("/embed", json={"inputs": SHORT[:2], "normalize": False})
        assert response.status_code == 200 and len(calls) == 1, calls
        too_long = client.post("/embed", json={"inputs": ["word " * 40]})
    assert too_long.status_code == 413 and "more than 16 tokens" in too_long.json()["error"]["message"]
    expected = load_light_model(tiny_onnx, "onnx", threads=1).encode(SHORT[:2])
    np.testing.assert_allclose(np.array(response.json()), expected, atol=1e-5)


def test_plan_batches_counts_real_tokens_when_asked():
    from neobert_embed.inference.pipeline import plan_batches

    assert [b.tolist() for b in plan_batches([10, 1, 1, 1], max_tokens=13)] == [[0], [1, 2, 3]]
    assert [b.tolist() for b in plan_batches([10, 1, 1, 1], max_tokens=13, padded=False)] == [[0, 1, 2, 3]]


def test_loading_a_model_as_a_library_changes_no_process_setting(tiny_bert, monkeypatch):
    """``load_inference_model`` sets no environment variable, thread count or allocator option; the CLI
    sets its own (``native_memory.bound_native_memory``) for itself."""
    import sentence_transformers  # noqa: F401  (third-party imports set their own variables: sklearn's KMP_*)
    import sklearn  # noqa: F401
    import torch

    from neobert_embed import native_memory
    from neobert_embed.inference.runtime import load_inference_model

    for name in (*native_memory.KERNEL_CACHE_VARIABLES, native_memory.MMAP_THRESHOLD_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    allocator: list[int] = []
    monkeypatch.setattr(native_memory, "fix_mmap_threshold", lambda size: allocator.append(size) or True)
    environment, threads = dict(os.environ), torch.get_num_threads()
    loaded = load_inference_model(str(tiny_bert), "fp32")
    loaded.model.encode([*SHORT] * 30, batch_size=4)
    assert dict(os.environ) == environment and torch.get_num_threads() == threads and allocator == []


def test_readme_load_example_runs_the_engine(minilm_path, monkeypatch, capsys):
    """README's Python example, verbatim but for the model's local path: ``neobert_embed.load`` gives a
    SentenceTransformer subclass (no method replaced on the instance) whose ``encode_query`` and
    ``encode_document`` run the toolkit's loop and give sentence-transformers' vectors."""
    import re

    from safety_helpers import REPO
    from sentence_transformers import SentenceTransformer

    from neobert_embed.inference import pipeline

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(from neobert_embed import load\n.*?)```", readme, flags=re.S).group(1)
    loops: list[int] = []
    real_loop = pipeline.encode_chunks
    monkeypatch.setattr(pipeline, "encode_chunks", lambda engine, texts, **kw: (loops.append(len(texts)),
                                                                                 real_loop(engine, texts, **kw))[1])
    namespace: dict = {}
    exec(block.replace("sentence-transformers/all-MiniLM-L6-v2", str(minilm_path)), namespace)  # noqa: S102
    model = namespace["model"]
    assert isinstance(model, SentenceTransformer) and "encode" not in vars(model)
    assert loops[-2:] == [1, 1]  # encode_query and encode_document, each through the loop
    plain = SentenceTransformer(str(minilm_path), device="cpu")
    expected = plain.encode_query(["how do I reset my password?"])
    tolerance = 1e-5 if model.compute_precision.precision == "fp32" else 5e-2
    np.testing.assert_allclose(namespace["queries"], expected, atol=tolerance)
    assert model.compute_precision.description in capsys.readouterr().out


def test_every_encode_argument_of_sentence_transformers_has_a_rule():
    """Each argument of today's ``SentenceTransformer.encode`` is either run by the engine (at listed values)
    or handled by it; a new argument in a later release fails here instead of silently changing path."""
    import inspect

    from sentence_transformers import SentenceTransformer

    from neobert_embed.inference.pipeline import HANDLED_ARGUMENTS, PIPELINED_DEFAULTS

    names = [name for name, parameter in inspect.signature(SentenceTransformer.encode).parameters.items()
             if name not in ("self", "inputs") and parameter.kind is not parameter.VAR_KEYWORD]
    assert sorted(set(names) - set(PIPELINED_DEFAULTS) - set(HANDLED_ARGUMENTS)) == []


def test_auto_is_measured_once_per_machine_and_model_on_enough_text(tiny_bert, tmp_path, monkeypatch):
    """``auto`` times each precision on enough text to be stable, and keeps its choice per machine, model
    weights and torch version (an atomic JSON file), so a restart computes the same way without measuring."""
    from neobert_embed.inference import runtime
    from neobert_embed.machine import describe_machine

    monkeypatch.setenv(runtime.CACHE_VARIABLE, str(tmp_path))
    measured: list[int] = []
    real = runtime.choose_precision
    monkeypatch.setattr(runtime, "choose_precision", lambda *a, **k: (measured.append(1), real(*a, **k))[1])
    first = runtime.load_inference_model(str(tiny_bert), "auto", sample_texts=SHORT)
    again = runtime.load_inference_model(str(tiny_bert), "auto", sample_texts=SHORT)
    assert measured == [1] and again.choice.precision == first.choice.precision
    assert (tmp_path / "precision.json").is_file() and not list(tmp_path.glob("*.tmp*"))
    sample = runtime.trial_texts(SHORT, describe_machine("cpu"))
    assert len(sample) == runtime.AUTO_SAMPLE_MAX or sum(map(len, sample)) >= runtime.AUTO_SAMPLE_CHARS


@pytest.mark.parametrize("runtime", ["torch", "light"])
def test_already_tokenized_texts_run_the_one_loop(runtime, tiny_bert, tiny_onnx, monkeypatch):
    """``encode_tokenized`` (the passages of long documents, tokenized once) runs ``encode``'s loop on both
    runtimes: the same vectors as ``encode``, CPU batches within the token budget, a non-finite row named."""
    from sentence_transformers import SentenceTransformer

    from neobert_embed.inference import pipeline
    from neobert_embed.inference.light import load_light_model

    engine = (pipeline.EncodePipeline(SentenceTransformer(str(tiny_bert), device="cpu")) if runtime == "torch"
              else load_light_model(tiny_onnx, "onnx", threads=1))
    texts = ["word " * 20, *SHORT, "cat " * 30]
    tokenized = engine.tokenize(texts, None)
    monkeypatch.setattr(pipeline, "CPU_BATCH_TOKENS", 2 * int(tokenized.lengths.max()))
    seen: list[tuple[int, ...]] = []
    forward = engine.forward

    def recording(features, *, normalize=False):
        seen.append(tuple(features["input_ids"].shape))
        return forward(features, normalize=normalize)

    monkeypatch.setattr(engine, "forward", recording)
    vectors = pipeline.encode_tokenized(engine, tokenized, batch_size=32)
    assert all(rows * width <= pipeline.CPU_BATCH_TOKENS for rows, width in seen) and len(seen) > 1
    np.testing.assert_allclose(vectors, pipeline.encode(engine, texts), atol=1e-5)

    def overflowing(features, *, normalize=False):
        out = forward(features, normalize=normalize)
        out[-1] = np.nan
        return out

    monkeypatch.setattr(engine, "forward", overflowing)
    with pytest.raises(UserInputError, match=r"passage \d+ of document 7: the model produced NaN"):
        pipeline.encode_tokenized(engine, tokenized, name_row=lambda row: f"passage {row + 1} of document 7")


def test_a_loaded_model_carries_no_patched_method_and_no_engine_inside(tiny_bert):
    """The loader builds classes, not patched instances: the model's ``encode``/``forward`` and its encoder's
    ``forward`` are their classes' own (the un-padded encoder is of ``unpadded_class``), and the engine is built
    from plain declared attributes (no pipeline object stored inside the model)."""
    from neobert_embed.inference.embedding_model import EmbeddingModel
    from neobert_embed.inference.pipeline import EncodePipeline, engine_of
    from neobert_embed.inference.runtime import load_inference_model
    from neobert_embed.inference.unpadded import unpadded_class

    model = load_inference_model(str(tiny_bert), "bf16").model
    encoder = model[0].auto_model
    assert type(model) is EmbeddingModel and not {"encode", "forward"} & set(vars(model))
    assert "forward" not in vars(encoder) and type(encoder) is unpadded_class(type(encoder).__bases__[0])
    assert model.autocast == ("cpu", "bf16") and model.engine_options.unpads
    assert not any(isinstance(value, EncodePipeline) for value in vars(model).values())
    assert engine_of(model).model is model and engine_of(model).direct is model.direct_tokenizer


def test_the_tokenizer_is_decided_at_load_on_the_probe_set(tiny_bert, monkeypatch):
    """The Rust tokenizer is checked against ``preprocess`` when the model is loaded, for each of its prompts, on
    a fixed probe set; encoding then never runs ``preprocess`` for those prompts, whatever the call's size, and a
    prompt not known at load is checked once, on its first use."""
    from neobert_embed.inference import pipeline
    from neobert_embed.inference.runtime import load_inference_model

    checked: list[str | None] = []
    real_check = pipeline.DirectTokenizer._check
    monkeypatch.setattr(pipeline.DirectTokenizer, "_check",
                        lambda self, model, prompt: (checked.append(prompt), real_check(self, model, prompt))[1])
    model = load_inference_model(str(tiny_bert), "fp32").model
    known = {None, *model.prompts.values()}
    assert sorted(checked, key=str) == sorted(known, key=str) and None not in model.direct_tokenizer.agreements.values()
    preprocessed: list[int] = []
    real_preprocess = pipeline.tokenize_with_preprocess
    monkeypatch.setattr(pipeline, "tokenize_with_preprocess",
                        lambda *a, **k: (preprocessed.append(1), real_preprocess(*a, **k))[1])
    model.encode(SHORT[:1])
    model.encode(SHORT * 20, batch_size=4)
    assert preprocessed == [] and len(checked) == len(known)
    model.encode(SHORT, prompt="query: ")
    model.encode(SHORT, prompt="query: ")
    assert checked[len(known):] == ["query: "] and preprocessed == [1]  # the probe of the new prompt only


def test_side_by_side_workers_set_their_thread_count_once_not_per_batch(tiny_bert, monkeypatch):
    """The workers' intra-op thread count is set when each worker starts (the pool's initializer); a later call
    only gives the caller's count back as the default of threads started later."""
    import threading

    import torch

    from neobert_embed.inference import pipeline
    from neobert_embed.inference.runtime import load_inference_model

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = load_inference_model(str(tiny_bert), "fp32").model
        assert pipeline.engine_of(model).side_by_side
        model.encode(SHORT * 8, batch_size=2)  # the pool's workers start here (or in an earlier test)
        calls: list[int] = []
        real = torch.set_num_threads
        monkeypatch.setattr(torch, "set_num_threads", lambda count: (calls.append(count), real(count))[1])
        model.encode(SHORT * 8, batch_size=2)  # 12 batches over 2 workers
        later: list[int] = []
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert calls == [2] and later == [2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
