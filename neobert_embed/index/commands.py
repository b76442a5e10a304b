"""CLI commands of `neobert_embed.index` (registered on the main app by `neobert_embed.cli`).

``neobert-embed index build|add|search|eval|plan``: thin wrappers over :mod:`neobert_embed.index`;
heavy imports happen inside the commands so ``--help`` stays instant.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Annotated

import typer

from neobert_embed import options as opt
from neobert_embed.sentence import DOCUMENT_PROMPT, QUERY_PROMPT

index_app = typer.Typer(help="Encode corpora into FAISS indexes, search them, and evaluate them.",
                        no_args_is_help=True)
logger = logging.getLogger(__name__)

Corpus = Annotated[str, typer.Option(
    "--corpus", help=".jsonl, .ndjson, .json, .csv, .parquet, .txt, a directory of them, or a HF dataset.")]
TextField = Annotated[str, typer.Option("--text-field", help="Field holding the document text.")]
IdField = Annotated[str, typer.Option("--id-field", help="Field holding the unique document id.")]
TitleField = Annotated[str, typer.Option(
    "--title-field", help="Field joined before the text as mteb does (title + ' ' + text) when a document has "
    "one; --title-field '' leaves titles out.")]
RowIds = Annotated[bool, typer.Option("--row-ids", help="Use line/row numbers as ids (corpus without ids).")]
Split = Annotated[str, typer.Option("--split", help="Split to read when the corpus is a HF dataset.")]
Devices = Annotated[str | None, typer.Option(
    "--devices", help="Encode with one worker per device, e.g. cuda:0,cuda:1 (or cpu,cpu); under torchrun "
    "every rank already takes its share.")]
BuiltIndex = Annotated[Path, typer.Argument(help="Index directory made by `index build`.")]
IndexPrecision = Annotated[str | None, typer.Option(
    "--precision", callback=opt.check_precision_option, help="Compute precision of the model's forward (auto, "
    "fp32, bf16, fp16, int8); default: the one the index's documents were encoded at (its manifest's "
    "compute_precision).")]
ModelOverride = Annotated[str | None, typer.Option(
    "--model", help="Where the index's model lives now, if it moved (must be the same weights).")]
IndexBackend = Annotated[str | None, typer.Option(
    "--backend", help="torch, onnx or openvino; default: a `neobert-embed export` directory runs on its own "
    "runtime without torch (the export of the index's model is accepted), any other model on torch.")]

def _used_line(manifest, fields=None, kind: str = DOCUMENT_PROMPT, compute: str | None = None) -> str:
    """One line: the compute precision, length, prompt and fields the index's model encodes with."""
    prompt = manifest.prompts.get(kind)
    recorded = (manifest.compute or {}).get("reason")
    compute = compute or (f"{manifest.compute_precision} ({recorded})" if recorded else manifest.compute_precision)
    parts = [f"precision {compute}", f"max_seq_length {manifest.max_seq_length}",
             f"{kind} prompt {prompt!r}" if prompt else f"no {kind} prompt"]
    if fields is not None:
        title = f"title={fields.title_field} (title + ' ' + text)" if fields.title_field else "no title"
        parts.append(f"fields: id={'row number' if fields.row_ids else fields.id_field}, "
                     f"text={fields.text_field}, {title}")
    return "used: " + "; ".join(parts)


