"""``humming.moe.grouped_linear_masked``: the masked layout of DeepEP's low-latency dispatch on the grouped
GEMMs.

Reference: each expert's valid rows times ``humming.dequantize`` of that expert in float64 (activations
quantized per token first where ``act`` is set), independent of the grouped path. Rows past ``masked_m``
are poisoned with NaN in the input (what a dispatch buffer may hold there): they must not reach a valid row,
and the valid rows must hold no NaN. Tolerance ``||out - ref|| / ||ref||`` <= 1e-2 for bf16 outputs (fp32
accumulation, one rounding; weights rounded to bf16 as the tensor-core kernels do: ``dequantize(qw, bf16)``
for 16-bit activations).
"""

from __future__ import annotations

import pytest
import torch
from helpers import rel_err

import humming
from humming import moe

pytest.importorskip("humming.triton_kernels.wna16")

E, N, K = 3, 32, 128
FORMATS = {  # name: (quantize kwargs, act)
    "int4-g128": (dict(weight="int4", group_size=128), None),
    "e4m3-fp8": (dict(weight="e4m3", group_size=-1), "fp8"),
    "mxfp4": (dict(weight="mxfp4"), None),
}
MASKS = {"zero": [0, 0, 0], "full": [32, 32, 32], "partial": [5, 16, 17], "ragged": [0, 32, 9]}


def _masked_ref(x, qw, masked_m, bias, act) -> list[torch.Tensor]:
    """float64 ``[masked_m[e], N]`` per expert."""
    out = []
    for e, m in enumerate(masked_m.tolist()):
        rows = x[e, :m]
        w = moe.expert_weight(qw, e)
        if act is None:
            xd, wd = rows.double(), humming.dequantize(w, x.dtype).double()
        else:
            xd = humming.dequantize_activation(humming.quantize_activation(rows, act)).double() if m else rows.double()
            wd = humming.dequantize(w).double()
        out.append(xd @ wd.T + (0 if bias is None else bias[e].double()))
    return out


def _poisoned_input(max_m: int, masked_m: torch.Tensor, device) -> torch.Tensor:
    x = torch.randn(E, max_m, K, device=device).bfloat16()
    past = torch.arange(max_m, device=device)[None, :] >= masked_m[:, None]
    return x.masked_fill(past[..., None], float("nan"))


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_grouped_linear_masked_matches_reference(fmt: str, mask: str, backend: str, seed: int, device: str) -> None:
    kwargs, act = FORMATS[fmt]
    qw = humming.quantize(torch.randn(E, N, K, device=device), **kwargs)
    bias = torch.randn(E, N, device=device) if fmt != "mxfp4" else None
    masked_m = torch.tensor(MASKS[mask], dtype=torch.int32, device=device)
    x = _poisoned_input(32, masked_m, device)
    out = moe.grouped_linear_masked(x, qw, masked_m, bias, act=act, expected_m=8, backend=backend)
    assert out.shape == (E, 32, N) and out.dtype == torch.bfloat16
    for e, ref in enumerate(_masked_ref(x, qw, masked_m, bias, act)):
        if ref.shape[0]:
            err = rel_err(out[e, : ref.shape[0]], ref)
            assert err <= 1e-2, f"expert {e}: rel err {err:.2e} (seed {seed})"


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_grouped_linear_masked_pads_max_m(backend: str, seed: int, device: str) -> None:
    """max_m = 20 (no routing block of 16 rows or more divides it): padded to 32 rows per expert, the output
    is [E, 20, N]; float32 output."""
    qw = humming.quantize(torch.randn(E, N, K, device=device), "int4", group_size=128)
    masked_m = torch.tensor([20, 3, 0], dtype=torch.int32, device=device)
    x = _poisoned_input(20, masked_m, device)
    out = moe.grouped_linear_masked(x, qw, masked_m, out_dtype=torch.float32, backend=backend)
    assert out.shape == (E, 20, N) and out.dtype == torch.float32 and out.is_contiguous()
    for e, ref in enumerate(_masked_ref(x, qw, masked_m, None, None)):
        if ref.shape[0]:
            assert rel_err(out[e, : ref.shape[0]], ref) <= 1e-2, f"expert {e}"


def test_masked_block_m_and_expert_ids() -> None:
    """block_m: the expected rows' choice (16 / 64 / 128) lowered to a divisor of max_m; the expert ids of
    each block, exactly."""
    assert [moe.masked_block_m(128, m) for m in (1, 16, 17, 96, 97, 128)] == [16, 16, 64, 64, 128, 128]
    assert [moe.masked_block_m(m, 1024) for m in (16, 32, 48, 96, 384)] == [16, 32, 16, 32, 128]
    masked_m = torch.tensor([0, 1, 32, 17, 100], dtype=torch.int32)
    ids = moe.masked_expert_ids(masked_m, 32, 16)
    assert ids.dtype == torch.int32
    assert ids.tolist() == [-1, -1, 1, -1, 2, 2, 3, 3, 4, 4]


def _ok():
    qw = humming.quantize(torch.randn(E, N, K), "int4", group_size=128)
    return torch.randn(E, 16, K).bfloat16(), qw, torch.tensor([1, 2, 3], dtype=torch.int32)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda x, qw, m: ((x[0], qw, m), {}), r"x: expected shape \[E=3, max_m, K=128\]"),
        (lambda x, qw, m: ((x[:2], qw, m), {}), r"x: expected shape \[E=3"),
        (lambda x, qw, m: ((x.double(), qw, m), {}), "x: expected dtype"),
        (lambda x, qw, m: ((x[:, :8], qw, m), {}), "experts must be max_m rows apart"),
        (lambda x, qw, m: ((x, qw, m.long()), {}), r"masked_m: expected an int32 tensor of shape \(3,\)"),
        (lambda x, qw, m: ((x, qw, m[:2]), {}), r"masked_m: expected an int32 tensor of shape \(3,\)"),
        (lambda x, qw, m: ((x, qw, m.to("meta")), {}), "masked_m is on meta"),
        (lambda x, qw, m: ((x, qw, m + 14), {}), r"masked_m: values must lie in \[0, 17\), found 17"),
        (lambda x, qw, m: ((x, qw, m - 2), {}), r"masked_m: values must lie in \[0, 17\), found -1"),
        (lambda x, qw, m: ((x, moe.expert_weight(qw, 0), m), {}), "expected an expert-stacked weight"),
        (lambda x, qw, m: ((x, qw, m), {"act": "fp8_tensor"}), "act: fp8_tensor takes one activation scale"),
        (lambda x, qw, m: ((x, qw, m), {"act": "nvfp4"}), "act: nvfp4 takes one activation scale"),
        (lambda x, qw, m: ((x, qw, m), {"bias": torch.randn(N)}), r"bias: expected .* \(3, 32\)"),
        (lambda x, qw, m: ((x, qw, m), {"expected_m": 0}), "expected_m: expected None or a positive int"),
        (lambda x, qw, m: ((x, qw, m), {"backend": "tpu"}), "backend: expected one of"),
    ],
    ids=[
        "x-2d",
        "x-experts",
        "x-dtype",
        "x-strides",
        "masked-dtype",
        "masked-shape",
        "masked-device",
        "masked-large",
        "masked-negative",
        "dense-weight",
        "act-per-tensor",
        "act-global-scale",
        "bias-shape",
        "expected-m",
        "backend-name",
    ],
)
def test_grouped_linear_masked_rejects(change, match: str) -> None:
    args, kwargs = change(*_ok())
    with pytest.raises(ValueError, match=match):
        moe.grouped_linear_masked(*args, **kwargs)
