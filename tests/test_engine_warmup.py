"""What the engines' MoE method warms at load (``MoECore.warm_experts``), without vLLM or SGLang: the layer's
fused_moe call where it says its top_k (so w13 is prepared in the gated epilogue's layout fused_moe reads, and
nothing else), its two expert weights otherwise; the IR codes freed in both cases."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import humming
from humming.engines._moe import MoECore
from humming.moe import MoeCall

E, K, INTER = 8, 128, 64


class _Core(MoECore):
    @staticmethod
    def capture_sizes() -> tuple[int, ...]:
        return (1, 2, 4)


def _layer(**attrs) -> SimpleNamespace:
    torch.manual_seed(0)
    w13 = humming.quantize(torch.randn(E, 2 * INTER, K), "int4", group_size=64)
    w2 = humming.quantize(torch.randn(E, K, INTER), "int4", group_size=64)
    scales = (torch.ones(1), torch.ones(1))
    base = dict(humming_w13=w13, humming_w2=w2, humming_act="fp8_tensor", humming_act_scales=scales)
    return SimpleNamespace(**base, humming_params_dtype=torch.bfloat16, **attrs)


def _warmed(monkeypatch, layer) -> tuple[list, dict]:
    seen = []
    monkeypatch.setattr(humming, "warmup", lambda layers, **kwargs: seen.append((list(layers), kwargs)))
    core = _Core()
    core.activation, core.config = "gelu", SimpleNamespace(backend="triton")
    core.warm_experts(layer)
    assert len(seen) == 1
    return seen[0]


def test_a_layer_with_top_k_warms_its_fused_moe_call(monkeypatch):
    layer = _layer(top_k=2, expert_map=None)
    layers, kwargs = _warmed(monkeypatch, layer)
    (call,) = layers
    assert isinstance(call, MoeCall) and (call.w13, call.w2, call.top_k) == (layer.humming_w13, layer.humming_w2, 2)
    assert (call.activation, call.act, call.backend) == ("gelu", "fp8_tensor", "triton")
    assert call.w13_act_scale is layer.humming_act_scales[0] and call.w2_act_scale is layer.humming_act_scales[1]
    assert kwargs["keep_codes"] is False and kwargs["m_values"] == (1, 2, 4)
    assert kwargs["act_dtype"] == torch.bfloat16


def test_expert_parallel_top_k_counts_every_routed_expert(monkeypatch):
    """With an expert map (expert parallelism) top_k may exceed the local experts: it counts the map's."""
    expert_map = torch.full((4 * E,), -1, dtype=torch.int32)
    expert_map[:E] = torch.arange(E, dtype=torch.int32)
    (call,), _ = _warmed(monkeypatch, _layer(top_k=E + 2, expert_map=expert_map))
    assert call.top_k == E + 2 and call.expert_map is expert_map


@pytest.mark.parametrize("attrs", [{}, {"top_k": None}, {"top_k": True}, {"top_k": E + 1}])
def test_without_a_usable_top_k_the_expert_weights_are_warmed(monkeypatch, attrs):
    layer = _layer(**attrs)
    layers, kwargs = _warmed(monkeypatch, layer)
    assert layers == [layer.humming_w13, layer.humming_w2] and kwargs["keep_codes"] is False
