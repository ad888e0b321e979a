"""humming.engines.vllm inside vLLM's real code (skipped where vLLM does not import; CI does not install it).

Runs on CPU with vLLM's CPU platform (``VLLM_TARGET_DEVICE=cpu``) and a one-process gloo group, so vLLM's own
layer classes (``QKVParallelLinear``, ``MergedColumnParallelLinear``, ``RowParallelLinear``,
``ReplicatedLinear``), parameter classes and weight loaders run unchanged. The one stand-in: a tensor-parallel
rank other than 0 of 1 is vLLM's ``get_tensor_model_parallel_rank`` / ``_world_size`` patched to return it (a
real TP group needs one process per rank)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # before vLLM resolves its platform
pytest.importorskip("vllm.model_executor.layers.linear", reason="vLLM is not installed (or does not import)")

import vllm.model_executor.layers.linear as vllm_linear
import vllm.model_executor.parameter as vllm_parameter
from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    UnquantizedLinearMethod,
)
from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.utils.import_utils import has_humming

import humming
from humming.engines.vllm import HummingConfig, HummingLinearMethod, HummingMoEMethod, capture_sizes

DATA = Path(__file__).parent / "data" / "checkpoints"
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
HEAD = 32
FIXTURES = [
    "autogptq_w4_g128_sym",
    "awq_w4_g128",
    "ct_w4a16_g128_sym",
    "ct_w4a16_asym",
    "ct_fp8_block",
    "ct_w8a8_int8",
    "modelopt_nvfp4",
]


@pytest.fixture(scope="module", autouse=True)
def vllm_process():
    """What a vLLM worker sets up before it builds a model: its config and a (one-process) TP group."""
    config = VllmConfig()
    config.compilation_config.cudagraph_capture_sizes = [24, 1, 2, 4, 8, 16]  # CPU captures none: as on CUDA
    with set_current_vllm_config(config):
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0, distributed_init_method=f"file://{tempfile.mkstemp()[1]}",
            backend="gloo",
        )  # fmt: skip
        initialize_model_parallel(1)
        yield


def _config(name: str) -> HummingConfig:
    qconfig = json.loads((DATA / name / "config.json").read_text())["quantization_config"]
    config = get_quantization_config("humming_ir").from_config(qconfig)
    config.packed_modules_mapping = dict(PACKED)  # what vLLM copies from the model class
    return config


def _shapes(tensors: dict, head: str) -> dict:
    """Module -> (out, in) of the fixture's projections, from the producer's reference."""
    return {m[len(head) + 1 :]: tuple(t.shape) for m, t in tensors.items() if m.startswith(head)}


def _layers(config, reference: dict, kind: str = "all"):
    """vLLM's own layers for the fixture's decoder layer (``kind``: all, qkv or mlp): (layer, {checkpoint
    module: shard id})."""
    attn, mlp = "model.layers.0.self_attn", "model.layers.0.mlp"
    s = {**_shapes(reference, attn), **_shapes(reference, mlp)}
    hidden, heads, kv = s["q_proj.weight"][1], s["q_proj.weight"][0] // HEAD, s["k_proj.weight"][0] // HEAD
    found = []
    if kind in ("all", "qkv"):
        qkv = QKVParallelLinear(hidden, HEAD, heads, kv, bias=False, quant_config=config, prefix=f"{attn}.qkv_proj")
        found.append((qkv, {f"{attn}.q_proj": "q", f"{attn}.k_proj": "k", f"{attn}.v_proj": "v"}))
    if kind in ("all", "mlp"):
        inter = s["gate_proj.weight"][0]
        gate_up = MergedColumnParallelLinear(
            hidden, [inter, inter], bias=False, quant_config=config, prefix=f"{mlp}.gate_up_proj"
        )
        down = RowParallelLinear(inter, hidden, bias=False, quant_config=config, prefix=f"{mlp}.down_proj")
        found += [(gate_up, {f"{mlp}.gate_proj": 0, f"{mlp}.up_proj": 1}), (down, {f"{mlp}.down_proj": None})]
    return found


def _load(layer, shards: dict, tensors: dict) -> None:
    """What a model's ``load_weights`` does: each checkpoint tensor through its parameter's weight_loader
    (with the shard id of vLLM's stacked_params_mapping), then process_weights_after_loading."""
    params = dict(layer.named_parameters())
    for module, shard in shards.items():
        for key, tensor in tensors.items():
            owner, _, leaf = key.rpartition(".")
            if owner != module or leaf not in params:  # AutoGPTQ's zero biases of bias-free layers: skipped, as vLLM
                continue
            param = params[leaf]
            if shard is None:
                param.weight_loader(param, tensor)
            else:
                param.weight_loader(param, tensor, shard)
    layer.quant_method.process_weights_after_loading(layer)


def test_vllm_probe_and_registry():
    """With humming installed vLLM's probe for humming-kernels is false and every quantization config vLLM
    ships imports (the import path every quantized model takes)."""
    assert not has_humming()
    for method in QUANTIZATION_METHODS:
        assert issubclass(get_quantization_config(method), QuantizationConfig), method
    assert get_quantization_config("humming_ir") is HummingConfig


@pytest.mark.parametrize("name", ["autogptq_w4_g128_sym", "ct_fp8_block", "modelopt_nvfp4"])
def test_vllm_selects_the_method(name):
    """vLLM's own checkpoint detection (ModelConfig) keeps its choice unless humming_ir is asked for."""
    default = ModelConfig(model=str(DATA / name), skip_tokenizer_init=True)
    assert default.quantization not in (None, "humming_ir")
    chosen = ModelConfig(model=str(DATA / name), quantization="humming_ir", skip_tokenizer_init=True)
    assert chosen.quantization == "humming_ir"


@pytest.mark.parametrize("name", FIXTURES)
def test_layers_equal_humming(name, seed):
    """Each of vLLM's layers, loaded through its own weight loaders, computes what humming computes on the
    checkpoint's modules (:func:`_expected`)."""
    config = _config(name)
    tensors = load_file(DATA / name / "model.safetensors")
    qws = humming.load_checkpoint(DATA / name)
    acts = humming.loaders.activation_schemes(DATA / name)
    for layer, shards in _layers(config, load_file(DATA / name / "reference.safetensors")):
        assert isinstance(layer.quant_method, HummingLinearMethod)
        _load(layer, shards, tensors)
        x = torch.randn(5, layer.input_size, dtype=torch.bfloat16)
        got = torch.full((5, layer.output_size), float("nan"), dtype=torch.bfloat16)
        got.copy_(layer(x)[0])
        expect = _expected(x, [qws[m] for m in shards], acts[next(iter(shards))][0])
        assert torch.equal(got, expect), layer.prefix if hasattr(layer, "prefix") else shards
        assert not hasattr(layer, "qweight") and not hasattr(layer, "weight_packed") and not hasattr(layer, "weight")


def _expected(x: torch.Tensor, parts: list, act) -> torch.Tensor:
    """humming.linear on the exact concatenation of a fused layer's modules; where they cannot be joined
    exactly (2-D blocks straddling two modules), the modules' outputs side by side."""
    try:
        joined = humming.concat(parts) if len(parts) > 1 else parts[0]
    except ValueError:
        return torch.cat([humming.linear(x, w, act=act) for w in parts], dim=-1)
    return humming.linear(x, joined, act=act)


def test_ignored_layers_stay_unquantized():
    qconfig = json.loads((DATA / "ct_w4a16_g128_sym" / "config.json").read_text())["quantization_config"]
    config = HummingConfig({**qconfig, "ignore": [*qconfig.get("ignore", []), "re:.*mlp\\.gate$"]})
    gate = ReplicatedLinear(256, 8, bias=False, quant_config=config, prefix="model.layers.0.mlp.gate")
    assert isinstance(gate.quant_method, UnquantizedLinearMethod)
    assert isinstance(config.get_quant_method(torch.nn.LayerNorm(4), "model.norm"), type(None))


@pytest.mark.parametrize(("rank", "world", "kind"), [(3, 5, "mlp"), (1, 3, "qkv"), (5, 6, "qkv")])
def test_tensor_parallel_rank_and_replicated_kv_heads(monkeypatch, rank, world, kind, seed):
    """Rank ``rank`` of ``world``: q, gate / up take their part along N, down along K; with 6 ranks and 3 KV
    heads vLLM replicates each KV head on 2 ranks and its loader gives rank 5 head 2."""
    for module in (vllm_linear, vllm_parameter):
        monkeypatch.setattr(module, "get_tensor_model_parallel_rank", lambda: rank)
        monkeypatch.setattr(module, "get_tensor_model_parallel_world_size", lambda: world)
    name = "autogptq_w4_g128_sym"
    config, tensors = _config(name), load_file(DATA / name / "model.safetensors")
    qws = humming.load_checkpoint(DATA / name)
    kv_heads = 3
    kv_part = (0, rank // (world // kv_heads), kv_heads) if world > kv_heads else (0, rank, world)
    parts = {"q": (0, rank, world), "k": kv_part, "v": kv_part, 0: (0, rank, world), 1: (0, rank, world)}
    layers = _layers(config, load_file(DATA / name / "reference.safetensors"), kind)
    for layer, shards in layers:
        _load(layer, shards, tensors)
        x = torch.randn(3, layer.input_size_per_partition, dtype=torch.bfloat16)
        expect = _expected(x, [qws[m].shard(*parts.get(s, (1, rank, world))) for m, s in shards.items()], None)
        assert torch.equal(layer.quant_method.apply(layer, x), expect), shards


def test_warmup_sizes_are_vllm_capture_sizes():
    assert capture_sizes() == (1, 2, 4, 8, 16, 24)


def test_moe_experts_equal_fused_moe(seed):
    """vLLM's routed experts (FusedMoEFactory's RoutedExperts) on the GPTQ MoE fixture, loaded expert by expert
    through vLLM's expert weight loader, compute humming.moe.fused_moe on the checkpoint's experts."""
    from vllm.model_executor.layers.fused_moe import FusedMoEFactory, fused_moe_make_expert_params_mapping

    path = Path(__file__).parent / "data" / "moe_gptq_w4_g128"
    hf = json.loads((path / "config.json").read_text())
    config = HummingConfig(hf["quantization_config"])
    prefix = "model.layers.0.mlp.experts"
    runner = FusedMoEFactory(
        num_experts=hf["num_experts"],
        top_k=hf["num_experts_per_tok"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["moe_intermediate_size"],
        params_dtype=torch.bfloat16,
        quant_config=config,
        prefix=prefix,
    )
    experts = runner.routed_experts
    assert isinstance(experts.quant_method, HummingMoEMethod)
    params = dict(experts.named_parameters())
    mapping = fused_moe_make_expert_params_mapping(experts, "gate_proj", "down_proj", "up_proj", hf["num_experts"])
    for key, tensor in load_file(path / "model.safetensors").items():
        for param_name, weight_name, expert_id, shard_id in mapping:
            if weight_name in key:  # what Qwen2-MoE's load_weights does, relative to the routed experts
                name = key.replace(weight_name, param_name).rpartition("routed_experts.")[2]
                if name in params:  # g_idx without act-order: vLLM's GPTQ experts keep none either
                    params[name].weight_loader(params[name], tensor, name, shard_id=shard_id, expert_id=expert_id)
    experts.quant_method.process_weights_after_loading(experts)
    qws = humming.load_checkpoint(path)
    w13 = humming.concat([qws[f"{prefix}.gate_proj"], qws[f"{prefix}.up_proj"]], dim=1)
    x = torch.randn(7, hf["hidden_size"], dtype=torch.bfloat16)
    topk_weights, topk_ids = torch.rand(7, 2).softmax(-1), torch.stack([torch.randperm(4)[:2] for _ in range(7)])
    got = experts.quant_method.apply(experts, x, topk_weights, topk_ids.to(torch.int32), None, None)
    expect = humming.moe.fused_moe(x, w13, qws[f"{prefix}.down_proj"], topk_weights, topk_ids.to(torch.int32))
    assert torch.equal(got, expect)
