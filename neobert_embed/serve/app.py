"""The FastAPI application: OpenAI and TEI embedding endpoints, index search, health and metrics.

Why: clients already speak the OpenAI embeddings API and TEI's ``/embed``. Handlers only validate,
tokenize (once) and format; encoding goes through the dynamic batcher (one model thread), searching
through the index registry, so the event loop is never blocked.

Example:
    >>> uvicorn.run(create_app(ServeSettings(model="sentence-transformers/all-MiniLM-L6-v2")), port=8080)
"""

from __future__ import annotations

import base64
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import Depends, FastAPI, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from neobert_embed.index.integrity import check_index_files
from neobert_embed.inference.runtime import InferenceModel, load_inference_model
from neobert_embed.sentence import QUERY_PROMPT
from neobert_embed.serve import schemas
from neobert_embed.serve.batcher import DynamicBatcher
from neobert_embed.serve.engine import Embedder
from neobert_embed.serve.errors import APIError, EdgeMiddleware, install_error_handlers
from neobert_embed.serve.indexes import IndexRegistry, OpenIndex
from neobert_embed.serve.metrics import CONTENT_TYPE, ServeMetrics
from neobert_embed.serve.settings import ServeSettings

if TYPE_CHECKING:
    from neobert_embed.index import Hit

INLINE_TOKENIZE_CHARS = 4096  # requests up to this many characters are tokenized on the event loop
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": schemas.ErrorResponse} for code in (401, 413, 422, 503)}


@dataclass
class ServerState:
    """What one server process holds: settings, the model, the batcher, indexes and metrics."""

    settings: ServeSettings
    engine: Embedder
    batcher: DynamicBatcher
    indexes: IndexRegistry
    metrics: ServeMetrics
    api_key: str | None
    started: float


def build_state(settings: ServeSettings, served: InferenceModel | None = None) -> ServerState:
    """Load the model (once; an export runs without torch), open the indexes, set up batching and metrics.

    Example:
        >>> build_state(ServeSettings(model="runs/my-embedder", indexes=["runs/my-index"])).indexes.names
        ['my-index']
    """
    settings.check()
    for directory in settings.indexes:  # a damaged index fails now, before the model loads
        check_index_files(directory)
    if served is None:
        served = load_inference_model(settings.model, settings.precision, device=settings.device,
                                      fingerprint=bool(settings.indexes), backend=settings.backend, spread=False)
    engine = Embedder(served, settings.max_input_tokens)
    metrics = ServeMetrics()
    batcher = DynamicBatcher(engine.forward, max_batch_tokens=settings.max_batch_tokens, padded=not engine.unpads,
                             max_wait_ms=settings.max_wait_ms, max_queue=settings.max_queue, observer=metrics)
    registry = IndexRegistry(settings.indexes, served=served, model_name=settings.name, device=settings.device)
    return ServerState(settings, engine, batcher, registry, metrics, settings.resolved_api_key(), time.time())


