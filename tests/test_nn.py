"""humming.nn: QuantizedLinear, FusedMoE and quantize_model against the functional API and the float
model holding the dequantized weights; state_dict, device / dtype moves, torch.compile."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import capture
from torch import nn

import humming
from humming import moe
from humming.nn import FusedMoE, QuantizedExperts, QuantizedLinear, quantize_model


class Block(nn.Module):
    """A toy transformer MLP: two projections and a head."""

    def __init__(self, dim=128, hidden=256):
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.head = nn.Linear(dim, 64)

    def forward(self, x):
        return self.head(self.down(torch.relu(self.up(x))))


def _float_twin(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every QuantizedLinear replaced by an nn.Linear holding the dequantized weight."""
    twin = copy.deepcopy(model)
    for name, module in model.named_modules():
        if isinstance(module, QuantizedLinear):
            qw = module.weight
            layer = nn.Linear(qw.K, qw.N, bias=qw.bias is not None)
            layer.weight.data = humming.dequantize(qw)
            if qw.bias is not None:
                layer.bias.data = qw.bias.float()
            parent, _, child = name.rpartition(".")
            setattr(twin.get_submodule(parent), child, layer)
    return twin


@pytest.mark.parametrize("weight, act", [("int4", None), ("nvfp4", None), ("e4m3", "fp8")])
def test_quantize_model_matches_the_dequantized_float_model(weight, act, seed):
    model = Block()
    quantize_model(model, weight, act=act, modules=["up", "down"], progress=False)
    assert isinstance(model.up, QuantizedLinear) and isinstance(model.down, QuantizedLinear)
    assert isinstance(model.head, nn.Linear)
    assert model.up.weight.group_size == (16 if weight == "nvfp4" else 128)
    x = torch.randn(5, 128)
    y = model(x)
    if act is None:  # the reference backend: float32 matmul of the dequantized weight
        torch.testing.assert_close(y, _float_twin(model)(x), rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(y, _float_twin(model)(x), rtol=0.1, atol=0.1)


def test_quantize_model_errors():
    with pytest.raises(ValueError, match=r"modules: no nn\.Linear or experts module of the model matches"):
        quantize_model(Block(), modules=["*.attn"], progress=False)
    with pytest.raises(ValueError, match=r"model: expected a torch\.nn\.Module"):
        quantize_model(object())
    with pytest.raises(ValueError, match=r"linear_module: expected a torch\.nn\.Linear"):
        QuantizedLinear.from_float(nn.Conv1d(1, 1, 1))


def test_quantized_linear_is_humming_linear(seed):
    w = torch.randn(96, 128, dtype=torch.bfloat16)
    qw = humming.quantize(w, "uint4", group_size=64, zero_point=True, bias=torch.randn(96, dtype=torch.bfloat16))
    layer = QuantizedLinear(qw, act="int8")
    x = torch.randn(2, 3, 128, dtype=torch.bfloat16)
    assert torch.equal(layer(x), humming.linear(x, qw, act="int8"))
    assert layer.weight is qw and "uint4 g64" in repr(layer)


def test_state_dict_and_moves_keep_the_weight(seed):
    layer = QuantizedLinear.from_float(nn.Linear(128, 64).to(torch.bfloat16), "nvfp4")
    names = set(layer.state_dict())
    assert {"qweight", "scales", "global_scale", "bias"} <= names
    other = QuantizedLinear.from_float(nn.Linear(128, 64).to(torch.bfloat16), "nvfp4")
    other.load_state_dict(layer.state_dict())
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    assert torch.equal(other(x), layer(x))
    before = layer.weight
    layer.half()  # codes, e4m3 scales and the fp32 global scale keep their dtypes
    assert layer.weight.scales.dtype == torch.float8_e4m3fn and layer.weight.global_scale.dtype == torch.float32
    assert torch.equal(humming.dequantize(layer.weight), humming.dequantize(before))


def test_fused_moe_module(seed):
    e, k, inter = 4, 64, 32
    layer = FusedMoE.from_float(torch.randn(e, 2 * inter, k), torch.randn(e, k, inter), 2, "int4", 32, renormalize=True)
    x = torch.randn(2, 3, k, dtype=torch.bfloat16)
    logits = torch.randn(2, 3, e)
    weights, ids = moe.topk_routing(logits.reshape(6, e), 2, renormalize=True)
    expect = moe.fused_moe(x.reshape(6, k), layer.w13, layer.w2, weights, ids)
    assert torch.equal(layer(x, logits), expect.reshape(2, 3, k))
    with pytest.raises(ValueError, match=r"top_k: expected an int in \[1, 4\]"):
        FusedMoE(layer.w13, layer.w2, 5)


def test_fused_moe_module_options(seed):
    """gpt-oss's activation on interleaved rows, as one expert-parallel rank (4 of 6 experts): the router
    logits cover every expert, the map moves with the module and stays out of the state_dict."""
    e, k, inter = 4, 64, 32
    expert_map = torch.tensor([0, -1, 1, 2, -1, 3])
    options = dict(activation="swiglu_oai", limit=5.0, gate_up_layout="interleaved", expert_map=expert_map)
    layer = FusedMoE.from_float(torch.randn(e, 2 * inter, k), torch.randn(e, k, inter), 2, "int4", 32, **options)
    x, logits = torch.randn(5, k, dtype=torch.bfloat16), torch.randn(5, 6)
    weights, ids = moe.topk_routing(logits, 2)
    expect = moe.fused_moe(x, layer.w13, layer.w2, weights, ids, **options)
    assert torch.equal(layer(x, logits), expect)
    assert "expert_map" not in layer.state_dict() and "activation=swiglu_oai (interleaved)" in repr(layer)
    assert layer.to("meta").expert_map.device.type == "meta"
    with pytest.raises(ValueError, match="alpha: parameters of activation='swiglu_oai'"):
        FusedMoE(layer.w13, layer.w2, 2, alpha=1.0)
    with pytest.raises(ValueError, match=r"top_k: expected an int in \[1, 6\]"):
        FusedMoE(layer.w13, layer.w2, 7, expert_map=expert_map)


#: FusedMoE's routing options over 8 experts, as topk_routing's keyword arguments
MODULE_ROUTINGS = {
    "mixtral": dict(renormalize=True),
    "deepseek": dict(
        scoring="sigmoid", renormalize=True, num_groups=4, topk_groups=2, correction_bias=True, routed_scaling=2.5
    ),
    "sigmoid-bias": dict(scoring="sigmoid", correction_bias=True),
    "gpt-oss": dict(order="topk_then_softmax"),
}


@pytest.mark.parametrize("routing", MODULE_ROUTINGS)
def test_fused_moe_module_routing(routing, seed):
    """Each routing option reaches topk_routing: the module's output is fused_moe on topk_routing's choice,
    bit for bit; route() and experts() are those two steps; the correction bias is in the state_dict."""
    e, k, inter, t = 8, 64, 32, 5
    kwargs = dict(MODULE_ROUTINGS[routing])
    if kwargs.get("correction_bias"):
        kwargs["correction_bias"] = torch.rand(e) / 4
    layer = FusedMoE.from_float(torch.randn(e, 2 * inter, k), torch.randn(e, k, inter), 2, "int4", 32, **kwargs)
    x, logits = torch.randn(t, k, dtype=torch.bfloat16), torch.randn(t, e)
    weights, ids = moe.topk_routing(logits, 2, **kwargs)
    expect = moe.fused_moe(x, layer.w13, layer.w2, weights, ids)
    assert torch.equal(layer(x, logits), expect)
    got_weights, got_ids = layer.route(logits)
    assert torch.equal(got_weights, weights) and torch.equal(got_ids, ids)
    assert torch.equal(layer.experts(x, weights, ids), expect)
    assert ("correction_bias" in layer.state_dict()) == ("correction_bias" in kwargs)


@pytest.mark.parametrize(
    ("activation", "params"),
    [("silu", {}), ("gelu", {}), ("gelu_tanh", {}), ("swiglu_oai", {}), ("swiglu_oai", dict(alpha=1.0, limit=3.0))],
    ids=["silu", "gelu", "gelu_tanh", "swiglu_oai", "swiglu_oai-1-3"],
)
@pytest.mark.parametrize("layout", ["concat", "interleaved"])
def test_fused_moe_module_activation_and_biases(activation, params, layout, seed):
    """Each activation and gate / up layout, with per-expert biases given to the module (in place of the
    weights' own, held in the state_dict): the output is fused_moe's with those biases on the weights."""
    e, k, inter = 4, 64, 32
    w13 = humming.quantize(torch.randn(e, 2 * inter, k), "int4", group_size=32)
    w2 = humming.quantize(torch.randn(e, k, inter), "int4", group_size=32)
    b13, b2 = torch.randn(e, 2 * inter), torch.randn(e, k)
    options = dict(activation=activation, gate_up_layout=layout, **params)
    layer = FusedMoE(w13, w2, 2, w13_bias=b13, w2_bias=b2, **options)
    x, logits = (torch.randn(5, k) / 2).bfloat16(), torch.randn(5, e)
    weights, ids = moe.topk_routing(logits, 2)
    expect = moe.fused_moe(x, w13.replace(bias=b13), w2.replace(bias=b2), weights, ids, **options)
    assert torch.equal(layer(x, logits), expect)
    assert torch.equal(layer.state_dict()["w13_bias"], b13) and torch.equal(layer.state_dict()["w2_bias"], b2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_groups=3, topk_groups=1), "num_groups: expected a positive int that divides E=4"),
        (dict(num_groups=2), "num_groups, topk_groups: give both or neither"),
        (dict(correction_bias=torch.zeros(3)), r"correction_bias: expected shape \(4,\)"),
        (dict(routed_scaling=0.0), "routed_scaling: expected a positive finite number"),
        (dict(order="topk_then_softmax", scoring="sigmoid"), "scoring: order='topk_then_softmax'"),
        (dict(scoring="tanh"), "scoring: expected one of"),
        (dict(w13_bias=torch.zeros(4, 32)), r"w13_bias: expected a float tensor of shape \(4, 64\)"),
        (dict(w2_bias=torch.zeros(4, 64, device="meta")), "w2_bias is on meta"),
        (dict(activation="relu"), "activation: expected one of"),
        (dict(w13_act_scale=torch.tensor(0.1)), "w13_act_scale: a static scale needs a per-token or per-tensor act"),
        (
            dict(act="mxfp4", w2_act_scale=torch.tensor(0.1)),
            "w2_act_scale: a static scale needs a per-token or per-tensor act, got act='mxfp4'",
        ),
        (dict(act="fp8", w13_act_scale=torch.ones(2)), "w13_act_scale: expected a one-element tensor"),
    ],
    ids=[
        *("groups", "groups-half", "bias-shape", "scaling", "order", "scoring", "w13-bias", "w2-bias-device", "act"),
        *("static-no-act", "static-mxfp4", "static-two-elements"),
    ],
)
def test_fused_moe_module_rejects(kwargs, match):
    w13 = humming.quantize(torch.randn(4, 64, 64), "int4", group_size=32)
    w2 = humming.quantize(torch.randn(4, 64, 32), "int4", group_size=32)
    with pytest.raises(ValueError, match=match):
        FusedMoE(w13, w2, 2, **kwargs)
    if "act_scale" in match:  # the experts module checks its scales the same way
        with pytest.raises(ValueError, match=match):
            QuantizedExperts(w13, w2, **kwargs)


