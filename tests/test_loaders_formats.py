"""Round trips through each producer's layout: our packers write a checkpoint folder following the format
spec, ``load_checkpoint`` reads it, and ``humming.dequantize`` equals an independent float32 decode of the
original codes, bit for bit. Odd shapes, every bit width, act-order and MoE stacking included."""

import json
from dataclasses import dataclass

import pytest
import torch
from helpers import assert_bit_exact
from safetensors.torch import save_file

import humming
from humming.ir.formats import get_format
from humming.loaders import load_checkpoint
from humming.loaders.awq import pack_awq
from humming.loaders.bnb import pack_bnb_nf4
from humming.loaders.compressed_tensors import pack_fp4, pack_int_quantized
from humming.loaders.gpt_oss import pack_gpt_oss
from humming.loaders.gptq import pack_gptq


def write_checkpoint(path, qconfig, modules, *, hf_quant_config=None):
    """A checkpoint folder: config.json with ``qconfig`` and model.safetensors with ``modules``' tensors."""
    tensors = {f"{m}.{k}" if not k.startswith("_") else f"{m}{k}": t for m, d in modules.items() for k, t in d.items()}
    tensors["model.norm.weight"] = torch.ones(8, dtype=torch.bfloat16)  # unquantized: must be left out
    save_file({k: v.clone() for k, v in tensors.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": qconfig}))
    if hf_quant_config is not None:
        (path / "hf_quant_config.json").write_text(json.dumps(hf_quant_config))
    return path


def reference(values, scales, zeros=None, g_idx=None, group=None, dtype=torch.bfloat16):
    """Independent decode: ``(values - zeros[group]) * scales[group]`` in float32, rounded once."""
    k = values.shape[-1]
    if g_idx is None:
        g_idx = torch.arange(k) // (group if group not in (None, -1) else k)
    s = scales.to(torch.float32)[..., g_idx.long()]
    z = zeros.to(torch.float32)[..., g_idx.long()] if zeros is not None else 0.0
    return ((values.to(torch.float32) - z) * s).to(dtype)


def act_order_g_idx(k, group, gen):
    """A real act-order g_idx: column perm[i] belongs to group i // group."""
    perm = torch.randperm(k, generator=gen)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k) // group).to(torch.int32)
    return g_idx


# ------------------------------------------------------------------------------------------------ GPTQ
@dataclass(frozen=True)
class GPTQCase:
    bits: int
    group: int
    sym: bool
    version: int = 1
    act_order: bool = False
    n: int = 72
    k: int = 256


GPTQ_CASES = [
    GPTQCase(4, 128, True),
    GPTQCase(4, 32, False),
    GPTQCase(4, 32, False, version=2),
    GPTQCase(2, 64, True, act_order=True),
    GPTQCase(3, 32, True, n=40, k=96),
    GPTQCase(3, 32, False, version=2, act_order=True, n=40, k=96),
    GPTQCase(8, -1, True, n=33, k=64),
    GPTQCase(8, 32, False, act_order=True, n=17, k=128),
    GPTQCase(4, 128, False, act_order=True, n=96, k=384),
]


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("case", GPTQ_CASES, ids=str)
def test_gptq_round_trip(tmp_path, case):
    gen = torch.Generator().manual_seed(case.bits * 100 + case.group)
    n, k, bits = case.n, case.k, case.bits
    groups = 1 if case.group == -1 else k // case.group
    codes = torch.randint(0, 2**bits, (n, k), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, groups, generator=gen) * 0.01 + 1e-3).half()
    if case.sym:
        zeros = torch.full((n, groups), 2 ** (bits - 1))
    else:  # v1 cannot store zero 0 (see test_gptq_v1_zero_point_zero_overflow)
        zeros = torch.randint(1 if case.version == 1 else 0, 2**bits, (n, groups), generator=gen)
    g_idx = act_order_g_idx(k, case.group, gen) if case.act_order else None
    tensors = pack_gptq(codes, scales, zeros, bits=bits, group_size=case.group, g_idx=g_idx, version=case.version)
    qconfig = {
        "quant_method": "gptq",
        "bits": bits,
        "group_size": case.group,
        "sym": case.sym,
        "desc_act": case.act_order,
    }
    if case.version == 2:
        qconfig["checkpoint_format"] = "gptq_v2"
    write_checkpoint(tmp_path, qconfig, {"model.layers.0.mlp.up_proj": tensors})
    qw = load_checkpoint(tmp_path)["model.layers.0.mlp.up_proj"]  # no zero of 0: v1 is unambiguous, no warning
    assert qw.shape == (n, k)
    assert qw.format.name == (f"int{bits}" if case.sym else f"uint{bits}")
    assert (qw.g_idx is not None) == case.act_order
    expected = reference(codes, scales, zeros, g_idx=g_idx, group=case.group, dtype=torch.float16)
    assert_bit_exact(humming.dequantize(qw, torch.float16), expected)


