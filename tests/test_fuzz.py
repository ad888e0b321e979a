"""Property-based fuzzing (hypothesis) of ``humming.linear`` and ``humming.moe`` against an independent reference.

What is drawn: a weight format of the one registry (``humming.FORMATS``, or a recipe of
``humming.WEIGHT_SCHEMES``), its layout (per-tensor, per-channel, groups along K, 2-D blocks, act-order
``g_idx``, integer and float zero points, every scale dtype, a global scale), odd shapes, an activation scheme
of ``humming.ACT_SCHEMES`` among those ``combination_error`` accepts for the weight, x and output dtypes,
bias (none, passed, or carried by the weight), x as a strided view or pre-quantized, and a seed. Every
tensor comes from a ``torch.Generator`` seeded with that seed, so hypothesis' falsifying example (and the
``note`` lines) reproduce a failure; combinations the quantizer refuses are rejected, combinations a backend
declares it does not run must raise ``ValueError`` (a refusal, never a wrong answer). Defects the fuzzer
found are kept as regression tests at the end of this file.

Reference: ``humming.dequantize(qw, float64)`` times the activations (``quantize_activation`` then
``dequantize_activation`` when ``act`` is set) in float64, plus bias. Checks: every element is finite (no
``out=`` in the public API to poison; on a GPU a free block of the caching allocator is filled with NaN
first, where the output is likely to land), ``||out - ref|| / ||ref|| <= tol`` and per element
``|out - ref| <= tol * (|A| @ |W|^T + |bias|)`` (the size of the dot: one wrong element cannot hide in the
norm), where ``tol = max(TOL[x dtype], TOL[out dtype])``: kernels may round each dequantized weight (and a
lookup value or folded scale) once to x's 16-bit dtype, then accumulate in fp32 and round once to the output
dtype; TOL is tests/test_triton_wna16.py's bound for one such rounding. ``fused_moe`` rounds twice more (the
first GEMM's output, the SiLU product): tests/moe/moe_cases.py's MOE_TOL.

Profiles (``HUMMING_FUZZ_PROFILE``): ``ci`` (default: few examples, derandomized so CI is reproducible,
small shapes for the Triton interpreter) and ``long`` (2000 examples per property, random, for a GPU run).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch
from helpers import act_order_dequantized, gated
from hypothesis import HealthCheck, event, given, note, reject, settings
from hypothesis import strategies as st

import humming
from humming import moe
from humming.dispatch.plan import plan_grouped, plan_linear
from humming.dispatch.support import combination_error
from humming.ir.act_order import act_order_perm
from humming.ir.quantize import GLOBAL_SCALE_DTYPES
from humming.ir.weight import SCALE_DTYPES, cdiv

_SLOW_EXAMPLES = [HealthCheck.too_slow, HealthCheck.data_too_large]


def _unusable(backend, qw, act, x, block_m):
    """Why ``backend`` declares it cannot run this call (``None`` when it can), as the dispatcher reads it."""
    try:
        if block_m is None:
            plan_linear(qw, act, x, backend)
        else:
            plan_grouped(qw, act, x, block_m, backend)
    except ValueError as err:
        return str(err)
    return None


settings.register_profile(
    "ci",
    max_examples=30,
    deadline=None,
    derandomize=True,
    print_blob=True,
    database=None,
    suppress_health_check=_SLOW_EXAMPLES,
)
settings.register_profile(
    "long", max_examples=2000, deadline=None, print_blob=True, database=None, suppress_health_check=_SLOW_EXAMPLES
)
FUZZ = settings.get_profile(os.environ.get("HUMMING_FUZZ_PROFILE", "ci"))
if os.environ.get("HUMMING_FUZZ_EXAMPLES"):  # a time-boxed run (the H200 checks) sets its own count
    FUZZ = settings(FUZZ, max_examples=int(os.environ["HUMMING_FUZZ_EXAMPLES"]))

#: ``||out - ref|| / ||ref||`` for one rounding to the dtype (tests/test_triton_wna16.py's TOL).
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1e-2}
#: ``fused_moe`` against fp32 weights, two more roundings to x's dtype (tests/moe/moe_cases.py's MOE_TOL).
MOE_TOL = {torch.float16: 5e-3, torch.bfloat16: 3e-2}

#: Element formats of the registry; e8m0 is a scale format, which quantize refuses as a weight.
WEIGHT_FORMATS = [f.name for f in humming.FORMATS if f.kind != "e8m0"]
X_DTYPES = [torch.bfloat16, torch.float16]
OUT_DTYPES = [None, torch.bfloat16, torch.float16, torch.float32]
#: Shape bounds: small on the CPU (the Triton interpreter runs one program at a time), real tiles on a GPU.
CPU_DIMS = dict(n=160, k=160, m=40)
GPU_DIMS = dict(n=1024, k=1024, m=300)


# ------------------------------------------------------------------------------------------- strategies
@dataclass(frozen=True)
class WeightCase:
    """Arguments of ``humming.quantize``; ``None`` fields keep the scheme's (or quantize's) default."""

    weight: str
    group_size: object = None
    zero_point: object = False
    scale_dtype: torch.dtype | None = None
    global_scale: bool | None = None
    act_order: bool = False

    def quantize(self, w: torch.Tensor, gen: torch.Generator, bias=None) -> humming.QuantizedWeight:
        kwargs = dict(zero_point=self.zero_point, scale_dtype=self.scale_dtype, global_scale=self.global_scale)
        if self.group_size is not None:
            kwargs["group_size"] = self.group_size
        if self.act_order:  # random groups of the columns, some possibly empty
            k = w.shape[-1]
            kwargs["g_idx"] = torch.randint(0, cdiv(k, self.group_size), (k,), generator=gen).to(w.device)
        return humming.quantize(w, self.weight, bias=bias, **kwargs)


@st.composite
def weight_cases(draw) -> WeightCase:
    """A named scheme, an integer format or a float / lookup format, about a third each, so that few examples
    still reach every family. Zero points are drawn only for integer formats and the global scale only
    without them and with 8-bit scales, as quantize documents; what it still refuses is rejected in the test."""
    family = draw(st.sampled_from(["scheme", "int", "float"]))
    if family == "scheme":
        return WeightCase(draw(st.sampled_from(sorted(humming.WEIGHT_SCHEMES))))
    names = [n for n in WEIGHT_FORMATS if humming.get_format(n).is_int == (family == "int")]
    name = draw(st.sampled_from(names))
    group_size = draw(
        st.one_of(
            st.sampled_from(["tensor", -1]),
            st.sampled_from([8, 16, 24, 32, 48, 64, 96, 128]),  # 24, 48, 96: groups of no power of two
            st.tuples(st.sampled_from([8, 16, 48, 128]), st.sampled_from([16, 32, 64, 128])),
        )
    )
    act_order = isinstance(group_size, int) and group_size > 0 and draw(st.booleans())
    zero_point = draw(st.sampled_from([False, True, "float"])) if family == "int" else False
    scale_dtypes = SCALE_DTYPES if zero_point != "float" else (torch.float32, torch.float16, torch.bfloat16)
    scale_dtype = draw(st.sampled_from(scale_dtypes))
    global_scale = not zero_point and scale_dtype in GLOBAL_SCALE_DTYPES and draw(st.booleans())
    return WeightCase(name, group_size, zero_point, scale_dtype, global_scale, act_order)


def _dim(hi: int) -> st.SearchStrategy[int]:
    """Any size up to ``hi`` (odd ones most of the time), or a tile-aligned one."""
    return st.one_of(st.integers(1, hi), st.sampled_from([d for d in (16, 64, 96, 128, 256, 512, 1024) if d <= hi]))


@dataclass(frozen=True)
class LinearCase:
    weight: WeightCase
    n: int
    k: int
    lead: tuple[int, ...]
    x_dtype: torch.dtype
    out_dtype: torch.dtype | None
    bias: str | None  # None, "arg" (passed to linear) or "weight" (qw.bias)
    bias_dtype: torch.dtype
    x_view: bool  # x is a column slice of a wider tensor: rows not contiguous with each other
    prequantize: bool  # pass humming.quantize_activation(x) instead of x (when act is set)
    seed: int


@st.composite
def linear_cases(draw, dims: dict) -> LinearCase:
    m = draw(_dim(dims["m"]))
    lead = draw(st.sampled_from([(m,), (2, cdiv(m, 2)), (1, m)]))
    x_dtype = draw(st.sampled_from(X_DTYPES))
    return LinearCase(
        weight=draw(weight_cases()),
        n=draw(_dim(dims["n"])),
        k=draw(_dim(dims["k"])),
        lead=lead,
        x_dtype=x_dtype,
        out_dtype=draw(st.sampled_from(OUT_DTYPES)),
        bias=draw(st.sampled_from([None, "arg", "weight"])),
        bias_dtype=draw(st.sampled_from([x_dtype, torch.float32])),
        x_view=draw(st.booleans()),
        prequantize=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@dataclass(frozen=True)
class MoeCase:
    weight: WeightCase
    experts: int
    tokens: int
    topk: int
    block_m: int
    n: int
    k: int
    x_dtype: torch.dtype
    out_dtype: torch.dtype | None
    bias: bool
    activation: str
    layout: str
    seed: int


@st.composite
def moe_cases(draw, dims: dict) -> MoeCase:
    experts = draw(st.integers(1, 4))
    x_dtype = draw(st.sampled_from(X_DTYPES))
    return MoeCase(
        weight=draw(weight_cases()),
        experts=experts,
        tokens=draw(st.integers(1, dims["m"] // 4)),
        topk=draw(st.integers(1, min(experts, 3))),
        block_m=draw(st.sampled_from([8, 16, 32])),
        n=draw(_dim(dims["n"] // 2)),
        k=draw(_dim(dims["k"] // 2)),
        x_dtype=x_dtype,
        out_dtype=draw(st.sampled_from(OUT_DTYPES)),
        bias=draw(st.booleans()),
        activation=draw(st.sampled_from(["silu", "gelu", "gelu_tanh", "swiglu_oai"])),
        layout=draw(st.sampled_from(["concat", "interleaved"])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


# ------------------------------------------------------------------------------------------- helpers
def _randn(shape, gen: torch.Generator, device: str, dtype=torch.float32) -> torch.Tensor:
    """Normal values (never all zeros) from ``gen``, drawn on the CPU so every device sees the same."""
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


def _weights(shape, gen: torch.Generator, device: str) -> torch.Tensor:
    """Rows of different magnitudes (0.1 to 1.1), so that per-channel and group scales differ."""
    rows = torch.rand(*shape[:-1], 1, generator=gen) + 0.1
    return (torch.randn(shape, generator=gen) * rows).to(device)


def _quantize(case: WeightCase, w: torch.Tensor, gen: torch.Generator, bias=None) -> humming.QuantizedWeight:
    try:
        qw = case.quantize(w, gen, bias=bias)
    except ValueError as err:  # a combination the quantizer refuses (its message says which)
        event("rejected: quantize refuses the layout")
        note(f"quantize refused {case}: {err}")
        reject()
    assert torch.isfinite(humming.dequantize(qw)).all(), f"quantize({case}) of finite weights is not finite"
    return qw


def _draw_act(data, fmt) -> str | None:
    """An activation scheme that humming computes with weight format ``fmt`` (or None: WnA16)."""
    quantized = [a for a in sorted(humming.ACT_SCHEMES) if combination_error(fmt, humming.ACT_SCHEMES[a]) is None]
    acts = st.sampled_from(quantized) if quantized else st.nothing()
    if combination_error(fmt, None) is None:
        acts = st.one_of(st.none(), acts)  # about half the examples WnA16, half quantized activations
    return data.draw(acts, label="act")


def _poison_allocator(device: str, numel: int) -> None:
    """On a GPU, leave a NaN-filled free block of at least ``numel`` fp32 in the caching allocator, where the
    next ``torch.empty`` of that size is likely to land, so that elements a kernel never writes read back as
    NaN (the public API takes no ``out=`` to poison)."""
    if device == "cuda":  # all-ones bytes: NaN in fp32, fp16 and bf16 alike
        torch.full((4 * numel + 4096,), 255, dtype=torch.uint8, device=device)


def _dequantized_act(x2d: torch.Tensor, act: str | None, perm: torch.Tensor | None = None) -> torch.Tensor:
    """``x2d`` as the GEMM sees it, float64; ``perm``: quantized in an act-order weight's column order."""
    if act is None:
        return x2d.double()
    return act_order_dequantized(x2d, act, perm, torch.float64)


