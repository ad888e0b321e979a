"""RMSNorm + activation quantization (``humming.rmsnorm_quantize``): the Triton kernel bit-exact with the
reference composition ``quantize_activation(rmsnorm(x, w, eps, residual=...), act)`` (codes, scales and the new
residual); the reference ``rmsnorm`` against a float64 RMSNorm (two roundings to x's dtype: a relative error
of 2 * eps(dtype) per element); the custom op (opcheck, torch.compile with a dynamic M); bad inputs.

Runs under the interpreter on CPU (tests/conftest.py); the ``gpu`` test repeats the table at realistic shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import humming
from humming.reference.norm import rms_inverse
from humming.triton_kernels import norm_quant

_EPS = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


@dataclass(frozen=True)
class Case:
    act: str
    dtype: torch.dtype
    m: int
    k: int
    residual: bool

    def __str__(self) -> str:
        return f"{self.act}-{str(self.dtype)[6:]}-{self.m}x{self.k}{'-residual' if self.residual else ''}"


_ACTS = ("fp8", "int8", "int4", "fp8_e5m2", "fp8_g128", "mxfp4", "mxfp8")
CASES = (
    [Case(act, torch.bfloat16, 5, 200, True) for act in _ACTS]
    + [Case(act, torch.float16, 3, 256, False) for act in _ACTS]
    + [Case("fp8", torch.float32, 4, 96, True), Case("fp8_g128", torch.bfloat16, 2, 48, False)]
    + [Case("int8", torch.bfloat16, 1, 320, False), Case("mxfp4", torch.float32, 3, 64, True)]
)


def _inputs(case: Case, device: str):
    """Rows of different magnitudes (1e-3 .. 1e3), one all-zero row, one row of tiny values; a weight near 1."""
    x = torch.randn(case.m, case.k, dtype=torch.float64) * 10.0 ** torch.randint(-3, 4, (case.m, 1))
    if case.m > 2:
        x[1] = 0.0
        x[2] *= 1e-6
    w = torch.rand(case.k, dtype=torch.float64) + 0.5
    res = torch.randn(case.m, case.k, dtype=torch.float64) if case.residual else None
    to = lambda t: None if t is None else t.to(device=device, dtype=case.dtype)
    return to(x), to(w), to(res)


def _split(out, residual):
    return out if residual is not None else (out, None)


def _assert_same(got, ref, what: str) -> None:
    assert got.scales.dtype == ref.scales.dtype and got.scales.shape == ref.scales.shape, what
    bad = (got.scales.view(torch.uint8) != ref.scales.view(torch.uint8)).nonzero()
    assert bad.numel() == 0, f"{what}: {len(bad)} scale bytes differ, first at {bad[0].tolist()}"
    bad = (got.codes != ref.codes).nonzero()
    assert bad.numel() == 0, f"{what}: {len(bad)} codes differ, first at {bad[0].tolist()}"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_triton_bit_exact(case, seed, device):
    x, w, res = _inputs(case, device)
    got, got_res = _split(humming.rmsnorm_quantize(x, w, 1e-6, case.act, residual=res, backend="triton"), res)
    normed, summed = _split(humming.rmsnorm(x, w, 1e-6, residual=res), res)
    ref = humming.quantize_activation(normed, case.act)
    _assert_same(got, ref, f"{case} seed={seed}")
    if res is not None:
        assert torch.equal(got_res, summed), f"{case} seed={seed}: residual"


@pytest.mark.parametrize("act", ["fp8_tensor", "int8_tensor", "int8"])
def test_static_scale(act, seed, device):
    x, w, res = _inputs(Case(act, torch.bfloat16, 4, 128, True), device)
    scale = torch.tensor(0.01, device=device)
    got, _ = humming.rmsnorm_quantize(x, w, 1e-5, act, residual=res, scale=scale, backend="triton")
    normed, _ = humming.rmsnorm(x, w, 1e-5, residual=res)
    _assert_same(got, humming.quantize_activation(normed, act, scale=scale), f"{act} seed={seed}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rmsnorm_matches_float64(dtype, seed):
    """The definition against RMSNorm in float64: inv_rms within one float32 rounding, y within two roundings
    to x's dtype (after the normalization and after the weight)."""
    x = (torch.randn(6, 200, dtype=torch.float64) * 10.0 ** torch.randint(-3, 4, (6, 1))).to(dtype)
    w = (torch.rand(200, dtype=torch.float64) + 0.5).to(dtype)
    eps = 1e-6
    x64 = x.double()
    inv64 = 1 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + torch.tensor(eps, dtype=torch.float32).double())
    assert bool(((rms_inverse(x, eps).double() - inv64).abs() <= 2.0**-24 * inv64).all()), f"seed={seed}"
    y = humming.rmsnorm(x, w, eps)
    assert y.dtype == dtype and y.shape == x.shape
    ref = x64 * inv64 * w.double()
    bound = 2.5 * _EPS[dtype] * ref.abs() + torch.finfo(dtype).smallest_normal
    assert bool(((y.double() - ref).abs() <= bound).all()), f"seed={seed}"


