"""``python -m humming bench`` and bench/report.py on tiny shapes, so that the benchmark code cannot rot on CPU CI:
every system builds and agrees with the float32 product (check only: no timing), the JSON has its header and
rows, and the report regenerates its tables from it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from humming import bench
from humming._bench_peer import find_site

REPORT = Path(__file__).resolve().parents[1] / "bench" / "report.py"


def _check(doc: dict, expected: set[str]) -> None:
    rows = doc["rows"]
    assert expected <= {r["system"] for r in rows}, doc["header"]["skipped"]
    for r in rows:
        assert "error" not in r, r
        assert r["rel_err"] < bench.CHECK_TOLERANCE, r
        assert r["floor_us"] > 0 and r["device"] and r["versions"], r


def test_linear_check_only(tmp_path):
    out = tmp_path / "linear.json"
    doc = bench.sweep(
        "linear", ["w4a16-int4-g128", "w8a8-fp8-channel"], [bench.Shape(64, 64)], [1, 5], check_only=True, out=out
    )
    _check(doc, {"humming", "humming:triton.wna16", "humming:triton.scaled_mm", "torch-bf16", "torch-scaled-mm"})
    assert json.loads(out.read_text()) == doc
    header = doc["header"]
    assert header["roofs"]["copy_bytes_per_s"] == bench.COPY_BYTES_PER_S and header["date"] and header["versions"]
    kernels = {r["kernel"] for r in doc["rows"] if r["system"] == "humming"}
    assert kernels == {"reference"}  # CPU tensors: what explain() says "auto" runs


def test_moe_check_only():
    doc = bench.sweep("moe", ["w4a16-int4-g128"], [bench.Shape(64, 64, 4, 2)], [3], check_only=True)
    _check(doc, {"humming", "humming:triton.grouped", "torch-grouped-mm"})
    assert {(r["experts"], r["topk"]) for r in doc["rows"]} == {(4, 2)}


def test_report_tables(tmp_path):
    bench.sweep("linear", ["w4a16-int4-g128"], [bench.Shape(64, 64)], [2], check_only=True, out=tmp_path / "l.json")
    spec = importlib.util.spec_from_file_location("bench_report", REPORT)
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    text = report.readme(report.load(tmp_path), tmp_path, plots=[])
    assert "### w4a16-int4-g128, 64x64, bf16 (relative error" in text
    assert "| 2 |" in text and "torch-bf16" in text
    assert "No results yet" in report.readme({}, tmp_path, plots=[])


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="shapes"):
        bench.parse_shapes("moe", "64x64")
    with pytest.raises(ValueError, match="systems"):
        bench.sweep("linear", ["w4a16-int4-g128"], [bench.Shape(64, 64)], [1], systems=["nope"], check_only=True)
    with pytest.raises(ValueError, match="cases"):
        bench.sweep("linear", ["nope"], [bench.Shape(64, 64)], [1], check_only=True)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="check_only"):
            bench.sweep("linear", ["w4a16-int4-g128"], [bench.Shape(64, 64)], [1])
    assert "humming-kernels is not installed" in find_site("/nonexistent")


def test_cli_help():
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--help"])
    assert exit_.value.code == 0
