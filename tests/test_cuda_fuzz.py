"""Seeded fuzzer for the CUDA backend: random shapes, formats, layouts, dtypes and M through
``humming.linear(backend="cuda")`` (so through both the decode kernel and the sm_90a GEMM), outputs poisoned
with NaN, against ``humming.dequantize`` + float32 matmul. A failure prints the case and its seed."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import backend_unsupported

import humming

pytestmark = pytest.mark.gpu

FORMATS = [("int4", False), ("uint4", True), ("int8", False), ("uint8", True), ("uint4", False)]


def _case(seed: int) -> dict:
    rng = random.Random(seed)
    weight, zp = rng.choice(FORMATS)
    return dict(
        weight=weight,
        zero_point=zp,
        n=16 * rng.randint(1, 96) if rng.random() < 0.5 else 128 * rng.randint(1, 24),
        k=64 * rng.randint(1, 48),
        group=rng.choice([64, 128, 256, -1]),
        m=rng.choice([1, 2, 3, 7, 8, 13, 16, 31, 32, 33, 64, 65, 100, 129, 257, 600]),
        act=rng.choice([torch.bfloat16, torch.float16]),
        out=rng.choice([None, torch.float32]),
        bias=rng.random() < 0.5,
        scale_dtype=rng.choice([torch.bfloat16, torch.float16, torch.float32]),
    )


@pytest.mark.parametrize("seed", range(40))
def test_fuzz_linear(seed):
    case = _case(seed)
    torch.manual_seed(seed)
    if case["group"] > case["k"]:
        case["group"] = -1
    w = torch.randn(case["n"], case["k"], device="cuda") * 0.05
    qw = humming.quantize(
        w,
        weight=case["weight"],
        group_size=case["group"],
        zero_point=case["zero_point"],
        scale_dtype=case["scale_dtype"],
    )
    x = torch.randn(case["m"], case["k"], device="cuda", dtype=case["act"])
    bias = torch.randn(case["n"], device="cuda", dtype=case["act"]) if case["bias"] else None
    out_dtype = case["out"] or case["act"]
    reason = backend_unsupported(qw, None, x, "cuda")
    if reason is not None:
        pytest.skip(f"seed {seed}: {reason} ({case})")
    torch.empty(case["m"] * case["n"] * 4, device="cuda", dtype=torch.uint8).fill_(0xFF)  # NaN-filled pool
    out = humming.linear(x, qw, bias, out_dtype=out_dtype, backend="cuda")
    ref = x.float() @ humming.dequantize(qw).T + (0 if bias is None else bias.float())
    assert not torch.isnan(out).any(), f"seed {seed}: unwritten outputs ({case})"
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, f"seed {seed}: relative error {err:.2e} ({case})"
