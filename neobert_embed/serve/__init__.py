"""``neobert-embed serve``: OpenAI ``/v1/embeddings``, TEI ``/embed`` and ``/search`` over a model and FAISS
indexes, with token-budgeted dynamic batching, limits, API keys and Prometheus metrics. FastAPI and
uvicorn are imported only by :mod:`neobert_embed.serve.app` (example: its :func:`~.app.create_app`).
"""
