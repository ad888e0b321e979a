"""Benchmark of the grouped (MoE) sm_90a GEMM against a per-expert loop of the dense sm_90a GEMM and a
per-expert loop of torch's bf16 matmul, at E=64, N=2816, K=2048 (a w13 of a 64-expert MoE), top-8 routing.

Kernel time is CUDA-graph replay time of calls rotating over 3 copies of the layer (cold weights: 3 x
184 MB of int4), divided by the number of calls; the floor is the weight bytes of the experts in use
over the copy bandwidth measured in the same run. ``--sanitize`` instead runs one small grouped config
for compute-sanitizer (memcheck, racecheck).

``--fp8 OUT.json``: the grouped FP8 GEMM (W8A8, e4m3 per-channel experts x fp8 per-token activations) at
the same shape, ``block_m`` of ``humming.moe.default_block_m``: the kernel on pre-quantized activations, the
whole ``humming.cuda_kernels.grouped_linear`` (Triton act pass + kernel), and a per-expert loop of
``torch._scaled_mm`` (rowwise scales, bf16 out) on pre-quantized activations, all CUDA-graph times over 3
copies of the layer (3 x 369 MB of e4m3). ``--sanitize-fp8``: one small grouped FP8 config for
compute-sanitizer.

Usage: python bench/cuda_grouped.py OUT.json | --sanitize | --fp8 OUT.json | --sanitize-fp8
"""

from __future__ import annotations

import json
import sys
from functools import partial

import torch
from cuda_decode import copy_bandwidth, graph_time

import humming
from humming.cuda_kernels import _gemm_sm90
from humming.cuda_kernels._layout import prepare_weight

E, N, K, TOPK = 64, 2816, 2048, 8
SLOTS = (16, 256, 4096)  # T * topk
COPIES = 3
T = _gemm_sm90.GemmTuning
TUNINGS = {  # block_m -> the tunings timed (None = default_grouped_tuning)
    16: (None, T(16, 4, 2), T(16, 8, 1), T(16, 12, 1)),
    32: (None, T(32, 8, 1)),
    64: (None, T(64, 8, 1)),
    128: (None,),
}