def test_sum_of_squares_is_order_independent(seed):
    """The sum of squares is exact: reversing the columns (another summation order) changes no bit."""
    x = (torch.randn(8, 4096) * 10.0 ** torch.randint(-3, 4, (8, 4096))).bfloat16()
    assert torch.equal(rms_inverse(x, 1e-6), rms_inverse(x.flip(-1), 1e-6)), f"seed={seed}"


def test_feeds_linear(seed, device):
    """The QuantizedActivation goes to humming.linear as it is: the same output as linear on the reference
    composition's activations."""
    x, w, res = _inputs(Case("fp8", torch.bfloat16, 3, 256, True), device)
    qw = humming.quantize(torch.randn(32, 256, device=device), "int4", group_size=128)
    qa, _ = humming.rmsnorm_quantize(x, w, 1e-6, "fp8", residual=res, backend="triton")
    ref = humming.quantize_activation(humming.rmsnorm(x, w, 1e-6, residual=res)[0], "fp8")
    y = humming.linear(qa, qw, backend="triton", out_dtype=torch.float32)
    assert not torch.isnan(y).any()
    assert torch.equal(y, humming.linear(ref, qw, backend="triton", out_dtype=torch.float32))


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply")  # inf * 0 under the interpreter
def test_non_finite_row_gets_a_nan_scale(device):
    x = torch.randn(3, 128, device=device, dtype=torch.bfloat16)
    x[1, 5] = float("inf")
    w = torch.ones(128, device=device, dtype=torch.bfloat16)
    qa = humming.rmsnorm_quantize(x, w, 1e-6, "fp8", backend="triton")
    assert torch.isnan(qa.scales[1]).all() and torch.isfinite(qa.scales[[0, 2]]).all()
    qw = humming.quantize(torch.randn(16, 128, device=device), "int4", group_size=128)
    y = humming.linear(qa, qw, backend="triton")
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()


@pytest.mark.parametrize("act", ["fp8_tensor", "int8_tensor", "nvfp4"])
def test_row_spanning_scales_run_on_the_reference(act, seed):
    x, w, _ = _inputs(Case(act, torch.bfloat16, 3, 64, False), "cpu")
    reason = norm_quant.unsupported(x, act)
    assert "spans rows" in reason
    with pytest.raises(ValueError, match=r"backend: 'triton' cannot run this call: act .* spans rows"):
        humming.rmsnorm_quantize(x, w, 1e-6, act, backend="triton")
    got = humming.rmsnorm_quantize(x, w, 1e-6, act)  # auto on CPU: the reference
    _assert_same(got, humming.quantize_activation(humming.rmsnorm(x, w, 1e-6), act), f"{act} seed={seed}")