def test_gptq_v1_zero_point_zero_overflow(tmp_path):
    """AutoGPTQ stores a v1 zero of 0 as -1: that field and every higher field of its word read as 2^bits."""
    n, k = 16, 64
    codes = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    scales = torch.full((n, 1), 0.5, dtype=torch.float16)
    zeros = torch.full((n, 1), 5)
    zeros[2, 0] = 0  # column 2 of word 0 (columns 0..7)
    tensors = pack_gptq(codes, scales, zeros, bits=4, group_size=-1)
    write_checkpoint(tmp_path, {"quant_method": "gptq", "bits": 4, "group_size": -1, "sym": False}, {"m": tensors})
    with pytest.warns(UserWarning, match=r"GPTQ v1 asymmetric checkpoint \(m and maybe others\)"):
        qw = load_checkpoint(tmp_path)["m"]
    expected_zeros = torch.full((n, 1), 5)
    expected_zeros[2:8, 0] = 16
    assert torch.equal(qw.zeros.to(torch.int64), expected_zeros)
    assert_bit_exact(
        humming.dequantize(qw, torch.float16), reference(codes, scales, expected_zeros, dtype=torch.float16)
    )


def test_gptq_dynamic_overrides(tmp_path):
    """GPTQModel ``dynamic``: ``-:`` excludes a module, a positive pattern overrides bits / group size."""
    gen = torch.Generator().manual_seed(1)
    n, k = 16, 128
    modules = {}
    for name, bits, group in (("model.layers.0.mlp.up_proj", 8, 64), ("model.layers.0.mlp.gate_proj", 4, 128)):
        codes = torch.randint(0, 2**bits, (n, k), generator=gen, dtype=torch.uint8)
        scales = torch.rand(n, k // group, generator=gen).half()
        modules[name] = pack_gptq(
            codes, scales, torch.full((n, k // group), 2 ** (bits - 1)), bits=bits, group_size=group
        )
    modules["model.layers.0.mlp.down_proj"] = modules["model.layers.0.mlp.gate_proj"]
    qconfig = {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 128,
        "sym": True,
        "dynamic": {"-:.*down_proj": {}, r"+:.*\.up_proj": {"bits": 8, "group_size": 64}},
    }
    qws = load_checkpoint(write_checkpoint(tmp_path, qconfig, modules))
    assert sorted(qws) == ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"]
    assert qws["model.layers.0.mlp.up_proj"].format.name == "int8"
    assert qws["model.layers.0.mlp.up_proj"].group_shape == (1, 64)


# ------------------------------------------------------------------------------------------------- AWQ
@pytest.mark.parametrize(("n", "k", "group"), [(72, 256, 128), (8, 96, 32), (136, 64, -1)])
def test_awq_round_trip(tmp_path, n, k, group):
    gen = torch.Generator().manual_seed(n + k)
    groups = 1 if group == -1 else k // group
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, groups, generator=gen) * 0.02).half()
    zeros = torch.randint(0, 16, (n, groups), generator=gen, dtype=torch.uint8)
    qconfig = {
        "quant_method": "awq",
        "version": "gemm",
        "bits": 4,
        "group_size": group,
        "zero_point": True,
        "modules_to_not_convert": ["visual"],
    }
    modules = {
        "model.layers.0.self_attn.v_proj": pack_awq(codes, scales, zeros),
        "model.visual.proj": pack_awq(codes, scales, zeros),
    }
    qws = load_checkpoint(write_checkpoint(tmp_path, qconfig, modules))
    assert list(qws) == ["model.layers.0.self_attn.v_proj"]
    qw = qws["model.layers.0.self_attn.v_proj"]
    assert qw.format.name == "uint4" and qw.zeros.dtype == torch.uint8
    assert_bit_exact(
        humming.dequantize(qw, torch.float16), reference(codes, scales, zeros, group=group, dtype=torch.float16)
    )


# ---------------------------------------------------------------------------------- compressed-tensors
def ct_config(weights, fmt, *, version="0.19.0", ignore=("lm_head",), targets=("Linear",)):
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "version": version,
        "ignore": list(ignore),
        "config_groups": {"group_0": {"targets": list(targets), "weights": weights, "input_activations": None}},
    }


