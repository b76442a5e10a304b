"""Shared by the index tests: a tiny BERT saved as a SentenceTransformer with query/document prompts."""

from __future__ import annotations

from pathlib import Path

from tiny_models import build_tiny_model

PROMPTS = {"query": "query: ", "document": "passage: "}


def tiny_bert_with_prompts(directory: Path) -> Path:
    """Build the tiny BERT under ``directory`` and save it with ``PROMPTS``; returns its path."""
    from neobert_embed.sentence import load_sentence_model

    plain = build_tiny_model("bert", directory / "plain", seed=0)
    load_sentence_model(str(plain), prompts=PROMPTS).save(str(directory / "bert"))
    return directory / "bert"


def write_corpus(path: Path, texts: list[str]) -> Path:
    """Write ``texts`` as a JSON-lines corpus with ids ``d0, d1, …``; returns ``path``."""
    import json

    path.write_text("".join(json.dumps({"_id": f"d{i}", "text": text}) + "\n" for i, text in enumerate(texts)),
                    encoding="utf-8")
    return path
