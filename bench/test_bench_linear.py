"""pytest-benchmark suite over the sweep's methods (bench/harness.py) at a few decode and prefill points.

    pytest bench/test_bench_linear.py --benchmark-columns=median,min,max

Needs a CUDA GPU (skipped otherwise). For the committed numbers (CUDA graphs, cold L2, roofs), use
bench/sweep.py; this suite is for quick A/B checks while changing a kernel.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("benchmarks need a CUDA GPU", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import METHODS

POINTS = [(1, 28672, 8192), (16, 28672, 8192), (1024, 8192, 8192), (8192, 8192, 8192)]
BENCHED = ["torch_bf16", "triton_w4a16_g128", "triton_w8a16", "triton_mxfp4_a16", "torch_int4pack_g128"]


@pytest.mark.parametrize("point", POINTS, ids=lambda p: "M{}-N{}-K{}".format(*p))
@pytest.mark.parametrize("name", BENCHED)
def test_linear(benchmark, name: str, point) -> None:
    m, n, k = point
    op = METHODS[name].build(n, k, "cuda")
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    op(x)
    torch.cuda.synchronize()

    def call():
        op(x)
        torch.cuda.synchronize()

    benchmark.pedantic(call, rounds=20, warmup_rounds=3)
