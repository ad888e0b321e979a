"""Writes this folder's fixture: a GPTQ (AutoGPTQ v1 layout, 4-bit, group 128, symmetric, no act-order)
checkpoint of one Qwen2-MoE-style sparse MLP, 4 experts of hidden 256 and intermediate 128, its router gate
kept in bfloat16, packed by ``humming.loaders.gptq.pack_gptq`` (the layout ``tests/test_checkpoints.py``
checks against AutoGPTQ's own checkpoints). Run from the repository root: ``python
tests/data/moe_gptq_w4_g128/make_fixture.py``."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from humming.loaders.gptq import pack_gptq

HERE = Path(__file__).parent
EXPERTS, HIDDEN, INTER, GROUP = 4, 256, 128, 128


def main() -> None:
    gen = torch.Generator().manual_seed(29)
    tensors = {"model.layers.0.mlp.gate.weight": torch.randn(EXPERTS, HIDDEN, generator=gen).to(torch.bfloat16)}
    for e in range(EXPERTS):
        for proj, (n, k) in {
            "gate_proj": (INTER, HIDDEN),
            "up_proj": (INTER, HIDDEN),
            "down_proj": (HIDDEN, INTER),
        }.items():
            codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
            scales = (torch.rand(n, k // GROUP, generator=gen) * 0.02 + 0.001).to(torch.float16)
            zeros = torch.full((n, k // GROUP), 8, dtype=torch.int32)
            packed = pack_gptq(codes, scales, zeros, bits=4, group_size=GROUP)
            for leaf, t in packed.items():
                tensors[f"model.layers.0.mlp.experts.{e}.{proj}.{leaf}"] = t.contiguous()
    save_file(tensors, HERE / "model.safetensors")
    config = {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "hidden_size": HIDDEN,
        "moe_intermediate_size": INTER,
        "num_experts": EXPERTS,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 1,
        "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": True},
    }
    (HERE / "config.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    main()
