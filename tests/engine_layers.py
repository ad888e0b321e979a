"""The engine tests' shared cases (vLLM's and SGLang's linear layers have the same classes and loaders): the
real-producer fixtures and two of humming's own (``tests/data/engines``: compressed-tensors nvfp4, mxfp4), one
decoder layer's fused layers built from the engine's own classes, loading as a model's ``load_weights`` does,
and what humming computes on the same checkpoint modules. Imported as ``engine_layers`` (pytest puts tests/ on
sys.path)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

import humming

DATA = Path(__file__).parent / "data" / "checkpoints"
ENGINE_DATA = Path(__file__).parent / "data" / "engines"
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
FIXTURES = [
    "autogptq_w4_g128_sym",
    "awq_w4_g128",
    "ct_w4a16_g128_sym",
    "ct_w4a16_asym",
    "ct_fp8_block",
    "ct_w8a8_int8",
    "modelopt_nvfp4",
    "ct_nvfp4",
    "ct_mxfp4",
]


def humming_config(config_class, name: str):
    """The engine's humming_ir config of fixture ``name``, as the engine makes it for a Llama model."""
    config = config_class.from_config(json.loads((_folder(name) / "config.json").read_text())["quantization_config"])
    config.packed_modules_mapping = dict(PACKED)  # what the engine copies from the model class
    return config


def layers(engine, config, name: str, kind: str = "all"):
    """The engine's own layers (``engine``: its linear-layer module) for fixture ``name``'s decoder layer, sized
    by its ``config.json`` (``kind``: all, qkv or mlp): ``[(layer, {checkpoint module: shard id})]``."""
    model = json.loads((_folder(name) / "config.json").read_text())
    hidden, heads, kv = model["hidden_size"], model["num_attention_heads"], model["num_key_value_heads"]
    head = model.get("head_dim") or hidden // heads
    attn, mlp = "model.layers.0.self_attn", "model.layers.0.mlp"
    found = []
    if kind in ("all", "qkv"):
        qkv = engine.QKVParallelLinear(
            hidden, head, heads, kv, bias=False, quant_config=config, prefix=f"{attn}.qkv_proj"
        )
        found.append((qkv, {f"{attn}.q_proj": "q", f"{attn}.k_proj": "k", f"{attn}.v_proj": "v"}))
    if kind in ("all", "mlp"):
        inter = model["intermediate_size"]
        gate_up = engine.MergedColumnParallelLinear(
            hidden, [inter, inter], bias=False, quant_config=config, prefix=f"{mlp}.gate_up_proj"
        )
        down = engine.RowParallelLinear(inter, hidden, bias=False, quant_config=config, prefix=f"{mlp}.down_proj")
        found += [(gate_up, {f"{mlp}.gate_proj": 0, f"{mlp}.up_proj": 1}), (down, {f"{mlp}.down_proj": None})]
    return found


def _folder(name: str) -> Path:
    """A fixture's folder: the real-producer ones, else the engine tests' own (``tests/data/engines``)."""
    return DATA / name if (DATA / name).is_dir() else ENGINE_DATA / name


def load(layer, shards: dict, tensors: dict) -> None:
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


def expected(x: torch.Tensor, parts: list, act) -> torch.Tensor:
    """humming.linear on the exact concatenation of a fused layer's modules; where they cannot be joined
    exactly (2-D blocks straddling two modules), the modules' outputs side by side."""
    try:
        joined = humming.concat(parts) if len(parts) > 1 else parts[0]
    except ValueError:
        return torch.cat([humming.linear(x, w, act=act) for w in parts], dim=-1)
    return humming.linear(x, joined, act=act)


def check_layers(engine, config_class, method_class, name: str) -> None:
    """Fixture ``name``'s QKV, gate / up and down layers, built from the engine's classes with its humming_ir
    config and loaded through its weight loaders, equal :func:`expected` on fresh inputs; the checkpoint's
    placeholder tensors are gone after loading."""
    config = humming_config(config_class, name)
    tensors = load_file(_folder(name) / "model.safetensors")
    qws = humming.load_checkpoint(_folder(name))
    acts = humming.loaders.activation_schemes(_folder(name))
    for layer, shards in layers(engine, config, name):
        assert isinstance(layer.quant_method, method_class)
        load(layer, shards, tensors)
        x = torch.randn(5, layer.input_size, dtype=torch.bfloat16)
        expect = expected(x, [qws[m] for m in shards], acts[next(iter(shards))][0])
        assert torch.equal(layer(x)[0], expect), sorted(shards)
        assert not {"qweight", "weight_packed", "weight"} & {n for n, _ in layer.named_parameters()}


def check_ignored(engine, config_class, unquantized_class) -> None:
    """A router gate the checkpoint's ``ignore`` names (a regex, as compressed-tensors writes them) gets the
    engine's unquantized method, and a layer that is not linear gets none."""
    qconfig = json.loads((DATA / "ct_w4a16_g128_sym" / "config.json").read_text())["quantization_config"]
    config = config_class({**qconfig, "ignore": [*qconfig.get("ignore", []), "re:.*mlp\\.gate$"]})
    gate = engine.ReplicatedLinear(256, 8, bias=False, quant_config=config, prefix="model.layers.0.mlp.gate")
    assert isinstance(gate.quant_method, unquantized_class)
    assert config.get_quant_method(torch.nn.LayerNorm(4), "model.norm") is None
