"""The custom ops (``torch.ops.humming.*``): ``torch.library.opcheck``, weight handles, ``torch.compile``
with a dynamic token dimension (no recompilation, the same output as eager) and, on a GPU, CUDA graphs."""

from __future__ import annotations

import gc
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
from helpers import capture

import humming
from humming import moe, ops


@dataclass(frozen=True)
class Case:
    """One weight recipe with one activation scheme."""

    name: str
    weight: str
    group_size: object
    act: str | None = None
    zero_point: bool = False


CASES = [
    Case("int4-g128", "int4", 128),
    Case("uint4-zp", "uint4", 64, zero_point=True),
    Case("int8-channel-int8", "int8", -1, "int8"),
    Case("e4m3-channel-fp8", "e4m3", -1, "fp8"),
    Case("mxfp4", "mxfp4", None),
    Case("nvfp4-nvfp4", "nvfp4", None, "nvfp4"),
    Case("fp8_block-fp8_g128", "fp8_block", None, "fp8_g128"),
    Case("int4-g128-fp8", "int4", 128, "fp8"),
]
M_VALUES = (1, 7, 33)


def _weight(case: Case, n: int = 64, k: int = 128, device="cpu") -> humming.QuantizedWeight:
    kwargs = {} if case.group_size is None else {"group_size": case.group_size}
    w = torch.randn(n, k, device=device)
    return humming.quantize(w, case.weight, zero_point=case.zero_point, **kwargs)


def _dynamic(x: torch.Tensor) -> torch.Tensor:
    torch._dynamo.mark_dynamic(x, 0)
    return x


@pytest.fixture
def no_recompile():
    """torch.compile raises on any recompilation. A size-1 dimension marked dynamic is specialised by
    torch unless sizes are treated obliviously (what an engine sets to keep M = 1 in the shared graph)."""
    torch._dynamo.reset()
    with (
        torch._dynamo.config.patch(error_on_recompile=True),
        torch.fx.experimental._config.patch(backed_size_oblivious=True),
    ):
        yield
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------------------ opcheck
_NO_SCHEMA_CHECK = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def test_opcheck_linear(seed):
    qw = _weight(Case("int4", "int4", 64))
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    bias = torch.randn(64, dtype=torch.bfloat16)
    for act, out_dtype in ((None, torch.bfloat16), ("fp8", torch.float32)):
        args = (x, None, None, *ops.weight_args(qw), bias, act, out_dtype, "reference")
        torch.library.opcheck(torch.ops.humming.linear.default, args)
    qa = humming.quantize_activation(x, "int8")
    args = (qa.codes, qa.scales, None, *ops.weight_args(qw), None, "int8", torch.bfloat16, "reference")
    torch.library.opcheck(torch.ops.humming.linear.default, args)
    for act, out_dtype in ((None, torch.bfloat16), (humming.ACT_SCHEMES["fp8"], torch.float32)):
        site = ops.bind(qw, act, out_dtype, "reference")
        torch.library.opcheck(torch.ops.humming.linear_bound.default, (x, None, None, bias, site))
    site = ops.bind(qw, humming.ACT_SCHEMES["int8"], torch.bfloat16, "reference")
    torch.library.opcheck(torch.ops.humming.linear_bound.default, (qa.codes, qa.scales, None, bias, site))
    # float8 inputs (NVFP4 scales): opcheck's schema check compares inputs before and after with a multiply
    # that CPU lacks for float8, so that one check runs on the GPU only (test_gpu_opcheck)
    qa = humming.quantize_activation(x, "nvfp4")
    nv = _weight(Case("nvfp4", "nvfp4", None))
    args = (qa.codes, qa.scales, qa.global_scale, *ops.weight_args(nv), None, "nvfp4", torch.bfloat16, "reference")
    torch.library.opcheck(torch.ops.humming.linear.default, args, test_utils=_NO_SCHEMA_CHECK)


def test_opcheck_linear_triton(seed):
    qw = _weight(Case("int4", "int4", 128), n=32)
    x = torch.randn(2, 128, dtype=torch.float16)
    args = (x, None, None, *ops.weight_args(qw), None, None, torch.float16, "triton")
    torch.library.opcheck(torch.ops.humming.linear.default, args)


def _moe_weights(e=4, k=64, inter=32):
    w13 = humming.quantize(torch.randn(e, 2 * inter, k), "int4", group_size=32)
    w2 = humming.quantize(torch.randn(e, k, inter), "int4", group_size=32)
    return w13, w2


