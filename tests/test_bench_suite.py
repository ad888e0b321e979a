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
from humming.bench.moe import Experts, MoeGroup, coarse_to_fine, scaled_grouped_mm
from humming.bench.peer import find_site, grouped_inputs

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
    assert header["roofs"]["copy_bytes_per_s"] == bench.COPY_BYTES_PER_S["NVIDIA H200"] and header["date"]
    assert "check only" in header["roofs"]["source"] and header["versions"]
    kernels = {r["kernel"] for r in doc["rows"] if r["system"] == "humming"}
    assert kernels == {"reference"}  # CPU tensors: what explain() says "auto" runs


#: gpt-oss's layer in miniature: MXFP4 experts with biases, clamped SwiGLU on interleaved gate / up rows
TINY_OSS = bench.MoeModel(
    "tiny-oss", 4, 2, 128, 64, ("mxfp4-a16",), "swiglu_oai", "interleaved", alpha=1.702, limit=7.0, bias=True
)
GROUPED_SYSTEMS = {"humming", "humming:triton.grouped", "torch-grouped-mm"}


@pytest.fixture(scope="module")
def moe_doc():
    """A check-only MoE sweep: every part and routing of TINY_OSS, and one part of a ``--shapes`` layer."""
    shape = bench.Shape(64, 64, 4, 2)
    return bench.sweep("moe", [], [shape], [3], models=[TINY_OSS], check_only=True, progress=False)


def test_moe_check_only(moe_doc):
    _check(moe_doc, GROUPED_SYSTEMS)
    rows = [r for r in moe_doc["rows"] if r["model"] == "tiny-oss"]
    by_part = {part: {r["system"] for r in rows if r["part"] == part} for part in bench.PARTS}
    assert by_part == {"grouped_w13": GROUPED_SYSTEMS, "grouped_w2": GROUPED_SYSTEMS, "layer": {"humming"}}
    assert {(r["routing"], r["part"]) for r in rows} == {(a, b) for a in bench.ROUTINGS for b in bench.PARTS}
    assert {(r["part"], r["n"], r["k"]) for r in rows} == {
        ("grouped_w13", 128, 128),
        ("grouped_w2", 128, 64),
        ("layer", 128, 128),
    }
    shaped = {(r["model"], r["case"]) for r in moe_doc["rows"] if r["model"] != "tiny-oss"}
    assert shaped == {("4x64x64/2", "w4a16-int4-g128"), ("4x64x64/2", "w8a8-fp8-block")}  # --shapes' default cases
    unsupported = moe_doc["header"]["unsupported"]
    assert "CUDA" in unsupported["torch-scaled-grouped-mm mxfp4-a16 tiny-oss grouped_w13"]
    assert "routings" in moe_doc["header"] and "humming-kernels" in moe_doc["header"]["skipped"]


@pytest.mark.parametrize("case", ["w8a8-fp8-block", "w4a16-int4-g32"])
def test_moe_formats(case):
    """DeepSeek-V3's fp8 blocks with fp8_g128 activations, Kimi-K2's int4 g32: the down-projection and the layer."""
    model = bench.MoeModel("tiny", 4, 2, 128, 128, (case,))
    doc = bench.sweep(
        "moe",
        [],
        [],
        [2],
        models=[model],
        routings=["skewed"],
        parts=["grouped_w2", "layer"],
        check_only=True,
        progress=False,
    )
    _check(doc, GROUPED_SYSTEMS)
    assert {r["part"] for r in doc["rows"]} == {"grouped_w2", "layer"}


def test_moe_budget_stops_gracefully(tmp_path):
    out = tmp_path / "moe.json"
    doc = bench.sweep("moe", [], [], [1, 4], models=[TINY_OSS], budget_s=0, check_only=True, out=out, progress=False)
    assert doc["rows"] == [] and doc["header"]["not_measured"] > 0
    assert json.loads(out.read_text()) == doc


@pytest.mark.parametrize("part", ["grouped_w13", "grouped_w2"])
@pytest.mark.parametrize("routing", bench.ROUTINGS)
def test_peer_gets_the_same_inputs(part, routing):
    """The humming-kernels worker draws the rows the sweep's own systems get (it cannot share the tensors)."""
    group = MoeGroup(Experts(TINY_OSS, "mxfp4-a16", torch.bfloat16, "cpu"), part, routing)
    request = dict(case=group.case, n=group.shape.n, k=group.shape.k, experts=4, topk=2, dtype="bfloat16")
    got = grouped_inputs({**request, **group.peer_fields()}, 5, "cpu")
    rows, order, counts = group.sorted_rows(group.inputs(5))
    assert torch.equal(got["rows"], rows) and torch.equal(got["order"], order)
    assert got["offsets"].tolist() == [0, *counts.cumsum(0).tolist()]


