"""The CUDA activation quantization pass (``humming.cuda_kernels.act_quant``): bit-exact codes, values and
scales with :func:`humming.quantize_activation`, in every layout the CUDA GEMMs ask for, and the Triton pass
wherever the CUDA one does not apply."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_bit_exact

import humming
from humming.cuda_kernels import act_quant
from humming.ir.activation import get_act_scheme


@pytest.mark.parametrize(
    ("act", "x", "reason"),
    [
        ("int8", torch.zeros(4, 64, dtype=torch.bfloat16), "e4m3 codes with float32 scales"),
        ("mxfp8", torch.zeros(4, 64, dtype=torch.bfloat16), "e4m3 codes with float32 scales"),
        ("fp8_tensor", torch.zeros(4, 64, dtype=torch.bfloat16), "per-token scales or groups"),
        ("fp8", torch.zeros(4, 64, dtype=torch.float32), "float16 / bfloat16"),
        ("fp8", torch.zeros(0, 64, dtype=torch.bfloat16), "non-empty"),
        ("fp8", torch.zeros(4, 60, dtype=torch.bfloat16), "K % 8 == 0"),
        ("fp8", torch.zeros(4, 76, dtype=torch.bfloat16)[:, :72], "16-byte rows"),
        ("fp8_g128", torch.zeros(4, 200, dtype=torch.bfloat16), "multiple of the group"),
        ("fp8", torch.zeros(4, 64, dtype=torch.bfloat16), "compute capabilities"),  # a CPU tensor
    ],
)
def test_calls_the_cuda_pass_leaves_to_triton(act, x, reason):
    assert reason in act_quant.cuda_unsupported(x, get_act_scheme(act))


def _inputs(m: int, k: int, dtype: torch.dtype, group: int) -> torch.Tensor:
    """Rows of magnitudes 1e-6 ... 1e4; a row of zeros, one of e4m3 grid midpoints times its scale, one with
    NaN and Inf, one of values near float32's smallest normals."""
    x = torch.randn(m, k, dtype=torch.float64) * 10.0 ** torch.randint(-6, 5, (m, 1))
    if m >= 5:
        x[1] = 0.0
        span = group or k
        amax = x[2].abs().reshape(-1, span).amax(1, keepdim=True)
        x[2] = ((torch.randint(-447, 447, (k // span, span)) + 0.5) * amax / 448).reshape(k)
        x[3, 7], x[3, k // 2] = float("nan"), float("inf")
        x[4] *= 1e-36 if dtype == torch.bfloat16 else 1e-3
    return x.to(dtype)


def _poisoned_allocations(nbytes: int) -> None:
    """Leave ``nbytes`` of freed 0xFF bytes in the caching allocator, where the pass's outputs will come from."""
    torch.full((nbytes,), 0xFF, dtype=torch.uint8, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["fp8", "fp8_g128"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("m", "k"), [(1, 64), (5, 1024), (37, 2048), (300, 8192), (9, 28672), (66000, 128)])
def test_codes_and_scales_are_the_reference_bits(act, dtype, m, k):
    """Codes and scales against humming.quantize_activation, from ``__call__`` and from
    ``addresses`` (one buffer), scales in rows or transposed into ``[spans, scales_rows]``."""
    group = 0 if act == "fp8" else 128
    if k % (group or 1):
        pytest.skip("K is not a multiple of the group")
    x = _inputs(m, k, dtype, group).cuda()
    ref = humming.quantize_activation(x.cpu(), act)
    ref_scales = ref.scales.float().reshape(m, -1)
    assert act_quant.cuda_unsupported(x, get_act_scheme(act)) is None
    for scales_rows in (0, m + 5):
        quant = act_quant.quantize_pass(x, act, scales_rows=scales_rows)
        assert isinstance(quant, act_quant.CudaQuantizePass)
        _poisoned_allocations(4 * m * k)
        codes, scales, gscale = quant(x)
        assert gscale is None
        assert_bit_exact(codes.cpu(), ref.codes.view(torch.uint8), f"{act} codes")
        got_scales = scales[:, :m].t() if scales_rows else scales
        assert_bit_exact(got_scales.cpu(), ref_scales, f"{act} scales")
        _poisoned_allocations(4 * m * k)
        buffer, codes_at, scales_at = quant.addresses(x)
        raw = buffer.cpu()
        assert codes_at == buffer.data_ptr() and scales_at - codes_at == quant.scales_offset
        assert_bit_exact(raw[: m * k].view(m, k), ref.codes.view(torch.uint8), f"{act} codes (one buffer)")
        flat = raw[quant.scales_offset :].view(torch.float32).reshape(scales.shape)
        assert_bit_exact(flat[:, :m].t() if scales_rows else flat, ref_scales, f"{act} scales (one buffer)")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 16, 64])
def test_values_are_the_codes_e4m3_values(dtype, m):
    """The fp8-values route: each code's e4m3 value in x's dtype, exactly."""
    k = 4096
    x = _inputs(m, k, dtype, 0).cuda()
    ref = humming.quantize_activation(x.cpu(), "fp8")
    quant = act_quant.quantize_pass(x, "fp8", values=True)
    assert isinstance(quant, act_quant.CudaQuantizePass)
    _poisoned_allocations(4 * m * k)
    values, scales, _ = quant(x)
    assert values.dtype == dtype
    assert_bit_exact(values.cpu(), ref.codes.view(torch.float8_e4m3fn).to(dtype), "values")
    assert_bit_exact(scales.cpu(), ref.scales.float().reshape(m, 1), "scales")


@pytest.mark.gpu
def test_unaligned_x_goes_through_the_triton_pass():
    k = 1024
    base = torch.randn(3 * k + 4, device="cuda", dtype=torch.bfloat16)
    x = base[4:].view(3, k)[:, :]  # 8-byte aligned rows
    quant = act_quant.quantize_pass(base[: 3 * k].view(3, k), "fp8")
    assert isinstance(quant, act_quant.CudaQuantizePass) and x.data_ptr() % 16
    codes, scales, _ = quant(x)
    ref = humming.quantize_activation(x.cpu(), "fp8")
    assert_bit_exact(codes.cpu(), ref.codes.view(torch.uint8), "codes")
    assert_bit_exact(scales.cpu(), ref.scales.float(), "scales")