def test_opcheck_moe(seed):
    w13, w2 = _moe_weights()
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    weights, ids = moe.topk_routing(torch.randn(5, 4), 2)
    torch.library.opcheck(torch.ops.humming.topk_routing.default, (torch.randn(5, 4), 2, "sigmoid", True))
    torch.library.opcheck(torch.ops.humming.moe_align.default, (ids, 4, 16))
    routing = moe.moe_align(ids, 4, 16)
    xg = torch.randn(routing.m_pad, 64, dtype=torch.bfloat16)
    grouped = lambda x, x_scales, rows, act, backend: (
        (x, x_scales, None, routing.expert_ids, 16, rows, *ops.weight_args(w13), None, act, torch.bfloat16, backend)
    )
    torch.library.opcheck(torch.ops.humming.grouped_linear.default, grouped(xg, None, None, "fp8", "reference"))
    # gathering the tokens through rows: 16-bit, per-tensor and pre-quantized ones, on both backends that
    # gather. One slot per expert fills every block (M_pad = 4 blocks of 16), so that no output row is unwritten.
    routing = moe.moe_align(torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), 4, 16)
    rows = routing.token_rows(2)
    qa = humming.quantize_activation(x[:2], "int8")
    for backend in ("reference", "triton"):
        for act in (None, "fp8_tensor"):
            torch.library.opcheck(torch.ops.humming.grouped_linear.default, grouped(x[:2], None, rows, act, backend))
        args = grouped(qa.codes, qa.scales, rows, "int8", backend)
        torch.library.opcheck(torch.ops.humming.grouped_linear.default, args)
    w13_args, w2_args = ops.weight_args(w13), ops.weight_args(w2)
    silu = ("silu", None, None, "concat")
    args = (x, weights, ids, *w13_args, None, *w2_args, None, None, *silu, None, None, None, 16, "reference")
    torch.library.opcheck(torch.ops.humming.fused_moe.default, args)
    site = ops.bind(w13, w2, "silu", "concat", None, "reference")
    args = (x, weights, ids, None, None, None, None, None, 16, site)
    torch.library.opcheck(torch.ops.humming.fused_moe_bound.default, args)
    # static scales of both GEMMs' inputs
    scales = (torch.tensor([[0.02]]), torch.tensor([[0.01]]))
    args = (x, weights, ids, *w13_args, None, *w2_args, None, None, *silu, "fp8", *scales, 16, "reference")
    torch.library.opcheck(torch.ops.humming.fused_moe.default, args)
    # gpt-oss's activation on interleaved rows, biases, an expert map (global ids over 6 experts, 4 here);
    # the Triton path too (activation pass and combine, under the interpreter on CPU)
    bias13, bias2 = torch.randn(4, 64), torch.randn(4, 64)
    expert_map = torch.tensor([0, -1, 1, 2, -1, 3], dtype=torch.int32)
    gids = torch.randint(0, 6, (5, 2), dtype=torch.int32)
    swiglu = ("swiglu_oai", 1.702, 7.0, "interleaved")
    for act, backend in ((None, "reference"), ("fp8", "reference"), (None, "triton")):
        args = (x, weights, gids, *w13_args, bias13, *w2_args, bias2, expert_map, *swiglu, act, None, None, 16, backend)
        torch.library.opcheck(torch.ops.humming.fused_moe.default, args)


@pytest.mark.parametrize(("act", "max_m"), [(None, 32), ("fp8", 16), (None, 20)])
def test_opcheck_grouped_linear_masked(act, max_m, seed):
    """The masked grouped GEMM's op: 16-bit and per-token fp8 activations, a max_m that is padded. The
    reference backend, whose skipped rows are zeros: the Triton kernels leave them unwritten (unspecified),
    which opcheck's comparison of whole outputs cannot allow (test_compile_grouped_linear_masked_dynamic_max_m
    runs the op on Triton)."""
    w13, _ = _moe_weights()
    x = torch.randn(4, max_m, 64, dtype=torch.bfloat16)
    masked_m = torch.tensor([0, 3, max_m, 17 % max_m], dtype=torch.int32)
    for expected_m in (0, 100):
        args = (x, masked_m, expected_m, *ops.weight_args(w13), torch.randn(4, 64), act, torch.bfloat16, "reference")
        torch.library.opcheck(torch.ops.humming.grouped_linear_masked.default, args)


