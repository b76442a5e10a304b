"""CLI command of `neobert_embed.serve`: ``neobert-embed serve`` (registered by `neobert_embed.cli`).

FastAPI, uvicorn and the model are imported inside the command, so ``--help`` stays instant.
"""

from __future__ import annotations

from typing import Annotated

import typer

from neobert_embed import options as opt


def serve(
    model: Annotated[str, typer.Option("--model", "-m", help="Registry key, hub id, HF or SentenceTransformer "
                                       "directory.")],
    index: Annotated[list[str] | None, typer.Option(
        "--index", help="Index directory to serve on /search (repeatable; named by its directory).")] = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind (default: loopback only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port.")] = 8080,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="NEOBERT_EMBED_API_KEY", show_envvar=True,
        help="Require 'Authorization: Bearer KEY' (401 otherwise).")] = None,
    served_name: Annotated[str | None, typer.Option(
        "--served-model-name", help="Model id for /v1/models (default: the model directory's name, or the key / hub id); any "
        "'model' a client sends is answered.")] = None,
    max_batch_tokens: Annotated[int, typer.Option(
        "--max-batch-tokens", min=1, help="Padded tokens per forward pass (inputs x longest).")] = 16384,
    max_wait_ms: Annotated[float, typer.Option(
        "--max-wait-ms", parser=opt.finite_float(0.0, 60_000.0), help="How long an idle model waits for a batch to fill.")] = 2.0,
    max_inputs: Annotated[int, typer.Option("--max-inputs", min=1, help="Texts per request (413 beyond).")] = 2048,
    max_input_tokens: Annotated[int | None, typer.Option(
        "--max-input-tokens", min=1, help="Tokens per text (413 beyond, or truncation with --truncate); "
        "default: the model's max_seq_length.")] = None,
    max_queue: Annotated[int, typer.Option(
        "--max-queue", min=1, help="Inputs queued or encoding at once (503 + Retry-After beyond).")] = 8192,
    max_request_bytes: Annotated[int, typer.Option(
        "--max-request-bytes", min=1, help="Largest request body (413 beyond).")] = 2_000_000,
    truncate: Annotated[bool, typer.Option(
        "--truncate/--no-truncate", help="Truncate too-long inputs instead of answering 413.")] = False,
    precision: opt.ComputePrecision = "auto",
    backend: opt.Backend = "torch",
    device: opt.Device = None,
) -> None:
    """Serve embeddings (OpenAI /v1/embeddings, TEI /embed) and index search (/search) over HTTP.

    Concurrent requests are merged into token-budgeted batches; SIGTERM stops accepting
    connections, finishes the requests in flight and exits 0. Docs at /docs, metrics at /metrics.
    """
    options = dict(locals())  # every flag but --index is the ServeSettings field of the same name
    import logging
    import signal

    import uvicorn

    from neobert_embed.console import user_console, without_progress_bars
    from neobert_embed.serve.app import create_app
    from neobert_embed.serve.connections import connection_limits, exposure_warning
    from neobert_embed.serve.settings import ServeSettings, check_port_free

    settings = ServeSettings(indexes=list(options.pop("index") or []), **options)
    settings.check()
    check_port_free(host, port)  # before the model loads: a busy port fails in a second, not after a minute
    console = user_console(stderr=True)
    with without_progress_bars():  # loading bars would break the console's lines
        app = create_app(settings)
    state = app.app.state.server
    engine = state.engine
    console.print(f"[bold]neobert-embed serve[/] {settings.name}: {engine.dimension}-d, "
                  f"max_seq_length {engine.max_seq_length}, prompts {engine.model.prompts or 'none'} "
                  f"(default {engine.model.default_prompt_name or 'none'}), "
                  f"{'normalized by the model' if engine.normalizes else 'not normalized by the model'}, "
                  f"precision {engine.served.choice.description}")
    for name in state.indexes.names:
        entry = state.indexes.get(name)
        how = "served model, batched" if entry.shared else "its own model"
        console.print(f"  index {name!r}: {entry.index.manifest.documents} documents, queries via {how}")
    console.print(f"  batching ≤ {settings.max_batch_tokens} tokens, wait ≤ {settings.max_wait_ms} ms; "
                  f"queue ≤ {settings.max_queue} inputs; API key {'required' if state.api_key else 'off'}; "
                  f"http://{host}:{port}/docs")
    # uvicorn re-raises the SIGTERM it handled once it has drained the requests; a handler of our
    # own turns that into a normal return, so a graceful stop exits 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    warning = exposure_warning(host, state.api_key)
    if warning is not None:
        console.print(f"[bold yellow]warning:[/] {warning}")
        logging.getLogger("neobert_embed.serve").warning(warning)
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=None, **connection_limits())


def register(app: typer.Typer) -> None:
    """Attach ``serve`` to the main app."""
    app.command("serve")(serve)
