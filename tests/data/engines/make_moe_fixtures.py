"""Writes this folder's MoE fixtures for the engine tests: one Qwen2-MoE-style sparse MLP (4 experts, hidden
128, intermediate 128, top-2; per-expert ``gate_proj`` / ``up_proj`` / ``down_proj``) per checkpoint format
the engines' MoE methods read, and ``tests/data/moe_gptq_w4_g128``:

- compressed-tensors, written by humming's export (``humming.loaders.export``, the layout
  ``tests/test_save.py`` checks loads back bit for bit) from ``humming.quantize`` of random experts:
  ``moe_ct_w4a16_sym`` (int4, groups of 64), ``moe_ct_w4a16_asym`` (uint4 with zero points, groups of 64),
  ``moe_ct_fp8_block`` (e4m3, 128x128 blocks, fp8 activations per 1x128 group; at these sizes, which keep
  the fp8 fixtures under 200 KB, each projection is one block), ``moe_ct_nvfp4``, ``moe_ct_mxfp4``
  (weight-only);
- producers humming does not write, in their own layouts from random codes and scales: ``moe_gptq_w4_g128``
  (AutoGPTQ v1, 4-bit, group 128, symmetric, no act-order, hidden 256, its router gate kept in bfloat16,
  ``humming.loaders.gptq.pack_gptq``, the layout ``tests/test_checkpoints.py`` checks against AutoGPTQ's own
  checkpoints), ``moe_awq`` (AutoAWQ
  GEMM, 4-bit, group 64, ``humming.loaders.awq.pack_awq``), ``moe_fp8_block`` (``quant_method: fp8``,
  DeepSeek-V3's e4m3 ``weight`` and fp32 ``weight_scale_inv`` per 128x128 block) and ``moe_modelopt_nvfp4``
  (ModelOpt: uint8 ``weight`` of two e2m1 codes, e4m3 ``weight_scale`` per 16, fp32 ``weight_scale_2`` and
  ``input_scale``).

Run from the repository root: ``python tests/data/engines/make_moe_fixtures.py``."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

import humming
from humming.loaders.awq import pack_awq
from humming.loaders.export import CT_VERSION, compressed_tensors_scheme, compressed_tensors_tensors
from humming.loaders.gptq import pack_gptq

HERE = Path(__file__).parent
EXPERTS, HIDDEN, INTER = 4, 128, 128
PREFIX = "model.layers.0.mlp.experts"
#: name -> (humming.quantize arguments, activation scheme)
CT = {
    "moe_ct_w4a16_sym": (dict(weight="int4", group_size=64), None),
    "moe_ct_w4a16_asym": (dict(weight="int4", group_size=64, zero_point=True), None),
    "moe_ct_fp8_block": (dict(weight="fp8_block", group_size=(128, 128)), "fp8_g128"),
    "moe_ct_nvfp4": (dict(weight="nvfp4"), None),
    "moe_ct_mxfp4": (dict(weight="mxfp4"), None),
}


def modules(hidden: int = HIDDEN):
    """``(checkpoint module, n, k)`` of every expert projection."""
    projs = {"gate_proj": (INTER, hidden), "up_proj": (INTER, hidden), "down_proj": (hidden, INTER)}
    return [(f"{PREFIX}.{e}.{proj}", n, k) for e in range(EXPERTS) for proj, (n, k) in projs.items()]


def compressed_tensors(kwargs: dict, act) -> tuple[dict, dict]:
    tensors, scheme = {}, None
    for module, n, k in modules():
        qw = humming.quantize(torch.randn(n, k) * 0.05, **kwargs)
        scheme = compressed_tensors_scheme(qw, act, False)
        found = compressed_tensors_tensors(qw, scheme["format"])
        if kwargs.get("group_size") == (128, 128):  # one block is the whole projection: written as blocks all the same
            scheme["weights"].update(strategy="block", block_structure=[128, 128])
            found["weight_scale"] = found["weight_scale"].reshape(1, 1)
        tensors.update({f"{module}.{leaf}": t for leaf, t in found.items()})
    group = dict(targets=["Linear"], output_activations=None, **scheme)
    qconfig = dict(
        quant_method="compressed-tensors",
        format=scheme["format"],
        config_groups={"group_0": group},
        ignore=["lm_head", "re:.*mlp\\.gate$"],
        quantization_status="compressed",
        version=CT_VERSION,
    )
    return tensors, qconfig


def gptq(gen: torch.Generator, hidden: int) -> tuple[dict, dict]:
    tensors, group = {"model.layers.0.mlp.gate.weight": torch.randn(EXPERTS, hidden, generator=gen).bfloat16()}, 128
    for module, n, k in modules(hidden):
        codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
        scales = (torch.rand(n, k // group, generator=gen) * 0.02 + 0.001).to(torch.float16)
        zeros = torch.full((n, k // group), 8, dtype=torch.int32)
        packed = pack_gptq(codes, scales, zeros, bits=4, group_size=group)
        tensors.update({f"{module}.{leaf}": t.contiguous() for leaf, t in packed.items()})
    return tensors, {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False, "sym": True}


def awq(gen: torch.Generator) -> tuple[dict, dict]:
    tensors, group = {}, 64
    for module, n, k in modules():
        codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
        zeros = torch.randint(0, 16, (n, k // group), generator=gen, dtype=torch.uint8)
        scales = (torch.rand(n, k // group, generator=gen) * 0.02 + 0.001).to(torch.float16)
        tensors.update({f"{module}.{leaf}": t.contiguous() for leaf, t in pack_awq(codes, scales, zeros).items()})
    qconfig = dict(quant_method="awq", bits=4, group_size=group, zero_point=True, version="gemm")
    return tensors, {**qconfig, "modules_to_not_convert": ["mlp.gate"]}


def fp8_block(gen: torch.Generator) -> tuple[dict, dict]:
    tensors = {}
    for module, n, k in modules():
        tensors[f"{module}.weight"] = (torch.randn(n, k, generator=gen) * 100).to(torch.float8_e4m3fn)
        tensors[f"{module}.weight_scale_inv"] = torch.rand(n // 128, k // 128, generator=gen) * 1e-3 + 1e-4
    qconfig = dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic", weight_block_size=[128, 128])
    return tensors, {**qconfig, "modules_to_not_convert": ["mlp.gate"]}


def modelopt_nvfp4(gen: torch.Generator) -> tuple[dict, dict]:
    tensors = {}
    for module, n, k in modules():
        tensors[f"{module}.weight"] = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
        scale = torch.rand(n, k // 16, generator=gen) * 400 + 16
        tensors[f"{module}.weight_scale"] = scale.to(torch.float8_e4m3fn)
        tensors[f"{module}.weight_scale_2"] = torch.rand((), generator=gen) * 1e-4 + 1e-5
        tensors[f"{module}.input_scale"] = torch.rand((), generator=gen) * 1e-2 + 1e-3
    qconfig = dict(quant_method="modelopt", quant_algo="NVFP4", group_size=16, exclude_modules=["lm_head", "*mlp.gate"])
    return tensors, qconfig


def write(folder: Path, tensors: dict, qconfig: dict, hidden: int = HIDDEN) -> None:
    folder.mkdir(exist_ok=True)
    save_file(tensors, folder / "model.safetensors")
    config = {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "hidden_size": hidden,
        "moe_intermediate_size": INTER,
        "num_experts": EXPERTS,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 1,
        "quantization_config": qconfig,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def main() -> None:
    torch.manual_seed(29)
    for name, (kwargs, act) in CT.items():
        write(HERE / name, *compressed_tensors(kwargs, act))
    write(HERE.parent / "moe_gptq_w4_g128", *gptq(torch.Generator().manual_seed(29), 256), hidden=256)
    gen = torch.Generator().manual_seed(29)
    write(HERE / "moe_awq", *awq(gen))
    write(HERE / "moe_fp8_block", *fp8_block(gen))
    write(HERE / "moe_modelopt_nvfp4", *modelopt_nvfp4(gen))


if __name__ == "__main__":
    main()
