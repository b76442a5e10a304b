"""Everything ``neobert-embed serve`` is configured with, checked once at startup.

Why: a limit that makes no sense (a queue smaller than one request, an empty API key) or a busy port
must fail when the server starts, with the flag named, not at the first request.

Example:
    >>> ServeSettings(model="runs/my-embedder", indexes=["runs/my-index"], precision="bf16").check()
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from neobert_embed.errors import UserInputError

API_KEY_ENV = "NEOBERT_EMBED_API_KEY"


@dataclass
class ServeSettings:
    """Server configuration (the CLI flags of ``neobert-embed serve``)."""

    model: str
    indexes: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    served_name: str | None = None  # the id /v1/models lists; default: the model directory's name, or the key / hub id
    max_batch_tokens: int = 16384
    max_wait_ms: float = 2.0
    max_inputs: int = 2048
    max_input_tokens: int | None = None  # default: the model's max_seq_length
    max_queue: int = 8192
    max_request_bytes: int = 2_000_000
    truncate: bool = False
    precision: str = "auto"
    backend: str = "torch"
    device: str | None = None

    @property
    def name(self) -> str:
        """The model id of ``/v1/models``: ``--served-model-name``, else the model directory's name
        (``runs/my-embedder`` → ``my-embedder``), else the registry key or hub id as given."""
        return self.served_name or (Path(self.model).name if Path(self.model).is_dir() else self.model)

    def resolved_api_key(self) -> str | None:
        """``--api-key``, else the ``NEOBERT_EMBED_API_KEY`` environment variable, else no key."""
        return self.api_key or os.environ.get(API_KEY_ENV) or None

    def check(self) -> None:
        """Refuse inconsistent limits, naming the flag (``load_inference_model`` checks ``--precision`` and
        ``--backend``)."""
        for flag, value in (("--max-batch-tokens", self.max_batch_tokens), ("--max-inputs", self.max_inputs),
                            ("--max-queue", self.max_queue), ("--max-request-bytes", self.max_request_bytes),
                            ("--max-input-tokens", self.max_input_tokens)):
            if value is not None and value < 1:
                raise UserInputError(f"{flag} must be positive, got {value}")
        if self.max_wait_ms < 0:
            raise UserInputError(f"--max-wait-ms must be 0 or more, got {self.max_wait_ms}")
        if self.max_queue < self.max_inputs:
            raise UserInputError(f"--max-queue ({self.max_queue}) must be at least --max-inputs "
                                 f"({self.max_inputs}), or a full request could never be queued")
        if not 0 <= self.port <= 65535:
            raise UserInputError(f"--port must be 0-65535, got {self.port}")
        key, where = ((self.api_key, "--api-key") if self.api_key is not None
                      else (os.environ.get(API_KEY_ENV), API_KEY_ENV))
        if key is not None and not key.strip():
            raise UserInputError(f"{where} is empty, which would let anyone in; give a key, or leave out "
                                 f"--api-key and {API_KEY_ENV} to serve without one")

def check_port_free(host: str, port: int) -> None:
    """Refuse ``--port`` when another program listens on it, before the model loads (a minute on a
    big model, only for the bind to fail). Port 0 (any free port) passes."""
    import socket

    if port == 0:
        return
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise UserInputError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a closing socket is no obstacle
        try:
            probe.bind((host, port))
        except OSError as exc:
            reason = ("is already in use" if exc.errno == errno.EADDRINUSE else
                      "needs more rights (ports below 1024 are for root)" if exc.errno == errno.EACCES else
                      f"cannot be bound ({exc.strerror})")
            raise UserInputError(f"--port {port}: {host}:{port} {reason}; choose another --port or stop the "
                                 "program listening on it") from None
