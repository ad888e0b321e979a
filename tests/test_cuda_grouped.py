"""The grouped (MoE) variant of the Hopper GEMM: expert-stacked fragment layout (CPU, bit-exact) and
results against a float64 reference built per expert from ``humming.dequantize`` (GPU, sm_90)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import (
    assert_gather_matches_copy,
    assert_rel_close,
    grouped_reference,
    grouped_route,
    needs_sm90,
    with_sm_count,
)

import humming
from humming.bench.inputs import random_experts
from humming.cuda_kernels import _gemm_sm90
from humming.cuda_kernels import _wna16 as cuda_kernels_wna16
from humming.cuda_kernels import grouped as cuda_grouped
from humming.cuda_kernels._layout import GATED_ACTS, prepare_weight
from humming.moe import expert_weight
from humming.reference import moe_layer

LAYOUT_CASES = {
    "int4-g128": dict(weight="int4", group_size=128),
    "uint4-g64-zp": dict(weight="uint4", group_size=64, zero_point=True),
    "int8-channel": dict(weight="int8", group_size=-1, scale_dtype=torch.bfloat16),
    "int4-e4m3-global": dict(weight="int4", group_size=128, scale_dtype=torch.float8_e4m3fn, global_scale=True),
    "uint8-tensor": dict(weight="uint8", group_size="tensor"),
}


@pytest.mark.parametrize("n", [256, 144])  # tile groups of 8 (128-row blocks) and of 1
@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_stacked_layout_is_the_dense_layout_of_each_expert(case, n, seed):
    qw = humming.quantize(torch.randn(3, n, 192), **LAYOUT_CASES[case])
    prep = prepare_weight(qw)
    assert prep.num_experts == 3 and prep.n == n
    for e in range(3):
        dense = prepare_weight(expert_weight(qw, e))
        assert dense.layout == prep.layout and dense.groups == prep.groups and dense.tile_group == prep.tile_group
        for name in ("qweight", "scales", "zeros"):
            stacked, one = getattr(prep, name), getattr(dense, name)
            if one is None:
                assert stacked is None
                continue
            assert stacked.shape[0] == 3 * one.shape[0] and stacked.shape[1:] == one.shape[1:], name
            assert torch.equal(stacked.chunk(3)[e], one), f"{name} of expert {e}"


def test_the_gemm_takes_ragged_rows_and_groups_of_32_but_the_gated_epilogue_needs_whole_blocks():
    """N % 128 != 0 (16-row tiles, each expert's last 128-row block partly filled) and groups of 32 (two
    16-bit scales per row and chunk) run the sm_90a GEMM; the gated epilogue's gate-up blocks of 128 rows
    need 2I % 128 == 0."""
    x = torch.empty(128, 256, dtype=torch.bfloat16)
    ragged = humming.quantize(torch.randn(4, 144, 256), weight="int4", group_size=128)
    g32 = humming.quantize(torch.randn(4, 128, 256, dtype=torch.bfloat16), weight="int4", group_size=32)
    for qw in (ragged, g32, humming.quantize(torch.randn(4, 144, 256), weight="mxfp4")):
        assert _gemm_sm90.grouped_unsupported(qw, x, 64, (9, 0)) is None, qw.describe()
    assert prepare_weight(ragged).tile_group == 1 and prepare_weight(g32).layout.scale == "bf16_halves"
    silu = moe_layer.check_activation("silu", None, None, "concat")
    assert "2I % 128 == 0" in cuda_grouped.gated_unsupported(ragged, silu)
    assert cuda_grouped.gated_unsupported(g32, silu) is None


@pytest.mark.parametrize("qargs", [LAYOUT_CASES["uint4-g64-zp"], LAYOUT_CASES["int8-channel"], dict(weight="mxfp4")])
def test_prepare_unpacks_a_bounded_number_of_rows_at_a_time(qargs, monkeypatch, seed):
    """A DeepSeek-size MoE layer must prepare in little more memory than its result: the re-tiling unpacks
    about _CODES_PER_STEP codes (whole tile blocks) at a time, never the whole [E, N, K] weight."""
    import humming.ir
    from humming.cuda_kernels import _layout

    monkeypatch.setattr(_layout, "_CODES_PER_STEP", 256 * 128)  # K = 128: 256 rows
    seen = []
    unpack = humming.ir.unpack_codes
    monkeypatch.setattr(humming.ir, "unpack_codes", lambda w, b, k: seen.append(w.shape[0]) or unpack(w, b, k))
    qw = humming.quantize(torch.randn(5, 384, 128), **qargs)
    prep = prepare_weight(qw)
    assert seen and max(seen) <= 256 and sum(seen) == 5 * 384, seen
    monkeypatch.setattr(_layout, "_CODES_PER_STEP", 1 << 30)  # one step: the same result
    whole = prepare_weight(qw)
    assert torch.equal(prep.qweight, whole.qweight) and torch.equal(prep.scales, whole.scales)


@pytest.mark.parametrize(
    ("qargs", "match"),
    [
        (dict(weight="nvfp4"), "as MXFP4"),
        (dict(weight="e4m3", group_size=-1), "int4/uint4/int8/uint8/MXFP4 weights, not e4m3"),
        (dict(weight="int4", group_size=96), "64 times a power of two"),
        (dict(weight="fp8_block"), "int4/uint4/int8/uint8/MXFP4"),
    ],
)
def test_prepare_refuses_what_the_layout_cannot_hold(qargs, match):
    """Repacking a weight the fragment layout cannot hold is a ValueError naming qweight and why, not an error
    from deep inside the re-tiling."""
    qw = humming.quantize(torch.randn(256, 384), **qargs)
    with pytest.raises(ValueError, match=rf"qweight: .*{match}"):
        humming.prepare(qw, backend="cuda")


def test_grouped_unsupported_says_why_not():
    qw = humming.quantize(torch.randn(2, 256, 128), weight="int4", group_size=128)
    x = torch.randn(32, 128, dtype=torch.bfloat16)
    assert "not a CUDA device" in cuda_grouped.grouped_unsupported(qw, None, x, 32)
    # act schemes go to the grouped FP8 GEMM, which refuses per-tensor activation scales
    tensor = humming.ir.activation.get_act_scheme("fp8_tensor")
    assert "padding rows and skipped blocks" in cuda_grouped.grouped_unsupported(qw, tensor, x, 32)
    with pytest.raises(ValueError, match="not a CUDA device"):
        cuda_grouped.grouped_linear(x, qw, torch.zeros(1, dtype=torch.int32), 32, None, None, torch.bfloat16)


def test_tuning_checks():
    with pytest.raises(ValueError, match="tuning"):
        _gemm_sm90.GemmTuning(128, 6, 2)  # two blocks per SM only for tiles of <= 64 tokens
    for bm in (40, 272):  # token tiles: multiples of 16 up to 256
        with pytest.raises(ValueError, match="tuning"):
            _gemm_sm90.GemmTuning(bm, 4)
    qw = humming.quantize(torch.randn(2, 128, 128), weight="int4", group_size=128)
    x, ids = torch.randn(32, 128, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="must divide block_m"):
        _gemm_sm90.run_grouped_gemm(prepare_weight(qw), x, ids, 16, None, x.dtype, _gemm_sm90.GemmTuning(32, 4))


SCHEMES = {
    "int4-g128": dict(weight="int4", group_size=128),
    "uint4-g128-zp": dict(weight="uint4", group_size=128, zero_point=True),
    "int8-channel": dict(weight="int8", group_size=-1),
    "mxfp4": dict(weight="mxfp4"),
    "int4-g32": dict(weight="int4", group_size=32),
}
CASES = [
    # (E, N, K, scheme, block_m, max rows per expert, token tiles): real MoE shapes; rows 0..max
    pytest.param(64, 2816, 2048, "int4-g128", 16, 12, (None,), marks=pytest.mark.heavy_memory),
    (64, 1536, 2048, "uint4-g128-zp", 32, 40, (None, 16)),
    # DeepSeek-V3-sized experts: with their float64 reference, a heavy test's memory
    pytest.param(8, 4096, 7168, "int4-g128", 64, 300, (None, 32), marks=pytest.mark.heavy_memory),
    (8, 2816, 2048, "int8-channel", 128, 300, (None, 64)),
    (8, 1536, 2048, "uint4-g128-zp", 256, 300, (None, 128)),
    (4, 5760, 2880, "mxfp4", 16, 12, (None,)),  # gpt-oss-120b's up projection: bf16 activations only
    (8, 1536, 2048, "mxfp4", 64, 300, (None, 32)),
    # N % 128 != 0: each expert's last 128-row block partly filled (gpt-oss-120b's w2, N = 2880; 592 = 4.6 x 128)
    (8, 2880, 2880, "mxfp4", 64, 300, (None, 32)),
    (8, 592, 1024, "uint4-g128-zp", 32, 100, (None, 16)),
    (8, 1024, 2048, "int4-g32", 64, 300, (None, 32)),  # Kimi-K2's experts: groups of 32
    # routing blocks sized to the tokens per expert: token tiles of several wgmma widths (128 + 16, 32 + 16)
    (8, 1536, 2048, "int4-g128", 144, 300, (None, 48)),
    (8, 1536, 2048, "mxfp4", 176, 400, (None, 176)),
]


@needs_sm90
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("e", "n", "k", "scheme", "block_m", "max_rows", "bms"), CASES)
@pytest.mark.usefixtures("seed")
def test_grouped_matchesgrouped_reference(e, n, k, scheme, block_m, max_rows, bms, act, monkeypatch):
    with_sm_count(monkeypatch, _gemm_sm90, 3)  # the persistent grid: 6 blocks walk every segment's tiles
    scale_dtype = {} if scheme == "mxfp4" else dict(scale_dtype=act)
    qw = humming.quantize(torch.randn(e, n, k, device="cuda") * 0.05, **scale_dtype, **SCHEMES[scheme])
    if scheme == "mxfp4" and act == torch.float16:
        x = torch.randn(block_m, k, device="cuda", dtype=act)
        assert "bfloat16 activations" in cuda_grouped.grouped_unsupported(qw, None, x, block_m)
        return
    prep = prepare_weight(qw)
    counts = torch.randint(1, max_rows + 1, (e,)).tolist()
    for i in torch.randperm(e)[: max(1, e // 4)].tolist():  # a quarter of the experts get no rows
        counts[i] = 0
    expert_ids, m_pad = grouped_route(counts, block_m, "cuda")
    x = torch.randn(m_pad, k, device="cuda", dtype=act)
    bias = torch.randn(e, n, device="cuda", dtype=act)
    row_expert = expert_ids.repeat_interleave(block_m)
    ref = grouped_reference(x, qw, row_expert, act)
    used = row_expert >= 0
    tunings = [None if bm is None else _gemm_sm90.GemmTuning(bm, 8) for bm in bms]
    tunings.append(_gemm_sm90.GemmTuning(16, 8, 2, persistent=True))  # blocks walking the segments' tiles
    for b in (None, bias):
        for tuning in tunings:
            out = torch.full((m_pad, n), float("nan"), device="cuda", dtype=act)
            _gemm_sm90.run_grouped_gemm(prep, x, expert_ids, block_m, b, act, tuning, out=out)
            want = ref if b is None else ref + b.double()[row_expert.clamp(min=0)]
            assert_rel_close(out[used], want[used], torch.finfo(act).eps, precision=torch.float64)
            assert out[~used].isnan().all(), "a row of a skipped (-1) segment was written"


@needs_sm90
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize(
    ("block_m", "bm", "blocks"),
    [(16, 16, 2), (64, 32, 2), (64, 64, 2), (128, 128, 1), (256, 256, 1), (144, 144, 1), (96, 48, 2)],
)
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.usefixtures("seed")
def test_gather_reads_the_tokens_in_place(scheme, block_m, bm, blocks, persistent, act, monkeypatch):
    """Grouped row r read as token rows[r] of x [T, K] (zeros for padding, -1) gives bit for bit what the
    grouped rows copied beforehand give to the one-tile-per-block grid (the same kernel math in the same
    order), and matches float64: every token tile and blocks-per-SM choice, gathered by one-tile blocks and
    by a persistent grid, x rows strided (a column slice of a wider tensor), repeated tokens (top-2), bias."""
    if scheme == "mxfp4" and act == torch.float16:
        pytest.skip("MXFP4 runs the sm_90a GEMM with bf16 activations only (test_grouped_matches_reference)")
    _check_gather(scheme, block_m, bm, blocks, persistent, act, monkeypatch)


@needs_sm90
@pytest.mark.parametrize("scheme", ["int4-g128", "mxfp4"])
@pytest.mark.parametrize(("block_m", "bm", "blocks"), [(64, 64, 2), (128, 128, 1)])
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("arrive_lag", ["one", "most"])
@pytest.mark.usefixtures("seed")
def test_gather_with_the_producer_fencing_its_rows(scheme, block_m, bm, blocks, persistent, arrive_lag, monkeypatch):
    """The arrival-lag variant (the producer waits for an earlier step's row copies, fences them and
    arrives) computes bit for bit what the copied grouped rows give: a lag of one step and the most the
    stages allow (stages - 2; one more deadlocks, GemmTuning refuses it)."""
    _check_gather(scheme, block_m, bm, blocks, persistent, torch.bfloat16, monkeypatch, arrive_lag)


@needs_sm90
@pytest.mark.parametrize("scheme", ["uint4-g128-zp", "mxfp4"])
@pytest.mark.parametrize(("block_m", "bm", "blocks"), [(16, 16, 2), (128, 128, 1)])
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.usefixtures("seed")
def test_gather_with_experts_of_n_not_a_multiple_of_128(scheme, block_m, bm, blocks, persistent, monkeypatch):
    """N = 208: each expert's second 128-row block holds 5 of its 8 16-row tiles, copied tile by tile."""
    _check_gather(scheme, block_m, bm, blocks, persistent, torch.bfloat16, monkeypatch, n=208)