#: topk_routing's keyword arguments: DeepSeek-V3's grouped, biased sigmoid routing; gpt-oss's
ROUTINGS = {
    "deepseek": {
        "scoring": "sigmoid",
        "renormalize": True,
        "num_groups": 4,
        "topk_groups": 2,
        "correction_bias": torch.linspace(-0.05, 0.05, 16),
        "routed_scaling": 2.5,
    },
    "gpt-oss": {"scoring": "softmax", "renormalize": False, "order": "topk_then_softmax"},
}


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("routing", ROUTINGS)
def test_opcheck_topk_routing(routing, backend, seed):
    kwargs = {**ROUTINGS[routing], "backend": backend}
    torch.library.opcheck(torch.ops.humming.topk_routing.default, (torch.randn(3, 16), 4), kwargs)


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("act", ["fp8", "int8_tensor", "nvfp4", "mxfp4"])
def test_opcheck_quantize_activation(seed, act, backend):
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.humming.quantize_activation.default, (x, act, None, backend))
    qa = ops.quantize_activation(x, act, backend=backend)
    ref = humming.quantize_activation(x, act)
    assert torch.equal(qa.codes, ref.codes)
    assert torch.equal(qa.scales.view(torch.uint8), ref.scales.view(torch.uint8))


# ------------------------------------------------------------------------------------------------ handles
def test_handle_finds_the_weight_and_rebuilds_copies(seed):
    qw = _weight(Case("uint4-zp", "uint4", 64, zero_point=True))
    args = ops.weight_args(qw)
    assert ops.weight_from_args(*args) is qw
    assert ops.weight_args(qw)[-2:] == args[-2:]  # one handle per object
    assert args[-1] == "uint4;1,64;64x128"
    copies = [t.clone() if isinstance(t, torch.Tensor) else t for t in args]
    rebuilt = ops.weight_from_args(*copies)
    assert rebuilt is not qw and torch.equal(humming.dequantize(rebuilt), humming.dequantize(qw))
    assert ops.weight_args(qw.replace(bias=None))[-2] != args[-2]  # a new object, a new handle


def test_custom_act_scheme_is_named_or_refused():
    assert ops.act_name(humming.ACT_SCHEMES["fp8"]) == "fp8"
    with pytest.raises(ValueError, match=r"act: .* not in humming.ACT_SCHEMES"):
        ops.act_name(humming.ActScheme("mine", "e4m3", 64))


def test_site_names_its_live_weights_only(seed):
    """A site (what a compiled call passes instead of the weight's tensors) stands for one weight and the
    call's arguments, one per kind of call, and names nothing once the weight is gone."""
    qw, other = _weight(CASES[0]), _weight(CASES[0])
    site = ops.bind(qw, None, torch.bfloat16, "auto")
    assert ops.bind(qw, None, torch.bfloat16, "auto") == site
    assert ops.bind(other, None, torch.bfloat16, "auto") != site
    assert ops.bind(qw, None, torch.float16, "auto") != site
    found = ops.bound(site)
    assert found[0] is qw and found[1:] == [None, torch.bfloat16, "auto"]
    del qw, found
    gc.collect()
    with pytest.raises(ValueError, match=r"site: '\d+:int4;1,-1;64x128\|None\|torch.bfloat16\|auto' names no live"):
        ops.bound(site)
    with pytest.raises(ValueError, match="site: 'mine' names no live weights"):
        torch.ops.humming.linear_bound(torch.randn(2, 128), None, None, None, "mine")


# ------------------------------------------------------------------------------------------------ compile
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_compile_linear_dynamic_m(case, seed, no_recompile, monkeypatch):
    qw = _weight(case)
    bias = torch.randn(64, dtype=torch.bfloat16)
    looked_up = []
    find = ops.bound
    monkeypatch.setattr(ops, "bound", lambda site: looked_up.append(find(site)[0]) or find(site))
    f = torch.compile(lambda x: humming.linear(x, qw, bias, act=case.act, backend="reference"), fullgraph=True)
    for m in M_VALUES:
        x = _dynamic(torch.randn(m, 128, dtype=torch.bfloat16))
        assert torch.equal(f(x), humming.linear(x, qw, bias, act=case.act, backend="reference"))
    assert looked_up and all(w is qw for w in looked_up)  # the dispatcher's caches see the one weight object