@index_app.command("build")
def build(
    model: Annotated[str, typer.Option("--model", help="Model name, hub id or local directory.")],
    corpus: Corpus,
    output: Annotated[Path, typer.Option("--output", help="Index directory to create.")],
    text_field: TextField = "text",
    id_field: IdField = "_id",
    title_field: TitleField = "title",
    row_ids: RowIds = False,
    split: Split = "train",
    index_type: Annotated[str, typer.Option("--index-type", help="flat | ivf | hnsw | ivfpq | auto")] = "auto",
    factory: Annotated[str | None, typer.Option(
        "--factory", help="Explicit FAISS factory string, e.g. 'IVF4096,PQ64'.")] = None,
    store_precision: opt.StorePrecision = None,
    chunk_size: Annotated[int, typer.Option("--chunk-size", min=1, max=1 << 24,
                                            help="Documents encoded and persisted per chunk.")] = 8192,
    batch_size: opt.BatchSize = 32,
    max_length: opt.MaxLength = None,
    device: opt.Device = None,
    revision: Annotated[str | None, typer.Option("--revision", help="Hub revision of the model.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted build.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing index.")] = False,
    no_wait: opt.NoWait = False,
    devices: Devices = None,
    on_disk: Annotated[bool, typer.Option(
        "--on-disk", help="IVF indexes only: merge per-shard indexes into memory-mapped on-disk lists "
        "(index.ivfdata), so RAM holds the coarse quantizer, not the corpus.")] = False,
    passages: Annotated[bool, typer.Option(
        "--passages", help="Index every token: split each document longer than the model's window (max_seq_length "
        "less special tokens and the document prompt) into overlapping passages; search ranks documents by their "
        "best passage and names its characters (span).")] = False,
    stride: Annotated[int | None, typer.Option(
        "--stride", min=1, help="With --passages: tokens between passage starts (default: window - window // 4, "
        "an overlap of a quarter window).")] = None,
    verbose: opt.Verbose = False,
    precision: opt.ComputePrecision = "auto",
    max_seq_length: opt.OldMaxLength = None,
    backend: IndexBackend = None,
) -> None:
    """Encode a corpus (streamed, chunked, resumable) into a FAISS index with a store and manifest.

    Runs data-parallel under `torchrun --nproc-per-node N` or with --devices (rank r encodes chunks
    i = r mod N; rank 0 builds the index).
    """
    from neobert_embed.console import third_party_log
    from neobert_embed.distributed import launch_on_devices, parse_devices
    from neobert_embed.index.build import build_index
    from neobert_embed.index.documents import CorpusFields

    max_seq_length = opt.renamed("--max-length", max_length, "--max-seq-length", max_seq_length)
    fields = CorpusFields(text_field, id_field, title_field, row_ids, split)
    options = dict(resume=resume, overwrite=overwrite, **dataclasses.asdict(fields), index_type=index_type,
                   factory=factory, precision=store_precision or "float32", compute_precision=precision,
                   chunk_size=chunk_size, batch_size=batch_size,
                   max_seq_length=max_seq_length, revision=revision, on_disk=on_disk, wait=not no_wait,
                   backend=backend, passages=passages, stride=stride)
    with third_party_log(output, verbose):
        if devices is not None:
            manifest = launch_on_devices(parse_devices(devices), build_index, model=model, corpus=corpus,
                                         output=output, **options)
        else:
            manifest = build_index(model, corpus, output, device=device, **options)
    logger.info(_used_line(manifest, fields))
    calibration = manifest.calibration
    recall = f", recall@10 {calibration.recall_at_10:.3f} vs exact" if calibration else ""
    trained = (f"; trained on {manifest.train_vectors} sampled vectors in {manifest.train_seconds:.1f} s"
               if manifest.train_vectors else "")
    extras = "".join([", lists on disk (mmap)" if manifest.on_disk else "",
                      f", top-{manifest.rerank_k_factor}x re-ranked exactly" if manifest.rerank_k_factor else ""])
    if manifest.passages is not None:
        extras += (f", {manifest.vectors} passages of {manifest.passages.window} tokens every "
                   f"{manifest.passages.stride}")
    logger.info("index of %d documents written to %s (%s, %s%s%s%s)", manifest.documents, output, manifest.factory,
                manifest.search_params or "exact", recall, extras, trained)


@index_app.command("add")
def add(
    index_dir: BuiltIndex,
    corpus: Corpus,
    text_field: TextField = "text",
    id_field: IdField = "_id",
    title_field: TitleField = "title",
    row_ids: RowIds = False,
    split: Split = "train",
    on_duplicate: Annotated[str, typer.Option(
        "--on-duplicate", help="error: refuse ids already indexed; replace: overwrite them.")] = "error",
    model: ModelOverride = None,
    batch_size: opt.BatchSize = 32,
    device: opt.Device = None,
    no_wait: opt.NoWait = False,
    verbose: opt.Verbose = False,
    precision: IndexPrecision = None,
    backend: IndexBackend = None,
) -> None:
    """Append documents to an index (all or nothing); duplicate ids are refused or replaced."""
    from neobert_embed.console import third_party_log
    from neobert_embed.errors import UserInputError
    from neobert_embed.index.add import add_documents
    from neobert_embed.index.documents import CorpusFields

    if on_duplicate not in ("error", "replace"):
        raise UserInputError(f"--on-duplicate must be 'error' or 'replace', got {on_duplicate!r}")
    fields = CorpusFields(text_field, id_field, title_field, row_ids, split)
    with third_party_log(index_dir, verbose):
        manifest = add_documents(index_dir, corpus, fields=fields, on_duplicate=on_duplicate, model=model,
                                 batch_size=batch_size, device=device, wait=not no_wait, precision=precision,
                                 backend=backend)
    logger.info(_used_line(manifest, fields))
    logger.info("%s now holds %d documents (%d replaced so far)", index_dir, manifest.documents, manifest.replaced)


