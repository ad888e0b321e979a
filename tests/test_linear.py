"""``humming.linear`` on the reference backend, activation quantization, and every input error."""

from __future__ import annotations

import pytest
import torch
from helpers import backend_unsupported, rel_err

import humming
from humming.ir.activation import ACT_SCHEMES, dequantize_activation, quantize_activation

# ------------------------------------------------------------------------------ activation quantization


@pytest.mark.parametrize("name", sorted(ACT_SCHEMES))
def test_activation_quantization(name, seed):
    scheme = ACT_SCHEMES[name]
    x = torch.randn(5, 96, dtype=torch.bfloat16) * 3
    qa = quantize_activation(x, name)
    assert qa.codes.dtype == torch.uint8 and qa.codes.shape == (5, 96)
    gm, gk = qa.scales.shape
    bn, bk = scheme.group_shape
    assert gm == (1 if bn == -1 else 5) and gk == (1 if bk == -1 else -(-96 // bk))
    xq = dequantize_activation(qa)
    bound = {8: 0.07, 6: 0.1, 4: 0.2}[scheme.element_format.bits]
    assert rel_err(xq, x.float()) < bound
    if scheme.element_format.torch_dtype is not None:
        assert qa.data().dtype == scheme.element_format.torch_dtype


def test_per_token_scales_are_amax_over_qmax(seed):
    x = torch.randn(4, 64)
    qa = quantize_activation(x, "fp8")
    assert torch.allclose(qa.scales, x.abs().amax(-1, keepdim=True) / 448, rtol=1e-6, atol=0)
    qa = quantize_activation(x, "int8")
    assert bool((qa.scales.double() >= x.double().abs().amax(-1, keepdim=True) / 127).all())
    assert torch.equal(qa.data(), qa.codes.view(torch.int8))


def test_static_scale(seed):
    x = torch.randn(3, 32)
    qa = quantize_activation(x, "fp8_tensor", scale=torch.tensor(0.01))
    assert qa.scales.shape == (1, 1)
    expected = (x / 0.01).to(torch.float8_e4m3fn).float() * torch.tensor(0.01)
    assert torch.equal(dequantize_activation(qa), expected)


# ----------------------------------------------------------------------------------------- reference

LINEAR_CASES = [
    ("int4", dict(group_size=32), None),
    ("int4", dict(group_size=32, zero_point=True), None),
    ("int3", dict(group_size=-1), None),
    ("nf4", dict(group_size=64), None),
    ("e4m3", dict(group_size=-1), None),
    ("mxfp4", dict(), None),
    ("int8", dict(group_size=-1), "int8"),
    ("int4", dict(group_size=-1), "int8"),
    ("e4m3", dict(group_size=-1), "fp8"),
    ("fp8_block", dict(group_size=(32, 32)), "fp8_g128"),
    ("int4", dict(group_size=32), "fp8"),
    ("mxfp4", dict(), "fp8"),
    ("int4", dict(group_size=-1), "int4"),
    ("nvfp4", dict(), "nvfp4"),
    ("mxfp4", dict(), "mxfp4"),
]


@pytest.mark.parametrize("weight,kwargs,act", LINEAR_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_linear(weight, kwargs, act, dtype, seed):
    w = torch.randn(48, 256)
    qw = humming.quantize(w, weight, **kwargs)
    x = torch.randn(2, 3, 256, dtype=dtype)
    bias = torch.randn(48, dtype=dtype)
    out = humming.linear(x, qw, bias, act=act)
    assert out.shape == (2, 3, 48) and out.dtype == dtype
    xf = x.double().reshape(-1, 256)
    if act is not None:
        xf = dequantize_activation(quantize_activation(x.reshape(-1, 256), act)).double()
    ref = (xf @ humming.dequantize(qw, torch.float64).T + bias.double()).reshape(2, 3, 48)
    assert rel_err(out, ref) < 1e-2  # one rounding of the output to 16 bits
    assert rel_err(out, x.double() @ w.double().T + bias.double()) < 0.35  # quantization error


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_strided_bias(backend, seed):
    """A bias view with stride 2 is read through its stride (a kernel reading it as contiguous adds the wrong
    elements)."""
    qw = humming.quantize(torch.randn(48, 256), "int4", group_size=64)
    x = torch.randn(3, 256, dtype=torch.float16)
    bias = torch.randn(96, dtype=torch.float16)[::2]
    out = humming.linear(x, qw, bias, backend=backend)
    ref = x.double() @ humming.dequantize(qw, torch.float64).T + bias.double()
    assert rel_err(out, ref) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize(("weight", "act"), [("int4", None), ("mxfp4", None), ("e4m3", "fp8"), ("int4", "fp8")])
@pytest.mark.parametrize("m", [2, 100])
def test_strided_bias_on_gpu(weight, act, m, seed):
    group = {"int4": dict(group_size=128), "e4m3": dict(group_size=-1), "mxfp4": {}}[weight]
    qw = humming.quantize(torch.randn(256, 512, device="cuda"), weight, **group)
    x = torch.randn(m, 512, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(512, dtype=torch.bfloat16, device="cuda")[::2]
    out = humming.linear(x, qw, bias, act=act)
    xf = x.double() if act is None else dequantize_activation(quantize_activation(x, act)).double()
    ref = xf @ humming.dequantize(qw, torch.float64).T + bias.double()
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("backend", ["auto", "reference", "triton"])
@pytest.mark.parametrize("act", [None, "fp8"])
def test_empty_batch_returns_an_empty_output(backend, act):
    qw = humming.quantize(torch.randn(48, 256), "int4", group_size=64)
    out = humming.linear(torch.empty(2, 0, 256, dtype=torch.bfloat16), qw, backend=backend, act=act)
    assert out.shape == (2, 0, 48) and out.dtype == torch.bfloat16


def test_quantize_activation_names_a_bad_x():
    for x in (torch.empty(0, 256), torch.randn(2, 3, 256)):
        with pytest.raises(ValueError, match=r"x: expected a non-empty \[M, K\]"):
            quantize_activation(x, "fp8")
    rows = humming.ir.pack_codes(torch.zeros(0, 64, dtype=torch.uint8), 4)  # no rows: no words, no error
    assert rows.shape == (0, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("act", [None, "fp8"])
def test_empty_batch_on_gpu(act):
    qw = humming.quantize(torch.randn(256, 512, device="cuda"), "int4", group_size=128)
    out = humming.linear(torch.empty(0, 512, dtype=torch.bfloat16, device="cuda"), qw, act=act, backend="cuda")
    assert out.shape == (0, 256) and out.device.type == "cuda"


def test_prequantized_activations_and_out_dtype(seed):
    qw = humming.quantize(torch.randn(32, 64), "e4m3", group_size=-1)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    qa = quantize_activation(x, "fp8")
    a = humming.linear(qa, qw, out_dtype=torch.float32)
    b = humming.linear(x, qw, act="fp8", out_dtype=torch.float32)
    assert a.dtype == torch.float32 and torch.equal(a, b)


def test_backend_env_override(monkeypatch, seed):
    qw = humming.quantize(torch.randn(16, 64), "int4", group_size=32)
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    monkeypatch.setenv("HUMMING_BACKEND", "reference")
    ref = humming.linear(x, qw)
    monkeypatch.setenv("HUMMING_BACKEND", "bogus")
    with pytest.raises(ValueError, match="backend"):
        humming.linear(x, qw)
    monkeypatch.delenv("HUMMING_BACKEND")
    assert torch.equal(humming.linear(x, qw), ref)  # auto on CPU = reference


# -------------------------------------------------------------------------------------------- errors


@pytest.fixture
def qw():
    return humming.quantize(torch.randn(16, 64), "int4", group_size=32)


@pytest.mark.parametrize(
    "make_x,kwargs,match",
    [
        (lambda: torch.randn(2, 64, dtype=torch.float64), {}, "x: expected dtype"),
        (lambda: torch.randint(0, 3, (2, 64)), {}, "x: expected dtype"),
        (lambda: torch.randn(2, 63, dtype=torch.bfloat16), {}, "K=64"),
        (lambda: torch.tensor(1.0, dtype=torch.bfloat16), {}, "rank"),
        (lambda: torch.randn(64, 2, dtype=torch.bfloat16).t(), {}, "contiguous"),
        (lambda: torch.randn(2, 64, dtype=torch.bfloat16, device="meta"), {}, "is on meta"),
        (lambda: [[1.0] * 64], {}, "x: expected a torch.Tensor"),
        (lambda: torch.randn(2, 64, dtype=torch.bfloat16), dict(bias=torch.randn(15)), "bias"),
        (lambda: torch.randn(2, 64, dtype=torch.bfloat16), dict(out_dtype=torch.int8), "out_dtype"),
        (lambda: torch.randn(2, 64, dtype=torch.bfloat16), dict(act="int2"), "act: unknown"),
        (lambda: torch.randn(2, 64, dtype=torch.bfloat16), dict(backend="tpu"), "backend"),
    ],
)
def test_linear_errors(qw, make_x, kwargs, match):
    with pytest.raises(ValueError, match=match):
        humming.linear(make_x(), qw, **kwargs)


def test_unsupported_combination_lists_what_is_supported():
    qw = humming.quantize(torch.randn(16, 64), "nvfp4")
    with pytest.raises(ValueError, match=r"e2m1 with act=int8 is not supported\. Supported: .*act int8"):
        humming.linear(torch.randn(2, 64, dtype=torch.bfloat16), qw, act="int8")
    qw8 = humming.quantize(torch.randn(16, 64), "int8", group_size=-1)
    with pytest.raises(ValueError, match="not supported"):
        humming.linear(torch.randn(2, 64, dtype=torch.bfloat16), qw8, act="nvfp4")


def test_weight_errors():
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"qweight: expected a humming\.QuantizedWeight"):
        humming.linear(x, torch.randn(16, 64))
    moe = humming.quantize(torch.randn(2, 16, 64), "int4", group_size=32)
    with pytest.raises(ValueError, match="2-D weight"):
        humming.linear(x, moe)


# ------------------------------------------------------------------------------ non-finite activations
@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("act", sorted(ACT_SCHEMES))
def test_non_finite_rows_propagate(act, backend, seed):
    """A NaN or Inf in a row of ``x`` makes that output row non-finite (as a bf16 matmul does) and leaves
    every other row bit for bit as it is when the non-finite elements are zeros (README, "Non-finite")."""
    qw = humming.quantize(torch.randn(24, 64), "int4", group_size=32)
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    x[1, 5] = float("nan")
    x[3, 40] = float("inf")
    x[4, 0] = float("-inf")
    reason = backend_unsupported(qw, humming.ACT_SCHEMES[act], x, backend)
    if reason:
        pytest.skip(f"{backend}: {reason}")
    out = humming.linear(x, qw, act=act, backend=backend)
    clean = humming.linear(torch.where(torch.isfinite(x), x, 0), qw, act=act, backend=backend)
    bad = torch.tensor([False, True, False, True, True, False])
    assert not torch.isfinite(out[bad]).any(), "a row with NaN/Inf activations gave finite outputs"
    assert torch.equal(out[~bad], clean[~bad]), "rows without NaN/Inf changed"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "weight, act",
    [("int4", "fp8"), ("int4", "fp8_tensor"), ("e4m3", "fp8"), ("fp8_block", "fp8_g128"), ("int8", "int8")],
)
@pytest.mark.parametrize("m", [6, 100])
def test_non_finite_rows_propagate_on_the_gpu(weight, act, m, seed):
    """The same rule on whatever kernel ``auto`` picks on this GPU (the CUDA decode / FP8 GEMMs on Hopper):
    their epilogues carry the NaN scale of a non-finite row into it, other rows are unchanged."""
    group = {} if weight == "fp8_block" else dict(group_size=128 if weight == "int4" else -1)
    qw = humming.quantize(torch.randn(256, 512, device="cuda"), weight, **group)
    x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
    x[1, 5], x[3, 400], x[m - 1, 0] = float("nan"), float("inf"), float("-inf")
    out = humming.linear(x, qw, act=act)
    clean = humming.linear(torch.where(torch.isfinite(x), x, 0), qw, act=act)
    bad = torch.zeros(m, dtype=torch.bool, device="cuda")
    bad[[1, 3, m - 1]] = True
    assert not torch.isfinite(out[bad]).any(), f"{humming.explain(qw, m, act).kernel}: finite output rows"
    assert torch.equal(out[~bad], clean[~bad]), f"{humming.explain(qw, m, act).kernel}: other rows changed"