def test_scaled_grouped_mm_arguments():
    """torch._scaled_grouped_mm has no CPU kernel: its meta function checks the layout the GPU call gets."""
    x = torch.empty(10, 128, dtype=torch.bfloat16, device="meta")
    codes = torch.empty(4, 64, 128, dtype=torch.float8_e4m3fn, device="meta")
    offsets = torch.empty(4, dtype=torch.int32, device="meta")
    out = scaled_grouped_mm(x, codes, torch.empty(4, 64, device="meta"), offsets, torch.bfloat16)
    assert out.shape == (10, 64) and out.dtype == torch.bfloat16


def test_coarse_to_fine():
    values = [1 << i for i in range(14)]
    order = coarse_to_fine(values)
    assert sorted(order) == values and order[:3] == [1, 8192, 64]
    assert coarse_to_fine([16, 1]) == [1, 16]


def _report():
    spec = importlib.util.spec_from_file_location("bench_report", REPORT)
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    return report


def test_report_tables(tmp_path):
    bench.sweep("linear", ["w4a16-int4-g128"], [bench.Shape(64, 64)], [2], check_only=True, out=tmp_path / "l.json")
    report = _report()
    text = report.readme(report.load(tmp_path), tmp_path, plots=[])
    assert "### w4a16-int4-g128, 64x64, bf16 (relative error" in text
    assert "| 2 |" in text and "torch-bf16" in text
    assert "No results yet" in report.readme({}, tmp_path, plots=[])


def test_report_moe_tables(moe_doc, tmp_path):
    """Check-only tables, and the timed tables and targets from the same rows given made-up times."""
    report = _report()
    (tmp_path / "moe.json").write_text(json.dumps(moe_doc))
    text = report.readme(report.load(tmp_path), tmp_path, plots=[])
    assert "### tiny-oss: mxfp4-a16, bf16 (E=4, top-2)" in text and "#### skewed routing, layer" in text
    timed = json.loads(json.dumps(moe_doc))
    for i, r in enumerate(timed["rows"]):
        r.update(graph_us=10.0 + i, eager_us=25.0 + 2 * i)
        del r["rel_err"]
    timed["rows"] += [
        dict(r, system="humming-kernels", graph_us=20.0)
        for r in timed["rows"]
        if r["system"] == "humming" and r["part"] != "layer"
    ]
    (tmp_path / "moe.json").write_text(json.dumps(timed))
    text = report.readme(report.load(tmp_path), tmp_path, plots=[])
    assert "- layer / (its two grouped GEMMs), humming: " in text and "geometric mean" in text
    assert "#### random routing, whole layer (fused_moe, w13 128x128)" in text and "| eager - graph us |" in text


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
    with pytest.raises(ValueError, match="routings"):
        bench.sweep("moe", [], [], [1], models=[TINY_OSS], routings=["uniform"], check_only=True)
    with pytest.raises(ValueError, match="shapes"):
        bench.MoeModel.from_shape(bench.Shape(63, 64, 4, 2), ["w4a16-int4-g128"])
    with pytest.raises(SystemExit) as exit_:
        bench.main(["moe", "--models", "nope", "--check-only"])
    assert exit_.value.code == 2


def test_cli_help():
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--help"])
    assert exit_.value.code == 0


def test_report_plots_the_committed_sweeps(tmp_path):
    pytest.importorskip("matplotlib", reason="the plots need the bench extra (matplotlib)")
    report = _report()
    results = REPORT.parent / "results" / "h200"
    for name in ("linear.json", "moe.json"):
        (tmp_path / name).write_text((results / name).read_text())
    written = report.plot(report.load(tmp_path), tmp_path)
    assert written == ["linear_speedup.png", "linear_floor.png", "moe_speedup.png", "moe_floor.png"]
    assert all((tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in written)
    assert report.color("humming") == report.COLORS["humming"] != report.color("humming-kernels")
    ratios = report._ratios_by_point("linear", report.load(tmp_path)["linear"]["rows"], lambda t: t.get(report.PEER))
    # the README's headline: W4A16 int4 g128 at 28672x8192 takes 1.24x humming-kernels' time at M = 16
    assert round(ratios[("w4a16-int4-g128", "28672x8192", "bf16")][16], 2) == 1.24


def test_grouped_parts_time_each_backend_on_its_layers_routing(monkeypatch):
    """A grouped kernel's row is timed on the routing block of the layer of its backend: a Triton kernel's tile
    divides the block, so on the CUDA layer's fitted blocks (144 rows) it would run 16-row tiles."""
    from humming.moe import grouped

    fitted = grouped.takes_fitted_blocks
    monkeypatch.setattr(grouped, "takes_fitted_blocks", lambda *a: a[-1] in ("auto", "cuda") or fitted(*a))
    group = MoeGroup(Experts(TINY_OSS, "mxfp4-a16", torch.bfloat16, "cpu"), "grouped_w13", "random")
    inp = group.inputs(64)  # 128 slots over 4 experts: 32 rows each, above the 16-row decode block
    *_, auto_block = group.grouped(inp)
    rows, routing, triton_block = group.grouped(inp, "triton")
    assert triton_block == 64 and auto_block != triton_block
    assert routing.expert_ids.shape[0] * triton_block == rows.shape[0]
