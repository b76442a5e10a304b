"""The server under hostile input, a full queue and SIGTERM: 4xx with a message, never a crash."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from serve_helpers import server_process, server_thread, tiny_neobert_st


@pytest.fixture(scope="module")
def tiny_neobert(tmp_path_factory) -> Path:
    return tiny_neobert_st(tmp_path_factory.mktemp("robust-neobert"), seed=1)


@pytest.fixture(scope="module")
def index_dir(tiny_neobert, tmp_path_factory) -> Path:
    from neobert_embed.index import build_index

    base = tmp_path_factory.mktemp("robust-index")
    corpus = base / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"document {i} about topic {i % 3}"}) + "\n"
                              for i in range(12)))
    build_index(str(tiny_neobert), corpus, base / "docs", index_type="flat", show_progress=False)
    return base / "docs"


def _hostile_requests(model: str) -> list[tuple[str, str, dict]]:
    """(method, path, httpx kwargs) of 52 malformed or hostile requests."""
    emb, embed, search = "/v1/embeddings", "/embed", "/search"
    raw = {"headers": {"content-type": "application/json"}}
    requests = [
        ("POST", emb, {"content": b"{not json", **raw}),
        ("POST", emb, {"content": b"", **raw}),
        ("POST", emb, {"content": b"[1, 2, 3]", **raw}),
        ("POST", emb, {"content": b"null", **raw}),
        ("POST", emb, {"content": b'{"input": "a", "model": ', **raw}),
        ("POST", emb, {"content": b'{"input": "\xff\xfe bad utf8", "model": "m"}', **raw}),
        ("POST", emb, {"content": b"\x00\x01\x02", **raw}),
        ("POST", emb, {"content": b"input=a&model=b", "headers": {"content-type": "application/x-www-form-urlencoded"}}),
        ("POST", emb, {"json": {"model": model}}),
        ("POST", emb, {"json": {"input": "a"}}),
        ("POST", emb, {"json": {"input": 123, "model": model}}),
        ("POST", emb, {"json": {"input": [1, 2, 3], "model": model}}),
        ("POST", emb, {"json": {"input": [[1, 2]], "model": model}}),
        ("POST", emb, {"json": {"input": ["ok", None], "model": model}}),
        ("POST", emb, {"json": {"input": {"text": "a"}, "model": model}}),
        ("POST", emb, {"json": {"input": [], "model": model}}),
        ("POST", emb, {"json": {"input": "a", "model": 7}}),
        ("POST", emb, {"json": {"input": "a", "model": model, "encoding_format": "int8"}}),
        ("POST", emb, {"json": {"input": "a", "model": model, "dimensions": 0}}),
        ("POST", emb, {"json": {"input": "a", "model": model, "dimensions": -4}}),
        ("POST", emb, {"json": {"input": "a", "model": model, "dimensions": 100000}}),
        ("POST", emb, {"json": {"input": "a", "model": model, "dimensions": "8"}}),
        ("POST", emb, {"json": {"input": "a", "model": model, "unknown_field": 1}}),
        ("POST", emb, {"json": {"input": "a", "model": model, "prompt_name": "missing"}}),
        ("POST", emb, {"json": {"input": ["x"] * 10_000, "model": model}}),
        ("POST", emb, {"json": {"input": "x " * 2_500_000, "model": model}}),  # a 5 MB string
        ("POST", emb, {"json": {"input": "word " * 3000, "model": model}}),  # too many tokens
        ("POST", emb, {"content": b'{"input": "\\ud800", "model": "%s"}' % model.encode(), **raw}),
        ("POST", emb, {"content": b'{"input": ["ok", "\\udfff tail"], "model": "%s"}' % model.encode(), **raw}),
        ("POST", emb, {"content": b'{"input": "a", "model": "m"}', "headers": {"content-type": "text/plain"}}),
        ("GET", emb, {}),
        ("PUT", emb, {"json": {"input": "a", "model": model}}),
        ("POST", embed, {"json": {"inputs": []}}),
        ("POST", embed, {"json": {"inputs": None}}),
        ("POST", embed, {"json": {"inputs": "a", "normalize": "yes please"}}),
        ("POST", embed, {"json": {"inputs": "a", "truncate": "sometimes"}}),
        ("POST", embed, {"json": {"inputs": "word " * 3000, "truncate": False}}),
        ("POST", embed, {"json": {"text": "a"}}),
        ("POST", embed, {"json": {"inputs": ["\u0000\u200b", {"nested": True}]}}),
        ("POST", search, {"json": {"query": "a", "k": 0}}),
        ("POST", search, {"json": {"query": "a", "k": -3}}),
        ("POST", search, {"json": {"query": "a", "k": 10**9}}),
        ("POST", search, {"json": {"query": "a", "k": "ten"}}),
        ("POST", search, {"json": {"query": "a", "index": "no-such-index"}}),
        ("POST", search, {"json": {"query": "a", "index": "../../etc"}}),
        ("POST", search, {"json": {"k": 3}}),
        ("POST", search, {"json": {"query": "a", "queries": ["b"]}}),
        ("POST", search, {"json": {"queries": []}}),
        ("POST", search, {"json": {"queries": "not a list"}}),
        ("POST", search, {"json": {"query": ""}}),
        ("POST", search, {"json": {"queries": ["fine", "  "]}}),
        ("POST", "/no/such/endpoint", {"json": {}}),
    ]
    assert len(requests) == 52
    return requests


def test_hostile_requests_get_4xx_then_valid_requests_work(tiny_neobert, index_dir):
    from sentence_transformers import SentenceTransformer

    from neobert_embed.serve.app import create_app
    from neobert_embed.serve.settings import ServeSettings

    model = str(tiny_neobert)
    app = create_app(ServeSettings(model=model, indexes=[str(index_dir)], max_input_tokens=64))
    with server_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        for method, path, kwargs in _hostile_requests(model):
            response = client.request(method, path, **kwargs)
            assert 400 <= response.status_code < 500, (path, repr(kwargs)[:120], response.status_code,
                                                        response.text[:300])
            message = response.json()["error"]["message"]
            assert isinstance(message, str) and len(message) > 5, response.text
        codes = httpx.get(f"{url}/metrics").text
        assert 'neobert_embed_errors_total{code="413"}' in codes and 'code="404"' in codes

        texts = ["naïve café 🚀 中文", "\u200b\u0000 control and zero-width", "right-to-left שלום", "plain"]
        valid = client.post("/v1/embeddings", json={"model": model, "input": texts, "encoding_format": "float"})
        assert valid.status_code == 200, valid.text
        expected = SentenceTransformer(model, device="cpu").encode(texts)
        got = np.array([d["embedding"] for d in valid.json()["data"]])
        if app.app.state.server.engine.served.precision == "fp32":
            np.testing.assert_allclose(got, expected, atol=1e-5)
        else:  # the default (auto) admits a precision only within this cosine of fp32
            from neobert_embed.inference.runtime import AUTO_TOLERANCE, cosine_to

            assert cosine_to(expected, got).min() >= AUTO_TOLERANCE.minimum
        found = client.post("/search", json={"query": "document 4 about topic 1", "k": 3})
        assert found.status_code == 200 and len(found.json()["results"][0]["hits"]) == 3
        assert client.post("/embed", json={"inputs": "word " * 3000, "truncate": True}).status_code == 200


def test_full_queue_answers_503_with_retry_after(tiny_neobert):
    from neobert_embed.serve.app import create_app
    from neobert_embed.serve.settings import ServeSettings

    # The first request waits up to 1.5 s for its batch to fill, holding the 4-input queue full.
    app = create_app(ServeSettings(model=str(tiny_neobert), max_inputs=4, max_queue=4, max_wait_ms=1500))
    with server_thread(app) as url:
        async def burst():
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                first = asyncio.create_task(client.post("/embed", json={"inputs": ["a", "b", "c", "d"]}))
                await asyncio.sleep(0.3)
                others = await asyncio.gather(*(client.post("/embed", json={"inputs": [f"t{i}"]})
                                                for i in range(6)))
                return await first, others

        first, others = asyncio.run(burst())
        assert first.status_code == 200 and len(first.json()) == 4
        assert [r.status_code for r in others] == [503] * 6
        assert others[0].headers["Retry-After"] == "1" and "busy" in others[0].json()["error"]["message"]
        again = httpx.post(f"{url}/embed", json={"inputs": ["after"]}, timeout=60)
        assert again.status_code == 200  # the queue drained: served again


@pytest.mark.slow
def test_sigterm_finishes_in_flight_requests_and_exits_0(tiny_neobert):
    args = ["--model", str(tiny_neobert), "--max-wait-ms", "4000", "--max-batch-tokens", "1000000"]
    with server_process(args) as (proc, url):
        texts = [[f"request {i} text {j}" for j in range(3)] for i in range(8)]
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(httpx.post, f"{url}/embed", json={"inputs": t}, timeout=120) for t in texts]
            deadline = time.monotonic() + 60
            while True:  # all 8 requests are queued inside the server (the batch waits 4 s to fill)
                metrics = httpx.get(f"{url}/metrics").text
                depth = next(float(line.split()[-1]) for line in metrics.splitlines()
                             if line.startswith("neobert_embed_queue_depth "))
                if depth == 24:
                    break
                assert time.monotonic() < deadline, metrics
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            responses = [f.result() for f in futures]
        assert [r.status_code for r in responses] == [200] * 8
        assert all(len(r.json()) == 3 for r in responses)
        assert proc.wait(timeout=60) == 0
        output = proc.stdout.read()
        assert "Shutting down" in output
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=2)