def test_bind_is_marked_constant_without_importing_dynamo():
    """``import humming`` leaves torch._dynamo unimported (a second of import time), so :func:`humming.ops.bind`
    carries the mark torch's assume_constant_result sets, under the name this torch uses."""
    code = "import sys, humming; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    marks = vars(torch._dynamo.assume_constant_result(lambda: None))
    assert marks and all(getattr(ops.bind, name, None) == value for name, value in marks.items()), marks


def _dynamo_graph(fn, *args) -> tuple[torch.fx.GraphModule, list]:
    """The graph dynamo hands its backend for ``fn(*args)`` (fullgraph), and the graph's inputs."""
    seen = []

    def backend(gm, inputs):
        seen.append((gm, inputs))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend=backend)(*args)
    return seen[0]


def test_compiled_calls_pass_sites_not_weights(seed):
    """Under torch.compile a linear (16-bit or pre-quantized activations) and a fused_moe call are one op each,
    given the activations and a site:
    no weight tensor is a graph input (each would cost a size check per call), and the graph runs the
    weights' own calls."""
    w13, w2 = _moe_weights(k=64)
    dense = _weight(CASES[0], n=64, k=64)
    weights, ids = moe.topk_routing(torch.randn(5, 4), 2)

    def layer(x):
        h = humming.linear(humming.linear(x, dense, backend="reference"), dense, backend="reference")
        h = humming.linear(ops.quantize_activation(h, "fp8"), dense, backend="reference")  # pre-quantized
        return moe.fused_moe(h, w13, w2, weights, ids, block_m=16, backend="reference")

    x = torch.randn(5, 64, dtype=torch.bfloat16)
    gm, inputs = _dynamo_graph(layer, x)
    calls = [n.target for n in gm.graph.nodes if n.op == "call_function" and "humming" in str(n.target)]
    linear, quantize = torch.ops.humming.linear_bound, torch.ops.humming.quantize_activation
    assert calls == [linear, linear, quantize, linear, torch.ops.humming.fused_moe_bound]
    weight_tensors = [t for w in (w13, w2, dense) for t in (w.qweight, w.scales)]
    assert not any(i is t for i in inputs for t in weight_tensors)
    assert torch.equal(gm(*inputs)[0], layer(x))


def test_export_passes_the_weights(seed):
    """An exported graph outlives the process, so its calls carry the weights' tensors and signatures."""
    qw = _weight(CASES[0])

    class Layer(torch.nn.Module):
        def forward(self, x):
            return humming.linear(x, qw, backend="reference")

    program = torch.export.export(Layer(), (torch.randn(4, 128, dtype=torch.bfloat16),))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.humming.linear.default]


def test_compile_one_code_many_weights(seed):
    """One function's code compiled over weights of every format and group shape (as a layer class's forward
    is): dynamo recompiles it per weight and makes the ints it reads from them symbolic; each stays exact."""

    def layer(qw, act):
        return torch.compile(lambda x: humming.linear(x, qw, act=act, backend="reference"), fullgraph=True)

    for case in CASES:
        qw = _weight(case, n=32 + 16 * CASES.index(case))
        x = torch.randn(5, 128, dtype=torch.bfloat16)
        assert torch.equal(layer(qw, case.act)(x), humming.linear(x, qw, act=case.act, backend="reference")), case


