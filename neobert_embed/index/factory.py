"""Choosing, creating and querying FAISS indexes.

Why: the right index depends on the corpus size. Exact search is best below ~100k vectors;
above, an inverted file (IVF) or a graph (HNSW) trades a little recall for a lot of speed, and the
stored precision (float16, int8 scalar quantizer, binary codes, product quantization) trades more
recall for memory. This module turns ``--index-type``/``--store-precision``/``--factory`` into one FAISS
factory string, refusing combinations FAISS cannot do, and runs every search the same way
(search-time parameters, exclusion of replaced rows, binary codes).

Example:
    >>> spec = choose_index_spec("auto", n_vectors=1_000_000, dimension=384)
    >>> spec.factory, spec.tuned_parameter
    ('IVF4096,Flat', 'nprobe')
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from neobert_embed.errors import UserInputError
from neobert_embed.files import atomic_path
from neobert_embed.quantization import check_storage_precision

if TYPE_CHECKING:
    from typing import TypeAlias

    import faiss

    #: A FAISS index as stored: float (``faiss.Index``) or sign-bit codes (``faiss.IndexBinary``).
    FaissIndex: TypeAlias = "faiss.Index | faiss.IndexBinary"

INDEX_TYPES = ("auto", "flat", "ivf", "hnsw", "ivfpq")
EXACT_SEARCH_LIMIT = 100_000
HNSW_NEIGHBOURS = 32
KMEANS_POINTS_PER_CENTROID = 40
# faiss's guideline for IVF-Flat is 4·sqrt(n) to 16·sqrt(n) lists: a float list scan costs as much per
# vector as a centroid does, so that is where the two costs balance at nprobe ~16. Product-quantized
# lists scan ~8x cheaper codes, which moves the balance to ~sqrt(n) lists.
IVF_FLAT_LISTS_PER_ROOT = 4
PQ_KMEANS_ITERATIONS = 10
NPROBE_CANDIDATES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096)
EF_SEARCH_CANDIDATES = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024)
_SQ_SUFFIX = {"float32": "Flat", "float16": "SQfp16", "int8": "SQ8"}


@dataclasses.dataclass(frozen=True)
class IndexSpec:
    """A resolved index choice.

    Attributes:
        index_type: flat, ivf, hnsw, ivfpq, or custom (``--factory``).
        factory: FAISS factory string (``index_binary_factory`` syntax when ``binary``).
        precision: how vectors are stored.
        binary: codes are sign bits searched by Hamming distance.
        tuned_parameter: search-time knob calibrated for recall (nprobe, efSearch) or None.
        train_size: vectors sampled to train the index (0: needs no training).
        reason: which index this is and why, for the user (``auto`` says why it chose it).
    """

    index_type: str
    factory: str
    precision: str
    binary: bool
    tuned_parameter: str | None
    train_size: int
    reason: str = dataclasses.field(default="", compare=False)

    @property
    def candidates(self) -> tuple[int, ...]:
        """Values of the tuned parameter tried in increasing cost order."""
        return {"nprobe": NPROBE_CANDIDATES, "efSearch": EF_SEARCH_CANDIDATES}.get(self.tuned_parameter or "", ())

    @property
    def lists(self) -> int:
        """IVF cells of the factory string (0 when it has no inverted file)."""
        match = re.search(r"IVF(\d+)", self.factory)
        return int(match.group(1)) if match else 0


def ivf_lists(n_vectors: int, per_root: int = 1) -> int:
    """Number of IVF cells: ``per_root`` x the smallest power of two >= sqrt(n), with >= 40 training points per cell.

    Example:
        >>> ivf_lists(1_000_000), ivf_lists(1_000_000, IVF_FLAT_LISTS_PER_ROOT)
        (1024, 4096)
    """
    nlist = per_root * 2 ** max(0, math.ceil(math.log2(math.sqrt(max(n_vectors, 1)))))
    while nlist > 1 and nlist * KMEANS_POINTS_PER_CENTROID > n_vectors:
        nlist //= 2
    return nlist


def _pq_layout(dimension: int, n_vectors: int) -> str:
    """``PQ{m}x{bits}``: 8 dimensions per sub-quantizer, 8 bits when there are enough points to train."""
    sub = next(s for s in (8, 4, 2, 1) if dimension % s == 0)
    bits = 8 if n_vectors >= 256 * 39 else 4
    if n_vectors < 16 * 39:
        raise UserInputError(f"--index-type ivfpq needs at least {16 * 39} vectors to train its codebooks, "
                             f"the corpus has {n_vectors}; use flat or ivf")
    return f"PQ{dimension // sub}x{bits}"


def check_options(index_type: str, precision: str, factory: str | None, dimension: int) -> None:
    """Refuse unknown or incompatible ``--index-type``/``--store-precision``/``--factory`` before any work.

    Example:
        >>> check_options("ivfpq", "int8", None, 384)
        Traceback (most recent call last):
        UserInputError: --store-precision does not apply to --index-type ivfpq ...
    """
    if index_type not in INDEX_TYPES:
        raise UserInputError(f"--index-type {index_type!r} is unknown; choose one of {', '.join(INDEX_TYPES)}")
    check_storage_precision(precision)
    if factory is not None and index_type != "auto":
        raise UserInputError("pass either --index-type or --factory, not both: the factory string "
                             "already names the index type")
    if factory is not None and precision != "float32":
        raise UserInputError("--store-precision cannot be combined with --factory; put the storage in the "
                             "factory string instead (e.g. 'IVF1024,SQ8' or 'HNSW32,SQfp16')")
    if index_type == "ivfpq" and precision != "float32":
        raise UserInputError("--store-precision does not apply to --index-type ivfpq (product quantization "
                             "already compresses the vectors); drop --store-precision or use flat/ivf/hnsw")
    if precision == "binary" and index_type in ("ivf", "ivfpq"):
        raise UserInputError(f"--store-precision binary works with --index-type flat, hnsw or auto, not "
                             f"{index_type} (FAISS's binary IVF cannot skip replaced documents)")
    if precision == "binary" and dimension % 8:
        raise UserInputError(f"--store-precision binary needs a dimension divisible by 8; the model has {dimension}")


def _custom_spec(factory: str, n_vectors: int) -> IndexSpec:
    binary = factory.startswith("B")
    tuned = "nprobe" if "IVF" in factory else ("efSearch" if "HNSW" in factory else None)
    needs_training = "IVF" in factory or "PQ" in factory or "SQ" in factory or "LSH" in factory
    spec = IndexSpec("custom", factory, "binary" if binary else "float32", binary, tuned, 0,
                     reason=f"custom: --factory {factory!r}")
    # k-means wants >= 40 points per list (faiss refuses fewer than one); 4096 lists' worth covers the rest
    train_size = min(n_vectors, max(256 * 39, KMEANS_POINTS_PER_CENTROID * max(4096, spec.lists)))
    return dataclasses.replace(spec, train_size=train_size if needs_training else 0)


def choose_index_spec(index_type: str, n_vectors: int, dimension: int, precision: str = "float32",
                      factory: str | None = None) -> IndexSpec:
    """Resolve the user's options into an :class:`IndexSpec`, refusing impossible combinations.

    ``auto`` is exact below ``EXACT_SEARCH_LIMIT`` vectors and IVF-Flat with faiss's 4·sqrt(n)
    lists above (HNSW for binary codes, which have no IVF here). Why not sqrt(n) lists or HNSW: on
    overlapping clusters (``benchmarks/index_bench.py --noise 2``) k-means with ~1 centroid per
    cluster leaves clusters without one, so their members scatter over unrelated cells and recall
    stalls near 0.93, and HNSW32 tops out at 0.95 only at 4x flat's cost at 1M; with 4x the
    lists every cluster gets its own cells and nprobe 8 reaches recall@10 1.0 at >100x flat's
    queries/s (``benchmarks/index_sweep.py``; figures in docs/indexing.md). The approximate
    indexes get their search parameter calibrated after building so recall@10 against exact
    search reaches 0.99 (plus a 0.005 margin) on queries the index has not seen, which keeps
    nDCG@10 within 0.005 of exact search (see :mod:`neobert_embed.index.tuning`). Below ``EXACT_SEARCH_LIMIT`` exact
    search is fast enough that no approximation is worth its risk; ``IndexSpec.reason`` says so.

    Example:
        >>> choose_index_spec("hnsw", 50_000, 384, precision="int8").factory
        'HNSW32,SQ8'
    """
    check_options(index_type, precision, factory, dimension)
    if factory is not None:
        return _custom_spec(factory, n_vectors)
    binary = precision == "binary"
    asked = index_type
    if index_type == "auto":
        index_type = "flat" if n_vectors < EXACT_SEARCH_LIMIT else ("hnsw" if binary else "ivf")
    spec = _resolved_spec(index_type, n_vectors, dimension, precision, binary)
    return dataclasses.replace(spec, reason=choice_reason(asked, spec, n_vectors))


def choice_reason(asked: str, spec: IndexSpec, n_vectors: int) -> str:
    """One line for the user: the index built and, for ``auto``, why.

    Example:
        >>> choice_reason("auto", choose_index_spec("auto", 4000, 384), 4000)
        'flat (exact): auto, 4,000 vectors < 100,000, exact search is fast'
    """
    name = f"{spec.index_type} (exact)" if spec.index_type == "flat" and spec.precision == "float32" else spec.index_type
    if asked != "auto":
        return f"{name}: --index-type {asked}"
    if spec.index_type == "flat":
        return f"{name}: auto, {n_vectors:,} vectors < {EXACT_SEARCH_LIMIT:,}, exact search is fast"
    if spec.binary:
        return (f"{name}: auto, {n_vectors:,} vectors >= {EXACT_SEARCH_LIMIT:,}, exact search slows down; "
                "binary codes have no IVF here, so HNSW")
    return (f"{name}: auto, {n_vectors:,} vectors >= {EXACT_SEARCH_LIMIT:,}, exact search slows down; IVF with "
            f"{spec.lists:,} lists, its nprobe calibrated against exact search")


def _resolved_spec(index_type: str, n_vectors: int, dimension: int, precision: str, binary: bool) -> IndexSpec:
    """The :class:`IndexSpec` of a concrete ``index_type`` (not auto) for ``n_vectors``."""
    nlist = ivf_lists(n_vectors, IVF_FLAT_LISTS_PER_ROOT if index_type == "ivf" else 1)
    ivf_train = min(n_vectors, KMEANS_POINTS_PER_CENTROID * nlist)
    sq_train = min(n_vectors, 100_000) if precision in ("int8",) else 0
    if index_type == "flat":
        return IndexSpec("flat", "BFlat" if binary else _SQ_SUFFIX[precision], precision, binary, None,
                         sq_train)
    if index_type == "hnsw":
        name = f"BHNSW{HNSW_NEIGHBOURS}" if binary else f"HNSW{HNSW_NEIGHBOURS}"
        if precision in ("float16", "int8"):
            name += f",{_SQ_SUFFIX[precision]}"
        return IndexSpec("hnsw", name, precision, binary, "efSearch", sq_train)
    if index_type == "ivf":
        return IndexSpec("ivf", f"IVF{nlist},{_SQ_SUFFIX[precision]}", precision, False, "nprobe",
                         ivf_train)
    pq = _pq_layout(dimension, n_vectors)
    return IndexSpec("ivfpq", f"IVF{nlist},{pq}", precision, False, "nprobe",
                     min(n_vectors, max(ivf_train, 256 * 39)))


def create_index(spec: IndexSpec, dimension: int) -> faiss.Index:
    """Instantiate an empty FAISS index (inner product; Hamming for binary codes).

    Example:
        >>> create_index(choose_index_spec("flat", 10, 32), 32).ntotal
        0
    """
    import faiss

    try:
        if spec.binary:
            return faiss.index_binary_factory(dimension, spec.factory)
        index = faiss.index_factory(dimension, spec.factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:  # "Error in <C++ signature> at <file>:<line>: <reason>": the reason alone
        reason = re.sub(r"^Error in .* at \S+:\d+: ", "", str(exc).strip().splitlines()[-1])
        raise UserInputError(f"--factory {spec.factory!r} is not a valid FAISS factory string for "
                             f"{dimension}-d vectors: {reason}") from None
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.cp.seed = 1234
    if isinstance(index, faiss.IndexIVFPQ):
        index.pq.cp.niter = PQ_KMEANS_ITERATIONS
        index.do_polysemous_training = False
    return index


def as_codes(spec: IndexSpec, vectors: np.ndarray) -> np.ndarray:
    """What FAISS stores for ``vectors``: the floats, or packed sign bits for binary indexes.

    Example:
        >>> as_codes(binary_spec, np.ones((1, 16), "float32")).shape
        (1, 2)
    """
    if spec.binary:
        return np.packbits(vectors > 0, axis=1)
    return np.ascontiguousarray(vectors, dtype=np.float32)


def exclusion_selector(rows: np.ndarray | None) -> faiss.IDSelector | None:
    """A FAISS selector that skips ``rows`` (replaced documents), or None when there are none.

    Built once per opened index, not per search: its hash set costs ~50 ms per million rows, far
    more than an IVF query.

    Example:
        >>> search_vectors(index, spec, queries, 10, excluded=exclusion_selector(np.array([3, 7])))
    """
    import faiss

    if rows is None or not len(rows):
        return None
    return faiss.IDSelectorNot(faiss.IDSelectorBatch(np.asarray(rows, dtype=np.int64)))


@runtime_checkable
class SearchableIndex(Protocol):
    """What searching needs of an index: a FAISS index, or a
    :class:`~neobert_embed.index.rerank.RerankedIndex` around one (which re-scores its candidates).

    Example:
        >>> isinstance(faiss.IndexFlatIP(8), SearchableIndex)
        True
    """

    ntotal: int
    d: int

    def search(self, x: np.ndarray, k: int, *, params: faiss.SearchParameters | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` (scores or distances, ids) per query row."""
        ...


