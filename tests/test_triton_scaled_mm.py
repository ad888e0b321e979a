"""Triton scaled GEMM (W8A8, W4A8, W4A4) against a float64 matmul of the dequantized operands.

Reference: ``dequantize_activation(humming.quantize_activation(x, act)) @ dequantize(W)^T + bias`` in float64
(the operands are humming's own definitions; the activation quantizer is checked bit-exact separately).

Tolerances, as a fraction of ``|A| @ |W|^T`` (the size of the dot, so cancellation does not hide errors),
plus one rounding of the output dtype:
- exact tensor-core operands (int8 with int32 accumulation, e4m3, fp16/bf16 holding the values and folded
  scales exactly): 1e-6 (fp32 summation order only; int8 x int8 per-token x per-channel is ~1e-7);
- lookup-table weights (nf4) through fp16 operands: 1e-3 (their values round to fp16);
- on Hopper, fp8 tensor cores accumulate each K step with ~14 bits: 5e-4 for the e4m3 path on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

import humming
from humming.triton_kernels import scaled_mm
from humming.triton_kernels.act_quant import quantize_activation as triton_quantize_activation
from humming.triton_kernels.scaled_mm_configs import scaled_mm_config


@dataclass(frozen=True)
class Case:
    name: str
    weight: dict = field(hash=False)
    act: str

    def __str__(self) -> str:
        return f"{self.name}-{self.act}"

    def quantize(self, w: torch.Tensor) -> humming.QuantizedWeight:
        return humming.quantize(w, **self.weight)


CASES = [
    # W8A8
    Case("int8-channel", dict(weight="int8", group_size=-1, scale_dtype=torch.float32), "int8"),
    Case("int8-channel", dict(weight="int8", group_size=-1, scale_dtype=torch.float32), "int8_tensor"),
    Case("e4m3-channel", dict(weight="e4m3", group_size=-1, scale_dtype=torch.float32), "fp8"),
    Case("e4m3-tensor", dict(weight="e4m3", group_size="tensor", scale_dtype=torch.float32), "fp8_tensor"),
    Case("fp8-block128", dict(weight="fp8_block"), "fp8_g128"),
    Case("e4m3-channel", dict(weight="e4m3", group_size=-1, scale_dtype=torch.float32), "fp8_e5m2"),
    # W4A8
    Case("int4-g128-bf16", dict(weight="int4", group_size=128, scale_dtype=torch.bfloat16), "fp8"),
    Case("uint4-zp-g64", dict(weight="int4", group_size=64, zero_point=True, scale_dtype=torch.float16), "fp8"),
    Case("int4-g128-fp16", dict(weight="int4", group_size=128, scale_dtype=torch.float16), "int8"),
    Case("uint4-zp-channel", dict(weight="int4", group_size=-1, zero_point=True), "int8"),
    Case("mxfp4", dict(weight="mxfp4"), "fp8"),
    Case("mxfp4", dict(weight="mxfp4"), "fp8_g128"),
    Case("int4-g32-fp32", dict(weight="int4", group_size=32, scale_dtype=torch.float32), "fp8"),
    Case("int8-channel", dict(weight="int8", group_size=-1, scale_dtype=torch.float32), "fp8"),
    Case("nf4-g64", dict(weight="nf4", group_size=64, scale_dtype=torch.float16), "fp8"),
    Case("e3m2-mx", dict(weight="mxfp6_e3m2"), "fp8"),
    Case("int2-g128", dict(weight="int2", group_size=128, scale_dtype=torch.float16), "int8"),
    Case("mxfp4", dict(weight="mxfp4"), "mxfp8"),
    Case("nf4-g64", dict(weight="nf4", group_size=64, scale_dtype=torch.float16), "mxfp8"),
    Case("uint8-zp-channel", dict(weight="int8", group_size=-1, zero_point=True), "int8"),
    # W4A4
    Case("int4-channel", dict(weight="int4", group_size=-1, scale_dtype=torch.float32), "int4"),
    Case("int4-g128", dict(weight="int4", group_size=128, scale_dtype=torch.bfloat16), "int4"),
    Case("nvfp4", dict(weight="nvfp4"), "nvfp4"),
    Case("mxfp4", dict(weight="mxfp4"), "mxfp4"),
]
#: (M, N, K): one row, odd M/N/K (not multiples of tiles or groups), a full small tile.
SHAPES = [(1, 64, 256), (7, 40, 200), (16, 33, 96)]
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_EPS = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def _tolerance(qw: humming.QuantizedWeight, plan: scaled_mm.ComputePlan, on_gpu: bool) -> float:
    if qw.format.kind == "lut":
        return 1e-3
    if plan.mma == "e4m3" and on_gpu:
        return 5e-4
    return 1e-6


def _check(y, x, qw, bias, act, qa_ref, tol, what):
    a = humming.dequantize_activation(qa_ref, torch.float64)
    w = humming.dequantize(qw, torch.float64)
    ref = a @ w.T + (0 if bias is None else bias.double())
    size = a.abs() @ w.abs().T
    allowed = tol * size + _EPS[y.dtype] * ref.abs() + 1e-30
    err = (y.double() - ref).abs()
    assert not torch.isnan(y).any(), f"{what}: NaN in the output (unwritten elements?)"
    worst = torch.argmax(err / allowed)
    i, j = divmod(int(worst), y.shape[1])
    assert bool((err <= allowed).all()), (
        f"{what}: worst at (m={i}, n={j}): got {y[i, j].item():.6g}, want {ref[i, j].item():.6g}, "
        f"error {err[i, j].item():.3g} > allowed {allowed[i, j].item():.3g} (|A||W| = {size[i, j].item():.3g})"
    )


def _run(case: Case, m: int, n: int, k: int, device: str, seed: int, prequantized: bool = False):
    w = torch.randn(n, k, device=device) * torch.rand(n, 1, device=device)
    qw = case.quantize(w)
    x = (torch.randn(m, k, device=device) * 2).to(torch.bfloat16 if (m + n) % 2 else torch.float16)
    bias = torch.randn(n, device=device) if m % 2 else None
    out_dtype = _OUT_DTYPES[(m + k) % 3]
    scheme = humming.ACT_SCHEMES[case.act]
    reason = scaled_mm.unsupported(qw, scheme, x)
    assert reason is None, reason
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device=device)
    if prequantized:
        y = scaled_mm.linear(triton_quantize_activation(x, scheme), qw, bias, None, out_dtype, out=out)
    else:
        y = scaled_mm.linear(x, qw, bias, scheme, out_dtype, out=out)
    assert y.shape == (m, n) and y.dtype == out_dtype
    plan = scaled_mm.compute_plan(qw, scheme, scaled_mm.act_group_k(scheme), scaled_mm.device_capability(x.device))
    tol = _tolerance(qw, plan, x.device.type == "cuda")
    what = f"{case} {m}x{n}x{k} {plan} out={out_dtype} seed={seed}"
    _check(y, x, qw, bias, case.act, humming.quantize_activation(x, scheme), tol, what)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_scaled_mm(case, shape, seed, device):
    _run(case, *shape, device, seed)


@pytest.mark.parametrize("case", [c for c in CASES if c.act in ("fp8", "int8", "nvfp4")][:4], ids=str)
def test_scaled_mm_prequantized(case, seed, device):
    _run(case, 5, 48, 128, device, seed, prequantized=True)


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[7], CASES[-2]], ids=str)
def test_scaled_mm_split_k(case, seed, device):
    """Split-K (fp32 atomics into a workspace, bias and the output cast after) gives the same results."""
    m, n, k = 3, 40, 256
    qw = case.quantize(torch.randn(n, k, device=device))
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    bias = torch.randn(n, device=device)
    scheme = humming.ACT_SCHEMES[case.act]
    plan = scaled_mm.compute_plan(qw, scheme, scaled_mm.act_group_k(scheme), scaled_mm.device_capability(x.device))
    cfg = scaled_mm_config(m, n, k, plan.operand_bits, plan.k_step, qw.bits).replace(block_k=64, split_k=2)
    out = torch.full((m, n), float("nan"), dtype=torch.float16, device=device)
    y = scaled_mm.linear(x, qw, bias, scheme, torch.float16, config=cfg, out=out)
    tol = _tolerance(qw, plan, x.device.type == "cuda")
    _check(y, x, qw, bias, case.act, humming.quantize_activation(x, scheme), tol, f"{case} split-K seed={seed}")


def test_int8_exact_accumulation(seed, device):
    """int8 x int8 with int32 accumulation: within 1e-6 of an exact float64 result (K = 8192 on a GPU)."""
    k = 8192 if device == "cuda" else 256
    qw = humming.quantize(torch.randn(16, k, device=device), "int8", group_size=-1, scale_dtype=torch.float32)
    x = torch.randn(2, k, device=device, dtype=torch.bfloat16)
    y = scaled_mm.linear(x, qw, None, humming.ACT_SCHEMES["int8"], torch.float32)
    _check(y, x, qw, None, "int8", humming.quantize_activation(x, "int8"), 1e-6, f"int8 K={k} seed={seed}")


def test_humming_linear_dispatch(seed, device):
    """``humming.linear(..., act=..., backend="triton")`` reaches this kernel (3-D x, prequantized x)."""
    qw = humming.quantize(torch.randn(24, 128, device=device), "int4", group_size=64, scale_dtype=torch.float16)
    x = torch.randn(2, 3, 128, device=device, dtype=torch.bfloat16)
    y = humming.linear(x, qw, act="fp8", backend="triton")
    ref = humming.linear(x, qw, act="fp8", backend="reference")
    assert y.shape == (2, 3, 24) and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ref.float(), rtol=2**-7, atol=1e-5)
    qa = triton_quantize_activation(x.reshape(6, 128), "fp8")
    y = humming.linear(qa, qw, backend="triton", out_dtype=torch.float32)
    _check(y, x, qw, None, "fp8", humming.quantize_activation(x.reshape(6, 128), "fp8"), 1e-6, f"seed={seed}")


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # NaN arithmetic under the interpreter
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_fp8_nan_codes_make_their_row_and_column_nan(backend, seed, device):
    """An e4m3 NaN code (0x7F) in pre-quantized activations makes its output row NaN, one in an e4m3 weight its
    column, on every backend (the interpreter's fp8 dot decodes NaN codes too); the other outputs stay finite."""
    x = torch.randn(3, 64, device=device)
    qa = humming.quantize_activation(x, "fp8")
    codes = qa.codes.clone()
    codes[1, 3] = 0x7F
    qw = humming.quantize(torch.randn(16, 64, device=device), "e4m3", group_size=-1, scale_dtype=torch.float32)
    y = humming.linear(humming.QuantizedActivation(qa.scheme, codes, qa.scales), qw, backend=backend)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all(), f"{backend} seed={seed}"
    weight_codes = humming.ir.unpacked_codes(qw).clone()
    weight_codes[2, 5] = 0xFF
    w_nan = qw.replace(qweight=humming.ir.pack_codes(weight_codes, 8))
    y = humming.linear(x.half(), w_nan, act="fp8", backend=backend, out_dtype=torch.float32)
    assert torch.isnan(y[:, 2]).all() and torch.isfinite(y[:, [0, 1, *range(3, 16)]]).all(), f"{backend} seed={seed}"


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("act", ["fp8_tensor", "int8_tensor", "nvfp4"])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_one_nan_activation_makes_one_nan_row(act, backend, seed, device):
    """A tensor-wide scale ignores the NaN: only its row of the output is NaN, on every backend."""
    x = torch.randn(4, 64, device=device, dtype=torch.bfloat16)
    x[2, 9] = float("nan")
    qw = humming.quantize(torch.randn(16, 64, device=device), "int8" if act == "int8_tensor" else "int4", 32)
    y = humming.linear(x, qw, act=act, backend=backend)
    assert torch.isnan(y[2]).all() and torch.isfinite(y[[0, 1, 3]]).all(), f"{act} {backend} seed={seed}"


def _mx_spread(n: int, k: int, binades: int, device, seed: int) -> torch.Tensor:
    """A weight whose 32-column groups have largest magnitude 6 * 2^-s for s = 0 .. binades - 1 (e8m0 scales
    2^-s), every row spanning all of them."""
    g = torch.Generator().manual_seed(seed)
    shifts = torch.stack([torch.randperm(binades, generator=g) for _ in range(n)])
    shifts = shifts.repeat(1, -(-k // 32 // binades) + 1)[:, : -(-k // 32)]
    w = torch.rand(n, k, generator=g) * 12 - 6
    w[:, ::32] = 6.0
    return (w * torch.exp2(-shifts.float()).repeat_interleave(32, 1)[:, :k]).to(device)


@pytest.mark.parametrize("binades", [15, 16])
@pytest.mark.parametrize("act", ["fp8", "fp8_g128"])
def test_mxfp4_row_fold(act, binades, seed, device):
    """MXFP4 x fp8 on the fp8 MMA: each group's e8m0 scale relative to its row's top folds into the e4m3
    operand (down to e4m3's subnormals at 15 binades) and the row's scale applies at the end; rows spanning 16
    binades take the 16-bit fold instead. Exact either way (the tensor cores' operands hold the values)."""
    m, n, k = 5, 24, 32 * 20
    scheme = humming.ACT_SCHEMES[act]
    qw = humming.quantize(_mx_spread(n, k, binades, device, seed), "mxfp4")
    qw.qweight.view(torch.uint8)[3, :16] = 0  # row 3's first group all zeros, under a scale above the row's top
    qw.scales.view(torch.uint8)[3, 0] = 254
    if binades > 15:
        assert "span 16 binades" in scaled_mm.row_tops(qw)
    else:
        tops = scaled_mm.row_tops(qw)
        codes = qw.scales.view(torch.uint8).int()
        assert tops.shape == (n,) and tops[3] == codes[3, 1:].max() and tops[0] == codes[0].max()
    plan = scaled_mm.compute_plan(qw, scheme, scaled_mm.act_group_k(scheme), (9, 0))
    assert (plan.mma, plan.w_scale) == (("e4m3", "rowfold") if binades <= 15 else ("bf16", "fold"))
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    bias = torch.randn(n, device=device)
    out = torch.full((m, n), float("nan"), dtype=torch.float32, device=device)
    y = scaled_mm.linear(x, qw, bias, scheme, torch.float32, out=out)
    tol = _tolerance(qw, plan, x.device.type == "cuda")
    what = f"mxfp4 x {act}, {binades} binades, {plan} seed={seed}"
    _check(y, x, qw, bias, act, humming.quantize_activation(x, scheme), tol, what)


def test_unsupported_reasons():
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    fp8 = humming.ACT_SCHEMES["fp8"]
    g_idx = (torch.arange(64, dtype=torch.int32) % 3) // 2  # act-order groups of 43 and 21 columns
    qw = humming.quantize(torch.randn(8, 64), "int4", group_size=32, g_idx=g_idx)
    assert "g_idx" in scaled_mm.unsupported(qw, fp8, x)
    qw = humming.quantize(torch.randn(8, 64), "int4", group_size=32, zero_point="float")
    assert "float zero points" in scaled_mm.unsupported(qw, fp8, x)
    qw = humming.quantize(torch.randn(8, 64), "int4", group_size=32)
    assert "needs quantized activations" in scaled_mm.unsupported(qw, None, x)
    reason = scaled_mm.unsupported(qw, fp8, x.float())
    assert "float16 or bfloat16" in reason
    with pytest.raises(ValueError, match="supported: act int8"):
        scaled_mm.linear(x, qw, None, None, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 333, 4096])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_scaled_mm_gpu(case, m, seed):
    _run(case, m, 4096, 4096, "cuda", seed)


@pytest.mark.gpu
@pytest.mark.heavy_memory
@pytest.mark.parametrize("case", [c for c in CASES if c.act in ("fp8", "fp8_g128")][:3], ids=str)
def test_scaled_mm_gpu_large(case, seed):
    _run(case, 8192, 28672, 8192, "cuda", seed)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 200])
