"""The Hopper GEMM's tuning heuristic (CPU): a pure function of the problem and the device's limits, whose
choices on the H200 follow what bench/results/h200/tuning.json measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import humming
from humming.cuda_kernels import _gemm_sm90
from humming.cuda_kernels._layout import WeightLayout, prepare_weight
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
    tuning = _gemm_sm90.default_gemm_tuning(m, n, 8192, INT4, H200, max_splits=1)  # the tile model alone
    assert (tuning.bm, tuning.blocks) == tile
    budget = H200.smem_per_block // tuning.blocks - 1024 * (tuning.blocks - 1)
    assert tuning.smem_bytes(INT4) <= budget
    assert (
        tuning.stages == 8
        or _gemm_sm90.GemmTuning(tuning.bm, tuning.stages + 1, tuning.blocks).smem_bytes(INT4) > budget
    )


def test_measured_choices_are_near_the_fastest():
    """Over every measured point of the sweep, the heuristic's tile runs within 5% of the fastest one tried
    (the sweep ran each tile with as many stages as fit, without K splits)."""
    rows = json.loads(MEASURED.read_text())["rows"]
    best: dict = {}
    for r in rows:
        if r["kernel"] != "gemm_sm90" or "graph_us" not in r or r["tuning"].get("splits", 1) != 1:
            continue
        point, tile = (r["case"], r["n"], r["k"], r["m"]), (r["tuning"]["bm"], r["tuning"]["blocks"])
        times = best.setdefault(point, {})
        times[tile] = min(times.get(tile, float("inf")), r["graph_us"])
    assert len(best) > 100
    for (case, n, k, m), times in best.items():
        layout = WeightLayout(8 if "int8" in case else 4, 8, "bf16")
        chosen = _gemm_sm90.default_gemm_tuning(m, n, k, layout, H200, max_splits=1)
        tile = (chosen.bm, chosen.blocks)
        assert tile in times, (case, n, k, m, tile)
        assert times[tile] <= 1.05 * min(times.values()), (case, n, k, m, tile, times)


@pytest.mark.parametrize(
    ("m", "n", "k", "splits"),
    [
        (64, 28672, 8192, 1),  # 224 tiles already fill the 264 block slots
        (1024, 28672, 8192, 1),
        (64, 8192, 8192, 4),  # 64 tiles: K in 4 fills the block slots, 2,048 columns each
        (128, 8192, 8192, 2),  # 64 tiles of 128 tokens: one block per SM at half of K
        (256, 8192, 8192, 1),  # 128 tiles of 128 tokens: splitting 256-token tiles costs more in reduction
        (64, 2048, 7168, 7),  # 16 or 32 tiles: as many splits as keep 16 chunks each
        (64, 8192, 1024, 1),  # 16 chunks of K: nothing to split
    ],
)
def test_k_splits_fill_a_small_grid(m, n, k, splits):
    """Split-K where the tiles leave SMs idle, never more splits than leave 16 chunks each, and only where
    the modelled time with the reduction beats the best unsplit tile; a split grid stays within two rounds
    of the block slots."""
    tuning = _gemm_sm90.default_gemm_tuning(m, n, k, INT4, H200)
    assert tuning.splits == splits, tuning
    assert k // 64 // tuning.splits >= min(16, k // 64)
    if splits > 1:
        blocks = (n // 128) * -(-m // tuning.bm) * tuning.splits
        assert blocks <= 2 * H200.sm_count * tuning.blocks, tuning
        unsplit = _gemm_sm90.default_gemm_tuning(m, n, k, INT4, H200, max_splits=1)
        one = _gemm_sm90.gemm_time(m, n, k, unsplit.bm, unsplit.blocks, H200.sm_count)
        assert _gemm_sm90.gemm_time(m, n, k, tuning.bm, tuning.blocks, H200.sm_count, splits) < one


def test_split_model_matches_the_h200_split_runs():
    """The model's times of the split GEMMs the H200 ran (bench/results/h200/linear_splitk.json, W4A16 int4
    g128, 8192 x 8192, tiles as chosen there) within 10%."""
    measured = {(64, 64, 2, 4): 28.1, (128, 128, 1, 2): 43.0, (256, 256, 1, 2): 68.8}
    for (m, bm, blocks, splits), us in measured.items():
        modelled = _gemm_sm90.gemm_time(m, 8192, 8192, bm, blocks, H200.sm_count, splits)
        assert abs(modelled - us) <= 0.1 * us, (m, modelled, us)


def test_split_k_refuses_more_splits_than_chunks():
    qw = humming.quantize(torch.randn(256, 256), weight="int4", group_size=128)
    with pytest.raises(ValueError, match="splits=5 exceeds the 4 chunks"):
        _gemm_sm90.GemmLaunch(
            prepare_weight(qw), 64, torch.bfloat16, 256, None, torch.bfloat16, _gemm_sm90.GemmTuning(64, 4, 1, 5), 0
        )