def int_weights(bits, strategy, group=None, sym=True, actorder=None):
    return {
        "num_bits": bits,
        "type": "int",
        "symmetric": sym,
        "strategy": strategy,
        "group_size": group,
        "block_structure": None,
        "dynamic": False,
        "actorder": actorder,
    }


CT_PACK_CASES = [
    (bits, sym, strategy, padded)
    for bits in range(1, 9)
    for sym, strategy in ((True, "group"), (False, "channel"), (False, "group"))
    for padded in ((False, True) if 32 % bits else (False,))
]


@pytest.mark.parametrize(("bits", "sym", "strategy", "padded"), CT_PACK_CASES)
def test_ct_pack_quantized_round_trip(tmp_path, bits, sym, strategy, padded):
    gen = torch.Generator().manual_seed(bits * 10 + sym)
    n, k, group = 37, 100, 20  # odd N and K: partial words, zero points straddling words along N
    cols = k // group if strategy == "group" else 1
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1)
    q = torch.randint(lo, hi, (n, k), generator=gen)
    scales = (torch.rand(n, cols, generator=gen) + 0.5).bfloat16()
    zp = None if sym else torch.randint(lo, hi, (n, cols), generator=gen)
    tensors = pack_int_quantized(q, scales, zp, bits=bits, padded=padded)
    weights = int_weights(bits, strategy, group if strategy == "group" else None, sym)
    config = ct_config(weights, "pack-quantized", version="0.10.2" if padded else "0.19.0")
    qw = load_checkpoint(write_checkpoint(tmp_path, config, {"model.layers.0.mlp.down_proj": tensors}))[
        "model.layers.0.mlp.down_proj"
    ]
    assert qw.format.name == (f"int{bits}" if sym else f"uint{bits}")
    expected = reference(q, scales, zp, group=group if strategy == "group" else -1)
    assert_bit_exact(humming.dequantize(qw, torch.bfloat16), expected)


