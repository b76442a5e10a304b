"""Prometheus metrics of one server: requests, inputs, tokens, batches, queue depth, latency, errors.

Why: an embedding server is tuned by its batch sizes and queue depth and watched by its latency and
errors. Each app has its own registry, so several servers in one process (tests) never share counters.

Example:
    >>> metrics = ServeMetrics()
    >>> metrics.observe_request("/v1/embeddings", 200, 0.012)
    >>> b"neobert_embed_requests_total" in metrics.render()
    True
"""

from __future__ import annotations

ENDPOINTS = ("/v1/embeddings", "/v1/models", "/embed", "/search", "/health", "/metrics")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServeMetrics:
    """The server's counters, gauges and histograms (the batcher reports batches and queue depth here)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.requests = Counter("neobert_embed_requests", "HTTP requests by endpoint and status code.",
                                ["endpoint", "code"], registry=r)
        self.errors = Counter("neobert_embed_errors", "Error responses (4xx/5xx) by status code.", ["code"],
                              registry=r)
        self.latency = Histogram("neobert_embed_request_latency_seconds", "Request latency by endpoint.",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.in_progress = Gauge("neobert_embed_requests_in_progress", "Requests being handled now.",
                                 registry=r)
        self.inputs = Counter("neobert_embed_inputs", "Texts embedded (queries included).", ["endpoint"],
                              registry=r)
        self.tokens = Counter("neobert_embed_tokens", "Tokens embedded (after truncation).", ["endpoint"],
                              registry=r)
        self.batch_size = Histogram("neobert_embed_batch_size", "Inputs per forward pass.",
                                    buckets=SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram("neobert_embed_batch_padded_tokens",
                                      "Padded tokens (inputs x longest) per forward pass.",
                                      buckets=TOKEN_BUCKETS, registry=r)
        self.batch_seconds = Histogram("neobert_embed_batch_seconds", "Forward-pass time per batch.",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Gauge("neobert_embed_queue_depth", "Inputs waiting for a forward pass.", registry=r)

    def observe_request(self, path: str, code: int, seconds: float) -> None:
        """Count one finished request."""
        endpoint = _endpoint(path)
        self.requests.labels(endpoint, str(code)).inc()
        self.latency.labels(endpoint).observe(seconds)
        if code >= 400:
            self.errors.labels(str(code)).inc()

    def observe_inputs(self, path: str, inputs: int, tokens: int) -> None:
        """Count the texts and tokens of one accepted request."""
        self.inputs.labels(_endpoint(path)).inc(inputs)
        self.tokens.labels(_endpoint(path)).inc(tokens)

    def batch_done(self, inputs: int, padded_tokens: int, seconds: float) -> None:
        """Record one forward pass (called by the batcher)."""
        self.batch_size.observe(inputs)
        self.batch_tokens.observe(padded_tokens)
        self.batch_seconds.observe(seconds)

    def queue_depth(self, inputs: int) -> None:
        """Set the number of inputs waiting (called by the batcher)."""
        self.queue.set(inputs)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def _endpoint(path: str) -> str:
    return path if path in ENDPOINTS else "other"  # unknown paths share one label: labels stay bounded