def _assert_close(out: torch.Tensor, ref: torch.Tensor, size: torch.Tensor | None, tol: float, what: str) -> None:
    """Every element finite, the norm-relative error within ``tol`` and, given ``size`` (``|A| @ |W|^T``),
    each element's error within ``tol * size`` (both up to the output dtype's subnormal spacing); failures
    name the worst element."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    bad = ~torch.isfinite(out)
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())} non-finite outputs (unwritten?), first at {first}")
    # Results below the output dtype's normal range round to a fixed spacing, not a relative one (fp16: 6e-8).
    finfo = torch.finfo(out.dtype)
    floor = finfo.smallest_normal * finfo.eps
    diff = (out.double() - ref).abs()
    rel = float((diff.norm() - floor * diff.numel() ** 0.5).clamp_min(0) / ref.norm().clamp_min(1e-30))
    excess = diff if size is None else diff / (tol * size + floor)
    i, j = divmod(int(excess.argmax()), out.shape[1])
    detail = f"worst at (m={i}, n={j}): got {out[i, j].item():.6g}, want {ref[i, j].item():.6g}"
    assert rel <= tol, f"{what}: relative error {rel:.3e} > {tol:.0e}; {detail}"
    if size is not None:
        assert float(excess[i, j]) <= 1, f"{what}: {detail}, error {diff[i, j].item():.3g} > {tol:.0e} * |A||W|"


# --------------------------------------------------------------------------------------- linear property
def _check_linear(data, backend: str, device: str, dims: dict) -> None:
    case = data.draw(linear_cases(dims), label="case")
    gen = torch.Generator().manual_seed(case.seed)
    n, k = case.n, case.k
    bias = _randn((n,), gen, device, case.bias_dtype) if case.bias else None
    qw = _quantize(case.weight, _weights((n, k), gen, device), gen, bias=bias if case.bias == "weight" else None)
    act = _draw_act(data, qw.format)
    lead = case.lead
    x = _randn((*lead, k + 8 if case.x_view else k), gen, device, case.x_dtype)[..., :k]
    x2d = x.reshape(-1, k)
    prequantized = case.prequantize and act is not None
    x_in = humming.quantize_activation(x2d, act) if prequantized else x
    what = f"linear backend={backend} {qw.describe()} act={act} x={tuple(x.shape)} {case}"
    note(what)

    scheme = act and humming.ACT_SCHEMES[act]
    declared = None if backend == "auto" else _unusable(backend, qw, scheme, x_in.codes if prequantized else x2d, None)
    if declared:
        event("refused as declared")
        note(f"{backend} declares: {declared}")
        with pytest.raises(ValueError, match="cannot run this call"):
            humming.linear(x_in, qw, bias if case.bias == "arg" else None, act=act, backend=backend)
        return
    event(f"ran: act={act}")
    event(f"ran: {qw.format.kind} {qw.layout}{' zeros' if qw.has_zeros else ''}")
    _poison_allocator(device, x2d.shape[0] * n)
    out = humming.linear(
        x_in, qw, bias if case.bias == "arg" else None, act=act, out_dtype=case.out_dtype, backend=backend
    )
    out_dtype = case.out_dtype or (torch.bfloat16 if prequantized else case.x_dtype)
    assert out.dtype == out_dtype and out.device == x.device
    assert out.shape == ((x2d.shape[0], n) if prequantized else (*lead, n))

    a = _dequantized_act(x2d, act, None if prequantized else act_order_perm(qw))
    w = humming.dequantize(qw, torch.float64)
    ref, size = a @ w.T, a.abs() @ w.abs().T
    if bias is not None:
        ref, size = ref + bias.double(), size + bias.double().abs()
    tol = max(TOL[case.x_dtype], TOL[out_dtype])
    _assert_close(out.reshape(-1, n), ref, size, tol, what)


@pytest.mark.parametrize("backend", ["reference", "triton"])
@FUZZ
@given(data=st.data())
def test_linear_matches_reference(backend: str, data) -> None:
    _check_linear(data, backend, "cpu", CPU_DIMS)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:humming.linear. no fast kernel")
@pytest.mark.parametrize("backend", ["auto", "cuda", "triton"])
@FUZZ
@given(data=st.data())
def test_linear_matches_reference_gpu(backend: str, data) -> None:
    _check_linear(data, backend, "cuda", GPU_DIMS)


# ----------------------------------------------------------------------------------------- MoE properties
def _routing(case: MoeCase, gen: torch.Generator, device: str) -> torch.Tensor:
    """Distinct random experts per token: int32 ``[T, topk]``."""
    order = torch.rand(case.tokens, case.experts, generator=gen).argsort(-1)
    return order[:, : case.topk].to(device=device, dtype=torch.int32)


def _check_grouped(data, backend: str, device: str, dims: dict) -> None:
    case = data.draw(moe_cases(dims), label="case")
    gen = torch.Generator().manual_seed(case.seed)
    e, n, k = case.experts, case.n, case.k
    qw = _quantize(case.weight, _weights((e, n, k), gen, device), gen)
    act = _draw_act(data, qw.format)
    routing = moe.moe_align(_routing(case, gen, device), e, case.block_m)
    x = _randn((routing.m_pad, k), gen, device, case.x_dtype)  # padding rows too: they must not matter
    bias = _randn((e, n), gen, device) if case.bias else None
    what = f"grouped_linear backend={backend} {qw.describe()} act={act} x={tuple(x.shape)} {case}"
    note(what)

    scheme = act and humming.ACT_SCHEMES[act]
    declared = None if backend == "auto" else _unusable(backend, qw, scheme, x, case.block_m)
    if declared:
        event("refused as declared")
        note(f"{backend} declares: {declared}")
        with pytest.raises(ValueError, match="cannot run this call"):
            moe.grouped_linear(x, qw, routing.expert_ids, case.block_m, bias, act=act, backend=backend)
        return
    event(f"ran: act={act}")
    event(f"ran: {qw.format.kind} {qw.layout}{' zeros' if qw.has_zeros else ''}")
    _poison_allocator(device, routing.m_pad * n)
    out = moe.grouped_linear(
        x, qw, routing.expert_ids, case.block_m, bias, act=act, out_dtype=case.out_dtype, backend=backend
    )
    out_dtype = case.out_dtype or case.x_dtype
    assert out.shape == (routing.m_pad, n) and out.dtype == out_dtype

    # Rows of blocks with expert -1 are unspecified; the others are one expert's dense layer each. A
    # dynamic per-tensor activation scale spans the rows in use (humming.moe.grouped_linear).
    row_expert = routing.expert_ids.long().repeat_interleave(case.block_m)
    used = row_expert >= 0
    a = _dequantized_act(x[used], act)
    w = humming.dequantize(qw, torch.float64)[row_expert[used]]  # [rows, N, K]
    ref = torch.einsum("rk,rnk->rn", a, w)
    size = torch.einsum("rk,rnk->rn", a.abs(), w.abs())
    if bias is not None:
        ref, size = ref + bias.double()[row_expert[used]], size + bias.double().abs()[row_expert[used]]
    tol = max(TOL[case.x_dtype], TOL[out_dtype])
    _assert_close(out[used], ref, size, tol, what)


def _check_fused(data, backend: str, device: str, dims: dict) -> None:
    case = data.draw(moe_cases(dims), label="case")
    gen = torch.Generator().manual_seed(case.seed)
    e, inter, k = case.experts, case.n, case.k
    b13 = _randn((e, 2 * inter), gen, device) if case.bias else None
    b2 = _randn((e, k), gen, device) if case.bias else None
    w13 = _quantize(case.weight, _weights((e, 2 * inter, k), gen, device), gen, bias=b13)
    w2 = _quantize(case.weight, _weights((e, k, inter), gen, device), gen, bias=b2)
    x = _randn((case.tokens, k), gen, device, case.x_dtype)
    ids = _routing(case, gen, device)
    topk_weights = torch.softmax(torch.randn(case.tokens, case.topk, generator=gen), -1).to(device)
    activation = dict(activation=case.activation, gate_up_layout=case.layout)
    what = f"fused_moe backend={backend} {w13.describe()} x={tuple(x.shape)} {case}"
    note(what)

    # act=None: the second GEMM quantizes the hidden activations after they were rounded to x's dtype, so a
    # float64 reference cannot reproduce their codes; the grouped property covers act schemes per GEMM.
    declared = None
    if backend != "auto":
        declared = _unusable(backend, w13, None, x, case.block_m) or _unusable(backend, w2, None, x, case.block_m)
    if declared:
        event("refused as declared")
        note(f"{backend} declares: {declared}")
        with pytest.raises(ValueError, match="cannot run this call"):
            moe.fused_moe(x, w13, w2, topk_weights, ids, block_m=case.block_m, backend=backend, **activation)
        return

    event(f"ran: {w13.format.kind} {w13.layout}{' zeros' if w13.has_zeros else ''}")
    _poison_allocator(device, 4 * case.tokens * case.topk * max(k, 2 * inter))
    out = moe.fused_moe(x, w13, w2, topk_weights, ids, block_m=case.block_m, backend=backend, **activation)
    assert out.shape == (case.tokens, k) and out.dtype == case.x_dtype

    # Per token and routed expert: h = W13 x + b13, hidden = the gated activation of h, y = W2 hidden + b2,
    # summed with the routing weights; all in float64.
    ids_l = ids.long()
    h = torch.einsum("tjnk,tk->tjn", humming.dequantize(w13, torch.float64)[ids_l], x.double())
    h = h + (0 if b13 is None else b13.double()[ids_l])
    hidden = gated(h, case.activation, case.layout)
    y = torch.einsum("tjki,tji->tjk", humming.dequantize(w2, torch.float64)[ids_l], hidden)
    y = y + (0 if b2 is None else b2.double()[ids_l])
    ref = (topk_weights.double().unsqueeze(-1) * y).sum(1)
    tol = MOE_TOL[case.x_dtype]
    # A two-layer product has no simple per-element bound: the norm check carries the property.
    _assert_close(out, ref, None, tol, what)


@pytest.mark.parametrize("backend", ["reference", "triton"])
@FUZZ
@given(data=st.data())
def test_grouped_linear_matches_reference(backend: str, data) -> None:
    _check_grouped(data, backend, "cpu", CPU_DIMS)


@pytest.mark.parametrize("backend", ["reference", "triton"])
@FUZZ
@given(data=st.data())
def test_fused_moe_matches_reference(backend: str, data) -> None:
    _check_fused(data, backend, "cpu", CPU_DIMS)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:humming.moe.grouped_linear. no fast kernel")
@pytest.mark.parametrize("backend", ["auto", "cuda", "triton"])
@FUZZ
@given(data=st.data())
def test_grouped_linear_matches_reference_gpu(backend: str, data) -> None:
    _check_grouped(data, backend, "cuda", GPU_DIMS)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:humming.moe.grouped_linear. no fast kernel")
@pytest.mark.parametrize("backend", ["auto", "cuda", "triton"])
@FUZZ
@given(data=st.data())
def test_fused_moe_matches_reference_gpu(backend: str, data) -> None:
    _check_fused(data, backend, "cuda", GPU_DIMS)


# ------------------------------------------------------------------------------- defects the fuzzer found
@pytest.mark.parametrize("weight", ["int1", "uint1"])
def test_quantize_symmetric_1bit_is_refused(weight: str) -> None:
    """A symmetric grid's step is amax / (2^(bits-1) - 1): with one bit there is no nonzero level (a scale
    would divide by 0), so quantize refuses and names the way out."""
    w = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"^weight: symmetric u?int1 .*zero_point=True"):
        humming.quantize(w, weight, group_size=-1)


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_global_scale_with_wide_scales_is_refused(scale_dtype: torch.dtype) -> None:
    """The global scale maps the largest group scale to the scale dtype's max: for fp32 or bf16 scales an fp32
    subnormal or 0, and scales overflowing to inf. A second level is for 8-bit scales, and quantize says so."""
    w = torch.randn(7, 64, generator=torch.Generator().manual_seed(1)) * 10
    with pytest.raises(ValueError, match=r"^global_scale=True: .*scale_dtype"):
        humming.quantize(w, "e4m3", group_size=-1, scale_dtype=scale_dtype, global_scale=True)


@pytest.mark.parametrize("scale_dtype", GLOBAL_SCALE_DTYPES)
@pytest.mark.parametrize("magnitude", [1e-3, 10.0, 1e4])
def test_quantize_global_scale_is_finite(scale_dtype: torch.dtype, magnitude: float) -> None:
    w = torch.randn(7, 64, generator=torch.Generator().manual_seed(1)) * magnitude
    qw = humming.quantize(w, "e4m3", group_size=-1, scale_dtype=scale_dtype, global_scale=True)
    assert torch.isfinite(qw.global_scale) and qw.global_scale > 0, f"global scale {qw.global_scale.item():.3g}"
    assert torch.isfinite(humming.dequantize(qw)).all()


@pytest.mark.parametrize(("act", "k", "group_size"), [("fp8_e5m2", 16, -1), ("mxfp8", 16, -1), ("fp8", 64, 16)])
def test_triton_scaled_mm_1bit_weights_small_block_k(act: str, k: int, group_size: int, device: str) -> None:
    """K tiles of 16 (K <= 16 with 16-bit operands, or a promotion step of 16) hold half a word of 1-bit
    codes: the unpacking must not assume whole words per tile."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(5, k, generator=gen).to(device)
    qw = humming.quantize(w, "uint1", group_size=group_size, zero_point=True)
    x = torch.randn(3, k, generator=gen).to(device=device, dtype=torch.bfloat16)
    out = humming.linear(x, qw, act=act, backend="triton", out_dtype=torch.float32)
    a = humming.dequantize_activation(humming.quantize_activation(x, act), torch.float64)
    ref = a @ humming.dequantize(qw, torch.float64).T
    _assert_close(out, ref, a.abs() @ humming.dequantize(qw, torch.float64).abs().T, TOL[torch.bfloat16], act)


