"""``index eval``: judge an index on a BEIR-layout retrieval task with mteb's own metrics.

Why: users need to know what an approximate index costs them in quality, in the same numbers the
MTEB leaderboard reports. The queries of the task are searched through the index (query prompt,
search parameters and all), and the ranked results are scored by mteb's retrieval scorer
(pytrec_eval underneath), so through an exact index the figures equal mteb's evaluation of the
same model on the same task.

Example:
    >>> scores = evaluate_index("runs/news-index", "tasks/news-retrieval")
    >>> scores["ndcg_at_10"], scores["recall_at_100"]
    (0.41234, 0.81)
"""

from __future__ import annotations

from pathlib import Path

from neobert_embed.beir import read_beir_task
from neobert_embed.errors import UserInputError
from neobert_embed.index.search import open_index

MTEB_K_VALUES = (1, 3, 5, 10, 20, 100, 1000)
METRICS = ("ndcg", "map", "recall", "precision", "mrr")


def evaluate_index(index_dir: str | Path, task_dir: str | Path, *, k: int = 10, split: str = "test",
                   model: str | Path | None = None, batch_size: int = 32,
                   device: str | None = None, precision: str | None = None) -> dict[str, float]:
    """Search every judged query of the task through the index and score the rankings.

    Returns:
        ``{"ndcg_at_10": ..., "recall_at_10": ..., "recall_at_100": ..., "mrr_at_10": ...,
        "map_at_10": ..., "precision_at_10": ..., ...}`` for k in mteb's k values and ``k``,
        plus ``queries`` (how many were scored) and ``documents`` (searchable in the index).

    Example:
        >>> evaluate_index("runs/news-index", "tasks/news", k=20)["ndcg_at_20"]
        0.45
    """
    from mteb._evaluators.retrieval_metrics import calculate_retrieval_scores

    if k < 1:
        raise UserInputError(f"--k must be at least 1, got {k}")
    task = read_beir_task(task_dir, split, with_corpus=False)
    k_values = sorted({*MTEB_K_VALUES, k})
    query_ids = [qid for qid in task.queries if qid in task.qrels]
    with open_index(index_dir, model=model, device=device, batch_size=batch_size, precision=precision) as index:
        depth = min(max(k_values), index.manifest.documents)
        hits = index.search([task.queries[qid] for qid in query_ids], k=depth)
        documents = index.manifest.documents
        compute = index.encoder.compute_precision
    results = {qid: {hit.doc_id: hit.score for hit in ranked} for qid, ranked in zip(query_ids, hits, strict=True)}
    scores = calculate_retrieval_scores(results, task.qrels, k_values)
    out: dict[str, float | str] = {f"{metric}_at_{key.split('@')[1]}": float(value)
                             for metric in METRICS for key, value in getattr(scores, metric).items()}
    out.update(queries=len(query_ids), documents=documents, k=k, compute_precision=compute)
    return out
