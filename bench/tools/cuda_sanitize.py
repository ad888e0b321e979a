"""One small run of each CUDA kernel family and variant, for compute-sanitizer (memcheck, racecheck).

Usage: compute-sanitizer --tool memcheck python bench/tools/cuda_sanitize.py
"""

from __future__ import annotations

import torch

import humming
from humming.cuda_kernels import _gemm_sm90, grouped_decode, wna16_decode
from humming.cuda_kernels import grouped as cuda_grouped
from humming.cuda_kernels._layout import prepare_weight


def main() -> None:
    torch.manual_seed(0)
    cases = [
        ("int4", 128, False, 5, 256, 512, None),  # one block per 16 rows, K split over warps
        ("uint4", 128, True, 16, 512, 1024, None),  # zero points, two token tiles, two row tiles
        ("int8", -1, False, 3, 48, 2048, wna16_decode.DecodeTuning(1, 1, 8, 3, 4)),  # split-K atomics
        ("int4", 64, False, 9, 256, 1024, wna16_decode.DecodeTuning(2, 4, 8, 3, 1)),  # four row tiles per warp
        ("int4", 128, False, 16, 512, 1024, wna16_decode.DecodeTuning(2, 1, 8, 3, 1, stream_k=2)),  # stream-K
    ]
    for weight, group, zp, m, n, k, tuning in cases:
        qw = humming.quantize(torch.randn(n, k, device="cuda"), weight=weight, group_size=group, zero_point=zp)
        prep = prepare_weight(qw)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda")
        out = wna16_decode.run_decode(prep, x, bias, torch.bfloat16, tuning)
        ref = x.float() @ humming.dequantize(qw).T + bias
        torch.cuda.synchronize()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        print(f"decode {weight} g{group} zp={zp} M={m} N={n} K={k}: rel err {err:.2e}")
    _grouped_decode()
    if torch.cuda.get_device_capability() == (9, 0):
        qw = humming.quantize(torch.randn(256, 512, device="cuda"), weight="uint4", group_size=128, zero_point=True)
        x = torch.randn(130, 512, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ humming.dequantize(qw).T
        T = _gemm_sm90.GemmTuning
        real_limits = _gemm_sm90.device_limits
        # K in 3 splits; a persistent grid of 2 blocks (as if the GPU had one SM) walking the 4 tiles
        for tuning in (T(128, 4), T(256, 3), T(64, 4, 2, 3), T(64, 4, 2, persistent=True)):
            if tuning.persistent:
                _gemm_sm90.device_limits = lambda device=None: real_limits(device)._replace(sm_count=1)
            out = _gemm_sm90.run_gemm(prepare_weight(qw), x, None, torch.bfloat16, tuning)
            _gemm_sm90.device_limits = real_limits
            torch.cuda.synchronize()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            print(f"gemm_sm90 uint4 g128 zp M=130 {tuning}: rel err {err:.2e}")
        mx = humming.quantize(torch.randn(256, 512, device="cuda"), weight="mxfp4")
        ref = x.float() @ humming.dequantize(mx).T
        out = _gemm_sm90.run_gemm(prepare_weight(mx), x, None, torch.bfloat16, _gemm_sm90.GemmTuning(64, 4, 2))
        torch.cuda.synchronize()
        print(f"gemm_sm90 mxfp4 M=130 bm=64 x2: rel err {((out.float() - ref).norm() / ref.norm()).item():.2e}")
        _grouped()


def _grouped_decode() -> None:
    """The decode kernel's grouped variant: routing blocks of 8 and 16, tokens gathered through the index
    (padding rows zero-filled), a grid of 2 segments looping over more used ones, the gated epilogue."""
    experts, n, k, t = 4, 256, 512, 9
    tokens = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
    topk = torch.randint(0, experts, (t, 2), device="cuda")
    for weight, group in (("uint4", 64), ("mxfp4", 32)):
        qw = humming.quantize(torch.randn(experts, n, k, device="cuda"), weight=weight, group_size=group)
        for block_m in (8, 16):
            routing = humming.moe.moe_align(topk, experts, block_m)
            rows, ids = routing.token_rows(2), routing.expert_ids
            out = grouped_decode.grouped_linear(tokens, qw, ids, block_m, None, torch.bfloat16, rows)
            real_grid = grouped_decode.segment_grid
            grouped_decode.segment_grid = lambda *args: 2
            looped = grouped_decode.GroupedDecodeLaunch(
                grouped_decode._prepared(qw, None),
                rows.shape[0],
                torch.bfloat16,
                k,
                None,
                torch.bfloat16,
                None,
                0,
                block_m,
                True,
            )(tokens, None, ids, rows)
            grouped_decode.segment_grid = real_grid
            ref = humming.moe.grouped_linear(tokens, qw, ids, block_m, rows=rows, backend="reference").float()
            torch.cuda.synchronize()
            used = (ids.repeat_interleave(block_m) >= 0) & (rows >= 0)
            err = ((out[used].float() - ref[used]).norm() / ref[used].norm()).item()
            same = torch.equal(out[used], looped[used])
            print(f"grouped decode {weight} block_m={block_m} gathered: rel err {err:.2e}, looped grid equal: {same}")
    w13 = humming.quantize(torch.randn(experts, 2 * n, k, device="cuda"), weight="mxfp4")
    w2 = humming.quantize(torch.randn(experts, k, n, device="cuda"), weight="mxfp4")
    weights = torch.rand(t, 2, device="cuda")
    out = humming.moe.fused_moe(tokens, w13, w2, weights, topk, activation="swiglu_oai", block_m=8)
    ref = humming.moe.fused_moe(tokens, w13, w2, weights, topk, activation="swiglu_oai", backend="reference")
    torch.cuda.synchronize()
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"fused_moe mxfp4 swiglu_oai block_m=8 (grouped decode, gated w13 epilogue): rel err {err:.2e}")