def _check_gather(scheme, block_m, bm, blocks, persistent, act, monkeypatch, arrive_lag=0, n=256):
    e, k, t, topk = 8, 512, 37, 2
    scale_dtype = {} if scheme == "mxfp4" else dict(scale_dtype=act)
    qw = humming.quantize(torch.randn(e, n, k, device="cuda") * 0.05, **scale_dtype, **SCHEMES[scheme])
    prep = prepare_weight(qw)
    x = torch.randn(t, k + 64, device="cuda", dtype=act)[:, :k]
    routing = humming.moe.moe_align(torch.randint(0, e, (t, topk), device="cuda"), e, block_m)
    rows, expert_ids = routing.token_rows(topk), routing.expert_ids
    bias = torch.randn(e, n, device="cuda", dtype=act)
    tuning = _gemm_sm90.GemmTuning(bm, 8 if bm <= 64 else 4, blocks)
    arrive_lag = {"one": 1, "most": tuning.stages - 2}.get(arrive_lag, arrive_lag)
    copied = torch.full((rows.shape[0], n), float("nan"), device="cuda", dtype=act)
    gathered = copied.clone()
    grouped = torch.where(rows[:, None] >= 0, x[rows.clamp(min=0).long()], 0)
    _gemm_sm90.run_grouped_gemm(prep, grouped, expert_ids, block_m, bias, act, tuning, out=copied)
    tuning = dataclasses.replace(tuning, persistent=persistent, arrive_lag=arrive_lag)
    with_sm_count(monkeypatch, _gemm_sm90, 1)  # persistent: one or two blocks walk every tile
    _gemm_sm90.run_grouped_gemm(prep, x, expert_ids, block_m, bias, act, tuning, out=gathered, rows=rows)
    assert_gather_matches_copy(gathered, copied, grouped, qw, expert_ids, block_m, rows, bias, act)


