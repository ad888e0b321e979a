"""fp8 activations through the CUDA WnA16 kernels: ``linear(x, int_weight, act="fp8" | "fp8_tensor")``
quantizes x to e4m3 values held exactly in x's 16-bit dtype and runs the decode kernel / sm_90a GEMM with
the activation scales in the epilogue (the kernels' ``unsupported`` say when)."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_rel_close, backend_unsupported

import humming
from humming.cuda_kernels import _gemm_sm90, fp8_gemm, wna16_decode, wna16_sm90
from humming.cuda_kernels._layout import prepare_weight, x_scale_args
from humming.cuda_kernels._wna16 import wna8_weight_unsupported
from humming.ir.activation import dequantize_activation, get_act_scheme, quantize_activation
from humming.triton_kernels.act_quant import quantize_activation_values

WEIGHTS = {
    "int4-g128": dict(weight="int4", group_size=128),
    "int4-channel": dict(weight="int4", group_size=-1),
    "uint4-g128-zp": dict(weight="uint4", group_size=128, zero_point=True),
    "int8-channel": dict(weight="int8", group_size=-1),
    "mxfp4": dict(weight="mxfp4"),
}


def test_scheme_and_weight_checks_say_why():
    int4 = humming.quantize(torch.randn(256, 256), weight="int4", group_size=128)
    mx = humming.quantize(torch.randn(256, 256), weight="mxfp4")
    e4m3 = humming.quantize(torch.randn(256, 256), weight="fp8")
    check = wna8_weight_unsupported
    assert check(int4, get_act_scheme("fp8")) is None and check(int4, get_act_scheme("fp8_tensor")) is None
    assert "per-token or per-tensor e4m3" in check(int4, get_act_scheme("fp8_g128"))
    assert "per-token or per-tensor e4m3" in check(int4, get_act_scheme("int8"))
    assert check(mx, get_act_scheme("fp8")) is None and check(mx, get_act_scheme("fp8_tensor")) is None
    assert "integer or MXFP4 weights, not e4m3" in check(e4m3, get_act_scheme("fp8"))
    x32 = torch.empty(4, 256)
    reason = wna16_decode.unsupported(int4, get_act_scheme("fp8"), x32)
    assert "as bfloat16 / float16 x" in reason


def test_x_scale_args_take_per_token_or_per_tensor_scales():
    assert x_scale_args(None, 5) == (None, 0)
    per_token = torch.ones(5, 1)
    assert x_scale_args(per_token, 5) == (per_token.data_ptr(), 1)
    one = torch.ones(1, 1)
    assert x_scale_args(one, 5) == (one.data_ptr(), 0) and x_scale_args(one, 1) == (one.data_ptr(), 0)
    with pytest.raises(ValueError, match="x_scale: expected a contiguous float32"):
        x_scale_args(torch.ones(3), 5)
    with pytest.raises(ValueError, match="x_scale: expected a contiguous float32"):
        x_scale_args(torch.ones(5, dtype=torch.float16), 5)


def _reference(x, qw, act, bias):
    xq = dequantize_activation(quantize_activation(x, act)).double()
    ref = xq @ humming.dequantize(qw, torch.float64).T
    return ref if bias is None else ref + bias.double()


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["fp8", "fp8_tensor"])
@pytest.mark.parametrize("scheme", list(WEIGHTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_runs_the_wna16_kernels_on_e4m3_values(act, scheme, dtype, seed, monkeypatch):
    """Against float64 (quantized activations times dequantized weights), M from 1 to 300 (decode, its
    stream-K and split-K schedules, the sm_90a GEMM), with and without bias; the FP8 GEMM is not called."""

    def no_fp8_gemm(*args, **kwargs):
        raise AssertionError("the FP8 GEMM ran")

    monkeypatch.setattr(fp8_gemm, "run", no_fp8_gemm)
    n, k = 512, 1024
    qw = humming.quantize(torch.randn(n, k, device="cuda") * 0.05, **WEIGHTS[scheme])
    bias = torch.randn(n, device="cuda", dtype=dtype)
    # the sm_90a GEMM (M > 64 here) takes MXFP4 weights with bfloat16 x only
    sm90_gemm = torch.cuda.get_device_capability() == (9, 0) and (scheme, dtype) != ("mxfp4", torch.float16)
    for m in (1, 5, 16, 33, 64) + ((100, 300) if sm90_gemm else ()):
        x = torch.randn(m, k, device="cuda", dtype=dtype) * torch.rand(m, 1, device="cuda", dtype=dtype) * 4
        for b in (None, bias):
            assert backend_unsupported(qw, get_act_scheme(act), x, "cuda") is None
            out = humming.linear(x, qw, b, act=act, backend="cuda")
            assert_rel_close(out, _reference(x, qw, act, b), precision=torch.float64)


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["fp8", "fp8_tensor"])
def test_kernels_scale_poisoned_outputs(act, seed):
    """run_decode (tile grid, split-K, stream-K) and run_gemm with x_scale write every element of a
    NaN-poisoned output, float32 and bf16."""
    qw = humming.quantize(torch.randn(48 * 16, 2048, device="cuda"), weight="int4", group_size=128)
    prep = prepare_weight(qw)
    tunings = [None, wna16_decode.DecodeTuning(1, 1, 8, 3, 4), wna16_decode.DecodeTuning(2, 2, 8, 3, 1, 2)]
    for m, tuning in [(3, tunings[0]), (7, tunings[1]), (13, tunings[2])]:
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        values, scales = quantize_activation_values(x, act)
        for out_dtype in (torch.float32, torch.bfloat16):
            out = torch.full((m, qw.N), float("nan"), device="cuda", dtype=out_dtype)
            if tuning is not None and tuning.stream_k:
                wna16_decode.reserve_workspace(m, qw.N, tuning, torch.cuda.current_device())
            wna16_decode.run_decode(prep, values, None, out_dtype, tuning, out, x_scale=scales)
            assert_rel_close(out, _reference(x, qw, act, None), precision=torch.float64)
    if torch.cuda.get_device_capability() == (9, 0):
        x = torch.randn(200, 2048, device="cuda", dtype=torch.bfloat16)
        values, scales = quantize_activation_values(x, act)
        out = torch.full((200, qw.N), float("nan"), device="cuda", dtype=torch.float32)
        _gemm_sm90.run_gemm(prep, values, None, torch.float32, out=out, x_scale=scales)
        assert_rel_close(out, _reference(x, qw, act, None), precision=torch.float64)


@pytest.mark.gpu
def test_shapes_outside_the_wna16_kernels_keep_the_fp8_gemm(seed):
    """N % 16 != 0 at M > 64 has no WnA16 kernel: the FP8 GEMM runs it (on Hopper), still correct."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the FP8 GEMM is sm_90a")
    qw = humming.quantize(torch.randn(328, 512, device="cuda"), weight="int4", group_size=128)
    x = torch.randn(100, 512, device="cuda", dtype=torch.bfloat16)
    act = get_act_scheme("fp8")
    assert "N % 16" in wna16_sm90.unsupported(qw, act, x)
    assert humming.explain(qw, 100, act="fp8").kernel == "cuda.fp8_gemm"
    assert_rel_close(
        humming.linear(x, qw, act="fp8", backend="cuda"), _reference(x, qw, "fp8", None), precision=torch.float64
    )
