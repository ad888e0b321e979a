"""Triton activation quantization: bit-exact (codes, scales, global scale) with humming.quantize_activation.

Runs under the interpreter on CPU (tests/conftest.py); the ``gpu`` test repeats the table at realistic
shapes on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import triton
import triton.language as tl
from helpers import assert_bit_exact

import humming
from humming.triton_kernels._act_quant_kernel import _encode_rne, _settled_quotient
from humming.triton_kernels.act_quant import (
    element_spec,
    quantize_activation,
    quantize_activation_values,
    quantize_pass,
    unsupported,
)


@dataclass(frozen=True)
class Case:
    act: str
    dtype: torch.dtype
    m: int
    k: int

    def __str__(self) -> str:
        return f"{self.act}-{str(self.dtype)[6:]}-{self.m}x{self.k}"


_SHAPES = ((1, 128), (5, 200), (16, 256), (3, 48))
CASES = [
    Case(act, dtype, m, k)
    for act in humming.ACT_SCHEMES
    for dtype in (torch.float16, torch.bfloat16)
    for m, k in _SHAPES
] + [Case(act, torch.float32, 7, 96) for act in humming.ACT_SCHEMES]


def _inputs(case: Case, device: str) -> torch.Tensor:
    """Rows of different magnitudes (1e-3 .. 1e3), one all-zero row, one row of tiny values."""
    x = torch.randn(case.m, case.k, dtype=torch.float64) * 10.0 ** torch.randint(-3, 4, (case.m, 1))
    if case.m > 2:
        x[1] = 0.0
        x[2] *= 1e-4
    return x.to(case.dtype).to(device)


def _assert_same(got: humming.QuantizedActivation, ref: humming.QuantizedActivation, what: str) -> None:
    assert_bit_exact(got.scales, ref.scales, f"{what} scales")
    assert_bit_exact(got.codes, ref.codes, f"{what} codes")
    if ref.global_scale is None:
        assert got.global_scale is None, what
    else:
        assert torch.equal(got.global_scale, ref.global_scale), what


@pytest.mark.parametrize("case", CASES, ids=str)
def test_act_quant_bit_exact(case, seed, device):
    x = _inputs(case, device)
    _assert_same(quantize_activation(x, case.act), humming.quantize_activation(x, case.act), f"{case} seed={seed}")


@pytest.mark.parametrize("case", [c for c in CASES if c.act in ("fp8", "fp8_tensor")], ids=str)
def test_act_quant_values_are_the_codes_values(case, seed, device):
    """quantize_activation_values: each e4m3 code's value in x's 16-bit dtype (bf16 for fp32 x), bit for bit,
    and the same scales as the codes."""
    x = _inputs(case, device)
    values, scales = quantize_activation_values(x, case.act)
    ref = humming.quantize_activation(x, case.act)
    want_dtype = case.dtype if case.dtype != torch.float32 else torch.bfloat16
    want = ref.codes.view(torch.float8_e4m3fn).to(want_dtype)
    assert values.dtype == want_dtype and torch.equal(values.view(torch.int16), want.view(torch.int16)), str(case)
    assert torch.equal(scales, ref.scales), str(case)


def _non_finite(dtype: torch.dtype, device: str) -> torch.Tensor:
    """Six rows of 96 (three 32-groups): NaN in row 1, +Inf in row 3, -Inf in row 4, row 5 all -Inf (a span
    whose absmax is then 0); rows 0 and 2 finite."""
    x = torch.randn(6, 96, dtype=torch.float64)
    x[1, 3], x[3, 40], x[4, 95], x[5] = float("nan"), float("inf"), float("-inf"), float("-inf")
    return x.to(dtype).to(device)


_NON_FINITE_ROWS = [False, True, False, True, True, True]


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # NaN arithmetic under the interpreter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("act", list(humming.ACT_SCHEMES))
def test_non_finite_activations_one_rule(act, dtype, device):
    """README, "Non-finite activations", as the quantizers hold it: a NaN or Inf element gets its format's NaN
    code (code 0 where the format has none), a per-token or per-group scale whose span holds one is NaN, and a
    per-tensor scale (and NVFP4's global scale) ignores them. The Triton pass and the reference agree bit for
    bit, and the dequantized rows that held one are NaN, the others finite: the row-only rule, but for
    int8_tensor, whose codes have no NaN (humming.linear marks those rows itself)."""
    x = _non_finite(dtype, device)
    ref = humming.quantize_activation(x, act)
    _assert_same(quantize_activation(x, act), ref, f"{act} {dtype}")
    # a scale over the whole tensor is the one it has without those values
    without = humming.quantize_activation(torch.where(torch.isfinite(x), x, torch.zeros_like(x)), act)
    if humming.ACT_SCHEMES[act].group == "tensor":
        assert_bit_exact(ref.scales, without.scales, f"{act} tensor scale")
    if ref.global_scale is not None:
        assert torch.equal(ref.global_scale, without.global_scale), act
    rows = (~torch.isfinite(humming.dequantize_activation(ref))).any(1).tolist()
    assert rows == ([False] * 6 if act == "int8_tensor" else _NON_FINITE_ROWS), f"{act}: non-finite rows {rows}"


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("act", ["fp8", "fp8_tensor", "int8", "int8_tensor", "fp8_g128"])
def test_non_finite_activations_static_scale(act, device):
    """With a static scale the same codes (NaN code or 0) on both backends; the scale stays as given."""
    x = _non_finite(torch.float16, device)
    scale = torch.tensor(0.01, device=device)
    ref = humming.quantize_activation(x, act, scale=scale)
    _assert_same(quantize_activation(x, act, scale=scale), ref, act)
    assert torch.isfinite(ref.scales).all(), act


def test_act_quant_values_refuse_other_schemes():
    with pytest.raises(ValueError, match="e4m3 schemes with float32 scales"):
        quantize_activation_values(torch.randn(2, 64), "int8")


@pytest.mark.parametrize("act", ["int8", "int4", "fp8", "fp8_e5m2"])
def test_static_scale_midpoints(act, seed, device):
    """float32 inputs placed on rounding midpoints of x / scale: the float32 quotient often lands exactly on
    the midpoint while the exact one does not, the case the kernel settles with the float64 residual."""
    fmt = humming.get_format(humming.ACT_SCHEMES[act].format)
    grid = fmt.value_table().unique().sort().values
    grid = grid[torch.isfinite(grid)]
    mids = (grid[1:] + grid[:-1]) / 2
    scale = torch.rand(()) + 0.5
    pick = mids[torch.randint(0, len(mids), (8, 64))]
    x = (pick.double() * scale.double()).float().to(device)
    got = quantize_activation(x, act, scale=scale)
    _assert_same(got, humming.quantize_activation(x, act, scale=scale), f"{act} seed={seed}")


@triton.jit
def _quotient_probe(x_ptr, s_ptr, code_ptr, n, ELEMENT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    s = tl.load(s_ptr + offs, mask=offs < n, other=1.0)
    q = _settled_quotient(x, s, ELEMENT.INT, ELEMENT.BITS, ELEMENT.MBITS, ELEMENT.BIAS, ELEMENT.MAXV)
    code = _encode_rne(q, ELEMENT.INT, ELEMENT.BITS, ELEMENT.MBITS, ELEMENT.BIAS, ELEMENT.MAXV)
    tl.store(code_ptr + offs, code, mask=offs < n)


def _ulp_steps(values: torch.Tensor, steps: int) -> torch.Tensor:
    """``values`` (float32) and their neighbours up to ``steps`` float32 ulps away on either side."""
    bits = values.view(torch.int32)
    return torch.stack([(bits + d).view(torch.float32) for d in range(-steps, steps + 1)], dim=-1)


@pytest.mark.parametrize("fmt_name", ["int8", "int4", "e4m3", "e5m2", "e2m1"])
@pytest.mark.parametrize("scale_range", [(0.5, 2.0), (1e-30, 1e-25), (1e-44, 1e-40), (1e25, 1e30)])
def test_quotient_rounds_as_the_exact_division(fmt_name, scale_range, seed, device):
    """The per-element arithmetic of float32 scales (``_settled_quotient`` then ``_encode_rne``, no division
    and no float64 per element) gives ``NumberFormat.encode`` of the float64 quotient ``x / s``: inputs at
    and around (4 float32 ulps each way) every grid point and every midpoint times the scale, both signs,
    past saturation, for scales near 1, tiny, subnormal and huge."""
    fmt = humming.get_format(fmt_name)
    grid = fmt.value_table().unique().sort().values
    grid = grid[torch.isfinite(grid) & (grid >= 0)].double()
    points = torch.cat([grid, (grid[1:] + grid[:-1]) / 2, torch.tensor([fmt.max_value * 1.01, fmt.max_value * 4])])
    lo, hi = scale_range
    scales = (lo * (hi / lo) ** torch.rand(points.shape[0], dtype=torch.float64)).float()
    x = _ulp_steps((points * scales.double()).float(), 4)
    s = scales[:, None].expand_as(x)
    keep = torch.isfinite(x) & (x.abs() > 0)
    x, s = torch.cat([x[keep], -x[keep]]), torch.cat([s[keep], s[keep]])
    want = fmt.encode(x.double() / s.double())
    codes = torch.empty(x.shape, dtype=torch.int32, device=device)
    _quotient_probe[(triton.cdiv(x.numel(), 1024),)](
        x.to(device), s.to(device), codes, x.numel(), element_spec(fmt), 1024
    )
    assert_bit_exact(codes.to(torch.uint8), want.to(device), f"{fmt_name} scales {scale_range} seed={seed}")


@pytest.mark.parametrize("act", ["fp8", "fp8_g128", "int8_tensor", "mxfp4"])
def test_pass_is_made_once_per_call_shape(act, seed, device):
    """quantize_pass works a call shape out once (the same object for x of the same dtype, shape and strides,
    another for another shape) and each call quantizes its own x, bit-exact."""
    x = torch.randn(5, 256, device=device).bfloat16()
    quant = quantize_pass(x, act)
    assert quantize_pass(x.clone(), act) is quant and quantize_pass(x[:4], act) is not quant
    for _ in range(2):
        x = torch.randn(5, 256, device=device).bfloat16()
        codes, scales, _ = quant(x)
        ref = humming.quantize_activation(x, act)
        assert torch.equal(codes, ref.codes) and torch.equal(scales, ref.scales.view(scales.dtype)), f"seed={seed}"


@pytest.mark.parametrize("act,m", [("fp8_g128", 1), ("fp8_g128", 16), ("fp8", 3)])
def test_pass_writes_transposed_scales(act, m, seed, device):
    """scales_rows: the scales of span j of row r at [j, r] of a [spans, scales_rows] row-major tensor (the
    CUDA FP8 GEMM's 1x128 layout, rows padded to its token tile); the codes as they are."""
    x = torch.randn(m, 384, device=device).bfloat16()
    codes, scales, _ = quantize_pass(x, act, scales_rows=m + 7)(x)
    ref = humming.quantize_activation(x, act)
    assert scales.shape == (ref.scales.shape[1], m + 7) and scales.is_contiguous()
    assert torch.equal(scales[:, :m].T, ref.scales) and torch.equal(codes, ref.codes), f"seed={seed}"
    with pytest.raises(ValueError, match="scales_rows"):
        quantize_pass(torch.zeros(m + 1, 384, dtype=torch.bfloat16, device=device), act, scales_rows=m)


def test_supports_reasons():
    x = torch.zeros(4, 32, dtype=torch.float16)
    assert unsupported(x, "fp8") is None
    assert "2-D" in unsupported(x[None], "fp8")
    with pytest.raises(ValueError, match="2-D"):
        quantize_activation(x.reshape(-1), "int8")


@pytest.mark.gpu
@pytest.mark.parametrize("act", list(humming.ACT_SCHEMES))
@pytest.mark.parametrize("m,k", [(1, 8192), (333, 4096), (4096, 7168)])
def test_act_quant_bit_exact_gpu(act, m, k, seed):
    x = (torch.randn(m, k, device="cuda") * 10.0 ** torch.randint(-3, 4, (m, 1), device="cuda")).bfloat16()
    _assert_same(quantize_activation(x, act), humming.quantize_activation(x, act), f"{act} {m}x{k} seed={seed}")


@pytest.mark.gpu
@pytest.mark.parametrize("act", list(humming.ACT_SCHEMES))
def test_act_quant_repeated_calls_gpu(act, seed):
    """Calls after the first of a launch key go to the compiled kernel directly (humming.triton_kernels._launch):
    fresh inputs each time, a misaligned view among them (another key), all bit-exact."""
    buf = torch.empty(16, 2056, device="cuda", dtype=torch.bfloat16)
    for x in [torch.randn(16, 2048, device="cuda").bfloat16() for _ in range(3)] + [buf[:, 1:2049], buf[:, 1:2049]]:
        x.copy_(torch.randn(16, 2048, device="cuda") * 10.0 ** torch.randint(-3, 4, (16, 1), device="cuda"))
        _assert_same(quantize_activation(x, act), humming.quantize_activation(x, act), f"{act} seed={seed}")


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["fp8", "int8_tensor", "mxfp4"])
def test_act_quant_past_2_31_elements(act: str) -> None:
    """M * K > 2^31: row offsets must not wrap in int32 (a wrapped offset reads or writes out of bounds).
    A few rows, first and last included, are compared with the reference quantizer."""
    m, k = 2**31 // 4096 + 64, 4096
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    got = quantize_activation(x, act)
    rows = torch.tensor([0, 1, m // 2, m - 2, m - 1], device="cuda")
    if humming.ACT_SCHEMES[act].group == "tensor":  # the scale depends on the tensor's absmax alone
        amax = x.abs().amax().reshape(1, 1)
        assert torch.equal(got.scales, humming.quantize_activation(amax, act).scales)
        ref = humming.quantize_activation(x[rows], act, scale=got.scales)
        assert torch.equal(got.codes[rows], ref.codes)
    else:
        ref = humming.quantize_activation(x[rows], act)
        assert torch.equal(got.codes[rows], ref.codes) and torch.equal(got.scales[rows], ref.scales)