@needs_sm90
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scheme", ["int4-g128", "uint4-g128-zp", "mxfp4"])
@pytest.mark.parametrize("activation", list(GATED_ACTS))
@pytest.mark.parametrize("layout", ["concat", "interleaved"])
@pytest.mark.usefixtures("seed")
def test_gated_epilogue_is_the_activation_of_the_gemm(scheme, activation, layout, act, monkeypatch):
    """w13 with the activation in its epilogue (rows reordered to gate-up tiles) against the unfused GEMM's
    output activated by the reference (each gate and up rounded to the output dtype, the activation in
    fp32): within one rounding of the output; bias, the gather, persistent blocks walking many tiles,
    unused segments left unwritten."""
    if scheme == "mxfp4" and act == torch.float16:
        pytest.skip("MXFP4 runs the sm_90a GEMM with bf16 activations only")
    e, two_i, k, t, topk, block_m = 8, 384, 512, 37, 2, 16
    scale_dtype = {} if scheme == "mxfp4" else dict(scale_dtype=act)
    qw = humming.quantize(torch.randn(e, two_i, k, device="cuda") * 0.05, **scale_dtype, **SCHEMES[scheme])
    x = torch.randn(t, k, device="cuda", dtype=act)
    routing = humming.moe.moe_align(torch.randint(0, e, (t, topk), device="cuda"), e, block_m)
    rows, ids = routing.token_rows(topk), routing.expert_ids
    bias = torch.randn(e, two_i, device="cuda", dtype=act)
    gated = moe_layer.check_activation(activation, None, None, layout)
    with_sm_count(monkeypatch, _gemm_sm90, 1)  # one or two blocks walk every tile
    h = cuda_grouped.grouped_linear(x, qw, ids, block_m, bias, None, act, rows)
    out = torch.full((rows.shape[0], two_i // 2), float("nan"), device="cuda", dtype=act)
    prep = cuda_kernels_wna16.prepare_gate_up(qw, layout)
    tuning = _gemm_sm90.GemmTuning(16, 8, 2, persistent=True)
    _gemm_sm90.run_grouped_gemm(prep, x, ids, block_m, bias, act, tuning, out=out, rows=rows, gated=gated)
    used = ids.repeat_interleave(block_m) >= 0
    want = moe_layer.activate(h[used], gated, torch.float64)
    assert_rel_close(out[used], want, torch.finfo(act).eps, precision=torch.float64)
    assert out[~used].isnan().all(), "a row of a skipped (-1) segment was written"
    # through grouped_linear, with the default tuning
    again = cuda_grouped.grouped_linear(x, qw, ids, block_m, bias, None, act, rows, gated=gated)
    assert torch.equal(again[used], out[used])


@needs_sm90
def test_grouped_linear_after_warmup_in_a_cuda_graph(seed):
    qw = humming.quantize(torch.randn(8, 256, 512, device="cuda"), weight="int4", group_size=128)
    expert_ids, m_pad = grouped_route([5, 0, 17, 3, 0, 0, 40, 1], 64, "cuda")  # 64: the sm_90a GEMM's blocks
    report = humming.warmup([qw], m_values=(m_pad,), block_ms=(64,), progress=False)
    assert sorted(k.spec.name.split("_")[3:5] for k in report.kernels) == [["grouped", "gather"], ["grouped", "u4z8"]]
    x = torch.randn(m_pad, 512, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = cuda_grouped.grouped_linear(x, qw, expert_ids, 64, None, None, torch.bfloat16)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    row_expert = expert_ids.repeat_interleave(64)
    used = row_expert >= 0
    assert_rel_close(
        out[used],
        grouped_reference(x, qw, row_expert, torch.bfloat16)[used],
        torch.finfo(torch.bfloat16).eps,
        precision=torch.float64,
    )


@needs_sm90
def test_through_humming_moe(seed):
    moe = pytest.importorskip("humming.moe", reason="humming.moe (the MoE entry points) is not in this tree")
    qw = humming.quantize(torch.randn(4, 384, 256, device="cuda"), weight="uint4", group_size=64, zero_point=True)
    expert_ids, m_pad = grouped_route([0, 30, 2, 9], 32, "cuda")
    x = torch.randn(m_pad, 256, device="cuda", dtype=torch.float16)
    bias = torch.randn(4, 384, device="cuda", dtype=torch.float16)
    out = moe.grouped_linear(x, qw, expert_ids, 32, bias, backend="cuda")
    row_expert = expert_ids.repeat_interleave(32)
    used = row_expert >= 0
    ref = grouped_reference(x, qw, row_expert, torch.float16) + bias.double()[row_expert.clamp(min=0)]
    assert_rel_close(out[used], ref[used], torch.finfo(torch.float16).eps, precision=torch.float64)


#: DeepSeek-V3's MoE layer: w13 (gate and up of 256 experts, 4096 x 7168) and w2 (256 x 7168 x 2048)
DEEPSEEK_V3 = {"w13": (256, 4096, 7168), "w2": (256, 7168, 2048)}


@pytest.mark.gpu
@pytest.mark.big_memory
@pytest.mark.parametrize("fmt, act", [("int4", None), ("e4m3", "fp8_g128")], ids=["int4-g128", "fp8-block"])
@pytest.mark.parametrize("proj", list(DEEPSEEK_V3))
def test_deepseek_v3_layer_prepares_in_bounded_memory_and_time(fmt, act, proj):
    """Each weight of a DeepSeek-V3 MoE layer (int4 g128: 3.8 GB for w13; FP8 block: 7.5 GB) re-tiles for
    its CUDA kernel with at most 10% of the weight's bytes of memory beyond the result, in under 2 s."""
    import time

    qw = random_experts(fmt, *DEEPSEEK_V3[proj])
    humming.prepare(random_experts(fmt, 2, 256, 256), act=act)  # first-use costs (packer kernels) untimed
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    prep = humming.prepare(qw, act=act)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    extra = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()  # the result stays allocated
    assert prep is not None and torch.cuda.memory_allocated() > base
    assert extra <= 0.10 * qw.nbytes, f"{extra / 2**20:.0f} MiB extra for a {qw.nbytes / 2**20:.0f} MiB weight"
    assert seconds < 2.0, f"{seconds:.2f} s"


@pytest.mark.parametrize(
    "qargs",
    [dict(weight="e4m3", group_size=-1), dict(weight="fp8_block"), dict(weight="int4", group_size=128)],
    ids=lambda q: q["weight"],
)
def test_stacked_prepare_is_each_expert_prepared_in_its_slice(qargs, seed):
    """The expert-stacked FP8 layout is built one expert at a time into its slice (no second copy of the layer):
    the same bytes as each expert prepared alone, concatenated along N (CPU)."""
    from humming.cuda_kernels import fp8_gemm
    from humming.cuda_kernels._fp8_layout import _prepare_2d
    from humming.ir.weight import expert_weight

    qw = humming.quantize(torch.randn(3, 256, 384), **qargs)
    stacked = fp8_gemm.prepare(qw)
    parts = [_prepare_2d(expert_weight(qw, e)) for e in range(3)]
    assert stacked.num_experts == 3
    for name, dim in (("weight", 0), ("w_scale", 0), ("w_block_scale", 0), ("w_group_scale", 1)):
        expected = None if getattr(parts[0], name) is None else torch.cat([getattr(p, name) for p in parts], dim)
        got = getattr(stacked, name)
        assert (got is None) == (expected is None), name
        assert got is None or torch.equal(got, expected), name
