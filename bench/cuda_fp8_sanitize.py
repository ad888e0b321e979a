"""Small FP8 GEMM calls for compute-sanitizer (and a quick smoke test): both scaling modes, odd shapes,
every warpgroup count; prints the relative error of each against float64 and exits 1 on any failure.

Usage: python bench/cuda_fp8_sanitize.py
"""

from __future__ import annotations

import sys

import torch

import humming
from humming.cuda_kernels import fp8_gemm
from humming.ir.activation import get_act_scheme

CASES = [  # m, n, k, weight group, act, tuning (None: the heuristic's)
    (37, 333, 1000, -1, "fp8", None),
    (37, 333, 1000, -1, "fp8", fp8_gemm.Fp8Tuning(2, 64, 3, 1)),
    (20, 256, 384, (128, 128), "fp8_g128", None),
    (130, 200, 520, (128, 128), "fp8_g128", fp8_gemm.Fp8Tuning(2, 128, 2, 1)),
    (1, 64, 32, "tensor", "fp8_tensor", None),
]


def main() -> int:
    torch.manual_seed(0)
    failed = 0
    for m, n, k, group, act_name, tuning in CASES:
        qw = humming.quantize(torch.randn(n, k, device="cuda") * 0.05, weight="e4m3", group_size=group)
        act = get_act_scheme(act_name)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        qa = humming.quantize_activation(x, act)
        out = fp8_gemm.run(fp8_gemm.prepare(qw), qa, act, bias, torch.bfloat16, tuning=tuning)
        torch.cuda.synchronize()
        xd = humming.dequantize_activation(qa).double()
        ref = xd @ humming.dequantize(qw, torch.float32).double().T + bias.double()
        rel = ((out.double() - ref).norm() / ref.norm()).item()
        ok = rel < 1e-2 and not torch.isnan(out).any()
        failed += not ok
        print(f"m={m} n={n} k={k} w={group} act={act_name} tuning={tuning}: rel err {rel:.2e} {'ok' if ok else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
