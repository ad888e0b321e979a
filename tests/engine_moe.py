"""The engine MoE tests' shared cases: one small MoE fixture per checkpoint format (``tests/data/moe_gptq_w4_g128``
and ``tests/data/engines/moe_*``, written by their scripts), the checkpoint tensors fed through an engine's own
expert weight loader as a Qwen2-MoE model's ``load_weights`` does, and what the loaded experts must compute:
``humming.moe.fused_moe`` on the experts humming reads from the same checkpoint (bit for bit), and the float64
loop over their dequantized experts (``tests/moe/moe_cases.fused_ref``). Imported as ``engine_moe``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from helpers import rel_err
from safetensors.torch import load_file

import humming

sys.path.insert(0, str(Path(__file__).parent / "moe"))  # moe_cases: the MoE tests' float64 reference
from moe_cases import MOE_TOL, fused_ref, random_routing

DATA = Path(__file__).parent / "data"
#: fixture name -> folder
FIXTURES = {
    "gptq_w4_g128": DATA / "moe_gptq_w4_g128",
    **{p.name.removeprefix("moe_"): p for p in sorted((DATA / "engines").glob("moe_*"))},
}
PREFIX = "model.layers.0.mlp.experts"


def model_config(name: str) -> dict:
    return json.loads((FIXTURES[name] / "config.json").read_text())


def load(experts, params: dict, mapping, name: str) -> None:
    """Every expert tensor of fixture ``name`` through its parameter's weight loader (``mapping``: the
    engine's expert params mapping, ``(param prefix, checkpoint prefix, expert, shard)``; ``params``: the
    experts module's parameters by the names the mapping gives), then process_weights_after_loading. A
    checkpoint tensor the method registers no parameter for is skipped, as the engines' models skip GPTQ's
    ``g_idx`` without act-order."""
    for key, tensor in load_file(FIXTURES[name] / "model.safetensors").items():
        for param_name, weight_name, expert_id, shard_id in mapping:
            if weight_name in key:
                param = key.replace(weight_name, param_name).rpartition("experts.")[2]
                if param in params:
                    params[param].weight_loader(params[param], tensor, param, shard_id=shard_id, expert_id=expert_id)
    experts.quant_method.process_weights_after_loading(experts)
    assert not [n for n, _ in experts.named_parameters() if n.startswith(("w13_", "w2_"))]


def check_experts(run, name: str) -> None:
    """``run(x, topk_weights, topk_ids)``, the engine's loaded experts of fixture ``name``, equals
    ``humming.moe.fused_moe`` on humming's own reading of the checkpoint bit for bit, on fresh inputs, and
    the float64 loop over the dequantized experts within the MoE tests' tolerance."""
    hf = model_config(name)
    qws = humming.load_checkpoint(FIXTURES[name])
    acts = humming.loaders.activation_schemes(FIXTURES[name])
    w13 = humming.concat([qws[f"{PREFIX}.gate_proj"], qws[f"{PREFIX}.up_proj"]], dim=1)
    w2 = qws[f"{PREFIX}.down_proj"]
    (act, w13_scale), (_, w2_scale) = acts[f"{PREFIX}.gate_proj"], acts[f"{PREFIX}.down_proj"]
    t, topk = 7, hf["num_experts_per_tok"]
    x = torch.randn(t, hf["hidden_size"], dtype=torch.bfloat16)
    topk_ids = random_routing(t, topk, hf["num_experts"], "cpu")
    topk_weights = torch.rand(t, topk).softmax(-1)
    got = run(x, topk_weights, topk_ids)
    scales = dict(w13_act_scale=w13_scale, w2_act_scale=w2_scale)
    assert torch.equal(got, humming.moe.fused_moe(x, w13, w2, topk_weights, topk_ids, act=act, **scales))
    err = rel_err(got, fused_ref(x, w13, w2, topk_weights, topk_ids, act, scales=(w13_scale, w2_scale)))
    assert err <= MOE_TOL[torch.bfloat16], f"{name}: rel err {err:.2e}"
