"""Calibrating an approximate index against exact search.

Why: "IVF" or "HNSW" says nothing about quality until its search parameter (nprobe, efSearch) is
set. After building, up to 512 vectors the index has not seen are used as queries, their exact
top-10 is computed by brute force over the indexed vectors, and the cheapest parameter whose
recall@10 reaches ``RECALL_TARGET`` (0.99) plus ``CALIBRATION_MARGIN`` (0.005) is kept in the manifest.

Why these numbers: a retrieval metric follows the recall of the real queries. On SNLI anchors
against 11,942 documents and on AG News titles against their 7,600 articles, with
all-MiniLM-L6-v2 (``benchmarks/index_defaults.py``; docs/indexing.md), every 0.01 of recall@10
the real queries lose costs up to 0.005 nDCG@10, so recall@10 0.99 keeps nDCG@10 within 0.005.
Queries unlike the documents (titles against article bodies) reach 0.006-0.008 less recall than
the calibration measures, hence the margin. The old 0.95 + 0.02, measured on vectors already in
the graph, left HNSW32 at efSearch 16: 0.019-0.020 nDCG@10 lost on both tasks (0.018 reported on
SciFact), and IVF lost 0.010 on AG News.

Which queries: an IVF query's probe and scan do not depend on whether its vector is stored, so
sampled indexed vectors (each excluding itself) are unseen queries to it. An HNSW graph is not:
every stored vector is linked to its neighbours and finds them through its own links (recall@10
0.989 at efSearch 16 on SNLI, where the real queries get 0.96). A graph index therefore holds back
its last vectors while it is calibrated (``index build`` adds them afterwards; FAISS ids must
follow row order, hence the last ones rather than a sample).

Example:
    >>> params, calibration = calibrate(index, spec, queries, rows, exact_neighbours(queries, blocks, 10, rows))
    >>> params, calibration.recall_at_10
    ({'nprobe': 64}, 0.9955)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import numpy as np

from neobert_embed.index.factory import IndexSpec, search_vectors
from neobert_embed.index.manifest import Calibration

RECALL_TARGET = 0.99
CALIBRATION_MARGIN = 0.005
CALIBRATION_QUERIES = 512
PLATEAU = 0.005
EXACT_SLICE_ROWS = 8192

log = logging.getLogger(__name__)


def exact_neighbours(queries: np.ndarray, blocks: Iterable[tuple[int, np.ndarray]], k: int,
                     query_rows: np.ndarray | None = None) -> np.ndarray:
    """Brute-force top-``k`` rows by inner product over vector blocks that need not fit in memory.

    Args:
        queries: (q, d) float32.
        blocks: ``(first_row, vectors)`` pieces of the database, in any order.
        k: neighbours to keep.
        query_rows: database row of each query, excluded from its own neighbours.

    Example:
        >>> exact_neighbours(x[:5], [(0, x)], k=10, query_rows=np.arange(5)).shape
        (5, 10)
    """
    n_queries = len(queries)
    best_scores = np.full((n_queries, 0), -np.inf, dtype=np.float32)
    best_rows = np.zeros((n_queries, 0), dtype=np.int64)
    for first_row, block in _slices(blocks):
        scores = queries @ np.asarray(block, dtype=np.float32).T
        if query_rows is not None:
            inside = (query_rows >= first_row) & (query_rows < first_row + len(block))
            scores[np.nonzero(inside)[0], query_rows[inside] - first_row] = -np.inf
        rows = np.broadcast_to(np.arange(first_row, first_row + len(block)), scores.shape)
        all_scores = np.concatenate([best_scores, scores], axis=1)
        all_rows = np.concatenate([best_rows, rows], axis=1)
        keep = min(k, all_scores.shape[1])
        top = np.argpartition(-all_scores, keep - 1, axis=1)[:, :keep]
        best_scores = np.take_along_axis(all_scores, top, axis=1)
        best_rows = np.take_along_axis(all_rows, top, axis=1)
    order = np.argsort(-best_scores, axis=1, kind="stable")
    return np.take_along_axis(best_rows, order, axis=1)


def _slices(blocks: Iterable[tuple[int, np.ndarray]]) -> Iterable[tuple[int, np.ndarray]]:
    """Cut blocks into ``EXACT_SLICE_ROWS`` rows so the score matrices stay small (RAM of a build)."""
    for first_row, block in blocks:
        for start in range(0, len(block), EXACT_SLICE_ROWS):
            yield first_row + start, block[start:start + EXACT_SLICE_ROWS]


def recall_at_k(found: Sequence[Sequence[int]], exact: np.ndarray, k: int = 10) -> float:
    """Mean fraction of the exact top-``k`` that the approximate top-``k`` contains.

    Example:
        >>> recall_at_k(np.array([[1, 2, 3]]), np.array([[1, 2, 4]]), k=3)
        0.6666666666666666
    """
    hits = [len(set(map(int, f[:k])) & set(map(int, e[:k]))) for f, e in zip(found, exact, strict=True)]
    return float(np.mean(hits) / k)


def _recall(index: object, spec: IndexSpec, queries: np.ndarray, query_rows: np.ndarray,
            exact: np.ndarray, params: dict[str, int], k: int) -> float:
    _, ids = search_vectors(index, spec, queries, k + 1, params)
    found = [[i for i in row if i not in (self_row, -1)][:k] for row, self_row in zip(ids, query_rows, strict=True)]
    return recall_at_k(found, exact, k)


def _candidates(index: object, spec: IndexSpec) -> list[int]:
    import faiss

    values = list(spec.candidates)
    index = getattr(index, "reranked_base", index)
    ivf = faiss.try_extract_index_ivf(index) if isinstance(index, faiss.Index) else None
    if spec.tuned_parameter == "nprobe" and ivf is not None:
        values = [v for v in values if v < ivf.nlist] + [int(ivf.nlist)]
    return values


def calibrate(index: object, spec: IndexSpec, queries: np.ndarray, query_rows: np.ndarray,
              exact: np.ndarray, target: float = RECALL_TARGET, k: int = 10) -> tuple[dict[str, int], Calibration]:
    """Pick the cheapest search parameter whose recall@``k`` reaches ``target`` + margin.

    When no value reaches it (product quantization, binary codes, graphs too large for the
    largest efSearch), the cheapest value within ``PLATEAU`` of the best recall seen is kept
    (scanning more buys nothing once the codes limit recall), and the achieved recall is recorded
    (and logged when below ``target``) so the user sees the cost.

    Example:
        >>> calibrate(ivf_index, spec, queries, rows, exact)[0]
        {'nprobe': 64}
    """
    k = min(k, exact.shape[1])
    if spec.tuned_parameter is None:
        recall = _recall(index, spec, queries, query_rows, exact, {}, k)
        return {}, Calibration(parameter=None, value=None, recall_at_10=recall, target=target,
                               queries=len(queries))
    measured: list[tuple[int, float]] = []
    for value in _candidates(index, spec):
        measured.append((value, _recall(index, spec, queries, query_rows, exact,
                                        {spec.tuned_parameter: value}, k)))
        if measured[-1][1] >= min(1.0, target + CALIBRATION_MARGIN):
            break
    chosen, recall = measured[-1]
    if recall < target + CALIBRATION_MARGIN:
        best = max(r for _, r in measured)
        chosen, recall = next((v, r) for v, r in measured if r >= best - PLATEAU)
    if recall < target:
        log.warning("%s reaches recall@%d %.3f < %.2f (best %s=%s); use a less compressed index for "
                    "higher recall", spec.factory, k, recall, target, spec.tuned_parameter, chosen)
    return ({spec.tuned_parameter: int(chosen)},
            Calibration(parameter=spec.tuned_parameter, value=int(chosen), recall_at_10=recall,
                        target=target, queries=len(queries)))