def test_ct_pack_quantized_act_order(tmp_path):
    gen = torch.Generator().manual_seed(7)
    n, k, group = 24, 128, 32
    q = torch.randint(-8, 8, (n, k), generator=gen)
    scales = torch.rand(n, k // group, generator=gen).bfloat16()
    g_idx = act_order_g_idx(k, group, gen)
    tensors = {**pack_int_quantized(q, scales, None, bits=4), "weight_g_idx": g_idx}
    config = ct_config(int_weights(4, "group", group, actorder="group"), "pack-quantized")
    qw = load_checkpoint(write_checkpoint(tmp_path, config, {"m.q_proj": tensors}))["m.q_proj"]
    assert torch.equal(qw.g_idx, g_idx)
    assert_bit_exact(humming.dequantize(qw, torch.bfloat16), reference(q, scales, g_idx=g_idx))


@pytest.mark.parametrize("fmt", ["int-quantized", "naive-quantized"])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("bits", [8, 4])
def test_ct_int_quantized(tmp_path, bits, sym, fmt):
    gen = torch.Generator().manual_seed(bits)
    n, k = 30, 50
    q = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(n, 1, generator=gen).bfloat16()
    zp = None if sym else torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (n, 1), generator=gen, dtype=torch.int8)
    tensors = {"weight": q, "weight_scale": scales, **({} if sym else {"weight_zero_point": zp})}
    config = ct_config(int_weights(bits, "channel", sym=sym), fmt)
    qw = load_checkpoint(write_checkpoint(tmp_path, config, {"m.o_proj": tensors}))["m.o_proj"]
    assert qw.format.name == (f"int{bits}" if sym else f"uint{bits}")
    assert_bit_exact(humming.dequantize(qw, torch.bfloat16), reference(q, scales, zp))


FP8_CASES = [("tensor", None, (1, 1)), ("channel", None, None), ("block", [128, 128], None), ("block", [64, 32], None)]