def _grouped() -> None:
    """The grouped sm_90a GEMM (16-bit activations) and the grouped FP8 GEMM, with an unused expert."""
    experts, n, k, block_m = 4, 256, 512, 16
    counts = [5, 0, 17, 3]
    blocks = [e for e, c in enumerate(counts) for _ in range(-(-c // block_m))]
    ids = torch.tensor(blocks, dtype=torch.int32, device="cuda")
    x = torch.randn(ids.numel() * block_m, k, device="cuda", dtype=torch.bfloat16)
    rows = ids.long().repeat_interleave(block_m)
    for weight, group, act in (("uint4", 128, None), ("mxfp4", 32, None), ("int4", 128, "fp8"), ("e4m3", -1, "fp8")):
        qw = humming.quantize(torch.randn(experts, n, k, device="cuda"), weight=weight, group_size=group)
        if act is None:  # the sm_90a GEMM (the dispatcher takes the grouped decode kernel for blocks of 16)
            out = cuda_grouped.grouped_linear(x, qw, ids, block_m, None, None, torch.bfloat16)
        else:
            out = humming.moe.grouped_linear(x, qw, ids, block_m, act=act, backend="cuda")
        ref = humming.moe.grouped_linear(x, qw, ids, block_m, act=act, backend="reference").float()
        torch.cuda.synchronize()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        print(f"grouped {weight} act={act} experts={experts} rows={rows.numel()}: rel err {err:.2e}")
    # the gathering variant: 9 tokens read through the index, padding rows (-1) zero-filled
    tokens = torch.randn(9, k, device="cuda", dtype=torch.bfloat16)
    index = torch.arange(rows.numel(), dtype=torch.int32, device="cuda") % 10 - 1  # tokens 0..8, -1 every 10th
    qw = humming.quantize(torch.randn(experts, n, k, device="cuda"), weight="int4", group_size=128)
    out = cuda_grouped.grouped_linear(tokens, qw, ids, block_m, None, None, torch.bfloat16, index)
    ref = humming.moe.grouped_linear(tokens, qw, ids, block_m, rows=index, backend="reference").float()
    torch.cuda.synchronize()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    print(f"grouped gather int4 experts={experts} rows={rows.numel()}: rel err {err:.2e}")
    # the same with the producer fencing and arriving for its rows two steps later, on a persistent grid
    lagged = _gemm_sm90.GemmTuning(16, 4, 1, persistent=True, arrive_lag=2)
    prep = prepare_weight(qw)
    out = _gemm_sm90.run_grouped_gemm(prep, tokens, ids, block_m, None, torch.bfloat16, lagged, rows=index)
    torch.cuda.synchronize()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    print(f"grouped gather int4, arrival lag 2: rel err {err:.2e}")
    # fused_moe: w13 with the activation in its epilogue (gate-up rows), then w2
    w13 = humming.quantize(torch.randn(experts, 2 * n, k, device="cuda"), weight="int4", group_size=128)
    w2 = humming.quantize(torch.randn(experts, k, n, device="cuda"), weight="int4", group_size=128)
    weights, topk = torch.rand(9, 2, device="cuda"), torch.randint(0, experts, (9, 2), device="cuda")
    out = humming.moe.fused_moe(tokens, w13, w2, weights, topk, activation="swiglu_oai", block_m=64)
    ref = humming.moe.fused_moe(tokens, w13, w2, weights, topk, activation="swiglu_oai", backend="reference")
    torch.cuda.synchronize()
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"fused_moe int4 swiglu_oai block_m=64 (sm_90a, gated w13 epilogue) experts={experts}: rel err {err:.2e}")


if __name__ == "__main__":
    main()