@pytest.mark.parametrize("layout", ["concat", "interleaved"])
def test_quantized_experts_activation(layout, seed):
    """QuantizedExperts (transformers' experts interface) runs the activation and layout it is given."""
    e, k, inter = 4, 64, 32
    w13 = humming.quantize(torch.randn(e, 2 * inter, k), "int4", group_size=32, bias=torch.randn(e, 2 * inter))
    w2 = humming.quantize(torch.randn(e, k, inter), "int4", group_size=32)
    options = dict(activation="swiglu_oai", limit=3.0, gate_up_layout=layout)
    experts = QuantizedExperts(w13, w2, **options)
    x, (weights, ids) = torch.randn(5, k).bfloat16(), moe.topk_routing(torch.randn(5, e), 2)
    assert torch.equal(
        experts(x, ids.long(), weights.bfloat16()),
        moe.fused_moe(x, w13, w2, weights.bfloat16().float(), ids, **options),
    )
    assert f"activation=swiglu_oai ({layout})" in repr(experts)


def test_compile_quantized_model(seed):
    model = quantize_model(Block(), "int4", progress=False)
    torch._dynamo.reset()
    f = torch.compile(model, fullgraph=True)
    with (
        torch._dynamo.config.patch(error_on_recompile=True),
        torch.fx.experimental._config.patch(backed_size_oblivious=True),
    ):
        for m in (2, 7, 33):
            x = torch.randn(m, 128)
            torch._dynamo.mark_dynamic(x, 0)
            assert torch.equal(f(x), model(x))
    x = torch.randn(1, 128)  # torch 2.9 specialises M = 1 (a graph of its own, a plain nn.Linear's too)
    assert torch.equal(f(x), model(x))
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("weight, act", [("int4", None), ("e4m3", "fp8"), ("nvfp4", "nvfp4")])
def test_gpu_quantized_model_compiled_and_graphed(weight, act, seed):
    """On the GPU: compiled (dynamic M) equals eager, and a CUDA graph of the model after warmup replays."""
    model = quantize_model(Block().cuda().to(torch.bfloat16), weight, act=act, modules=["up", "down"])
    layers = [model.up.weight, model.down.weight]
    humming.warmup(layers, m_values=(1, 7, 33), act=act, progress=False)
    f = torch.compile(model, fullgraph=True)
    for m in (1, 7, 33):
        x = torch.randn(m, 128, dtype=torch.bfloat16, device="cuda")
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(f(x), model(x), rtol=0, atol=0)
    x = torch.randn(7, 128, dtype=torch.bfloat16, device="cuda")
    graph, y = capture(lambda: model(x))
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(y, model(x), rtol=0, atol=0)


