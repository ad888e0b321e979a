"""Timing of the Hopper W4A8 MXFP4 GEMM (e2m1 x e4m3, e8m0 scales folded) against the W4A8 int4 g128 GEMM
and torch's bf16 matmul, 28672x8192 at M = 1, 16, 1024, 4096.

Kernel time: a CUDA graph of several launches rotating over two weight copies (each larger than the L2:
cold weights), median replay per launch (bench/cuda_decode.py ``graph_time``); activations quantized once
beforehand (GEMM only). The relative error against the float64 reference is recorded for M <= 16.

Usage: python bench/cuda_fp8_mxfp4.py OUT.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
from functools import partial

import torch

from bench.cuda_decode import graph_time
from bench.cuda_fp8 import launches
from bench.cuda_fp8_inputs import random_weight, reference, reference_weight
from humming.cuda_kernels import fp8_gemm, jit
from humming.ir.activation import get_act_scheme
from humming.triton_kernels.act_quant import quantize_activation

N, K = 28672, 8192
M_VALUES = (1, 16, 1024, 4096)
bf16 = torch.bfloat16


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    args = parser.parse_args()
    torch.manual_seed(0)
    act = get_act_scheme("fp8")
    weights = {
        "mxfp4": random_weight(N, K, 32, "cuda", fmt="mxfp4"),
        "int4_g128": random_weight(N, K, 128, "cuda", fmt="int4"),
    }
    preps = {}
    for name, qw in weights.items():
        prep = fp8_gemm.prepare(qw)
        preps[name] = [prep, dataclasses.replace(prep, weight=prep.weight.clone(), maps={})]
    w_bf16 = [reference_weight(weights["mxfp4"]).to(bf16) for _ in range(2)]
    rows = []
    for m in M_VALUES:
        x = torch.randn(m, K, device="cuda", dtype=bf16)
        qa = quantize_activation(x, act)
        count = launches(m)
        row = dict(m=m, n=N, k=K)
        for name, ps in preps.items():
            row[f"{name}_s"] = graph_time([partial(fp8_gemm.run, ps[i % 2], qa, act, None, bf16) for i in range(count)])
            if m <= 16:  # the float64 reference of larger M takes too long for one device call
                out = fp8_gemm.run(ps[0], qa, act, None, bf16)
                ref = reference(qa, weights[name])
                row[f"{name}_rel_err"] = ((out.double() - ref).norm() / ref.norm()).item()
            row[f"{name}_tuning"] = dataclasses.asdict(
                fp8_gemm.choose_tuning(m, N, K, fp8_gemm.device_limits(0), ps[0].w_format)
            )
        row["torch_bf16_s"] = graph_time([partial(torch.matmul, x, w_bf16[i % 2].T) for i in range(count)])
        rows.append(row)
        tflops = 2 * m * N * K / row["mxfp4_s"] / 1e12
        print(
            f"W4A8 {N}x{K} m={m:5d}: mxfp4 {row['mxfp4_s'] * 1e6:8.1f} us ({tflops:5.0f} TFLOP/s)"
            f"  int4 g128 {row['int4_g128_s'] * 1e6:8.1f} us  torch bf16 {row['torch_bf16_s'] * 1e6:8.1f} us"
            f"  (mxfp4 / int4 x{row['mxfp4_s'] / row['int4_g128_s']:.2f},"
            f" bf16 / mxfp4 x{row['torch_bf16_s'] / row['mxfp4_s']:.2f})"
            + (f"  rel err {row['mxfp4_rel_err']:.1e}" if "mxfp4_rel_err" in row else ""),
            flush=True,
        )
    props = torch.cuda.get_device_properties(0)
    result = dict(
        device=props.name,
        torch=torch.__version__,
        nvrtc=jit.nvrtc_version(),
        python=platform.python_version(),
        method="CUDA graph of launches rotating over 2 cold weight copies, median of 20 replays per launch",
        rows=rows,
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
