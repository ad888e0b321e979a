"""Benchmark of the Hopper FP8 GEMM against torch._scaled_mm and the floor, on 8192x8192 and 28672x8192.

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

from bench.cuda_fp8_inputs import random_weight
from humming.cuda_kernels import fp8_gemm, jit
from humming.ir.activation import get_act_scheme
from humming.triton_kernels.act_quant import quantize_activation

NOMINAL_FP8 = 1979e12
SHAPES = [(8192, 8192), (28672, 8192)]
M_VALUES = (1, 16, 128, 1024, 4096, 8192)
bf16 = torch.bfloat16


def graph_time(fns, replays: int = 10) -> float:
    """Median seconds per launch of the calls in ``fns``, captured once into a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns[:2]:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(fns))
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth() -> float:
    """Bytes read + written per second of a 2 GiB device-to-device copy."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return 2 * src.numel() / graph_time([lambda: dst.copy_(src)] * 5)


def launches(m: int) -> int:
    return 32 if m <= 128 else (8 if m <= 1024 else 3)


def bench_shape(n: int, k: int, bw: float, l2: int) -> list[dict]:
    rows = []
    for mode, group, act_name in (("rowcol", -1, "fp8"), ("block128", (128, 128), "fp8_g128")):
        qw = random_weight(n, k, group, "cuda")
        act = get_act_scheme(act_name)
        prep = fp8_gemm.prepare(qw)
        copies = max(1, -(-3 * l2 // prep.weight.numel()))
        preps = [prep] + [dataclasses.replace(prep, weight=prep.weight.clone(), maps={}) for _ in range(copies - 1)]
        w_fp8 = [p.weight.view(torch.float8_e4m3fn) for p in preps]
        w_scale = prep.w_scale[:n].reshape(1, n) if prep.w_scale is not None else None
        for m in M_VALUES:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            qa = quantize_activation(x, act)
            count = launches(m)
            tuning = fp8_gemm.choose_tuning(m, n, k, fp8_gemm.device_limits(torch.cuda.current_device()))
            ours = graph_time([partial(fp8_gemm.run, preps[i % copies], qa, act, None, bf16) for i in range(count)])
            full = graph_time([partial(fp8_gemm.run, preps[i % copies], x, act, None, bf16) for i in range(count)])
            out = fp8_gemm.run(prep, qa, act, None, bf16)
            row = dict(mode=mode, m=m, n=n, k=k, tuning=dataclasses.asdict(tuning), ours_s=ours, linear_s=full)
            nbytes = n * k + m * k + 2 * m * n
            row["floor_bw_s"] = nbytes / bw
            row["floor_flop_s"] = 2 * m * n * k / NOMINAL_FP8
            row["floor_s"] = max(row["floor_bw_s"], row["floor_flop_s"])
            row["ours_tflops"] = 2 * m * n * k / ours / 1e12
            if w_scale is not None:
                fns = [
                    partial(torch._scaled_mm, qa.data(), w_fp8[i % copies].t(), qa.scales, w_scale, out_dtype=bf16)
                    for i in range(count)
                ]
                try:
                    ref = fns[0]()
                    row["torch_s"] = graph_time(fns)
                except RuntimeError as err:  # recorded, not fatal: the rest of the sweep still runs
                    row["torch_error"] = str(err).splitlines()[0]
                else:
                    row["rel_err_vs_torch"] = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                    row["speedup_vs_torch"] = row["torch_s"] / ours
            rows.append(row)
            vs = f" torch {row['torch_s'] * 1e6:9.1f} us  x{row['speedup_vs_torch']:.2f}" if "torch_s" in row else ""
            print(
                f"{mode:8s} {n:5d}x{k} m={m:5d}: ours {ours * 1e6:9.1f} us ({row['ours_tflops']:6.0f} TFLOP/s,"
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
