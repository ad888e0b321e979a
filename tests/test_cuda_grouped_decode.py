"""``cuda.grouped_decode``, the decode kernel's grouped (MoE) variant: its grid bound and checks (CPU), and
results against a float64 reference built per expert from ``humming.dequantize`` (GPU, sm_80+): grouped and
gathered rows, every routing block it takes, grids smaller than the used segments, the gated epilogue."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_gather_matches_copy, assert_rel_close, grouped_reference, grouped_route

import humming
from humming.cuda_kernels import _wna16, grouped_decode
from humming.cuda_kernels import grouped as cuda_grouped
from humming.cuda_kernels._decode_launch import DECODE_CCS
from humming.cuda_kernels._layout import GATED_ACTS
from humming.dispatch.kernels import GROUPED_KERNELS
from humming.dispatch.plan import plan_grouped
from humming.reference import moe_layer
from humming.reference.align import align

HAS_DECODE = torch.cuda.is_available() and torch.cuda.get_device_capability() in DECODE_CCS


def needs_decode_gpu(test):
    test = pytest.mark.gpu(test)
    return pytest.mark.skipif(torch.cuda.is_available() and not HAS_DECODE, reason="needs an sm_80+ GPU")(test)


SCHEMES = {
    "int4-g128": dict(weight="int4", group_size=128),
    "int4-g32": dict(weight="int4", group_size=32),  # Kimi-K2's experts: two 16-bit scales per chunk
    "uint4-g64-zp": dict(weight="uint4", group_size=64, zero_point=True),
    "int8-channel": dict(weight="int8", group_size=-1),
    "int4-e4m3-global": dict(weight="int4", group_size=128, scale_dtype=torch.float8_e4m3fn, global_scale=True),
    "mxfp4": dict(weight="mxfp4"),
}


@pytest.mark.parametrize("block_m", grouped_decode.BLOCK_MS)
@pytest.mark.parametrize(("tokens", "topk", "experts"), [(1, 8, 256), (7, 8, 256), (64, 4, 128), (300, 8, 64)])
def test_segment_grid_covers_every_used_segment_of_a_routing(tokens, topk, experts, block_m):
    """The grid's segments bound the segments moe_align uses, for skewed and uniform routings alike (the
    kernel stays exact past the bound, it only loops)."""
    gen = torch.Generator().manual_seed(tokens)
    for skew in (False, True):
        if skew:  # every slot on the first experts
            ids = torch.arange(tokens * topk).reshape(tokens, topk) % topk
        else:
            ids = torch.rand(tokens, experts, generator=gen).topk(topk).indices
        src_slots, expert_ids, _, _ = align(ids, experts, block_m)
        used = int((expert_ids >= 0).sum())
        grid = grouped_decode.segment_grid(src_slots.shape[0], block_m, experts)
        assert used <= grid <= expert_ids.shape[0], (used, grid)


def test_unsupported_says_why_not():
    qw = humming.quantize(torch.randn(2, 256, 128), weight="int4", group_size=128)
    x = torch.randn(16, 128, dtype=torch.bfloat16)
    assert "not a CUDA device" in grouped_decode.unsupported(qw, None, x, 16)
    fp8 = humming.ir.activation.get_act_scheme("fp8")
    assert "16-bit activations" in grouped_decode.unsupported(qw, fp8, x, 16)
    dense = humming.quantize(torch.randn(256, 128), weight="int4", group_size=128)
    assert "expert-stacked" in grouped_decode.unsupported(dense, None, x, 16)
    with pytest.raises(ValueError, match="not a CUDA device"):
        grouped_decode.grouped_linear(x, qw, torch.zeros(1, dtype=torch.int32), 16, None, torch.bfloat16)
    w13 = humming.quantize(torch.randn(2, 2 * 2880, 128), weight="mxfp4")
    silu = moe_layer.check_activation("silu", None, None, "concat")
    assert grouped_decode.gated_decode_unsupported(w13, silu) is None
    odd = humming.quantize(torch.randn(2, 2 * 72, 128), weight="int4", group_size=128)
    assert "2I % 128" in grouped_decode.gated_decode_unsupported(odd, silu)


def _experts(scheme: str, e: int, n: int, k: int, act: torch.dtype):
    scale = {} if scheme == "mxfp4" or "scale_dtype" in SCHEMES[scheme] else dict(scale_dtype=act)
    return humming.quantize(torch.randn(e, n, k, device="cuda") * 0.05, **scale, **SCHEMES[scheme])


CASES = [
    # (E, N, K, scheme, block_m, max rows per expert): real MoE decode shapes, rows 0..max per expert
    (32, 512, 7168, "int4-g128", 16, 3),  # DeepSeek-V3 w13's K, few experts used
    (32, 512, 7168, "int4-g32", 8, 3),  # Kimi-K2's w13
    (16, 1536, 2048, "uint4-g64-zp", 16, 16),  # Qwen3-30B-A3B w13
    (16, 2048, 768, "int8-channel", 8, 9),  # Qwen3-30B-A3B w2 (K = 12 chunks: 4 warps)
    (8, 256, 1024, "int4-e4m3-global", 16, 40),
    (4, 2880, 2880, "mxfp4", 16, 12),  # gpt-oss-120b's w2: N % 128 != 0 (tile groups of one)
    (4, 5760, 2880, "mxfp4", 8, 5),  # gpt-oss-120b's w13
]


@needs_decode_gpu
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("e", "n", "k", "scheme", "block_m", "max_rows"), CASES)
@pytest.mark.usefixtures("seed")
def test_grouped_rows_matchgrouped_reference(e, n, k, scheme, block_m, max_rows, act, monkeypatch):
    """Grouped rows ``x [M_pad, K]`` against float64, with and without bias; rows of -1 segments stay
    unwritten; a grid of fewer segments than are used (blocks looping over theirs) gives the same bits."""
    qw = _experts(scheme, e, n, k, act)
    counts = torch.randint(1, max_rows + 1, (e,)).tolist()
    for i in torch.randperm(e)[: max(1, e // 4)].tolist():  # a quarter of the experts get no rows
        counts[i] = 0
    expert_ids, m_pad = grouped_route(counts, block_m, "cuda")
    x = torch.randn(m_pad, k, device="cuda", dtype=act)
    bias = torch.randn(e, n, device="cuda", dtype=act)
    row_expert = expert_ids.repeat_interleave(block_m)
    used = row_expert >= 0
    ref = grouped_reference(x, qw, row_expert, act)
    for b in (None, bias):
        out = torch.full((m_pad, n), float("nan"), device="cuda", dtype=act)
        grouped_decode.grouped_linear(x, qw, expert_ids, block_m, b, act, out=out)
        want = ref if b is None else ref + b.double()[row_expert.clamp(min=0)]
        assert_rel_close(out[used], want[used], torch.finfo(act).eps, precision=torch.float64)
        assert out[~used].isnan().all(), "a row of a skipped (-1) segment was written"
    monkeypatch.setattr(grouped_decode, "segment_grid", lambda *args: 3)
    looped = torch.full((m_pad, n), float("nan"), device="cuda", dtype=act)
    grouped_decode.GroupedDecodeLaunch(_wna16.prepare(qw), m_pad, act, k, act, act, None, 0, block_m, False)(
        x, bias, expert_ids, None, looped
    )
    assert torch.equal(looped[used], out[used]) and looped[~used].isnan().all()


@needs_decode_gpu
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("block_m", grouped_decode.BLOCK_MS)
@pytest.mark.usefixtures("seed")
def test_gather_reads_the_tokens_in_place(scheme, block_m, act):
    """Grouped row r read as token rows[r] of x [T, K] (zeros for padding rows) gives bit for bit what the
    rows copied into grouped order give (the same math in the same order), and matches float64: x rows
    strided (a column slice of a wider tensor), repeated tokens (top-2), bias, moe_align's routing."""
    e, n, k, t, topk = 8, 256, 512, 37, 2
    qw = _experts(scheme, e, n, k, act)
    x = torch.randn(t, k + 64, device="cuda", dtype=act)[:, :k]
    routing = humming.moe.moe_align(torch.randint(0, e, (t, topk), device="cuda"), e, block_m)
    rows, expert_ids = routing.token_rows(topk), routing.expert_ids
    bias = torch.randn(e, n, device="cuda", dtype=act)
    grouped = torch.where(rows[:, None] >= 0, x[rows.clamp(min=0).long()], 0)
    copied = torch.full((rows.shape[0], n), float("nan"), device="cuda", dtype=act)
    gathered = copied.clone()
    grouped_decode.grouped_linear(grouped, qw, expert_ids, block_m, bias, act, out=copied)
    grouped_decode.grouped_linear(x, qw, expert_ids, block_m, bias, act, rows, out=gathered)
    assert_gather_matches_copy(gathered, copied, grouped, qw, expert_ids, block_m, rows, bias, act)