def test_compile_linear_unbacked_m(seed):
    """``mark_unbacked``: one graph for every M, 0 included."""
    qw = _weight(CASES[0])
    torch._dynamo.reset()
    f = torch.compile(lambda x: humming.linear(x, qw, backend="reference"), fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for m in (1, 0, 5):
            x = torch.randn(m, 128, dtype=torch.bfloat16)
            torch._dynamo.decorators.mark_unbacked(x, 0)
            y = f(x)
            assert y.shape == (m, 64)
            assert torch.equal(y, humming.linear(x, qw, backend="reference"))


def test_compile_linear_lead_dims(seed, no_recompile):
    qw = _weight(CASES[0])
    f = torch.compile(lambda x: humming.linear(x, qw, backend="reference"), fullgraph=True)
    for s in (1, 6):
        x = torch.randn(2, s, 128, dtype=torch.bfloat16)
        torch._dynamo.mark_dynamic(x, 1)
        y = f(x)
        assert y.shape == (2, s, 64)
        assert torch.equal(y, humming.linear(x, qw, backend="reference"))


def test_compile_prequantized_activation(seed, no_recompile):
    qw = _weight(CASES[3])

    def f(x):
        return humming.linear(ops.quantize_activation(x, "fp8"), qw, backend="reference")

    g = torch.compile(f, fullgraph=True)
    for m in M_VALUES:
        x = _dynamic(torch.randn(m, 128, dtype=torch.bfloat16))
        assert torch.equal(g(x), f(x))


def test_compile_triton(seed, no_recompile):
    qw = _weight(CASES[0], n=32)
    f = torch.compile(lambda x: humming.linear(x, qw, backend="triton"), fullgraph=True)
    for m in (1, 3):
        x = _dynamic(torch.randn(m, 128, dtype=torch.float16))
        assert torch.equal(f(x), humming.linear(x, qw, backend="triton"))


@pytest.mark.parametrize(
    ("act", "activation", "layout", "mapped", "backend"),
    [
        (None, "silu", "concat", False, "reference"),
        ("fp8", "silu", "concat", False, "reference"),
        ("fp8", "swiglu_oai", "interleaved", True, "reference"),
        (None, "gelu_tanh", "concat", True, "triton"),
    ],
    ids=lambda v: str(v),
)
def test_compile_fused_moe(act, activation, layout, mapped, backend, seed, no_recompile):
    """One graph for every T (the activation's parameters and the expert map go through the op)."""
    w13, w2 = _moe_weights()
    expert_map = torch.tensor([2, -1, 0, 3, 1, -1], dtype=torch.int32) if mapped else None
    num_routed = 6 if mapped else 4
    kwargs = dict(activation=activation, gate_up_layout=layout, act=act, block_m=16, backend=backend)

    def layer(x, logits):
        weights, ids = moe.topk_routing(logits, 2, renormalize=True)
        return moe.fused_moe(x, w13, w2, weights, ids, expert_map=expert_map, **kwargs)

    f = torch.compile(layer, fullgraph=True)
    for t in (1, 6, 19):
        x, logits = _dynamic(torch.randn(t, 64, dtype=torch.bfloat16)), _dynamic(torch.randn(t, num_routed))
        assert torch.equal(f(x, logits), layer(x, logits))


def test_compile_fused_moe_dynamic_numbers(seed):
    """``dynamic=True`` makes the numbers a compiled function reads symbolic (swiglu_oai's alpha and limit,
    block_m, here from a default argument): they reach the op as its arguments, not through a site."""
    w13, w2 = _moe_weights()
    weights, ids = moe.topk_routing(torch.randn(5, 4), 2)
    options = dict(activation="swiglu_oai", alpha=1.5, limit=6.0, gate_up_layout="interleaved", block_m=16)
    layer = lambda x, options=options: moe.fused_moe(x, w13, w2, weights, ids, backend="reference", **options)
    torch._dynamo.reset()
    f = torch.compile(layer, fullgraph=True, dynamic=True)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    assert torch.equal(f(x), layer(x))


def test_compile_moe_align_and_grouped_linear(seed, no_recompile):
    w13, _ = _moe_weights()

    def step(x, ids):
        routing = moe.moe_align(ids, 4, 16)
        xg = x[routing.src_slots.clamp_min(0).long() // 2]
        return moe.grouped_linear(xg, w13, routing.expert_ids, 16, backend="reference")

    f = torch.compile(step, fullgraph=True)
    for t in (1, 9):
        x = _dynamic(torch.randn(t, 64, dtype=torch.bfloat16))
        ids = _dynamic(torch.randint(0, 4, (t, 2), dtype=torch.int32))
        assert torch.equal(f(x, ids), step(x, ids))


@pytest.mark.parametrize(("act", "backend"), [(None, "triton"), ("fp8", "reference")])
def test_compile_grouped_linear_masked_dynamic_max_m(act, backend, seed, no_recompile):
    """One graph for every max_m (the block size is chosen inside the op), the output equal to eager."""
    w13, _ = _moe_weights()

    def f(x, masked_m):
        return moe.grouped_linear_masked(x, w13, masked_m, act=act, backend=backend)

    g = torch.compile(f, fullgraph=True)
    for max_m in (16, 48, 20):
        x = torch.randn(4, max_m, 64, dtype=torch.bfloat16)
        torch._dynamo.mark_dynamic(x, 1)
        masked_m = torch.randint(0, max_m + 1, (4,), dtype=torch.int32)
        valid = torch.arange(max_m)[None, :] < masked_m[:, None]
        got, expect = g(x, masked_m), f(x, masked_m)
        assert got.shape == (4, max_m, 64)
        assert torch.equal(got[valid], expect[valid])


@pytest.mark.parametrize(("act", "backend"), [(None, "triton"), ("fp8_tensor", "triton"), ("nvfp4", "reference")])
def test_compile_grouped_linear_gather(act, backend, seed, no_recompile):
    """The gather (``rows``) through the op: one graph for every T, the tokens never copied into grouped
    order by the graph."""
    w13, _ = _moe_weights()

    def step(x, ids):
        routing = moe.moe_align(ids, 4, 16)
        rows = routing.token_rows(2)
        return moe.grouped_linear(x, w13, routing.expert_ids, 16, rows=rows, act=act, backend=backend)

    f = torch.compile(step, fullgraph=True)
    for t in (1, 6):
        x = _dynamic(torch.randn(t, 64, dtype=torch.bfloat16))
        ids = _dynamic(torch.randint(0, 4, (t, 2), dtype=torch.int32))
        routing = moe.moe_align(ids, 4, 16)
        used = (routing.src_slots >= 0)[:, None]
        assert torch.equal(torch.where(used, f(x, ids), 0), torch.where(used, step(x, ids), 0))


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("routing", ROUTINGS)
def test_compile_topk_routing(routing, backend, seed, no_recompile):
    kwargs = {**ROUTINGS[routing], "backend": backend}
    f = torch.compile(lambda logits: moe.topk_routing(logits, 4, **kwargs), fullgraph=True)
    for t in (1, 5, 9):
        logits = _dynamic(torch.randn(t, 16))
        for got, expect in zip(f(logits), moe.topk_routing(logits, 4, **kwargs)):
            assert torch.equal(got, expect)


def test_topk_routing():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 1.0]])
    weights, ids = moe.topk_routing(logits, 2)
    assert ids.dtype == torch.int32 and ids.tolist() == [[1, 2], [2, 3]]
    torch.testing.assert_close(weights, logits.softmax(-1).topk(2).values)
    weights, _ = moe.topk_routing(logits, 2, scoring="sigmoid", renormalize=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2))
    with pytest.raises(ValueError, match="top_k: expected an int in \\[1, 4\\]"):
        moe.topk_routing(logits, 5)
    with pytest.raises(ValueError, match="scoring: expected one of"):
        moe.topk_routing(logits, 2, scoring="relu")