def create_app(settings: ServeSettings, served: InferenceModel | None = None) -> FastAPI:
    """The ASGI application for ``settings`` (the model is loaded now, batching starts with the app);
    example in the module docstring."""
    state = build_state(settings, served)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.batcher.start()
        yield
        await state.batcher.stop()

    app = FastAPI(title="neobert-embed server", version="1", lifespan=lifespan,
                  description="Embeddings (OpenAI and TEI compatible) and FAISS search with dynamic batching.")
    app.state.server = state
    install_error_handlers(app)
    bearer = HTTPBearer(auto_error=False, description="The server's API key (--api-key).")

    async def authorized(credentials: HTTPAuthorizationCredentials | None = Security(bearer)) -> None:
        given = credentials.credentials if credentials is not None else ""
        if state.api_key is not None and not secrets.compare_digest(given.encode(), state.api_key.encode()):
            raise APIError("missing or wrong API key: send 'Authorization: Bearer <key>'", 401,
                           "authentication_error", {"WWW-Authenticate": "Bearer"})

    guarded = [Depends(authorized)]

    @app.post("/v1/embeddings", response_model=schemas.EmbeddingsResponse, responses=ERRORS,
              dependencies=guarded, tags=["OpenAI"])
    async def openai_embeddings(body: schemas.EmbeddingsRequest) -> Response:
        """Embed ``input`` (OpenAI-compatible); ``dimensions`` truncates and renormalizes. The server
        holds one model, so any ``model`` value is answered by it (as TEI does): clients send whatever
        name their user configured."""
        prompt = state.engine.prompt_for(body.prompt_name)
        vectors, tokens = await _embed(state, "/v1/embeddings", body.texts, prompt, state.settings.truncate,
                                       body.dimensions, normalize=body.dimensions is not None)
        data = ([base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in vectors]
                if body.encoding_format == "base64" else vectors.tolist())
        return JSONResponse({
            "object": "list", "model": state.settings.name,
            "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        })

    @app.get("/v1/models", response_model=schemas.ModelList, dependencies=guarded, tags=["OpenAI"])
    async def models() -> dict:
        """The served model."""
        return {"object": "list", "data": [{"id": state.settings.name, "object": "model",
                                            "created": int(state.started), "owned_by": "neobert-embed",
                                            "precision": state.engine.served.choice.to_json()}]}

    @app.post("/embed", response_model=list[list[float]], responses=ERRORS, dependencies=guarded, tags=["TEI"])
    async def tei_embed(body: schemas.EmbedRequest) -> Response:
        """Embed ``inputs`` (TEI-compatible): a list of vectors."""
        truncate = state.settings.truncate if body.truncate is None else body.truncate
        prompt = state.engine.prompt_for(body.prompt_name)
        vectors, _ = await _embed(state, "/embed", body.texts, prompt, truncate, body.dimensions, body.normalize)
        return JSONResponse(vectors.tolist())

    @app.post("/search", response_model=schemas.SearchResponse, responses={**ERRORS, 404: ERRORS[422]},
              dependencies=guarded, tags=["Search"])
    async def search(body: schemas.SearchRequest) -> Response:
        """Top-``k`` documents of a served index for ``query`` or each of ``queries``."""
        entry = await run_in_threadpool(state.indexes.get, body.index)
        hits = await _search(state, entry, body.texts, body.k)
        results = [{"query": query, "hits": [{"rank": h.rank, "id": h.doc_id, "score": h.score,
                                              "title": h.title, "text": h.text, **h.passage_fields}
                                             for h in found]}
                   for query, found in zip(body.texts, hits, strict=True)]
        return JSONResponse({"index": entry.name, "documents": entry.index.manifest.documents,
                             "results": results})

    @app.get("/health", tags=["Operations"])
    async def health() -> dict:
        """Liveness and what is served (no API key needed)."""
        gone = await run_in_threadpool(state.indexes.unavailable)  # an index whose directory disappeared
        return {"status": "degraded" if gone else "ok", "model": state.settings.name,
                "precision": state.engine.served.choice.description, "max_seq_length": state.engine.max_seq_length,
                "indexes": [name for name in state.indexes.names if name not in gone],
                "unavailable_indexes": gone, "queued_inputs": state.batcher.pending}

    @app.get("/metrics", dependencies=guarded, tags=["Operations"], response_class=Response)
    async def metrics() -> Response:
        """Prometheus metrics (text exposition format)."""
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    return EdgeMiddleware(app, state.metrics, settings.max_request_bytes)


def _check_texts(state: ServerState, texts: list[str]) -> None:
    if len(texts) > state.settings.max_inputs:
        raise APIError(f"{len(texts)} inputs; the limit is {state.settings.max_inputs} per request "
                       "(--max-inputs): split the request", 413, "request_too_large")
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise APIError(f"input[{i}] is not valid Unicode ({exc.reason} at character {exc.start}): "
                           "send UTF-8 text") from None


async def _embed(state: ServerState, path: str, texts: list[str], prompt: str | None, truncate: bool,
                 dimensions: int | None = None, normalize: bool = False) -> tuple[np.ndarray, int]:
    """The vectors (cut at ``dimensions``) and tokens of a request, tokenized once, refused before any
    work is queued."""
    _check_texts(state, texts)
    if sum(map(len, texts)) <= INLINE_TOKENIZE_CHARS:  # ~0.1 ms of tokenizing: no thread hop
        tokenized = state.engine.tokenize(texts, prompt)
    else:
        tokenized = await run_in_threadpool(state.engine.tokenize, texts, prompt)
    if not truncate and tokenized.cut is not None and tokenized.cut.any():
        limit = state.engine.max_seq_length
        raise APIError(f"input[{int(np.argmax(tokenized.cut))}] has more than {limit} tokens; the limit is "
                       f"{limit} (--max-input-tokens): shorten it, or ask for truncation (truncate: true / "
                       "--truncate)", 413, "request_too_large")
    if dimensions is not None and dimensions > state.engine.dimension:
        raise APIError(f"dimensions={dimensions} is larger than the model's {state.engine.dimension}")
    tokens = int(tokenized.lengths.sum())
    state.metrics.observe_inputs(path, len(texts), tokens)
    vectors = await state.batcher.embed([(tokenized, row) for row in range(len(texts))], prompt,
                                        tokenized.lengths.tolist())
    vectors = vectors[:, :dimensions]
    if normalize:
        vectors = (vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)).astype(np.float32)
    return vectors, tokens


async def _search(state: ServerState, entry: OpenIndex, texts: list[str], k: int) -> list[list[Hit]]:
    if not entry.shared:  # the index's own model: encoded on the model thread, in turn with batches
        _check_texts(state, texts)
        state.metrics.observe_inputs("/search", len(texts), 0)
        return await state.batcher.run_exclusive(lambda: entry.search(texts, k))  # type: ignore[return-value]
    manifest = entry.index.manifest  # queries get the index's prompt and normalization
    vectors, _ = await _embed(state, "/search", texts, manifest.prompts.get(QUERY_PROMPT) or None, truncate=True,
                              normalize=manifest.normalized)
    return await run_in_threadpool(entry.hits, vectors, k)
