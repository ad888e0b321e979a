"""The Triton GEMMs past 2^31 elements: ``M * K`` activations and ``M * N`` outputs that int32 offsets
would wrap (a wrapped offset reads or writes out of bounds, or silently elsewhere).

GPU only (bf16 ``x`` of 4 GiB; the interpreter would take hours). A few rows, the first, a middle and the
last ones included, are compared with the float32 reference computed on those rows alone:
``dequantize_activation(quantize_activation(x[rows]))`` (or ``x[rows]``) ``@ dequantize(qw)^T + bias``.
The bias makes the WnA16 call run the tiled Triton kernel (without it, large M dequantizes first and
calls cuBLAS).
"""

from __future__ import annotations

import pytest
import torch

import humming

#: K = N = 8192 and M past 2^31 / 8192: both M * K and M * N exceed 2^31.
M, N, K = 2**31 // 8192 + 80, 8192, 8192


def _reference(x, qw, bias, act, rows) -> torch.Tensor:
    xr = x[rows]
    if act is not None:  # per-token scales: each row quantizes on its own
        xr = humming.dequantize_activation(humming.quantize_activation(xr, act), torch.float32)
    w = humming.dequantize(qw, x.dtype if act is None else torch.float32).float()
    return xr.float() @ w.T + bias.float()


@pytest.mark.gpu
@pytest.mark.big_memory
@pytest.mark.parametrize(
    "weight,act",
    [("int4", None), ("int3", None), ("int8", "int8"), ("e4m3", "fp8")],
    ids=["wna16-int4", "wna16-int3", "scaled-int8", "scaled-fp8"],
)
def test_linear_past_2_31_elements(weight: str, act: str | None, seed: int) -> None:
    qw = humming.quantize(torch.randn(N, K, device="cuda"), weight, 128 if act is None else -1)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    out = humming.linear(x, qw, bias, act=act, backend="triton")
    rows = torch.tensor([0, 1, M // 2, M - 2, M - 1], device="cuda")
    ref = _reference(x, qw, bias, act, rows)
    err = (out[rows].float() - ref).norm() / ref.norm()
    assert err < 1e-2, f"{weight} act={act} M={M}: relative error {err:.3g} on rows {rows.tolist()} (seed={seed})"