_X = torch.zeros(2, 64, dtype=torch.bfloat16)
_W = torch.ones(64, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(x=_X[0]), "x: expected a non-empty"),
        (dict(x=_X.int()), "x: expected a non-empty"),
        (dict(weight=_W[:32]), r"weight: expected a float tensor \[K=64\]"),
        (dict(weight=_W.int()), r"weight: expected a float tensor"),
        (dict(eps=-1.0), "eps: expected a non-negative float"),
        (dict(residual=_X.half()), "residual: expected x's shape and dtype"),
        (dict(residual=_X[:1]), "residual: expected x's shape and dtype"),
        (dict(act="fp9"), "act: unknown activation scheme"),
        (dict(backend="cuda"), "backend: expected 'auto', 'reference' or 'triton'"),
    ],
)
def test_bad_inputs(kwargs, match):
    args = dict(x=_X, weight=_W, eps=1e-6, act="fp8") | kwargs
    backend = args.pop("backend", "auto")
    residual = args.pop("residual", None)
    with pytest.raises(ValueError, match=match):
        humming.rmsnorm_quantize(**args, residual=residual, backend=backend)


@pytest.mark.parametrize(
    ("act", "residual", "backend"),
    [
        ("fp8", True, "reference"),
        ("nvfp4", False, "reference"),
        ("fp8", True, "triton"),
        ("fp8_g128", False, "triton"),
        ("mxfp4", True, "triton"),
    ],
)
def test_opcheck(act, residual, backend, seed):
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    res = torch.randn(3, 64, dtype=torch.bfloat16) if residual else None
    args = (x, torch.rand(64, dtype=torch.bfloat16) + 0.5, 1e-6, act, res, None, backend)
    # float8 scale outputs: opcheck's schema check multiplies tensors, which CPU lacks for float8
    float8 = humming.ACT_SCHEMES[act].scale_dtype != torch.float32
    checks = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic") if float8 else "ALL"
    torch.library.opcheck(torch.ops.humming.rmsnorm_quantize.default, args, test_utils=checks)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_compile_dynamic_m(backend, seed):
    """One graph for every M (fullgraph, no recompilation), the same bits as eager; the result feeds linear."""
    w = torch.rand(64, dtype=torch.bfloat16) + 0.5
    qw = humming.quantize(torch.randn(32, 64), "int8", group_size=-1)

    def layer(x, res):
        qa, res = humming.rmsnorm_quantize(x, w, 1e-6, "int8", residual=res, backend=backend)
        return humming.linear(qa, qw, backend="reference"), res

    torch._dynamo.reset()
    f = torch.compile(layer, fullgraph=True)
    with (
        torch._dynamo.config.patch(error_on_recompile=True),
        torch.fx.experimental._config.patch(backed_size_oblivious=True),
    ):
        for m in (1, 5, 9):
            x, res = torch.randn(m, 64, dtype=torch.bfloat16), torch.randn(m, 64, dtype=torch.bfloat16)
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(res, 0)
            for got, want in zip(f(x, res), layer(x, res)):
                assert torch.equal(got, want), f"M={m} seed={seed}"
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("act", _ACTS)
@pytest.mark.parametrize("m,k", [(1, 8192), (333, 4096), (2048, 7168), (7, 16384)])
def test_triton_bit_exact_gpu(act, m, k, seed):
    x = (torch.randn(m, k, device="cuda") * 10.0 ** torch.randint(-3, 4, (m, 1), device="cuda")).bfloat16()
    res = torch.randn(m, k, device="cuda").bfloat16()
    w = (torch.rand(k, device="cuda") + 0.5).bfloat16()
    got, got_res = humming.rmsnorm_quantize(x, w, 1e-6, act, residual=res)
    normed, summed = humming.rmsnorm(x, w, 1e-6, residual=res)
    _assert_same(got, humming.quantize_activation(normed, act), f"{act} {m}x{k} seed={seed}")
    assert torch.equal(got_res, summed)
