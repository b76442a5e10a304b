"""Running real servers for the serve tests: uvicorn in a thread, or the CLI in a subprocess."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tiny_neobert_st(directory: Path, seed: int = 0) -> Path:
    """A tiny random NeoBERT saved as a SentenceTransformer with a "query: " prompt."""
    from tiny_models import build_tiny_model

    from neobert_embed.sentence import load_sentence_model

    plain = build_tiny_model("neobert", directory / "plain", seed=seed)
    load_sentence_model(str(plain), prompts={"query": "query: "}).save(str(directory / "st"))
    return directory / "st"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server_thread(app, timeout: float = 60.0) -> Iterator[str]:
    """Serve the ASGI ``app`` with uvicorn on a free loopback port in a thread; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)


@contextlib.contextmanager
def server_process(args: list[str], timeout: float = 240.0) -> Iterator[tuple[subprocess.Popen, str]]:
    """Run ``neobert-embed serve ARGS --port P`` as a subprocess; yields (process, base URL) once healthy."""
    import httpx

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "neobert_embed.cli", "serve", *args, "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {proc.stdout.read()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become healthy in time")
            time.sleep(0.2)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
