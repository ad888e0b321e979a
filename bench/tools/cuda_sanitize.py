"""One small run of each CUDA kernel family and variant, for compute-sanitizer (memcheck, racecheck).

Usage: compute-sanitizer --tool memcheck python bench/tools/cuda_sanitize.py
"""

from __future__ import annotations

import torch

import humming
from humming.cuda_kernels import _decode, _gemm_sm90
from humming.cuda_kernels._layout import prepare_weight


def main() -> None:
    torch.manual_seed(0)
    cases = [
        ("int4", 128, False, 5, 256, 512, None),  # one block per 16 rows, K split over warps
        ("uint4", 128, True, 16, 512, 1024, None),  # zero points, two token tiles, two row tiles
        ("int8", -1, False, 3, 48, 2048, _decode.DecodeTuning(1, 1, 8, 3, 4)),  # split-K atomics
        ("int4", 64, False, 9, 256, 1024, _decode.DecodeTuning(2, 4, 8, 3, 1)),  # four row tiles per warp
    ]
    for weight, group, zp, m, n, k, tuning in cases:
        qw = humming.quantize(torch.randn(n, k, device="cuda"), weight=weight, group_size=group, zero_point=zp)
        prep = prepare_weight(qw)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda")
        out = _decode.run_decode(prep, x, bias, torch.bfloat16, tuning)
        ref = x.float() @ humming.dequantize(qw).T + bias
        torch.cuda.synchronize()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        print(f"decode {weight} g{group} zp={zp} M={m} N={n} K={k}: rel err {err:.2e}")
    if torch.cuda.get_device_capability() == (9, 0):
        qw = humming.quantize(torch.randn(256, 512, device="cuda"), weight="uint4", group_size=128, zero_point=True)
        x = torch.randn(130, 512, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ humming.dequantize(qw).T
        for tuning in (_gemm_sm90.GemmTuning(128, 4), _gemm_sm90.GemmTuning(256, 3)):
            out = _gemm_sm90.run_gemm(prepare_weight(qw), x, None, torch.bfloat16, tuning)
            torch.cuda.synchronize()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            print(f"gemm_sm90 uint4 g128 zp M=130 {tuning}: rel err {err:.2e}")


if __name__ == "__main__":
    main()
