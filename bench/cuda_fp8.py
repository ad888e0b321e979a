"""Benchmark of the Hopper FP8 GEMMs (W8A8 per-token x per-channel, W8A8 128-blocks, W4A8 int4 g128) against
torch._scaled_mm (W8A8 row-wise), torch's bf16 matmul (W4A8) and the floor, on 8192x8192 and 28672x8192.

Weights are random non-NaN e4m3 codes with random scales (bench/cuda_fp8_inputs.py); activations are
random normal bf16 quantized by the Triton activation pass. Kernel time: a CUDA graph of several
launches that rotate over enough weight copies to exceed the L2 (cold weights), replayed; the median
replay divided by the launches. Activations are quantized once beforehand (GEMM only); the ``linear``
column adds the Triton activation pass. The floor is the larger of bytes (weights + activations +
output, once) over the copy bandwidth measured in the same run, and FLOPs over the nominal dense e4m3
rate (1979 TFLOP/s, the H100/H200 SXM datasheet).

Usage: python bench/cuda_fp8.py OUT.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
from functools import partial

import torch

from bench.cuda_decode import copy_bandwidth, graph_time
from bench.cuda_fp8_inputs import random_weight, reference_weight
from humming.cuda_kernels import fp8_gemm, jit
from humming.ir.activation import get_act_scheme
from humming.triton_kernels.act_quant import quantize_activation

NOMINAL_FP8 = 1979e12
SHAPES = [(8192, 8192), (28672, 8192)]
M_VALUES = (1, 16, 128, 1024, 4096, 8192)
bf16 = torch.bfloat16


def launches(m: int) -> int:
    return 32 if m <= 128 else (8 if m <= 1024 else 3)


def baseline(row: dict, key: str, fns, ours: float, out: torch.Tensor) -> None:
    """Time ``fns`` (a torch baseline) into ``row[key]``; a refusal is recorded, not fatal."""
    try:
        ref = fns[0]()
        row[key] = graph_time(fns)
    except RuntimeError as err:
        row[f"{key}_error"] = str(err).splitlines()[0]
        return
    row[f"{key}_rel_err"] = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    row[f"{key}_speedup"] = row[key] / ours


MODES = (  # name, weight format, weight group, activation scheme
    ("w8a8_rowcol", "e4m3", -1, "fp8"),
    ("w8a8_block128", "e4m3", (128, 128), "fp8_g128"),
    ("w4a8_g128", "int4", 128, "fp8"),
)


def bench_shape(n: int, k: int, bw: float, l2: int) -> list[dict]:
    rows = []
    limits = fp8_gemm.device_limits(torch.cuda.current_device())
    for mode, fmt, group, act_name in MODES:
        qw = random_weight(n, k, group, "cuda", fmt=fmt)
        act = get_act_scheme(act_name)
        prep = fp8_gemm.prepare(qw)
        copies = max(1, -(-3 * l2 // prep.weight.numel()))
        preps = [prep] + [dataclasses.replace(prep, weight=prep.weight.clone(), maps={}) for _ in range(copies - 1)]
        w_fp8 = [p.weight.view(torch.float8_e4m3fn) for p in preps]
        w_scale = prep.w_scale[:n].reshape(1, n) if mode == "w8a8_rowcol" else None
        w_bf16 = reference_weight(qw).to(torch.bfloat16) if fmt == "int4" else None
        for m in M_VALUES:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            qa = quantize_activation(x, act)
            count = launches(m)
            tuning = fp8_gemm.choose_tuning(m, n, k, limits, prep.w_format)
            ours = graph_time([partial(fp8_gemm.run, preps[i % copies], qa, act, None, bf16) for i in range(count)])
            full = graph_time([partial(fp8_gemm.run, preps[i % copies], x, act, None, bf16) for i in range(count)])
            out = fp8_gemm.run(prep, qa, act, None, bf16)
            row = dict(mode=mode, m=m, n=n, k=k, tuning=dataclasses.asdict(tuning), ours_s=ours, linear_s=full)
            nbytes = prep.weight.numel() + m * k + 2 * m * n
            row["floor_bw_s"] = nbytes / bw
            row["floor_flop_s"] = 2 * m * n * k / NOMINAL_FP8
            row["floor_s"] = max(row["floor_bw_s"], row["floor_flop_s"])
            row["ours_tflops"] = 2 * m * n * k / ours / 1e12
            if w_scale is not None:
                a, s = qa.data(), qa.scales
                fns = [partial(torch._scaled_mm, a, w.t(), s, w_scale, out_dtype=bf16) for w in w_fp8 * count][:count]
                baseline(row, "torch_scaled_mm_s", fns, ours, out)
            if w_bf16 is not None:
                baseline(row, "torch_bf16_s", [partial(torch.matmul, x, w_bf16.T)] * count, ours, out)
            rows.append(row)
            key = next((key for key in ("torch_scaled_mm_s", "torch_bf16_s") if key in row), None)
            vs = f" {key[:-2]} {row[key] * 1e6:9.1f} us x{row[key + '_speedup']:.2f}" if key else ""
            print(
                f"{mode:13s} {n:5d}x{k} m={m:5d}: ours {ours * 1e6:9.1f} us ({row['ours_tflops']:6.0f} TFLOP/s,"
                f" {ours / row['floor_s']:.2f}x floor) linear {full * 1e6:9.1f} us{vs}",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    args = parser.parse_args()
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    bw = copy_bandwidth()
    print(f"{props.name}: copy bandwidth {bw / 1e12:.2f} TB/s, L2 {props.L2_cache_size >> 20} MiB", flush=True)
    rows = []
    for n, k in SHAPES:
        rows += bench_shape(n, k, bw, props.L2_cache_size)
    result = dict(
        device=props.name,
        sm_count=props.multi_processor_count,
        copy_bandwidth=bw,
        nominal_fp8_flops=NOMINAL_FP8,
        torch=torch.__version__,
        nvrtc=jit.nvrtc_version(),
        python=platform.python_version(),
        method="CUDA graph of rotating cold-weight launches, median of 10 replays per launch",
        rows=rows,
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
