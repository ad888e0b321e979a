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
from humming.nn import FusedMoE, QuantizedLinear, quantize_model


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
    with pytest.raises(ValueError, match=r"modules: no nn\.Linear of the model matches"):
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


def test_compile_quantized_model(seed):
    model = quantize_model(Block(), "int4", progress=False)
    torch._dynamo.reset()
    f = torch.compile(model, fullgraph=True)
    with (
        torch._dynamo.config.patch(error_on_recompile=True),
        torch.fx.experimental._config.patch(backed_size_oblivious=True),
    ):
        for m in (1, 7, 33):
            x = torch.randn(m, 128)
            torch._dynamo.mark_dynamic(x, 0)
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
