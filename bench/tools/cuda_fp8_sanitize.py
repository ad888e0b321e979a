"""Small FP8 GEMM calls for compute-sanitizer: W8A8 in both scaling modes and W4A8 (int4, MXFP4), odd shapes,
both warpgroup counts and both epilogues, the persistent grid, token halves and codes read ahead; prints the
relative error of each against float64 and exits 1 on any failure.

Usage: compute-sanitizer python bench/tools/cuda_fp8_sanitize.py [WEIGHT_FORMAT ...]   (only those formats, e.g. mxfp4)
"""

from __future__ import annotations

import sys

import torch

from humming.cuda_kernels import fp8_gemm
from humming.testing import random_activation, random_weight, reference

CASES = [  # weight format, m, n, k, weight group, act, tuning (None: the heuristic's)
    ("e4m3", 37, 333, 1000, -1, "fp8", None),
    ("e4m3", 37, 333, 1000, -1, "fp8", fp8_gemm.Fp8Tuning(2, 64, 3, 1)),
    ("e4m3", 20, 256, 384, (128, 128), "fp8_g128", fp8_gemm.Fp8Tuning(1, 32, 2, 2, tma_store=False)),
    ("e4m3", 130, 200, 520, (128, 128), "fp8_g128", fp8_gemm.Fp8Tuning(2, 128, 2, 1)),
    ("e4m3", 1, 64, 32, "tensor", "fp8_tensor", None),
    ("int4", 37, 333, 1000, 256, "fp8", None),
    ("int4", 130, 200, 520, -1, "fp8", fp8_gemm.Fp8Tuning(2, 128, 2, 1)),
    ("mxfp4", 37, 333, 1000, 32, "fp8", None),
    ("mxfp4", 130, 200, 520, 32, "fp8_tensor", fp8_gemm.Fp8Tuning(2, 128, 2, 1, tma_store=False)),
    # token halves (a group of four K blocks and the one after it), codes read ahead, persistent
    ("int4", 130, 200, 640, 128, "fp8", fp8_gemm.Fp8Tuning(2, 128, 2, 1, persistent=True, token_halves=True)),
    ("mxfp4", 130, 200, 640, 32, "fp8", fp8_gemm.Fp8Tuning(2, 128, 3, 1, token_halves=True)),
    ("e4m3", 130, 200, 640, (128, 128), "fp8_g128", fp8_gemm.Fp8Tuning(2, 128, 2, 1, token_halves=True)),
    ("int4", 130, 200, 640, -1, "fp8", fp8_gemm.Fp8Tuning(2, 128, 2, 1, prefetch_codes=True)),
]


def main() -> int:
    torch.manual_seed(0)
    failed = 0
    formats = set(sys.argv[1:])
    for fmt, m, n, k, group, act_name, tuning in CASES:
        if formats and fmt not in formats:
            continue
        qw = random_weight(n, k, group, "cuda", torch.bfloat16, fmt)
        qa = random_activation(m, k, act_name, "cuda")
        out = fp8_gemm.run(fp8_gemm.prepare(qw), qa, qa.scheme, qw.bias, torch.bfloat16, tuning=tuning)
        torch.cuda.synchronize()
        ref = reference(qa, qw, qw.bias)
        rel = ((out.double() - ref).norm() / ref.norm()).item()
        ok = rel < 1e-2 and not torch.isnan(out).any()
        failed += not ok
        print(f"{fmt} m={m} n={n} k={k} w={group} act={act_name} {tuning}: rel err {rel:.2e} {'ok' if ok else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
