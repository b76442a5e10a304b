"""``index plan``: estimates scaled from measured unit costs, through the CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from neobert_embed.cli import app
from neobert_embed.errors import UserInputError
from neobert_embed.index.plan import COSTS_PATH, load_costs, plan_index

COSTS = {"machine": "test", "nprobe": {"ivf": 16, "ivfpq": 8}, "ef_search": 64, "rerank_k": 80,
         "unit": {"flat_scan_s_per_dim": 1e-10, "flat_add_s_per_dim": 1e-10, "hnsw_link_bytes": 260,
                  "hnsw_query_s_per_dim_log": 1e-7, "hnsw_add_s_per_dim_log": 1e-8,
                  "kmeans_s_per_point_centroid_dim": 1e-11, "ivf_assign_s_per_centroid_dim": 1e-11,
                  "pq_scan_s_per_byte": 1e-10, "rerank_s_per_dim": 1e-9}}


def test_plan_scales_each_structure_as_it_grows():
    small, large = plan_index(10**6, 768, costs=COSTS), plan_index(10**8, 768, costs=COSTS)
    by_type = {row.index_type: (s, row) for s, row in zip(small, large, strict=True)}
    flat_small, flat_large = by_type["flat"]
    assert flat_large.ram_gb == pytest.approx(100 * flat_small.ram_gb) == pytest.approx(307.2)
    assert flat_large.queries_per_s == pytest.approx(flat_small.queries_per_s / 100, rel=1e-2)
    ivf_small, ivf_large = by_type["ivf"]
    assert ivf_large.factory == "IVF65536,Flat" and ivf_small.factory == "IVF4096,Flat"   # 4 x 2^ceil(log2 sqrt(n))
    assert ivf_large.queries_per_s > flat_large.queries_per_s * 10      # IVF scans a shrinking share
    pq_small, pq_large = by_type["ivfpq"]
    assert pq_large.factory == "IVF16384,PQ96x8"
    assert pq_large.ram_gb < flat_large.ram_gb / 10
    assert pq_large.disk_gb == pytest.approx((10**8 * (96 + 8 + 768 * 2) + 16384 * 768 * 4) / 1e9, rel=1e-3)
    on_disk = plan_index(10**8, 768, "ivfpq", on_disk=True, costs=COSTS)[0]
    assert on_disk.on_disk and on_disk.ram_gb == pytest.approx(16384 * 768 * 4 / 1e9, rel=1e-2)
    auto = plan_index(10**6, 384, "auto", costs=COSTS)[0]
    assert (auto.index_type, auto.factory, auto.search_param) == ("ivf", "IVF4096,Flat", "nprobe=16")
    assert auto.ram_gb == pytest.approx((10**6 * (384 * 4 + 8) + 4096 * 384 * 4) / 1e9, rel=1e-3)
    with pytest.raises(UserInputError, match="cannot be planned"):
        plan_index(10**6, 384, "annoy", costs=COSTS)


@pytest.mark.skipif(not COSTS_PATH.is_file(), reason="no measured costs saved")
def test_plan_cli_uses_the_saved_measured_costs(tmp_path):
    result = CliRunner().invoke(app, ["index", "plan", "--vectors", "100000000", "--dim", "768", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["measured_on"] == load_costs()["machine"]
    assert [row["index_type"] for row in report["rows"]] == ["flat", "ivf", "hnsw", "ivfpq"]
    # the flat row by hand from the saved unit costs: a query scans all 1e8 x 768 dimensions once, a
    # build appends each of them once (estimates are rounded to 4 significant figures)
    unit, n, d = load_costs()["unit"], 10**8, 768
    rows = {row["index_type"]: row for row in report["rows"]}
    assert rows["flat"]["queries_per_s"] == pytest.approx(1 / (n * d * unit["flat_scan_s_per_dim"]), rel=1e-3)
    assert rows["flat"]["build_s"] == pytest.approx(n * d * unit["flat_add_s_per_dim"], rel=1e-3)
    for kind in ("ivf", "hnsw", "ivfpq"):  # at 1e8 vectors: faster to query than a full scan, dearer to build
        assert rows[kind]["queries_per_s"] > 10 * rows["flat"]["queries_per_s"], kind
        assert rows["flat"]["build_s"] < rows[kind]["build_s"] < float("inf"), kind
    table = CliRunner().invoke(app, ["index", "plan", "--vectors", "1000000", "--dim", "384"])
    assert table.exit_code == 0 and "IVF1024,PQ48x8" in table.output
    missing = CliRunner().invoke(app, ["index", "plan", "--vectors", "10", "--dim", "8", "--costs",
                                       str(tmp_path / "none.json")])
    assert missing.exit_code != 0 and "--save-costs" in str(missing.exception)
