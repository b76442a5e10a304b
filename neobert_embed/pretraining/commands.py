"""CLI commands of `neobert_embed.pretraining` (registered on the main app by `neobert_embed.cli`)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach this area's commands to the main `neobert-embed` app."""