def route(counts: list[int], block_m: int) -> tuple[torch.Tensor, int]:
    """``expert_ids`` of the contiguous grouped layout (segments padded to ``block_m``) and M_pad."""
    m_pad = -(-(sum(counts) + E * (block_m - 1)) // block_m) * block_m
    ids = [i for i, c in enumerate(counts) for _ in range(-(-c // block_m))]
    ids += [-1] * (m_pad // block_m - len(ids))
    return torch.tensor(ids, dtype=torch.int32, device="cuda"), m_pad


def expert(qw, e: int):
    """Expert ``e`` of a stacked weight (no global scale) as a dense ``QuantizedWeight``."""
    zeros = None if qw.zeros is None else qw.zeros[e]
    return qw.replace(shape=qw.shape[1:], qweight=qw.qweight[e], scales=qw.scales[e], zeros=zeros)


def dense_loop(xs: dict, experts: list) -> None:
    """What MoE costs without a grouped kernel: one dense sm_90a GEMM call per expert in use."""
    for e, x in xs.items():
        _gemm_sm90.run_gemm(experts[e], x, None, torch.bfloat16)


def torch_loop(xs: dict, w: torch.Tensor) -> None:
    for e, x in xs.items():
        torch.matmul(x, w[e].T)


def sanitize() -> None:
    torch.manual_seed(0)
    qw = humming.quantize(torch.randn(4, 256, 512, device="cuda"), weight="uint4", group_size=128, zero_point=True)
    prep = prepare_weight(qw)
    ids, m_pad = route([0, 30, 5, 40] + [0] * (E - 4), 32)
    x = torch.randn(m_pad, 512, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    rows = ids.repeat_interleave(32)
    ref = torch.zeros(m_pad, 256, device="cuda")
    for i in range(4):
        ref[rows == i] = x[rows == i].float() @ humming.dequantize(expert(qw, i)).T + bias[i].float()
    used = rows >= 0
    for tuning in (T(16, 4, 2), T(32, 3, 1)):
        out = _gemm_sm90.run_grouped_gemm(prep, x, ids, 32, bias, torch.bfloat16, tuning)
        torch.cuda.synchronize()
        err = ((out[used].float() - ref[used]).norm() / ref[used].norm()).item()
        print(f"gemm_sm90 grouped uint4 g128 zp E=4 block_m=32 M_pad={m_pad} {tuning}: rel err {err:.2e}")


def main(path: str) -> None:
    torch.manual_seed(0)
    bandwidth = copy_bandwidth()
    layers = [
        humming.quantize(torch.randn(E, N, K, device="cuda") * 0.02, "int4", group_size=128, scale_dtype=torch.bfloat16)
        for _ in range(COPIES)
    ]
    preps = [prepare_weight(qw) for qw in layers]
    dense = [[prepare_weight(expert(qw, e)) for e in range(E)] for qw in layers]
    w_bf16 = [humming.dequantize(qw, torch.bfloat16) for qw in layers]
    expert_bytes = preps[0].nbytes // E
    rows = []
    print(f"E={E} N={N} K={K} top{TOPK}, copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    for slots in SLOTS:
        topk_ids = torch.rand(slots // TOPK, E, device="cuda").topk(TOPK, dim=1).indices
        counts = torch.bincount(topk_ids.flatten(), minlength=E).tolist()
        used = [e for e in range(E) if counts[e]]
        floor = len(used) * expert_bytes / bandwidth
        row = dict(slots=slots, experts_used=len(used), floor_us=floor * 1e6, grouped={})
        for block_m, tunings in TUNINGS.items():
            ids, m_pad = route(counts, block_m)
            x = torch.randn(m_pad, K, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m_pad, N, device="cuda", dtype=torch.bfloat16)
            for tuning in tunings:
                chosen = tuning or _gemm_sm90.default_grouped_tuning(
                    block_m,
                    m_pad,
                    E,
                    preps[0].layout,
                    torch.cuda.get_device_properties(0).shared_memory_per_block_optin,
                )
                calls = [
                    partial(_gemm_sm90.run_grouped_gemm, p, x, ids, block_m, None, torch.bfloat16, chosen, out)
                    for p in preps
                ]
                t = graph_time(calls * 4)
                key = f"block_m={block_m} bm={chosen.bm} stages={chosen.stages} blocks={chosen.blocks}"
                row["grouped"][key + (" (default)" if tuning is None else "")] = t * 1e6
        xs = {e: torch.randn(counts[e], K, device="cuda", dtype=torch.bfloat16) for e in used}
        loops = {"dense_loop_us": dense_loop, "torch_bf16_loop_us": torch_loop}
        for key, loop in loops.items():
            weights = dense if loop is dense_loop else w_bf16
            row[key] = graph_time([partial(loop, xs, weights[c]) for c in range(COPIES)] * 2) * 1e6
        best = min(row["grouped"].values())
        print(
            f"T*topk={slots:5d} experts used {len(used):2d}  floor {row['floor_us']:7.1f} us  grouped best "
            f"{best:7.1f} us  dense loop {row['dense_loop_us']:7.1f} us  "
            f"torch bf16 loop {row['torch_bf16_loop_us']:7.1f} us"
        )
        for key, us in row["grouped"].items():
            print(f"    {key:48s} {us:8.1f} us")
        rows.append(row)
    with open(path, "w") as f:
        json.dump(
            dict(device=torch.cuda.get_device_name(), torch=torch.__version__, bandwidth=bandwidth, rows=rows),
            f,
            indent=1,
        )


def scaled_mm_loop(xs: dict, codes: torch.Tensor, w_scales: torch.Tensor) -> None:
    """A grouped FP8 GEMM without a grouped kernel: one rowwise-scaled ``torch._scaled_mm`` per expert in use."""
    for e, q in xs.items():
        a = q.codes.view(torch.float8_e4m3fn)
        torch._scaled_mm(a, codes[e].T, q.scales, w_scales[e], out_dtype=torch.bfloat16)


def _fp8_layer(e: int, n: int, k: int):
    """An e4m3 expert-stacked layer with per-channel scales (random non-NaN codes, built in the IR)."""
    codes = torch.randint(0, 254, (e * n, k), dtype=torch.int32, device="cuda")
    codes = (codes + (codes >= 0x7F).to(torch.int32)).to(torch.uint8).view(torch.int32).view(e, n, -1)
    scales = (1 + torch.rand(e, n, 1, device="cuda")) * 2e-3
    return humming.QuantizedWeight((e, n, k), "e4m3", codes, scales, (1, -1))


def sanitize_fp8() -> None:
    from humming.cuda_kernels import fp8_gemm
    from humming.ir.activation import get_act_scheme

    torch.manual_seed(0)
    qw = _fp8_layer(4, 256, 512)
    ids, m_pad = route([0, 30, 5, 40] + [0] * (E - 4), 32)
    x = torch.randn(m_pad, 512, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    for act in ("fp8", "fp8_g128"):
        layer = (
            qw
            if act == "fp8"
            else qw.replace(scales=qw.scales[:, :2, :1].expand(4, 2, 4).contiguous(), group_shape=(128, 128))
        )
        out = fp8_gemm.run_grouped(fp8_gemm.prepare(layer), x, get_act_scheme(act), ids, 32, bias, torch.bfloat16)
        torch.cuda.synchronize()
        print(
            f"fp8_gemm grouped e4m3 {act} E=4 block_m=32 M_pad={m_pad}: finite rows in use "
            f"{bool(out[ids.repeat_interleave(32) >= 0].isfinite().all())}"
        )


def main_fp8(path: str) -> None:
    from humming.cuda_kernels import fp8_gemm, grouped_linear
    from humming.ir.activation import get_act_scheme
    from humming.moe import default_block_m
    from humming.triton_kernels.act_quant import quantize_activation

    torch.manual_seed(0)
    bandwidth = copy_bandwidth()
    act = get_act_scheme("fp8")
    layers = [_fp8_layer(E, N, K) for _ in range(COPIES)]
    preps = [fp8_gemm.prepare(qw) for qw in layers]
    codes = [qw.qweight.view(torch.float8_e4m3fn) for qw in layers]  # [E, N, K] e4m3
    w_scales = [qw.scales.view(E, 1, N) for qw in layers]
    rows = []
    print(f"FP8 grouped W8A8 E={E} N={N} K={K} top{TOPK}, copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    for slots in SLOTS:
        topk_ids = torch.rand(slots // TOPK, E, device="cuda").topk(TOPK, dim=1).indices
        counts = torch.bincount(topk_ids.flatten(), minlength=E).tolist()
        used = [e for e in range(E) if counts[e]]
        block_m = default_block_m(slots, E)
        ids, m_pad = route(counts, block_m)
        x = torch.randn(m_pad, K, device="cuda", dtype=torch.bfloat16)
        qa = quantize_activation(x, act)
        out = torch.empty(m_pad, N, device="cuda", dtype=torch.bfloat16)
        tuning = fp8_gemm.choose_grouped_tuning(block_m, m_pad, N, E, fp8_gemm.device_limits(0))
        kernel = [
            partial(fp8_gemm.run_grouped, p, qa, act, ids, block_m, None, torch.bfloat16, None, out) for p in preps
        ]
        full = [partial(grouped_linear, x, qw, ids, block_m, None, act, torch.bfloat16) for qw in layers]
        row = dict(slots=slots, experts_used=len(used), block_m=block_m, m_pad=m_pad, tuning=str(tuning))
        row["floor_us"] = len(used) * N * K / bandwidth * 1e6
        row["kernel_us"] = graph_time(kernel * 4) * 1e6
        row["grouped_linear_us"] = graph_time(full * 4) * 1e6
        xs = {e: quantize_activation(torch.randn(counts[e], K, device="cuda", dtype=torch.bfloat16), act) for e in used}

        try:
            row["scaled_mm_loop_us"] = (
                graph_time([partial(scaled_mm_loop, xs, codes[c], w_scales[c]) for c in range(COPIES)] * 2) * 1e6
            )
        except RuntimeError as err:  # torch builds without rowwise-scaled fp8 GEMMs
            row["scaled_mm_loop_us"] = f"failed: {err}".splitlines()[0]
        print(
            f"T*topk={slots:5d} experts used {len(used):2d} block_m={block_m:3d}  floor {row['floor_us']:7.1f} us  "
            f"kernel {row['kernel_us']:7.1f} us  grouped_linear {row['grouped_linear_us']:7.1f} us  "
            f"_scaled_mm loop {row['scaled_mm_loop_us']} us  ({tuning})"
        )
        rows.append(row)
    with open(path, "w") as f:
        json.dump(
            dict(device=torch.cuda.get_device_name(), torch=torch.__version__, bandwidth=bandwidth, rows=rows),
            f,
            indent=1,
        )


if __name__ == "__main__":
    modes = {"--sanitize": sanitize, "--sanitize-fp8": sanitize_fp8}
    if sys.argv[1] in modes:
        modes[sys.argv[1]]()
    elif sys.argv[1] == "--fp8":
        main_fp8(sys.argv[2])
    else:
        main(sys.argv[1])
