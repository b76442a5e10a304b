"""``neobert-embed serve``: an embedding and search server over a model and FAISS indexes.

OpenAI-compatible ``/v1/embeddings``, TEI-compatible ``/embed``, ``/search`` over indexes built
by ``index build``, with dynamic token-budgeted batching, limits, API keys and Prometheus metrics.
FastAPI and uvicorn are imported only by :func:`neobert_embed.serve.app.create_app`.

Example:
    >>> from neobert_embed.serve.app import create_app
    >>> from neobert_embed.serve.settings import ServeSettings
    >>> app = create_app(ServeSettings(model="sentence-transformers/all-MiniLM-L6-v2"))
"""
