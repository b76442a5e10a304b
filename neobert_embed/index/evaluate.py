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

from collections.abc import Mapping, Sequence
from pathlib import Path

from neobert_embed.beir import check_judged_documents, read_beir_task
from neobert_embed.errors import UserInputError
from neobert_embed.index.integrity import open_store
from neobert_embed.index.manifest import read_manifest
from neobert_embed.index.search import open_index

MTEB_K_VALUES = (1, 3, 5, 10, 20, 100, 1000)
TREC_MEASURES = {"ndcg": "ndcg_cut", "map": "map_cut", "recall": "recall", "precision": "P"}
MTEB_DIGITS = 5


def evaluate_index(index_dir: str | Path, task_dir: str | Path, *, k: int = 10, split: str = "test",
                   model: str | Path | None = None, batch_size: int = 32,
                   device: str | None = None, precision: str | None = None,
                   backend: str | None = None) -> dict[str, float]:
    """Search every judged query of the task through the index and score the rankings (queries encoded
    by ``backend`` as ``index search`` does: an export of the index's model runs without torch).

    Returns:
        ``{"ndcg_at_10": ..., "recall_at_10": ..., "recall_at_100": ..., "mrr_at_10": ...,
        "map_at_10": ..., "precision_at_10": ..., ...}`` for k in mteb's k values and ``k``,
        plus ``queries`` (how many were scored), ``documents`` (searchable in the index), and how
        the figures were obtained: ``split``, ``compute_precision`` of the queries, and the index's
        ``index_type``, ``factory``, ``search_params`` and ``store_precision``.

    Example:
        >>> evaluate_index("runs/news-index", "tasks/news", k=20)["ndcg_at_20"]
        0.45
    """
    if k < 1:
        raise UserInputError(f"--k must be at least 1, got {k}")
    task = read_beir_task(task_dir, split, with_corpus=False)
    k_values = sorted({*MTEB_K_VALUES, k})
    query_ids = [qid for qid in task.queries if qid in task.qrels]
    with open_store(index_dir, read_manifest(index_dir)) as store:  # before the model loads
        check_judged_documents(Path(task_dir) / "qrels" / f"{split}.tsv", task.qrels, store.unknown_ids,
                               f"the index {index_dir}")
    with open_index(index_dir, model=model, device=device, batch_size=batch_size, precision=precision,
                    backend=backend) as index:
        depth = min(max(k_values), index.manifest.documents)
        hits = index.search([task.queries[qid] for qid in query_ids], k=depth)
        manifest = index.manifest
        compute = index.encoder.compute_precision
    results = {qid: {hit.doc_id: hit.score for hit in ranked} for qid, ranked in zip(query_ids, hits, strict=True)}
    out: dict[str, float | str | dict[str, int]] = {**ranking_scores(results, task.qrels, k_values)}
    out.update(queries=len(query_ids), documents=manifest.documents, k=k, split=split, compute_precision=compute,
               index_type=manifest.index_type, factory=manifest.factory, search_params=dict(manifest.search_params),
               store_precision=manifest.precision)
    return out


def ranking_scores(results: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]],
                   k_values: Sequence[int]) -> dict[str, float]:
    """nDCG, MAP, recall, precision and MRR at each k, averaged over the ranked queries, as mteb reports them.

    Example:
        >>> ranking_scores({"q1": {"d1": 0.9, "d2": 0.5}}, {"q1": {"d2": 1}}, [1, 10])["mrr_at_10"]
        0.5
    """
    import pytrec_eval

    measures = {f"{name}.{','.join(map(str, k_values))}" for name in TREC_MEASURES.values()}
    per_query = pytrec_eval.RelevanceEvaluator(dict(qrels), measures).evaluate(dict(results))
    out: dict[str, float] = {}
    for metric, trec_name in TREC_MEASURES.items():
        for k in k_values:
            mean = sum(scores[f"{trec_name}_{k}"] for scores in per_query.values()) / len(per_query)
            out[f"{metric}_at_{k}"] = round(mean, MTEB_DIGITS)
    reciprocal = _reciprocal_ranks(results, qrels, k_values)
    out.update({f"mrr_at_{k}": sum(ranks) / len(ranks) for k, ranks in reciprocal.items()})
    return out


def _reciprocal_ranks(results: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]],
                      k_values: Sequence[int]) -> dict[int, list[float]]:
    """1/rank of the first relevant document within each k; ties broken by document id, descending."""
    ranks: dict[int, list[float]] = {k: [] for k in k_values}
    for query_id, doc_scores in results.items():
        relevant = {doc for doc, grade in qrels[query_id].items() if grade > 0}
        ranked = [doc for doc, _ in sorted(doc_scores.items(), key=lambda item: (item[1], item[0]), reverse=True)]
        first = next((rank for rank, doc in enumerate(ranked, 1) if doc in relevant), None)
        for k in k_values:
            ranks[k].append(1.0 / first if first is not None and first <= k else 0.0)
    return ranks
