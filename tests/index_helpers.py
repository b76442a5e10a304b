"""Shared by the index tests: a tiny BERT saved as a SentenceTransformer with query/document prompts,
and one compute precision for builds that are compared with each other."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tiny_models import build_tiny_model

from neobert_embed.machine import FEATURES_VARIABLE

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


@pytest.fixture(scope="module", autouse=True)
def auto_without_candidates() -> Iterator[None]:
    """Every build of the importing module, and every process it starts, computes in fp32 under ``auto``.

    Why: these modules compare independent builds (resumed against uninterrupted, torchrun ranks against
    one process) to the byte or to 1e-6. Each build's ``auto`` measures the machine again, and on a CPU
    with bf16/int8 units a tiny random model's candidates sit near the 1.15× bar at a cosine that rounds
    to 1 (one run took int8 at 1.28× fp32, the next fp32), so two builds may pick two precisions and
    differ by 4e-5 while each is right. With the units hidden (:data:`FEATURES_VARIABLE`) ``auto`` has
    nothing to try and always takes fp32; how it chooses is tested in ``test_compute_precision.py``,
    and a resumed ``auto`` build keeping its first precision in ``test_index.py``.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(FEATURES_VARIABLE, "none")
        yield
