"""Benchmark of the sm_90a large-M GEMM (W4A16 / W8A16) against torch's bf16 matmul on the same shapes.

Usage: python bench/cuda_gemm.py OUT.json
"""

from __future__ import annotations

import json
import sys
from functools import partial

import torch
from cuda_decode import graph_time

import humming
from humming.cuda_kernels import _gemm_sm90
from humming.cuda_kernels._layout import prepare_weight

SHAPES = [(8192, 8192), (28672, 8192)]
SCHEMES = {
    "int4-g128": dict(weight="int4", group_size=128, zero_point=False),
    "int8-channel": dict(weight="int8", group_size=-1, zero_point=False),
}
M_VALUES = (128, 512, 1024, 4096)


def main() -> None:
    rows = []
    print(f"{'shape':>12} {'scheme':>13} {'M':>5} {'us':>9} {'TFLOP/s':>8} {'torch us':>9} {'vs torch':>8}")
    for n, k in SHAPES:
        w = torch.randn(n, k, device="cuda") * 0.02
        w_bf16 = w.to(torch.bfloat16)
        for scheme, kwargs in SCHEMES.items():
            qw = humming.quantize(w, scale_dtype=torch.bfloat16, **kwargs)
            prep = prepare_weight(qw)
            wref = humming.dequantize(qw, torch.float32)
            for m in M_VALUES:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                got = _gemm_sm90.run_gemm(prep, x, None, torch.bfloat16, out=out)
                ref = x.float() @ wref.T
                err = ((got.float() - ref).norm() / ref.norm()).item()
                times = {
                    bm: graph_time(
                        [
                            partial(
                                _gemm_sm90.run_gemm, prep, x, None, torch.bfloat16, _gemm_sm90.GemmTuning(bm, st), out
                            )
                        ]
                        * 10
                    )
                    for bm, st in ((128, 6), (256, 5))
                }
                t = min(times.values())
                tt = graph_time([partial(torch.matmul, x, w_bf16.T)] * 10)
                flops = 2 * m * n * k
                rows.append(
                    dict(
                        n=n,
                        k=k,
                        scheme=scheme,
                        m=m,
                        seconds=t,
                        seconds_by_bm=times,
                        tflops=flops / t / 1e12,
                        torch_bf16_seconds=tt,
                        speedup_vs_torch=tt / t,
                        rel_error=err,
                    )
                )
                print(
                    f"{n:>6}x{k:<5} {scheme:>13} {m:>5} {t * 1e6:9.1f} {flops / t / 1e12:8.1f} {tt * 1e6:9.1f} "
                    f"{tt / t:7.2f}x  err {err:.1e}  bm128 {times[128] * 1e6:.1f} bm256 {times[256] * 1e6:.1f}"
                )
    with open(sys.argv[1], "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