# -------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gpu_compile_and_graph(case, seed, no_recompile):
    """On CUDA with backend "auto": compiled with a dynamic M equals eager, and after humming.warmup a
    CUDA graph of the compiled and of the eager call replays to the eager output."""
    qw = _weight(case, n=256, k=512, device="cuda")
    humming.warmup([qw], m_values=(*M_VALUES, 8192), act=case.act, progress=False)
    f = torch.compile(lambda x: humming.linear(x, qw, act=case.act), fullgraph=True)
    for m in (*M_VALUES, 8192):
        x = _dynamic(torch.randn(m, 512, dtype=torch.bfloat16, device="cuda"))
        torch.testing.assert_close(f(x), humming.linear(x, qw, act=case.act), rtol=0, atol=0)
    for fn in (f, lambda x: humming.linear(x, qw, act=case.act)):
        x = torch.randn(7, 512, dtype=torch.bfloat16, device="cuda")
        graph, y = capture(lambda fn=fn, x=x: fn(x))
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(y, humming.linear(x, qw, act=case.act), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gpu_opcheck(case, seed):
    qw = _weight(case, n=256, k=512, device="cuda")
    x = torch.randn(5, 512, dtype=torch.bfloat16, device="cuda")
    args = (x, None, None, *ops.weight_args(qw), None, case.act, torch.bfloat16, "auto")
    # opcheck's schema check multiplies every input, which torch has no kernel for on float8 tensors
    float8 = any(isinstance(a, torch.Tensor) and a.dtype.itemsize == 1 and a.is_floating_point() for a in args)
    checks = _NO_SCHEMA_CHECK if float8 else None
    torch.library.opcheck(torch.ops.humming.linear.default, args, test_utils=checks or "ALL")
    if case.act is not None:
        qa = ops.quantize_activation(x, case.act)
        torch.library.opcheck(torch.ops.humming.quantize_activation.default, (x, case.act, None, "auto"))
        gs = qa.global_scale
        args = (qa.codes, qa.scales, gs, *ops.weight_args(qw), None, case.act, torch.bfloat16, "auto")
        float8 = any(isinstance(a, torch.Tensor) and a.dtype.itemsize == 1 and a.is_floating_point() for a in args)
        torch.library.opcheck(torch.ops.humming.linear.default, args, test_utils=_NO_SCHEMA_CHECK if float8 else "ALL")


@pytest.mark.gpu
def test_gpu_capture_of_an_unwarmed_call_names_the_warmup(seed):
    qw = _weight(CASES[0], n=256, k=512, device="cuda")
    x = torch.randn(5, 512, dtype=torch.bfloat16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"humming.warmup\(\[weight\], m_values=\[5\]"), torch.cuda.graph(graph):
        humming.linear(x, qw)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gpu_dense_capture_after_warmup_alone(case, seed):
    """humming.warmup alone readies a dense call's every kernel (the activation quantization pass before a
    CUDA GEMM included): a capture with no eager call before it succeeds and replays to the eager output."""
    qw = _weight(case, n=256, k=512, device="cuda")
    humming.warmup([qw], m_values=(3,), act=case.act, progress=False)
    x = torch.randn(3, 512, dtype=torch.bfloat16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = humming.linear(x, qw, act=case.act)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(y, humming.linear(x, qw, act=case.act), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize(("act", "mapped"), [(None, False), ("fp8", False), ("fp8", True)])
def test_gpu_fused_moe_graph(act, mapped, seed):
    """Compiled and graphed equal eager; mapped: gpt-oss's activation as one rank (8 of 12 experts)."""
    e, k, inter, t = 8, 512, 256, 6
    w13 = humming.quantize(torch.randn(e, 2 * inter, k, device="cuda"), "int4", group_size=128)
    w2 = humming.quantize(torch.randn(e, k, inter, device="cuda"), "int4", group_size=128)
    x = torch.randn(t, k, dtype=torch.bfloat16, device="cuda")
    options = {}
    if mapped:
        expert_map = torch.tensor([0, 1, -1, 2, 3, -1, 4, 5, -1, 6, 7, -1], dtype=torch.int32, device="cuda")
        options = dict(activation="swiglu_oai", gate_up_layout="interleaved", expert_map=expert_map)
    logits = torch.randn(t, 12 if mapped else e, device="cuda")

    def layer(x, logits):
        weights, ids = moe.topk_routing(logits, 2)
        return moe.fused_moe(x, w13, w2, weights, ids, act=act, block_m=16, **options)

    m_pad = moe.padded_rows(t * 2, e, 16)
    humming.warmup([w13, w2], m_values=[m_pad], act=act, block_ms=[16], progress=False)
    expect = layer(x, logits)
    torch.testing.assert_close(torch.compile(layer, fullgraph=True)(x, logits), expect, rtol=0, atol=0)
    graph, y = capture(lambda: layer(x, logits))
    graph.replay()
    torch.testing.assert_close(y, expect, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("act", [None, "fp8"])
def test_gpu_fused_moe_capture_after_warmup_alone(act, seed):
    """humming.warmup of a FusedMoE's MoeCall readies every kernel of the layer (routing, grouped GEMMs, the
    activation pass with w2's quantization, the combine): a capture with no eager call before it succeeds,
    and its replay gives the eager result."""
    from humming.nn import FusedMoE

    e, k, inter, t = 8, 512, 256, 6
    w13, w2 = torch.randn(e, 2 * inter, k, device="cuda"), torch.randn(e, k, inter, device="cuda")
    routing = dict(scoring="sigmoid", renormalize=True, num_groups=4, topk_groups=2)
    bias = torch.rand(e, device="cuda")
    layer = FusedMoE.from_float(w13, w2, 2, "int4", 128, act=act, correction_bias=bias, **routing)
    humming.warmup([layer.moe_call()], m_values=[t], progress=False)
    x = torch.randn(t, k, dtype=torch.bfloat16, device="cuda")
    logits = torch.randn(t, e, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer(x, logits)
    graph.replay()
    torch.testing.assert_close(y, layer(x, logits), rtol=0, atol=0)