@pytest.mark.parametrize(("strategy", "block", "_"), FP8_CASES)
def test_ct_float_quantized(tmp_path, strategy, block, _):
    gen = torch.Generator().manual_seed(3)
    n, k = 200, 300  # partial blocks along both dimensions
    codes = torch.randint(0, 256, (n, k), generator=gen, dtype=torch.uint8)
    codes[codes.bitwise_and(0x7F) == 0x7F] = 0x80  # no NaN codes; -0.0 stays
    weight = codes.view(torch.float8_e4m3fn)
    rows, cols = {"tensor": (1, 1), "channel": (n, 1)}.get(strategy) or (-(-n // block[0]), -(-k // block[1]))
    scales = torch.rand(rows, cols, generator=gen).bfloat16()
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "block_structure": block}
    qw = load_checkpoint(
        write_checkpoint(
            tmp_path, ct_config(weights, "float-quantized"), {"m.k_proj": {"weight": weight, "weight_scale": scales}}
        )
    )["m.k_proj"]
    bn, bk = block or {"tensor": (n, k), "channel": (1, k)}[strategy]
    s = scales.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    assert_bit_exact(humming.dequantize(qw, torch.bfloat16), (weight.float() * s).bfloat16())


E2M1 = get_format("e2m1")


def test_ct_nvfp4(tmp_path):
    """Global scale stored as a divisor; a power-of-two divisor makes 1/x exact, so the result is bit-exact."""
    gen = torch.Generator().manual_seed(4)
    n, k = 48, 96
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, k // 16, generator=gen) * 200).to(torch.float8_e4m3fn)
    global_scale = torch.tensor([2048.0])
    tensors = {
        "weight_packed": pack_fp4(codes),
        "weight_scale": scales,
        "weight_global_scale": global_scale,
        "weight_shape": torch.tensor([n, k]),
    }
    weights = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": 16}
    qw = load_checkpoint(write_checkpoint(tmp_path, ct_config(weights, "nvfp4-pack-quantized"), {"m": tensors}))["m"]
    assert qw.global_scale.item() == 1 / 2048
    expected = (E2M1.decode(codes) * (scales.float() / global_scale).repeat_interleave(16, 1)).bfloat16()
    assert_bit_exact(humming.dequantize(qw, torch.bfloat16), expected)  # -0.0 for code 8, as compressed-tensors


def test_ct_mxfp4(tmp_path):
    gen = torch.Generator().manual_seed(5)
    n, k = 40, 64
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    exps = torch.randint(118, 136, (n, k // 32), generator=gen, dtype=torch.uint8)
    tensors = {"weight_packed": pack_fp4(codes), "weight_scale": exps}
    weights = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32}
    qw = load_checkpoint(write_checkpoint(tmp_path, ct_config(weights, "mxfp4-pack-quantized"), {"m": tensors}))["m"]
    expected = torch.ldexp(E2M1.decode(codes), exps.repeat_interleave(32, 1).float() - 127).bfloat16()
    assert_bit_exact(humming.dequantize(qw, torch.bfloat16), expected)


def test_ct_mixed_precision_and_ignore(tmp_path):
    """Per-group formats (``mixed-precision``); exact-name targets beat regex beat class names; ignore wins."""
    gen = torch.Generator().manual_seed(6)
    n, k = 16, 64
    q = torch.randint(-8, 8, (n, k), generator=gen)
    scales = torch.rand(n, 1, generator=gen).bfloat16()
    fp8 = torch.randn(n, k, generator=gen).to(torch.float8_e4m3fn)
    config = ct_config(int_weights(4, "channel"), "mixed-precision", ignore=["re:.*gate_proj$"])
    config["config_groups"] = {
        "int4": {"targets": ["re:.*mlp.*"], "format": "pack-quantized", "weights": int_weights(4, "channel")},
        "fp8": {
            "targets": ["Linear"],
            "format": "float-quantized",
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
        },
    }
    packed = pack_int_quantized(q, scales, None, bits=4)
    modules = {
        "l.mlp.up_proj": packed,
        "l.mlp.gate_proj": packed,
        "l.self_attn.q_proj": {"weight": fp8, "weight_scale": scales},
    }
    qws = load_checkpoint(write_checkpoint(tmp_path, config, modules))
    assert sorted(qws) == ["l.mlp.up_proj", "l.self_attn.q_proj"]
    assert qws["l.mlp.up_proj"].format.name == "int4"
    assert qws["l.self_attn.q_proj"].format.name == "e4m3"


# ---------------------------------------------------------------------------------- fp8 / ModelOpt
def test_fp8_deepseek_block(tmp_path):
    """DeepSeek-V3 ``weight_scale_inv`` multiplies despite its name."""
    gen = torch.Generator().manual_seed(8)
    n, k = 200, 300
    weight = (torch.randn(n, k, generator=gen) * 50).to(torch.float8_e4m3fn)
    scale_inv = torch.rand(2, 3, generator=gen)
    qconfig = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["lm_head"],
    }
    modules = {
        "model.layers.0.self_attn.kv_a_proj": {"weight": weight, "weight_scale_inv": scale_inv},
        "lm_head": {"weight": weight, "weight_scale_inv": scale_inv},
    }
    qws = load_checkpoint(write_checkpoint(tmp_path, qconfig, modules))
    assert list(qws) == ["model.layers.0.self_attn.kv_a_proj"]
    s = scale_inv.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    qw = qws["model.layers.0.self_attn.kv_a_proj"]
    assert qw.group_shape == (128, 128)
    assert_bit_exact(humming.dequantize(qw, torch.bfloat16), (weight.float() * s).bfloat16())


def test_fp8_per_tensor(tmp_path):
    weight = torch.randn(24, 40, generator=torch.Generator().manual_seed(9)).to(torch.float8_e4m3fn)
    scale = torch.tensor(0.0123)
    qconfig = {"quant_method": "fp8", "activation_scheme": "static"}
    qw = load_checkpoint(
        write_checkpoint(tmp_path, qconfig, {"m": {"weight": weight, "weight_scale": scale, "input_scale": scale}})
    )["m"]
    assert qw.group_shape == (-1, -1)
    assert_bit_exact(humming.dequantize(qw, torch.float16), (weight.float() * scale).half())


def test_modelopt_nvfp4_positive_zero_and_exclude(tmp_path):
    gen = torch.Generator().manual_seed(10)
    n, k = 32, 48
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    codes[0, :4] = 8
    scales = (torch.rand(n, k // 16, generator=gen) * 100).to(torch.float8_e4m3fn)
    scale_2 = torch.tensor(0.000321)
    tensors = {"weight": pack_fp4(codes), "weight_scale": scales, "weight_scale_2": scale_2}
    hf = {"quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["model.layers.*.mlp.gate"]}}
    modules = {"model.layers.0.mlp.up_proj": tensors, "model.layers.0.mlp.gate": tensors}
    qws = load_checkpoint(write_checkpoint(tmp_path, {"quant_method": "modelopt"}, modules, hf_quant_config=hf))
    assert list(qws) == ["model.layers.0.mlp.up_proj"]
    values = E2M1.decode(codes).abs().where(codes == 8, E2M1.decode(codes))  # ModelOpt: code 8 is +0.0
    expected = (values * (scales.float() * scale_2).repeat_interleave(16, 1)).bfloat16()
    out = humming.dequantize(qws["model.layers.0.mlp.up_proj"], torch.bfloat16)
    assert_bit_exact(out, expected)
    assert not out[0, :4].signbit().any()


def test_modelopt_fp8(tmp_path):
    weight = torch.randn(16, 32, generator=torch.Generator().manual_seed(11)).to(torch.float8_e4m3fn)
    scale = torch.tensor(0.5)
    hf = {"quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"]}}
    qws = load_checkpoint(
        write_checkpoint(tmp_path, {}, {"m": {"weight": weight, "weight_scale": scale}}, hf_quant_config=hf)
    )
    assert_bit_exact(humming.dequantize(qws["m"], torch.bfloat16), (weight.float() * 0.5).bfloat16())


# ----------------------------------------------------------------------------------------- MoE
def test_gpt_oss_mxfp4_experts(tmp_path):
    gen = torch.Generator().manual_seed(12)
    e, n, k = 3, 64, 96  # gate_up: 2 * 32 interleaved rows
    codes = torch.randint(0, 16, (e, n, k), generator=gen, dtype=torch.uint8)
    exps = torch.randint(120, 134, (e, n, k // 32), generator=gen, dtype=torch.uint8)
    blocks, scales = pack_gpt_oss(codes, exps)
    bias = torch.randn(e, n, generator=gen).bfloat16()
    modules = {"model.layers.0.mlp.experts.gate_up_proj": {"_blocks": blocks, "_scales": scales, "_bias": bias}}
    qconfig = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}
    qw = load_checkpoint(write_checkpoint(tmp_path, qconfig, modules))["model.layers.0.mlp.experts.gate_up_proj"]
    assert qw.shape == (e, n, k) and torch.equal(qw.bias, bias)
    expected = torch.ldexp(E2M1.decode(codes), exps.repeat_interleave(32, -1).float() - 127).bfloat16()
    assert_bit_exact(humming.dequantize(qw, torch.bfloat16), expected)


def test_moe_per_expert_modules_are_stacked(tmp_path):
    """``experts.{e}.<proj>`` 2-D modules become one [E, N, K] weight; mixed sym/asym experts unify exactly."""
    gen = torch.Generator().manual_seed(13)
    e, n, k, group = 4, 24, 64, 32
    modules, expected = {}, []
    for i in range(e):
        codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
        scales = torch.rand(n, k // group, generator=gen).half()
        zeros = torch.full((n, k // group), 8) if i % 2 else torch.randint(0, 16, (n, k // group), generator=gen)
        modules[f"model.layers.0.mlp.experts.{i}.down_proj"] = pack_gptq(
            codes, scales, zeros, bits=4, group_size=group, version=2
        )
        expected.append(reference(codes, scales, zeros, group=group, dtype=torch.float16))
    qconfig = {"quant_method": "gptq", "bits": 4, "group_size": group, "sym": False, "checkpoint_format": "gptq_v2"}
    qws = load_checkpoint(write_checkpoint(tmp_path, qconfig, modules))
    assert list(qws) == ["model.layers.0.mlp.experts.down_proj"]
    qw = qws["model.layers.0.mlp.experts.down_proj"]
    assert qw.shape == (e, n, k) and qw.format.name == "uint4"
    assert_bit_exact(humming.dequantize(qw, torch.float16), torch.stack(expected))


# ---------------------------------------------------------------------------------- bitsandbytes
@pytest.mark.parametrize("double_quant", [False, True])
def test_bnb_nf4(tmp_path, double_quant):
    gen = torch.Generator().manual_seed(14)
    n, k, block = 24, 128, 64
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    blocks = n * k // block
    if double_quant:
        absmax_codes = torch.randint(0, 256, (blocks,), generator=gen, dtype=torch.uint8)
        nested_map = torch.sort(torch.rand(256, generator=gen) * 2 - 1).values
        nested_absmax = torch.rand(-(-blocks // 16), generator=gen)
        offset = 0.0371
        absmax = nested_map[absmax_codes.long()] * nested_absmax[torch.arange(blocks) // 16] + torch.tensor(offset)
        tensors = pack_bnb_nf4(codes, absmax, nested=(absmax_codes, nested_absmax, nested_map, offset, 16))
    else:
        absmax = torch.rand(blocks, generator=gen)
        tensors = pack_bnb_nf4(codes, absmax)
    qconfig = {
        "quant_method": "bitsandbytes",
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": double_quant,
        "llm_int8_skip_modules": ["lm_head"],
    }
    qws = load_checkpoint(write_checkpoint(tmp_path, qconfig, {"m.gate_proj": tensors, "lm_head": tensors}))
    assert list(qws) == ["m.gate_proj"]
    values = get_format("nf4").decode(codes)
    expected = (values * absmax.reshape(n, k // block).repeat_interleave(block, 1)).bfloat16()
    assert_bit_exact(humming.dequantize(qws["m.gate_proj"], torch.bfloat16), expected)


def test_modelopt_mixed_precision_from_config_json(tmp_path):
    """``quant_method: modelopt`` in config.json alone; MIXED_PRECISION picks each layer's algorithm."""
    gen = torch.Generator().manual_seed(15)
    codes = torch.randint(0, 16, (16, 32), generator=gen, dtype=torch.uint8)
    nvfp4 = {
        "weight": pack_fp4(codes),
        "weight_scale": torch.rand(16, 2, generator=gen).to(torch.float8_e4m3fn),
        "weight_scale_2": torch.tensor(0.01),
    }
    fp8 = {"weight": torch.randn(16, 32, generator=gen).to(torch.float8_e4m3fn), "weight_scale": torch.tensor(0.5)}
    qconfig = {
        "quant_method": "modelopt",
        "quant_algo": "MIXED_PRECISION",
        "quantized_layers": {
            "l.mlp.up_proj": {"quant_algo": "NVFP4", "group_size": 16},
            "l.attn.q": {"quant_algo": "FP8"},
        },
    }
    qws = load_checkpoint(write_checkpoint(tmp_path, qconfig, {"l.mlp.up_proj": nvfp4, "l.attn.q": fp8, "l.x": fp8}))
    assert sorted(qws) == ["l.attn.q", "l.mlp.up_proj"]
    assert qws["l.mlp.up_proj"].format.name == "e2m1" and qws["l.attn.q"].format.name == "e4m3"


def test_ct_zero_zero_points_become_signed(tmp_path):
    """An asymmetric scheme whose zero points are all 0 is symmetric: int4 codes, no zeros tensor (exact)."""
    gen = torch.Generator().manual_seed(16)
    q = torch.randint(-8, 8, (20, 64), generator=gen)
    scales = torch.rand(20, 2, generator=gen).bfloat16()
    tensors = pack_int_quantized(q, scales, torch.zeros(20, 2, dtype=torch.int64), bits=4)
    config = ct_config(int_weights(4, "group", 32, sym=False), "pack-quantized")
    qw = load_checkpoint(write_checkpoint(tmp_path, config, {"m": tensors}))["m"]
    assert qw.format.name == "int4" and qw.zeros is None
    assert_bit_exact(humming.dequantize(qw, torch.bfloat16), reference(q, scales, group=32))