@index_app.command("search")
def search(
    index_dir: BuiltIndex,
    query: Annotated[str | None, typer.Argument(help="Query text.")] = None,
    k: Annotated[int, typer.Option("--k", min=1, max=100_000, help="Results per query.")] = 10,
    queries: Annotated[Path | None, typer.Option(
        "--queries", help="File of queries: .txt (one per line), or .jsonl/.json/.csv/.parquet… with 'text'.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines instead of a table.")] = False,
    model: ModelOverride = None,
    batch_size: opt.BatchSize = 32,
    device: opt.Device = None,
    precision: IndexPrecision = None,
    backend: IndexBackend = None,
) -> None:
    """Search with the index's model and query prompt: a table (rank, score, id, snippet) or JSON lines."""
    from neobert_embed.console import json_only_stdout, without_progress_bars
    from neobert_embed.encoding import read_texts
    from neobert_embed.errors import UserInputError
    from neobert_embed.index.search import open_index

    if (query is None) == (queries is None):
        raise UserInputError("give either a QUERY argument or --queries FILE (not both)")
    if query is not None and not query.strip():
        raise UserInputError("QUERY is empty; give the text to search for (or --queries FILE)")
    texts = [query] if query is not None else read_texts(queries, "text", keep_blank=False)
    with json_only_stdout(as_json), without_progress_bars(), \
            open_index(index_dir, model=model, device=device, batch_size=batch_size, precision=precision,
                       backend=backend) as index:
        choice = index.encoder.choice
        logger.info(_used_line(index.manifest, kind=QUERY_PROMPT, compute=choice.description if choice else None))
        results = index.search(texts, k=k)
    if as_json:
        for text, hits in zip(texts, results, strict=True):
            typer.echo(json.dumps({"query": text, "hits": [
                {"rank": h.rank, "score": round(h.score, 6), "id": h.doc_id, "title": h.title, "text": h.text,
                 **h.passage_fields} for h in hits]}, ensure_ascii=False))
        return
    _print_tables(texts, results)


def _print_tables(texts: list[str], results: list) -> None:
    from rich.table import Table

    from neobert_embed.console import user_console

    console = user_console()
    for text, hits in zip(texts, results, strict=True):
        table = Table(title=f"query: {text}", title_justify="left")
        for column in ("rank", "score", "id", "snippet"):
            table.add_column(column, overflow="fold" if column == "snippet" else "ellipsis")
        for hit in hits:
            snippet = f"{hit.title} — {hit.text}" if hit.title else hit.text
            if hit.span is not None:  # found through a passage: show it, and where it lies
                snippet = f"[{hit.span[0]}:{hit.span[1]}] {hit.text[hit.span[0]:hit.span[1]]}"
            table.add_row(str(hit.rank), f"{hit.score:.4f}", hit.doc_id,
                          snippet if len(snippet) <= 100 else snippet[:99] + "…")
        console.print(table)


