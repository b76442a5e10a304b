"""`neobert-embed serve` through real clients: the `openai` package, httpx, over loopback HTTP.

Vectors are compared with `SentenceTransformer.encode` of the same model (same prompt, same
normalization); /search runs over an index built with the index API and reopened after `add`.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from serve_helpers import server_thread, tiny_neobert_st
from typer.testing import CliRunner

from neobert_embed.cli import app as cli_app
from neobert_embed.index import add_documents, build_index

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXTS = ["a cat sits on the mat", "", "Stock markets fell sharply today as oil prices rose again, "
         "dragging energy shares and the wider index lower for a third day in a row.",
         "naïve café — emoji 🚀 and 中文 text", "dogs"]
DOCS = [("d1", "Cats", "Cats are small domesticated felines that purr and chase mice."),
        ("d2", "Oil", "Crude oil prices rose after producers cut output."),
        ("d3", "Football", "The home team won the football match in extra time."),
        ("d4", "Rain", "Heavy rain is expected across the region tomorrow.")]


def _corpus(path: Path, docs) -> Path:
    path.write_text("".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in docs))
    return path


@pytest.fixture(scope="module")
def minilm_served(minilm_path):
    from neobert_embed.inference.runtime import load_inference_model

    return load_inference_model(str(minilm_path), "fp32", fingerprint=True)


@pytest.fixture(scope="module")
def minilm_st(minilm_path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path), device="cpu")


@pytest.fixture(scope="module")
def news_index(minilm_path, tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("serve-index")
    output = base / "news"
    build_index(str(minilm_path), _corpus(base / "corpus.jsonl", DOCS), output, index_type="flat",
                title_field="title", show_progress=False, compute_precision="fp32")  # the served model's
    return output


@pytest.fixture(scope="module")
def server(minilm_path, minilm_served, news_index):
    from neobert_embed.serve.app import create_app
    from neobert_embed.serve.settings import ServeSettings

    settings = ServeSettings(model=str(minilm_path), served_name="minilm", indexes=[str(news_index)],
                             api_key=KEY, max_inputs=64)
    app = create_app(settings, served=minilm_served)
    with server_thread(app) as url:
        yield url, app


def test_openai_client_matches_sentence_transformers(server, minilm_st):
    from openai import OpenAI

    url, _ = server
    client = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    expected = minilm_st.encode(TEXTS)

    floats = client.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    got = np.array([item.embedding for item in floats.data], dtype=np.float32)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert [item.index for item in floats.data] == list(range(len(TEXTS)))
    counts = minilm_st.tokenizer(TEXTS)["input_ids"]
    assert floats.usage.prompt_tokens == sum(len(ids) for ids in counts)

    default = client.embeddings.create(model="minilm", input=TEXTS)  # the client asks for base64 itself
    np.testing.assert_allclose(np.array([d.embedding for d in default.data]), expected, atol=1e-5)

    raw = client.embeddings.create(model="minilm", input=TEXTS[:2], encoding_format="base64")
    decoded = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in raw.data])
    np.testing.assert_allclose(decoded, expected[:2], atol=1e-5)

    short = client.embeddings.create(model="minilm", input=TEXTS, dimensions=64, encoding_format="float")
    truncated = minilm_st.encode(TEXTS, truncate_dim=64, normalize_embeddings=True)
    np.testing.assert_allclose(np.array([d.embedding for d in short.data]), truncated, atol=1e-5)
    assert len(short.data[0].embedding) == 64

    single = client.embeddings.create(model="minilm", input="dogs", encoding_format="float")
    np.testing.assert_allclose(single.data[0].embedding, expected[-1], atol=1e-5)
    assert [m.id for m in client.models.list().data] == ["minilm"]


def test_wrong_or_missing_api_key_is_401(server):
    from openai import AuthenticationError, OpenAI

    url, _ = server
    with pytest.raises(AuthenticationError, match="API key"):
        OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).embeddings.create(model="minilm", input="x")
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": KEY}):
        response = httpx.post(f"{url}/embed", json={"inputs": "x"}, headers=headers)
        assert response.status_code == 401, headers
        assert "API key" in response.json()["error"]["message"]
    assert httpx.get(f"{url}/health").status_code == 200  # liveness needs no key
    assert httpx.get(f"{url}/metrics").status_code == 401


def test_tei_embed_normalizes_and_truncates_dimensions(server, minilm_st):
    url, _ = server
    response = httpx.post(f"{url}/embed", json={"inputs": TEXTS, "normalize": True}, headers=AUTH)
    assert response.status_code == 200
    np.testing.assert_allclose(np.array(response.json()), minilm_st.encode(TEXTS, normalize_embeddings=True),
                               atol=1e-5)
    one = httpx.post(f"{url}/embed", json={"inputs": "dogs", "dimensions": 32, "normalize": False}, headers=AUTH)
    np.testing.assert_allclose(one.json()[0], minilm_st.encode(["dogs"])[0][:32], atol=1e-5)


def test_search_returns_documents_and_sees_index_add(server, news_index, tmp_path):
    url, app = server
    state = app.app.state.server
    assert state.indexes.get("news").shared  # same weights: queries go through the batcher
    response = httpx.post(f"{url}/search", json={"query": "purring felines", "k": 2}, headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["index"] == "news" and body["documents"] == 4
    top = body["results"][0]["hits"][0]
    assert (top["id"], top["title"], top["rank"]) == ("d1", "Cats", 1)
    assert top["text"].startswith("Cats are small") and 0 < top["score"] <= 1.0001

    from neobert_embed.index import open_index

    with open_index(news_index) as index:  # the same ranking as the library's own search
        expected = index.search(["purring felines", "who won the match"], k=3)
    both = httpx.post(f"{url}/search", json={"queries": ["purring felines", "who won the match"], "k": 3,
                                             "index": "news"}, headers=AUTH).json()
    for hits, want in zip(both["results"], expected, strict=True):
        assert [h["id"] for h in hits["hits"]] == [h.doc_id for h in want]
        np.testing.assert_allclose([h["score"] for h in hits["hits"]], [h.score for h in want], atol=1e-5)

    add_documents(news_index, _corpus(tmp_path / "more.jsonl",
                                      [("d5", "Volcano", "A volcano erupted, spewing lava and ash.")]),
                  show_progress=False)
    after = httpx.post(f"{url}/search", json={"query": "lava from an erupting volcano", "k": 1},
                       headers=AUTH).json()
    assert after["documents"] == 5
    assert after["results"][0]["hits"][0]["id"] == "d5"


def test_metrics_and_docs(server):
    url, _ = server
    httpx.post(f"{url}/embed", json={"inputs": ["one", "two"]}, headers=AUTH)
    httpx.post(f"{url}/embed", json={"inputs": []}, headers=AUTH)
    text = httpx.get(f"{url}/metrics", headers=AUTH).text
    for name in ("neobert_embed_requests_total", "neobert_embed_inputs_total", "neobert_embed_tokens_total",
                 "neobert_embed_batch_size_bucket", "neobert_embed_queue_depth",
                 "neobert_embed_request_latency_seconds_bucket", 'neobert_embed_errors_total{code="422"}'):
        assert name in text, name
    assert httpx.get(f"{url}/docs").status_code == 200
    paths = httpx.get(f"{url}/openapi.json").json()["paths"]
    assert {"/v1/embeddings", "/embed", "/search", "/health", "/metrics"} <= set(paths)


@pytest.fixture(scope="module")
def tiny_neobert(tmp_path_factory) -> Path:
    """A tiny NeoBERT SentenceTransformer with a query prompt (exercises the un-padded path)."""
    return tiny_neobert_st(tmp_path_factory.mktemp("serve-neobert"), seed=3)


def test_neobert_prompts_batching_and_precisions(tiny_neobert):
    import asyncio

    from sentence_transformers import SentenceTransformer

    from neobert_embed.serve.app import create_app
    from neobert_embed.serve.settings import ServeSettings

    reference = SentenceTransformer(str(tiny_neobert), device="cpu")
    texts = [f"text number {i} " + "word " * (i * 7 % 40) for i in range(24)]
    app = create_app(ServeSettings(model=str(tiny_neobert), max_wait_ms=50, precision="fp32"))
    with server_thread(app) as url:
        async def many():  # concurrent requests: merged into batches with padding
            async with httpx.AsyncClient(base_url=url) as client:
                return await asyncio.gather(*(client.post("/v1/embeddings", json={
                    "model": str(tiny_neobert), "input": [text], "prompt_name": "query"}) for text in texts))

        responses = asyncio.run(many())
        got = np.array([r.json()["data"][0]["embedding"] for r in responses])
        np.testing.assert_allclose(got, reference.encode(texts, prompt_name="query"), atol=1e-5)
        sizes = httpx.get(f"{url}/metrics").text
        count = float(next(line.split()[-1] for line in sizes.splitlines()
                           if line.startswith("neobert_embed_batch_size_count")))
        assert count < len(texts)  # some requests shared a forward pass
        bad = httpx.post(f"{url}/embed", json={"inputs": "x", "prompt_name": "nope"})
        assert bad.status_code == 422 and "query" in bad.json()["error"]["message"]

    for precision, floor in (("bf16", 0.999), ("int8", 0.98)):  # the documented per-text tolerances
        app = create_app(ServeSettings(model=str(tiny_neobert), precision=precision))
        with server_thread(app) as url:
            vectors = np.array(httpx.post(f"{url}/embed", json={"inputs": texts, "normalize": True}).json())
            card = httpx.get(f"{url}/v1/models").json()["data"][0]
        expected = reference.encode(texts, normalize_embeddings=True)
        cosine = (vectors * expected).sum(axis=1)
        assert vectors.shape == expected.shape and cosine.min() >= floor, (precision, cosine)
        assert card["precision"]["precision"] == precision and card["precision"]["requested"] == precision
        assert card["precision"]["layout"] == "as the model runs"  # requests are batched by the server, not spread


def test_cli_help_and_bad_settings(tiny_neobert):
    runner = CliRunner()
    result = runner.invoke(cli_app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--max-batch-tokens" in result.output
    from neobert_embed.errors import UserInputError

    result = runner.invoke(cli_app, ["serve", "--model", str(tiny_neobert), "--max-inputs", "10",
                                     "--max-queue", "5"])
    assert isinstance(result.exception, UserInputError) and "--max-queue" in str(result.exception)
    result = runner.invoke(cli_app, ["serve", "--model", str(tiny_neobert), "--precision", "int4"])
    assert isinstance(result.exception, UserInputError) and "int4" in str(result.exception)


def test_batcher_cuts_length_ordered_token_budgeted_batches():
    import asyncio

    from neobert_embed.serve.batcher import DynamicBatcher

    calls: list[list[int]] = []

    def forward(texts, prompts):
        calls.append([len(t) for t in texts])
        return np.array([[float(len(t)), float(p == "q: ")] for t, p in zip(texts, prompts, strict=True)],
                        dtype=np.float32)

    lengths = [3, 10, 1, 7, 20, 2]

    async def run(min_fill=0.0):
        batcher = DynamicBatcher(forward, max_batch_tokens=40, max_wait_ms=200, max_queue=100, min_fill=min_fill)
        await batcher.start()
        try:
            return await asyncio.gather(*(batcher.embed(["x" * n], "q: " if n % 2 else None, [n])
                                          for n in lengths))
        finally:
            await batcher.stop()

    results = asyncio.run(run())
    assert [(r[0, 0], r[0, 1]) for r in results] == [(n, float(n % 2 == 1)) for n in lengths]
    assert calls == [[20, 10], [7, 3, 2, 1]]  # longest first; 2 x 20 and 4 x 7 padded tokens <= 40
    calls.clear()
    asyncio.run(run(min_fill=0.5))
    assert calls == [[20, 10], [7], [3, 2], [1]]  # nothing padded to more than twice its length


def test_readme_serving_example_answers_200_with_the_models_vectors(minilm_path, minilm_st, tmp_path):
    """README's `serve --model runs/my-embedder` then `{"model": "my-embedder", ...}`, its JSON body
    taken verbatim from README.md; any other model name is answered too (one model per server)."""
    import re
    import shutil

    from fastapi.testclient import TestClient
    from safety_helpers import REPO

    from neobert_embed.serve.app import create_app
    from neobert_embed.serve.settings import ServeSettings

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    serve_line = re.search(r"neobert-embed serve --model (\S+)", readme).group(1)
    body = json.loads(re.search(r"-d '(\{\"model\": \"my-embedder\".*?\})'", readme).group(1))
    model_dir = tmp_path / Path(serve_line).name  # runs/my-embedder: a directory named my-embedder
    shutil.copytree(minilm_path, model_dir)
    with TestClient(create_app(ServeSettings(model=str(model_dir), precision="fp32"))) as client:
        answer = client.post("/v1/embeddings", json=body)
        assert answer.status_code == 200, answer.text
        got = np.array([item["embedding"] for item in answer.json()["data"]], dtype=np.float32)
        np.testing.assert_allclose(got, minilm_st.encode(body["input"]), atol=1e-5)
        assert answer.json()["model"] == "my-embedder"
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["my-embedder"]
        other = client.post("/v1/embeddings", json={**body, "model": "text-embedding-3-small"})
        assert other.status_code == 200 and other.json()["data"][0]["embedding"] == answer.json()["data"][0]["embedding"]