def test_static_activation_scale(seed):
    """act_scale: x / act_scale quantized per tensor (a checkpoint's static input_scale), eager and compiled."""
    qw = humming.quantize(torch.randn(64, 128), "e4m3", group_size=-1)
    scale = torch.tensor(0.05)
    layer = QuantizedLinear(qw, act="fp8_tensor", act_scale=scale)
    x = torch.randn(2, 3, 128, dtype=torch.bfloat16)
    qa = humming.quantize_activation(x.reshape(6, 128), "fp8_tensor", scale=scale)
    assert torch.equal(layer(x), humming.linear(qa, qw, out_dtype=torch.bfloat16).reshape(2, 3, 64))
    assert "act=fp8_tensor static" in repr(layer) and "act_scale" in layer.state_dict()
    torch._dynamo.reset()
    f = torch.compile(layer, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for m in (3, 9):
            x = torch.randn(m, 128, dtype=torch.bfloat16)
            torch._dynamo.mark_dynamic(x, 0)
            assert torch.equal(f(x), layer(x))
    torch._dynamo.reset()
    with pytest.raises(ValueError, match=r"act_scale: a static scale needs a per-token or per-tensor act"):
        QuantizedLinear(humming.quantize(torch.randn(64, 128), "nvfp4"), act="nvfp4", act_scale=scale)
    with pytest.raises(ValueError, match=r"act_scale: expected a one-element tensor"):
        QuantizedLinear(qw, act="fp8", act_scale=torch.ones(2))


def _static_moe(backend: str, scales: str, factor: float = 1.0) -> FusedMoE:
    """An int4 FusedMoE (4 experts, K=64, I=32, top 2) on fp8 activations with static scales of the inputs of
    ``w13``, ``w2`` or both (``scales``; 0.02 and 4.0 times ``factor``), on ``backend``."""
    e, k, inter = 4, 64, 32
    options = dict(act="fp8", backend=backend)
    options["w13_act_scale"] = torch.tensor(0.02 * factor) if scales in ("w13", "both") else None
    options["w2_act_scale"] = torch.tensor(4.0 * factor) if scales in ("w2", "both") else None
    w13, w2 = torch.randn(e, 2 * inter, k), torch.randn(e, k, inter)
    return FusedMoE.from_float(w13, w2, 2, "int4", 32, **options)


@pytest.mark.parametrize("scales", ["both", "w13", "w2"])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_moe_modules_static_act_scales(backend, scales, seed):
    """w13_act_scale / w2_act_scale (checkpoints' static input scales): FusedMoE (from_float passes them on)
    and QuantizedExperts are fused_moe with those scales, bit for bit; the scales are float32 buffers in the
    state_dict (a round trip carries them: checked on the reference backend), kept float32 through dtype
    casts."""
    layer = _static_moe(backend, scales)
    s13, s2 = layer.w13_act_scale, layer.w2_act_scale
    assert all(s is None or (s.dtype == torch.float32 and s.shape == (1, 1)) for s in (s13, s2))
    x, logits = torch.randn(5, 64, dtype=torch.bfloat16), torch.randn(5, 4)
    weights, ids = moe.topk_routing(logits, 2, backend=backend)
    options = dict(act="fp8", w13_act_scale=s13, w2_act_scale=s2)
    expect = moe.fused_moe(x, layer.w13, layer.w2, weights, ids, **options, backend=backend)
    assert torch.isfinite(expect).all()
    assert torch.equal(layer(x, logits), expect)
    experts = QuantizedExperts(layer.w13, layer.w2, **options, backend=backend)
    assert torch.equal(experts(x, ids.long(), weights), expect)
    static = {"both": "act=fp8 static", "w13": "act=fp8 static w13", "w2": "act=fp8 static w2"}[scales]
    assert repr(layer).endswith(static + ")") and repr(experts).endswith(static + ")")
    state = layer.state_dict()
    given = {name for name, s in (("w13_act_scale", s13), ("w2_act_scale", s2)) if s is not None}
    assert {name for name in ("w13_act_scale", "w2_act_scale") if name in state} == given
    other = _static_moe("reference", scales, factor=2.0)
    other.load_state_dict(state)
    other.half()
    assert all(s is None or s.dtype == torch.float32 for s in (other.w13_act_scale, other.w2_act_scale))
    expect = moe.fused_moe(x, layer.w13, layer.w2, weights, ids, **options, backend="reference")
    assert torch.equal(other(x, logits), expect)
    dynamic = moe.fused_moe(x, layer.w13, layer.w2, weights, ids, act="fp8", backend="reference")
    assert not torch.equal(dynamic, expect)  # the scales are used


def test_compile_fused_moe_static_act_scales(seed):
    """FusedMoE with static activation scales compiles to one graph (the scales are buffers the graph reads),
    for any token count, and equals eager."""
    layer = _static_moe("auto", "both")
    torch._dynamo.reset()
    f = torch.compile(layer, fullgraph=True)
    with (
        torch._dynamo.config.patch(error_on_recompile=True),
        torch.fx.experimental._config.patch(backed_size_oblivious=True),
    ):
        for t in (2, 7):
            x, logits = torch.randn(t, 64, dtype=torch.bfloat16), torch.randn(t, 4)
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(logits, 0)
            assert torch.equal(f(x, logits), layer(x, logits))
    torch._dynamo.reset()


@pytest.mark.parametrize(
    "other, field",
    [
        (dict(weight="nf4"), "format"),  # int4 and nf4 codes pack alike: the tensors alone would load
        (dict(weight="int4", group_size=64), "group_shape"),
        (dict(weight="e2m1", group_size=128), "format"),
    ],
)
def test_load_state_dict_refuses_another_weight(other, field, seed):
    layer = QuantizedLinear.from_float(nn.Linear(256, 64), "int4", 128)
    source = QuantizedLinear.from_float(nn.Linear(256, 64), **other)
    before = layer.weight.qweight.clone()
    with pytest.raises(ValueError, match=rf"^load_state_dict: {field}: the state has "):
        layer.load_state_dict(source.state_dict())
    assert torch.equal(layer.weight.qweight, before)  # refused before any tensor was copied
    experts = QuantizedExperts(
        humming.quantize(torch.randn(2, 64, 128), "int4"), humming.quantize(torch.randn(2, 128, 32), "int4")
    )
    wider = QuantizedExperts(
        humming.quantize(torch.randn(2, 64, 128), "int4"), humming.quantize(torch.randn(2, 128, 64), "int4")
    )
    with pytest.raises(ValueError, match=r"^load_state_dict: w2_shape: the state has \[2, 128, 64\]"):
        experts.load_state_dict(wider.state_dict())


def test_load_state_dict_loads_into_a_new_weight(seed):
    layer = QuantizedLinear.from_float(nn.Linear(256, 64), "int4", 128)
    source = QuantizedLinear.from_float(nn.Linear(256, 64), "int4", 128)
    old = layer.weight
    layer.load_state_dict(source.state_dict())
    assert layer.weight is not old and torch.equal(layer.weight.qweight, source.weight.qweight)
    x = torch.randn(3, 256)
    assert torch.equal(layer(x), source(x))
