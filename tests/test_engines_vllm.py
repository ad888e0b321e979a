"""humming.engines.vllm against vLLM's real base classes (skipped where vLLM does not import): the hooks vLLM
calls (create_weights, the parameters' weight_loader as vLLM's loader calls it, process_weights_after_loading,
apply) on the real-producer checkpoints, fused QKV / gate-up shards and a tensor-parallel rank included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import humming

pytest.importorskip("vllm.model_executor.layers.linear", reason="vLLM is not installed (or does not import)")
from vllm.model_executor.layers.linear import LinearMethodBase
from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from humming.engines.vllm import HummingConfig, HummingLinearMethod

DATA = Path(__file__).parent / "data" / "checkpoints"
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
LAYERS = [  # (vLLM layer, shard ids of the checkpoint modules it fuses)
    ("model.layers.0.self_attn.qkv_proj", {"q_proj": "q", "k_proj": "k", "v_proj": "v"}),
    ("model.layers.0.mlp.gate_up_proj", {"gate_proj": 0, "up_proj": 1}),
    ("model.layers.0.mlp.down_proj", {"down_proj": None}),
]


def _config(name: str) -> HummingConfig:
    qconfig = json.loads((DATA / name / "config.json").read_text())["quantization_config"]
    config = HummingConfig.from_config(qconfig)
    config.packed_modules_mapping = dict(PACKED)
    return config


def _load_layer(config: HummingConfig, prefix: str, shards: dict, tensors: dict, tp=(0, 1)) -> torch.nn.Module:
    """What vLLM does for one linear layer: create_weights, then each checkpoint tensor through its
    parameter's weight_loader (shard id on the tensor, as vLLM 0.33's WeightsMapper sets it), then
    process_weights_after_loading."""
    layer = torch.nn.Module()
    layer.tp_rank, layer.tp_size = tp
    method = HummingLinearMethod(config, prefix)
    method.create_weights(layer, 0, [], 0, 0, torch.bfloat16, weight_loader=None)
    head = prefix.rpartition(".")[0]
    for module, shard in shards.items():
        for key, tensor in tensors.items():
            owner, _, leaf = key.rpartition(".")
            if owner == f"{head}.{module}" and leaf != "bias":
                param = getattr(layer, leaf)
                tensor = tensor.clone()
                if shard is not None:
                    tensor.shard_id = shard
                param.weight_loader(param, tensor)
    method.process_weights_after_loading(layer)
    layer.quant_method = method
    return layer


def test_registered_with_vllm():
    # vLLM's own get_quantization_config cannot be called here: it imports vLLM's built-in humming-kernels
    # method, whose package is also named humming (see humming/engines/vllm.py)
    from vllm.model_executor.layers.quantization import _CUSTOMIZED_METHOD_TO_QUANT_CONFIG

    assert "humming_ir" in QUANTIZATION_METHODS and _CUSTOMIZED_METHOD_TO_QUANT_CONFIG["humming_ir"] is HummingConfig
    assert issubclass(HummingConfig, QuantizationConfig) and issubclass(HummingLinearMethod, LinearMethodBase)
    assert _config("awq_w4_g128").get_quant_method(torch.nn.LayerNorm(4), "model.norm") is None


@pytest.mark.parametrize(
    "name", ["autogptq_w4_g128_sym", "awq_w4_g128", "ct_fp8_block", "ct_w8a8_int8", "modelopt_nvfp4"]
)
def test_layers_equal_humming(name, seed):
    """Each fused layer computes humming.linear on the exact concatenation of its modules' weights, with the
    checkpoint's activation scheme."""
    config = _config(name)
    tensors = load_file(DATA / name / "model.safetensors")
    qws = humming.load_checkpoint(DATA / name)
    acts = humming.loaders.activation_schemes(DATA / name)
    for prefix, shards in LAYERS:
        if name == "ct_fp8_block" and "qkv" in prefix:  # 96-row k / v in 128x128 blocks: no exact join
            with pytest.raises(ValueError, match=r"straddle two parts"):
                _load_layer(config, prefix, shards, tensors)
            continue
        layer = _load_layer(config, prefix, shards, tensors)
        head = prefix.rpartition(".")[0]
        parts = [qws[f"{head}.{m}"] for m in shards]
        expect_w = humming.concat(parts) if len(parts) > 1 else parts[0]
        act = acts[f"{head}.{next(iter(shards))}"][0]
        x = torch.randn(5, expect_w.K, dtype=torch.bfloat16)
        got = layer.quant_method.apply(layer, x)
        assert torch.equal(got, humming.linear(x, expect_w, act=act)), f"{prefix}"
        assert not hasattr(layer, "qweight") and not hasattr(layer, "weight_scale")  # placeholders dropped


def test_tensor_parallel_rank():
    """Rank 1 of 2: column-parallel layers take their half of each fused shard before joining them."""
    config = _config("ct_w4a16_g128_sym")
    tensors = load_file(DATA / "ct_w4a16_g128_sym" / "model.safetensors")
    qws = humming.load_checkpoint(DATA / "ct_w4a16_g128_sym")
    prefix, shards = LAYERS[1]
    layer = _load_layer(config, prefix, shards, tensors, tp=(1, 2))
    head = prefix.rpartition(".")[0]
    expect = humming.concat([qws[f"{head}.{m}"].shard(0, 1, 2) for m in shards])
    assert torch.equal(humming.dequantize(layer.humming.weight), humming.dequantize(expect))