@pytest.mark.parametrize("group_size", ["tensor", 16, 32, 64])
@pytest.mark.parametrize("act", ["fp8", "nvfp4", "mxfp4"])
def test_triton_scaled_mm_large_scales_with_global_scale(act: str, group_size, device: str) -> None:
    """With e8m0 scales and a global scale, quantize puts the largest scale near 2^127 and the global scale
    near 2^-127: the kernel must apply fp32(scale) * global, as dequantize does, and never one of them alone,
    which would overflow (in the epilogue, per promotion step, or folded into an operand)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(8, 64, generator=gen).to(device)
    qw = humming.quantize(w, "e2m1", group_size=group_size, scale_dtype=torch.float8_e8m0fnu, global_scale=True)
    assert qw.scales.float().max() >= 2.0**126, "the case needs scales near the top of e8m0's range"
    x = torch.randn(4, 64, generator=gen).to(device=device, dtype=torch.bfloat16)
    out = humming.linear(x, qw, act=act, backend="triton", out_dtype=torch.float32)
    a = humming.dequantize_activation(humming.quantize_activation(x, act), torch.float64)
    wd = humming.dequantize(qw, torch.float64)
    _assert_close(out, a @ wd.T, a.abs() @ wd.abs().T, TOL[torch.bfloat16], act)


@pytest.mark.parametrize("group_size", [33, 40, 48, 96])
def test_triton_gemv_group_not_power_of_two(group_size: int, device: str) -> None:
    """The GEMV kernel (M = 1) needs power-of-two K tiles: a group of no power of two above 32 must not set
    the tile, and tiles that span groups must read each column's own scale."""
    gen = torch.Generator().manual_seed(0)
    qw = humming.quantize(torch.randn(3, 200, generator=gen).to(device), "e2m1", group_size=group_size)
    x = torch.randn(1, 200, generator=gen).to(device=device, dtype=torch.bfloat16)
    out = humming.linear(x, qw, backend="triton", out_dtype=torch.float32)
    wd = humming.dequantize(qw, torch.float64)
    what = f"gemv g{group_size}"
    _assert_close(out, x.double() @ wd.T, x.double().abs() @ wd.abs().T, TOL[torch.bfloat16], what)