@pytest.mark.parametrize("case", [c for c in CASES if c.name in ("int4-g128-bf16", "uint4-zp-g64")], ids=str)
def test_packed_e4m3_decode_matches_the_fp32_decode(case, m, seed, monkeypatch):
    """W4A8 with the packed e4m3 decode (humming/triton_kernels/_decode_e4m3.py) against the fp32 decode, on two
    weights of the same values (a launch is made ready under the flag as it is at its first call): the operand
    tiles are bit-equal (tests/test_triton_packed_ptx.py), so the outputs may differ only by the order of the
    fp32 sums (2 ulps plus 2^-16 of ``|A| @ |W|^T``); a weight in a wrong column moves an output by about 2^-11
    of it. Both are checked against the float64 reference first."""
    from humming.triton_kernels import _decode_e4m3

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("the packed e4m3 decode needs sm_89 (cvt to e4m3x2)")
    w = torch.randn(1024, 2048, device="cuda")
    fast, plain = case.quantize(w), case.quantize(w)
    x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
    scheme = humming.ACT_SCHEMES[case.act]
    qa = humming.quantize_activation(x, scheme)
    capability = torch.cuda.get_device_capability()
    plan = scaled_mm.compute_plan(fast, scheme, scaled_mm.act_group_k(scheme), capability)
    assert _decode_e4m3.e4m3_ptx(fast, plan.mma, plan.w_scale, capability), "the case does not take the packed decode"
    outs = {}
    for flag, qw in (("1", fast), ("0", plain)):
        monkeypatch.setenv("HUMMING_TRITON_PACKED_DECODE", flag)
        out = torch.full((m, 1024), float("nan"), dtype=torch.bfloat16, device="cuda")
        scaled_mm.linear(qa, qw, None, None, torch.bfloat16, None, out)
        outs[flag] = out
    a = humming.dequantize_activation(qa, torch.float64)
    wd = humming.dequantize(plain, torch.float64)
    ref, magnitudes = a @ wd.T, a.abs() @ wd.abs().T
    for out in outs.values():
        assert not torch.isnan(out).any()
        assert bool(((out.double() - ref).abs() <= 5e-4 * magnitudes + 2.0**-8 * ref.abs()).all())
    ulp = 2.0**-8 * torch.maximum(outs["1"].abs(), outs["0"].abs()).double()
    excess = (outs["1"].double() - outs["0"].double()).abs() - (2 * ulp + magnitudes * 2**-16)
    worst = divmod(int(excess.argmax()), excess.shape[1])
    assert bool((excess <= 0).all()), f"{worst}: {outs['1'][worst].item()} vs {outs['0'][worst].item()}"