@needs_decode_gpu
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scheme", ["int4-g128", "uint4-g64-zp", "mxfp4"])
@pytest.mark.parametrize("activation", list(GATED_ACTS))
@pytest.mark.parametrize("layout", ["concat", "interleaved"])
@pytest.mark.usefixtures("seed")
def test_gated_epilogue_is_the_activation_of_the_gemm(scheme, activation, layout, act):
    """w13 with the activation in its epilogue (rows reordered to gate-up tiles) against the unfused
    kernel's output activated by the reference (each gate and up rounded to the output dtype, the
    activation in fp32): within one rounding of the output; bias, the gather, unused segments unwritten."""
    e, two_i, k, t, topk, block_m = 8, 384, 512, 37, 2, 16
    qw = _experts(scheme, e, two_i, k, act)
    x = torch.randn(t, k, device="cuda", dtype=act)
    routing = humming.moe.moe_align(torch.randint(0, e, (t, topk), device="cuda"), e, block_m)
    rows, ids = routing.token_rows(topk), routing.expert_ids
    bias = torch.randn(e, two_i, device="cuda", dtype=act)
    gated = moe_layer.check_activation(activation, None, None, layout)
    h = grouped_decode.grouped_linear(x, qw, ids, block_m, bias, act, rows)
    out = torch.full((rows.shape[0], two_i // 2), float("nan"), device="cuda", dtype=act)
    grouped_decode.grouped_linear(x, qw, ids, block_m, bias, act, rows, gated, out=out)
    used = ids.repeat_interleave(block_m) >= 0
    want = moe_layer.activate(h[used], gated, torch.float64)
    assert_rel_close(out[used], want, torch.finfo(act).eps, precision=torch.float64)
    assert out[~used].isnan().all(), "a row of a skipped (-1) segment was written"


@needs_decode_gpu
@pytest.mark.usefixtures("seed")
def test_agrees_with_the_sm90_grouped_gemm_and_is_planned_for_decode():
    """The dispatcher plans this kernel for routing blocks of 16 (decode) and the sm_90a GEMM for 64;
    both give the same rows within one bf16 rounding (different summation orders)."""
    e, n, k, t, topk = 16, 512, 1024, 5, 4
    qw = _experts("int4-g128", e, n, k, torch.bfloat16)
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
    routing = humming.moe.moe_align(torch.randint(0, e, (t, topk), device="cuda"), e, 16)
    rows, ids = routing.token_rows(topk), routing.expert_ids
    assert plan_grouped(qw, None, x, 16, "auto", rows.shape[0]).kernel == "cuda.grouped_decode"
    out = humming.moe.grouped_linear(x, qw, ids, 16, rows=rows)
    if torch.cuda.get_device_capability() == (9, 0):
        assert plan_grouped(qw, None, x, 64, "auto", 256).kernel == "cuda.grouped"
        sm90 = cuda_grouped.grouped_linear(x, qw, ids, 16, None, None, torch.bfloat16, rows)
        used = (ids.repeat_interleave(16) >= 0) & (rows >= 0)
        assert_rel_close(out[used], sm90[used].double(), 1e-2, precision=torch.float64)


@needs_decode_gpu
@pytest.mark.parametrize("kernel", ["cuda.grouped_decode", "cuda.grouped"])
def test_gather_without_tokens_reads_zeros(kernel, seed):
    """T = 0 tokens (every grouped row padding), both CUDA grouped kernels: the bias of each used segment's
    expert, no read of x."""
    if kernel == "cuda.grouped" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a grouped GEMM needs an sm_90 GPU")
    qw = humming.quantize(torch.randn(2, 128, 256, device="cuda"), weight="int4", group_size=128)
    rows = torch.full((32,), -1, dtype=torch.int32, device="cuda")
    expert_ids = torch.tensor([1, -1], dtype=torch.int32, device="cuda")
    bias = torch.randn(2, 128, device="cuda", dtype=torch.bfloat16)
    x = torch.empty(0, 256, device="cuda", dtype=torch.bfloat16)
    out = GROUPED_KERNELS[kernel].run(x, qw, expert_ids, 16, bias, None, torch.bfloat16, None, rows=rows)
    assert torch.equal(out[:16], bias[1].expand(16, -1))


@needs_decode_gpu
def test_after_warmup_in_a_cuda_graph(seed):
    qw = humming.quantize(torch.randn(8, 256, 512, device="cuda"), weight="int4", group_size=128)
    expert_ids, m_pad = grouped_route([5, 0, 17, 3, 0, 0, 11, 1], 16, "cuda")
    report = humming.warmup([qw], m_values=(m_pad,), block_ms=(16,), progress=False)
    assert [k.spec.name.endswith("_grouped") for k in report.kernels] == [True]
    x = torch.randn(m_pad, 512, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = humming.moe.grouped_linear(x, qw, expert_ids, 16)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    row_expert = expert_ids.repeat_interleave(16)
    used = row_expert >= 0
    ref = grouped_reference(x, qw, row_expert, torch.bfloat16)
    assert_rel_close(out[used], ref[used], torch.finfo(torch.bfloat16).eps, precision=torch.float64)
