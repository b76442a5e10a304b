"""What reading a corpus through :mod:`neobert_embed.sources` costs, in the two cases where the reader
can do less work than "everything": a ``.json`` file that is JSON lines (streamed like ``.jsonl``,
not read and decoded whole first), and a wide parquet file read for one column (``columns=``, as
``pretrain`` does).

Figures, all within this one run so ratios are comparable on a busy machine:
    json_lines: for the same records saved as ``.jsonl`` and as ``.json``, the seconds and the peak
        Python memory (tracemalloc) until the first record, and the seconds to read all records;
    parquet: seconds to read every row with every column, and with ``columns=["text"]``.

Usage:
    PYTHONPATH=. python benchmarks/source_reading.py [--rows 100000] [--extra-columns 8]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from neobert_embed.sources import iter_records

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by path
from conditions import conditions  # noqa: E402


def _first_record(path: Path) -> dict[str, float]:
    """Seconds and peak traced memory (MiB) until the first record of ``path`` is yielded."""
    tracemalloc.start()
    start = time.perf_counter()
    next(iter_records(path))
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"first_record_s": round(seconds, 4), "first_record_peak_mib": round(peak / 2**20, 2)}


def _read_all(path: Path, **options) -> float:
    start = time.perf_counter()
    count = sum(1 for _ in iter_records(path, **options))
    assert count > 0
    return round(time.perf_counter() - start, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--extra-columns", type=int, default=8)
    args = parser.parse_args()
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = "the quick brown fox jumps over the lazy dog " * 6
    records = [{"_id": f"d{i}", "text": f"{i} {text}", **{f"meta{j}": f"value {i} {j}" for j in
                                                           range(args.extra_columns)}} for i in range(args.rows)]
    report: dict = {"rows": args.rows, "extra_columns": args.extra_columns}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        lines = "".join(json.dumps(r) + "\n" for r in records)
        for name in ("corpus.jsonl", "corpus.json"):
            (root / name).write_text(lines, encoding="utf-8")
        report["file_mib"] = round((root / "corpus.json").stat().st_size / 2**20, 1)
        report["json_lines"] = {name: {**_first_record(root / name), "all_records_s": _read_all(root / name)}
                                for name in ("corpus.jsonl", "corpus.json")}
        pq.write_table(pa.Table.from_pylist(records), root / "corpus.parquet")
        every = _read_all(root / "corpus.parquet")
        text_only = _read_all(root / "corpus.parquet", columns=["text"])
        report["parquet"] = {"all_columns_s": every, "text_column_s": text_only,
                             "speedup": round(every / text_only, 2)}
    report["conditions"] = conditions(
        data=(f"synthetic: {args.rows} records (_id, a ~270-character text, {args.extra_columns} meta columns) saved "
              "as the same JSON lines in .jsonl and .json, and as one parquet file"),
        precision="not applicable (no model: reading files)",
        protocol=("neobert_embed.sources.iter_records: time and peak traced Python memory (tracemalloc) to the "
                  "first record, seconds to read every record; parquet with every column vs columns=['text']"),
        selection="nothing selected",
        timing="one run per figure, no warm-up (the files are fresh in the page cache)")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
