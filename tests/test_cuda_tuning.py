"""The Hopper GEMM's tuning heuristic (CPU): a pure function of the problem and the device's limits, whose
choices on the H200 follow what bench/results/h200/tuning.json measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from humming.cuda_kernels import _gemm_sm90
from humming.cuda_kernels._layout import WeightLayout
from humming.device import DeviceLimits

H200 = DeviceLimits(132, 232448, 233472)
INT4 = WeightLayout(4, 8, "bf16")
MEASURED = Path(__file__).parents[1] / "bench" / "results" / "h200" / "tuning.json"


@pytest.mark.parametrize(
    ("m", "n", "tile"),
    [
        (64, 28672, (64, 2)),  # 224 tiles: one round on 264 block slots
        (128, 28672, (128, 1)),  # a full grid: one 128-token tile per SM beats two 64-token ones
        (256, 28672, (256, 1)),  # one weight pass instead of two
        (64, 8192, (32, 2)),  # a small grid spread over every SM
        (128, 8192, (64, 1)),
        (1024, 2048, (128, 1)),  # 128 tiles fill the 132 SMs; 256-token tiles would leave half idle
        (8192, 28672, (256, 1)),  # compute-bound: half the dequantization per FLOP
    ],
)
def test_dense_tile_follows_the_grid(m, n, tile):
    tuning = _gemm_sm90.default_gemm_tuning(m, n, INT4, H200)
    assert (tuning.bm, tuning.blocks) == tile
    budget = H200.smem_per_block // tuning.blocks - 1024 * (tuning.blocks - 1)
    assert tuning.smem_bytes(INT4) <= budget
    assert (
        tuning.stages == 8
        or _gemm_sm90.GemmTuning(tuning.bm, tuning.stages + 1, tuning.blocks).smem_bytes(INT4) > budget
    )


def test_measured_choices_are_near_the_fastest():
    """Over every measured point of the sweep, the heuristic's tile runs within 5% of the fastest one tried
    (the sweep ran each tile with as many stages as fit)."""
    rows = json.loads(MEASURED.read_text())["rows"]
    best: dict = {}
    for r in rows:
        if r["kernel"] != "gemm_sm90" or "graph_us" not in r:
            continue
        point, tile = (r["case"], r["n"], r["k"], r["m"]), (r["tuning"]["bm"], r["tuning"]["blocks"])
        times = best.setdefault(point, {})
        times[tile] = min(times.get(tile, float("inf")), r["graph_us"])
    assert len(best) > 100
    for (case, n, k, m), times in best.items():
        chosen = _gemm_sm90.default_gemm_tuning(m, n, WeightLayout(8 if "int8" in case else 4, 8, "bf16"), H200)
        tile = (chosen.bm, chosen.blocks)
        assert tile in times, (case, n, k, m, tile)
        assert times[tile] <= 1.05 * min(times.values()), (case, n, k, m, tile, times)