def _search_parameters(index: SearchableIndex, params: dict[str, int],
                       selector: faiss.IDSelector | None) -> faiss.SearchParameters:
    """Build the right ``SearchParameters`` subclass, skipping what ``selector`` excludes."""
    import faiss

    index = getattr(index, "reranked_base", index)  # a RerankedIndex takes its base index's parameters
    ivf = faiss.try_extract_index_ivf(index) if isinstance(index, faiss.Index) else None
    if ivf is not None:
        parameters = faiss.SearchParametersIVF()
        parameters.nprobe = int(params.get("nprobe", ivf.nprobe))
    elif hasattr(index, "hnsw"):
        parameters = faiss.SearchParametersHNSW()
        parameters.efSearch = int(params.get("efSearch", index.hnsw.efSearch))
    else:
        parameters = faiss.SearchParameters()
    if selector is not None:
        parameters.sel = selector
    return parameters


def search_vectors(index: SearchableIndex, spec: IndexSpec, queries: np.ndarray, k: int,
                   params: dict[str, int] | None = None,
                   excluded: faiss.IDSelector | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` (scores, FAISS ids) for each query; ids are -1 where fewer than ``k`` exist;
    ``excluded`` is an :func:`exclusion_selector`.

    Scores are inner products (cosine for normalized models); for binary codes they are
    ``1 - 2 * hamming / dimension``, the cosine estimate of sign-bit codes.

    Example:
        >>> scores, ids = search_vectors(index, spec, encoder.encode(["q"], "query"), k=10)
    """
    parameters = _search_parameters(index, params or {}, excluded)
    k = max(1, min(int(k), int(index.ntotal))) if index.ntotal else 1
    scores, ids = index.search(as_codes(spec, queries), k, params=parameters)
    if spec.binary:
        scores = 1.0 - 2.0 * scores.astype(np.float32) / float(index.d)
    return scores.astype(np.float32), ids


def write_faiss_index(index: FaissIndex, path: Path) -> None:
    """Write a float or binary FAISS index via a temporary file and a rename."""
    import faiss

    write = faiss.write_index_binary if isinstance(index, faiss.IndexBinary) else faiss.write_index
    with atomic_path(path) as tmp:
        write(index, str(tmp))


def read_faiss_index(path: str | Path, binary: bool) -> FaissIndex:
    """Load an index written by :func:`write_faiss_index`."""
    import faiss

    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"{path}: missing; the index directory is incomplete, rebuild it")
    return faiss.read_index_binary(str(path)) if binary else faiss.read_index(str(path))
