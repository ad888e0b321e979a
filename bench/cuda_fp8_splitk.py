"""Split-K table of the Hopper FP8 GEMM at decode M: the split tuning (:func:`fp8_gemm.choose_split_tuning`)
vs the same tuning with one split (what :func:`fp8_gemm.choose_tuning` picks) vs torch._scaled_mm (W8A8
row-wise), on 8192x8192, 4096x4096 and 28672x8192 at M = 1 and 16, for W8A8 per-channel, W4A8 int4 g128 and
W4A8 MXFP4. The measurement that decides whether ``choose_tuning`` adopts split-K.

Time as bench/cuda_fp8.py: a CUDA graph of launches rotating over enough weight copies to exceed the L2
(cold weights), median replay per launch; activations quantized beforehand (GEMM only), the ``linear``
column adds the Triton activation pass. The split columns include the workspace memset and the rounding
copy. Floor: weight + activation + output bytes over the copy bandwidth measured in the same run.

Usage: python bench/cuda_fp8_splitk.py OUT.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from functools import partial

import torch

from bench.cuda_decode import copy_bandwidth, graph_time
from bench.cuda_fp8_inputs import random_weight
from humming.cuda_kernels import fp8_gemm
from humming.ir.activation import get_act_scheme
from humming.triton_kernels.act_quant import quantize_activation

SHAPES = [(8192, 8192), (4096, 4096), (28672, 8192)]
M_VALUES = (1, 16)
MODES = (("w8a8_rowcol", "e4m3", -1), ("w4a8_g128", "int4", 128), ("w4a8_mxfp4", "mxfp4", 32))
LAUNCHES = 32
bf16 = torch.bfloat16


def _time(preps, act, inputs, tuning) -> float:
    """Seconds per call of ``run`` with ``tuning``, over LAUNCHES launches rotating the weight copies."""
    return graph_time(
        [partial(fp8_gemm.run, preps[i % len(preps)], inputs, act, None, bf16, tuning) for i in range(LAUNCHES)]
    )


def rows_for(n: int, k: int, bw: float, l2: int) -> list[dict]:
    rows = []
    limits = fp8_gemm.device_limits(torch.cuda.current_device())
    act = get_act_scheme("fp8")
    for mode, fmt, group in MODES:
        prep = fp8_gemm.prepare(random_weight(n, k, group, "cuda", fmt=fmt))
        copies = max(1, -(-3 * l2 // prep.weight.numel()))
        preps = [prep] + [dataclasses.replace(prep, weight=prep.weight.clone(), maps={}) for _ in range(copies - 1)]
        for m in M_VALUES:
            x = torch.randn(m, k, device="cuda", dtype=bf16)
            qa = quantize_activation(x, act)
            split = fp8_gemm.choose_split_tuning(m, n, k, limits, prep.w_format)
            one = dataclasses.replace(split, splits=1)
            timed = partial(_time, preps, act)
            row = dict(mode=mode, m=m, n=n, k=k, splits=split.splits, tuning=dataclasses.asdict(split))
            row["split_s"], row["one_s"] = timed(qa, split), timed(qa, one)
            row["split_linear_s"], row["one_linear_s"] = timed(x, split), timed(x, one)
            ref = fp8_gemm.run(prep, qa, act, None, torch.float32, one)
            got = fp8_gemm.run(prep, qa, act, None, torch.float32, split)
            row["split_vs_one_rel"] = ((got - ref).norm() / ref.norm()).item()
            row["floor_s"] = (prep.weight.numel() + m * k + 2 * m * n) / bw
            if fmt == "e4m3":
                w = [p.weight.view(torch.float8_e4m3fn).t() for p in preps]
                s = prep.w_scale[:n].reshape(1, n)
                fns = [
                    partial(torch._scaled_mm, qa.data(), w[i % copies], qa.scales, s, out_dtype=bf16)
                    for i in range(LAUNCHES)
                ]
                row["torch_scaled_mm_s"] = graph_time(fns)
            rows.append(row)
            torch_us = f" scaled_mm {row['torch_scaled_mm_s'] * 1e6:6.1f}" if "torch_scaled_mm_s" in row else ""
            print(
                f"{mode:11s} {n:5d}x{k} m={m:2d} splits={split.splits}: split {row['split_s'] * 1e6:6.1f} us"
                f" one {row['one_s'] * 1e6:6.1f} us{torch_us} | linear split {row['split_linear_s'] * 1e6:6.1f}"
                f" one {row['one_linear_s'] * 1e6:6.1f} | floor {row['floor_s'] * 1e6:5.1f} us"
                f" (split {row['split_s'] / row['floor_s']:.2f}x) rel {row['split_vs_one_rel']:.1e}",
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
    rows = [row for n, k in SHAPES for row in rows_for(n, k, bw, props.L2_cache_size)]
    result = dict(device=props.name, copy_bandwidth=bw, torch=torch.__version__, launches=LAUNCHES, rows=rows)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