@pytest.mark.parametrize(("weight", "act"), [("int4", "fp8"), ("int4", "int8"), ("e2m1", "mxfp8")])
def test_triton_scaled_mm_promotion_step_without_power_of_two_tile(weight: str, act: str, device: str) -> None:
    """Weight groups of 24 along K set a promotion step that no power-of-two K tile of the tensor cores'
    minimum (16) divides: the scaled GEMM declares it cannot run them (so 'auto' falls back) instead of
    failing at launch."""
    from humming.triton_kernels import scaled_mm

    gen = torch.Generator().manual_seed(0)
    qw = humming.quantize(torch.randn(5, 100, generator=gen).to(device), weight, group_size=24)
    x = torch.randn(3, 100, generator=gen).to(device=device, dtype=torch.bfloat16)
    assert "promotion step" in (scaled_mm.unsupported(qw, act, x) or "")
    with pytest.raises(ValueError, match="cannot run this call"):
        humming.linear(x, qw, act=act, backend="triton")


@pytest.mark.parametrize(("weight", "act"), [("int4", "fp8"), ("int4", "int8"), ("e2m1", "mxfp8")])
def test_triton_scaled_mm_promotion_step_below_8bit_tile(weight: str, act: str, device: str) -> None:
    """Weight groups of 80 along K: 8-bit tensor cores need K tiles of 32, which do not divide 80, so the
    plan takes the 16-bit path (tiles of 16) and runs."""
    gen = torch.Generator().manual_seed(0)
    qw = humming.quantize(torch.randn(5, 200, generator=gen).to(device), weight, group_size=80)
    x = torch.randn(3, 200, generator=gen).to(device=device, dtype=torch.bfloat16)
    out = humming.linear(x, qw, act=act, backend="triton", out_dtype=torch.float32)
    a = humming.dequantize_activation(humming.quantize_activation(x, act), torch.float64)
    wd = humming.dequantize(qw, torch.float64)
    _assert_close(out, a @ wd.T, a.abs() @ wd.abs().T, TOL[torch.bfloat16], f"{weight} g80 {act}")
