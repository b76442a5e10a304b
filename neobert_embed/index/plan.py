"""``index plan``: memory, disk, build time and queries/s of an index before building it.

Why: at 100M or 1B vectors the wrong index type costs days or a machine that does not exist. The
estimates here are not guesses: ``benchmarks/index_bench.py --save-costs`` measures, on the machine
it runs on, what each index type costs per vector (bytes in RAM and on disk, seconds per
vector-dimension to scan, train and add), and this module scales those measured unit costs with
the way each structure grows: a flat scan with ``n``, an IVF query with its ``nlist`` centroids plus
the ``nprobe / nlist`` share of the lists it scans, an HNSW query with ``log n``, k-means training
with ``sample x nlist``. The factory strings are the ones ``index build`` would choose.

Example:
    >>> rows = plan_index(100_000_000, 768)
    >>> [(r.index_type, round(r.ram_gb)) for r in rows][:2]
    [('flat', 307), ('ivf', 308)]
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from neobert_embed.errors import UserInputError
from neobert_embed.index.factory import choose_index_spec
from neobert_embed.recipes import read_spec

COSTS_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "index_costs.json"
PLAN_TYPES = ("flat", "ivf", "hnsw", "ivfpq")
ID_BYTES = 8


@dataclass(frozen=True)
class PlanRow:
    """Estimated cost of one index type at the planned size (times in seconds, sizes in GB)."""

    index_type: str
    factory: str
    on_disk: bool
    ram_gb: float
    disk_gb: float
    build_s: float
    queries_per_s: float
    search_param: str


def load_costs(path: str | Path | None = None) -> dict[str, Any]:
    """The unit costs saved by the benchmark (``benchmarks/index_costs.json`` by default)."""
    path = Path(path) if path else COSTS_PATH
    return read_spec(path, "costs", f"run `python benchmarks/index_bench.py --save-costs {path}` on this "
                     "machine first").data


def _pq_bytes(factory: str) -> int:
    """Code bytes per vector of a ``PQ{m}x{bits}`` factory."""
    layout = factory.split("PQ")[-1]
    m, _, bits = layout.partition("x")
    return math.ceil(int(m) * int(bits or 8) / 8)


def _row(index_type: str, n: int, d: int, costs: dict[str, Any], on_disk: bool) -> PlanRow:
    unit = costs["unit"]
    spec = choose_index_spec(index_type, n, d)
    scan = unit["flat_scan_s_per_dim"]          # seconds to score one float32 vector-dimension
    nlist = spec.lists
    nprobe = costs["nprobe"].get(index_type, 1)
    if index_type == "flat":
        vector_bytes = 4 * d
        query_s = n * d * scan
        build_s = n * d * unit["flat_add_s_per_dim"]
    elif index_type == "hnsw":
        vector_bytes = 4 * d + unit["hnsw_link_bytes"]
        query_s = unit["hnsw_query_s_per_dim_log"] * d * math.log(n)
        build_s = n * d * math.log(n) * unit["hnsw_add_s_per_dim_log"]
    else:
        pq = index_type == "ivfpq"
        vector_bytes = (_pq_bytes(spec.factory) if pq else 4 * d) + ID_BYTES
        per_code = unit["pq_scan_s_per_byte"] * _pq_bytes(spec.factory) if pq else scan * d
        rerank_s = costs["rerank_k"] * d * unit["rerank_s_per_dim"] if pq else 0.0
        query_s = nlist * d * scan + nprobe * n / nlist * per_code + rerank_s
        build_s = (spec.train_size * nlist * d * unit["kmeans_s_per_point_centroid_dim"]
                   + n * nlist * d * unit["ivf_assign_s_per_centroid_dim"])
    centroids = nlist * d * 4 if index_type in ("ivf", "ivfpq") else 0
    disk = n * vector_bytes + centroids + (n * d * 2 if index_type == "ivfpq" else 0)   # + float16 re-rank copy
    ram = centroids + (0 if on_disk and index_type in ("ivf", "ivfpq") else n * vector_bytes)
    param = f"nprobe={nprobe}" if index_type in ("ivf", "ivfpq") else (
        f"efSearch={costs['ef_search']}" if index_type == "hnsw" else "exact")
    return PlanRow(index_type, spec.factory, on_disk and index_type in ("ivf", "ivfpq"), _sig(ram / 1e9),
                   _sig(disk / 1e9), _sig(build_s), _sig(1.0 / query_s), param)


def _sig(value: float) -> float:
    """Four significant figures: estimates are not more precise than that."""
    return float(f"{value:.4g}")


def plan_index(n_vectors: int, dimension: int, index_type: str | None = None, on_disk: bool = False,
               costs: dict[str, Any] | None = None) -> list[PlanRow]:
    """Estimate RAM, disk, build time and single-process queries/s for each index type (or one).

    Build time is the index's own (training on the sample ``index build`` draws, then adding);
    encoding time depends on the model and is not included. RAM is what a search process holds;
    ``on_disk`` IVF indexes keep only their centroids (and the OS page cache) in RAM.

    Example:
        >>> plan_index(10_000_000, 384, "ivfpq", on_disk=True)[0].ram_gb
        0.006291
    """
    if n_vectors < 1 or dimension < 1:
        raise UserInputError("--vectors and --dim must be positive")
    costs = costs or load_costs()
    types = PLAN_TYPES if index_type in (None, "all") else (index_type,)
    if index_type == "auto":
        types = (choose_index_spec("auto", n_vectors, dimension).index_type,)
    unknown = [t for t in types if t not in PLAN_TYPES]
    if unknown:
        raise UserInputError(f"--index-type {unknown[0]!r} cannot be planned; choose one of "
                             f"{', '.join(PLAN_TYPES)}, auto or all")
    return [_row(t, n_vectors, dimension, costs, on_disk) for t in types]


def plan_json(rows: list[PlanRow], n_vectors: int, dimension: int, costs: dict[str, Any]) -> str:
    """The plan as one JSON object (what ``index plan --json`` prints)."""
    return json.dumps({"vectors": n_vectors, "dimension": dimension, "measured_on": costs.get("machine"),
                       "rows": [asdict(r) for r in rows]})
