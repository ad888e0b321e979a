"""Act-order weights (GPTQ ``desc_act``) with quantized activations on the dense Triton scaled GEMM.

- ``sort_act_order``: ``dequantize(sorted) == dequantize(qw)[:, perm]`` bit for bit.
- The Triton activation quantizer's column gather: bit-exact with ``humming.quantize_activation(x[:, perm])``.
- ``humming.linear(x, qw, act=...)`` on the Triton backend against a float64 matmul of the dequantized operands,
  activations quantized in the weight's group order (humming/ir/act_order.py). Tolerance as a fraction of
  ``|A| @ |W|^T`` (the size of the dot): 1e-6 (exact tensor-core operands; fp32 summation order only), plus
  one rounding of the output dtype.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import act_order_dequantized

import humming
from humming.dispatch.plan import explain
from humming.ir import pack_codes, unpacked_codes
from humming.ir.act_order import act_order_perm, sort_act_order
from humming.triton_kernels import scaled_mm
from humming.triton_kernels.act_quant import quantize_activation as triton_quantize_activation

_EPS = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def _gptq_weight(fmt: str, n: int, k: int, group: int, device: str = "cpu", **kwargs) -> humming.QuantizedWeight:
    """A GPTQ desc_act weight: columns in a random activation order, groups of ``group`` consecutive columns
    of that order (``g_idx[perm[j]] = j // group``)."""
    order = torch.randperm(k)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[order] = (torch.arange(k) // group).int()
    w = torch.randn(n, k) * torch.rand(n, 1)
    return humming.quantize(w.to(device), fmt, group_size=group, g_idx=g_idx.to(device), **kwargs)


@pytest.mark.parametrize("fmt,kwargs", [("int4", {}), ("uint4", {"zero_point": True}), ("int8", {})])
def test_sort_act_order_is_exact(fmt, kwargs, seed):
    qw = _gptq_weight(fmt, 24, 200, 64, **kwargs)
    sorted_qw, perm = sort_act_order(qw)
    assert sorted_qw.g_idx is None and sorted_qw.group_shape == (1, 64)
    assert torch.equal(perm, act_order_perm(qw))
    assert torch.equal(humming.dequantize(sorted_qw), humming.dequantize(qw)[:, perm]), f"seed={seed}"


def test_sort_act_order_refuses_uneven_groups(seed):
    g_idx = torch.randint(0, 4, (128,), dtype=torch.int32)  # groups of random sizes
    qw = humming.quantize(torch.randn(8, 128), "int4", group_size=32, g_idx=g_idx)
    assert "consecutive columns" in sort_act_order(qw)
    reason = scaled_mm.unsupported(qw, humming.ACT_SCHEMES["fp8"], torch.zeros(2, 128, dtype=torch.bfloat16))
    assert "consecutive columns" in reason
    with pytest.raises(ValueError, match="needs an act-order weight"):
        sort_act_order(humming.quantize(torch.randn(8, 128), "int4", group_size=32))


@pytest.mark.parametrize("act", ["fp8", "fp8_g128", "int8", "fp8_tensor", "mxfp4"])
@pytest.mark.parametrize("m,k", [(3, 256), (5, 200)])
def test_quantizer_gathers_columns(act, m, k, seed):
    x = torch.randn(m, k, dtype=torch.bfloat16) * 10.0 ** torch.randint(-2, 3, (m, 1))
    perm = torch.randperm(k).int()
    got = triton_quantize_activation(x, act, perm=perm)
    ref = humming.quantize_activation(x[:, perm.long()], act)
    assert torch.equal(got.codes, ref.codes), f"{act} seed={seed}"
    assert torch.equal(got.scales.view(torch.uint8), ref.scales.view(torch.uint8)), f"{act} seed={seed}"


def test_quantizer_perm_errors():
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="perm: expected an int32 tensor"):
        triton_quantize_activation(x, "fp8", perm=torch.arange(64))
    with pytest.raises(ValueError, match="perm: expected an int32 tensor"):
        triton_quantize_activation(x, "fp8", perm=torch.arange(32, dtype=torch.int32))


CASES = [  # weight format, its options, act
    ("int4", {"scale_dtype": torch.float16}, "fp8"),
    ("int4", {"scale_dtype": torch.float16}, "fp8_g128"),
    ("int4", {"scale_dtype": torch.float16}, "int8"),
    ("uint4", {"zero_point": True, "scale_dtype": torch.float16}, "int8"),
    ("int8", {"scale_dtype": torch.float16}, "fp8"),
    ("int8", {"scale_dtype": torch.float16}, "fp8_g128"),
    ("int8", {"scale_dtype": torch.float16}, "int8"),
]


@pytest.mark.parametrize("m,n,k", [(1, 40, 256), (6, 32, 384)], ids=lambda v: str(v))
@pytest.mark.parametrize("fmt,kwargs,act", CASES, ids=lambda v: str(v))
def test_linear_act_order(fmt, kwargs, act, m, n, k, seed, device):
    qw = _gptq_weight(fmt, n, k, 128, device, **kwargs)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    bias = torch.randn(n, device=device)
    out_dtype = torch.float32 if m == 1 else torch.bfloat16
    plan = explain(qw, m, act, backend="triton")
    assert plan.kernel == "triton.scaled_mm", plan
    if device == "cuda":
        assert explain(qw, m, act).kernel == "triton.scaled_mm"  # auto: no CUDA kernel takes act-order
    y = humming.linear(x, qw, bias, act=act, out_dtype=out_dtype, backend="triton")
    assert y.shape == (m, n) and y.dtype == out_dtype and not torch.isnan(y).any()

    a = act_order_dequantized(x, act, act_order_perm(qw))
    w = humming.dequantize(qw, torch.float64)
    ref, size = a @ w.T + bias.double(), a.abs() @ w.abs().T
    err = (y.double() - ref).abs()
    allowed = 1e-6 * size + _EPS[out_dtype] * ref.abs() + 1e-30
    i, j = divmod(int(torch.argmax(err / allowed)), n)
    assert bool((err <= allowed).all()), f"seed {seed}: worst (m={i}, n={j}) {y[i, j].item()} vs {ref[i, j].item()}"
    # the reference backend follows the same definition (groups of the activations in the weight's order)
    y_ref = humming.linear(x, qw, bias, act=act, out_dtype=torch.float32, backend="reference")
    assert float((y_ref.double() - ref).norm() / ref.norm()) < 1e-6


@pytest.mark.parametrize("act", ["fp8", "int8"])
def test_prequantized_per_token_codes_are_gathered(act, seed):
    """A QuantizedActivation (per-token scales, x's column order) runs with its codes gathered by the weight's
    order; groups along K quantized in x's order cannot, and say so."""
    qw = _gptq_weight("int4", 32, 256, 128, scale_dtype=torch.float16)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    qa = humming.quantize_activation(x, act)
    y = humming.linear(qa, qw, out_dtype=torch.float32, backend="triton")
    ref = humming.dequantize_activation(qa, torch.float64) @ humming.dequantize(qw, torch.float64).T
    assert not torch.isnan(y).any() and float((y.double() - ref).norm() / ref.norm()) < 1e-6, f"seed={seed}"
    grouped = humming.quantize_activation(x, "fp8_g128")
    assert "groups along K of x's column order" in scaled_mm.unsupported(qw, grouped.scheme, grouped.codes)
    y = humming.linear(grouped, qw, out_dtype=torch.float32)  # the reference (CPU, auto)
    ref = humming.dequantize_activation(grouped, torch.float64) @ humming.dequantize(qw, torch.float64).T
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-6


def test_prepare_sorts_once(seed):
    qw = _gptq_weight("int4", 16, 256, 128)
    prepared = humming.prepare(qw, backend="triton", act="fp8")
    assert prepared.g_idx is None and humming.prepare(qw, backend="triton", act="fp8") is prepared
    assert humming.prepare(qw, backend="triton") is qw  # WnA16 reads g_idx in place


def test_real_gptq_weight_in_desc_act_layout(seed):
    """AutoGPTQ's own codes and scales (tests/data, desc_act=False) with their columns scattered into a desc_act
    layout (``g_idx[perm[j]] = j // 128``): the Triton route against the producer's reference dequantization."""
    from safetensors.torch import load_file

    folder = Path(__file__).parent / "data" / "checkpoints" / "autogptq_w4_g128_sym"
    name = "model.layers.0.self_attn.k_proj"
    qw = humming.load_checkpoint(folder, modules=[name])[name]
    w_ref = load_file(str(folder / "reference.safetensors"))[f"{name}.weight"].double()  # [96, 256]
    k = qw.K
    perm = torch.randperm(k)
    codes = torch.empty_like(unpacked_codes(qw))
    codes[:, perm] = unpacked_codes(qw)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k) // 128).int()
    act_order = qw.replace(qweight=pack_codes(codes, qw.bits), g_idx=g_idx)
    assert torch.equal(humming.dequantize(act_order)[:, perm], humming.dequantize(qw))
    x = torch.randn(3, k, dtype=torch.float16)
    for act in ("fp8", "fp8_g128", "int8"):
        y = humming.linear(x, act_order, act=act, out_dtype=torch.float32, backend="triton")
        a = act_order_dequantized(x, act, act_order_perm(act_order))
        ref = a @ w_ref[:, torch.argsort(perm)].T
        assert not torch.isnan(y).any()
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-3, f"{act} seed={seed}"  # fp16 reference weights