@index_app.command("eval")
def evaluate(
    index_dir: BuiltIndex,
    task_dir: Annotated[Path, typer.Option("--task-dir", help="BEIR task: queries.jsonl, qrels/<split>.tsv.")],
    k: Annotated[int, typer.Option("--k", min=1, max=100_000, help="Cut-off reported as the main metrics.")] = 10,
    split: Annotated[str, typer.Option("--split", help="Which qrels/<split>.tsv to use.")] = "test",
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON object of all metrics.")] = False,
    model: ModelOverride = None,
    batch_size: opt.BatchSize = 32,
    device: opt.Device = None,
    precision: IndexPrecision = None,
    backend: IndexBackend = None,
) -> None:
    """Score the index on a BEIR-layout task: nDCG@k, recall@k/100, MRR@k (mteb's implementation)."""
    from rich.table import Table

    from neobert_embed.console import json_only_stdout, user_console, without_progress_bars
    from neobert_embed.index.evaluate import evaluate_index
    from neobert_embed.index.manifest import read_manifest

    manifest = read_manifest(index_dir)
    with json_only_stdout(as_json), without_progress_bars():  # no log folder: loading bars would break the lines
        scores = evaluate_index(index_dir, task_dir, k=k, split=split, model=model, batch_size=batch_size,
                                device=device, precision=precision, backend=backend)
    logger.info(_used_line(manifest, kind=QUERY_PROMPT, compute=str(scores["compute_precision"])))
    searched = ", ".join(f"{key} {value}" for key, value in scores["search_params"].items()) or "exact"
    table = Table(title=f"{index_dir} ({scores['index_type']} {scores['factory']}, {searched}, vectors stored "
                        f"{scores['store_precision']}) on {task_dir}, split {split}: {scores['queries']} judged "
                        "queries, each ranking scored by pytrec_eval as mteb does", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in (f"ndcg_at_{k}", f"recall_at_{k}", "recall_at_100", f"mrr_at_{k}", f"map_at_{k}"):
        table.add_row(key, f"{scores[key]:.5f}")
    user_console(stderr=as_json).print(table)
    if as_json:
        typer.echo(json.dumps(scores, sort_keys=True))


@index_app.command("verify")
def verify(
    index_dir: BuiltIndex,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
) -> None:
    """Check an index's files against the checksums in its manifest (exit 1 when any differs)."""
    from neobert_embed.console import user_console
    from neobert_embed.index.integrity import verify_index

    report = verify_index(index_dir)
    if as_json:
        typer.echo(json.dumps({**dataclasses.asdict(report), "ok": report.ok}, sort_keys=True))
    else:
        console = user_console(stderr=True)
        for problem in report.problems:
            console.print(f"[red]✗[/] {problem}", highlight=False, soft_wrap=True)
        if report.ok:
            console.print(f"{index_dir}: OK ({', '.join(report.checked)} match the manifest)", highlight=False)
    if not report.ok:
        raise typer.Exit(1)


@index_app.command("plan")
def plan(
    vectors: Annotated[int, typer.Option("--vectors", min=1, help="Number of vectors to index.")],
    dim: Annotated[int, typer.Option("--dim", min=1, max=65_536, help="Embedding dimension.")],
    index_type: Annotated[str, typer.Option("--index-type", help="flat | ivf | hnsw | ivfpq | auto | all")] = "all",
    on_disk: Annotated[bool, typer.Option("--on-disk", help="IVF lists memory-mapped from disk.")] = False,
    costs: Annotated[Path | None, typer.Option(
        "--costs", help="Unit costs measured by benchmarks/index_bench.py --save-costs (default: the saved ones).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Estimate RAM, disk, build time and queries/s from per-vector costs measured by the benchmark."""
    from rich.table import Table

    from neobert_embed.console import user_console
    from neobert_embed.index.plan import load_costs, plan_index, plan_json

    measured = load_costs(costs)
    rows = plan_index(vectors, dim, index_type, on_disk=on_disk, costs=measured)
    if as_json:
        typer.echo(plan_json(rows, vectors, dim, measured))
        return
    table = Table(title=f"{vectors:,} x {dim} vectors (unit costs measured on: {measured.get('machine')})",
                  title_justify="left")
    for column in ("index", "factory", "RAM GB", "disk GB", "index build", "queries/s", "search"):
        table.add_column(column, justify="left" if column in ("index", "factory", "search") else "right")
    for row in rows:
        table.add_row(row.index_type + (" (on disk)" if row.on_disk else ""), row.factory, f"{row.ram_gb:,.2f}",
                      f"{row.disk_gb:,.2f}", _duration(row.build_s), f"{row.queries_per_s:,.3g}", row.search_param)
    console = user_console()
    console.width = max(120, console.width)  # the table's seven columns
    console.print(table)
    typer.echo("Build time is the index's own (train + add), without encoding; queries/s is one process, "
               "batched queries; RAM for on-disk indexes excludes the OS page cache.")


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def register(app: typer.Typer) -> None:
    """Attach this area's commands to the main `neobert-embed` app."""
    app.add_typer(index_app, name="index")
