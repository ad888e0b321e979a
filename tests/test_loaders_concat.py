"""``concat`` (fused projections along N) and ``stack`` (experts): exact joins, clear refusals."""

from pathlib import Path

import pytest
import torch

import humming
from humming.ir.packing import pack_codes
from humming.ir.weight import QuantizedWeight
from humming.loaders import concat, load_checkpoint, stack

DATA = Path(__file__).parent / "data" / "checkpoints"
QKV = ("q_proj", "k_proj", "v_proj")


def _attn(name):
    qws = load_checkpoint(DATA / name, modules=["*.self_attn.*"])
    return [qws[f"model.layers.0.self_attn.{p}"] for p in QKV]


def _expected(parts, dim=-2):
    return torch.cat([humming.dequantize(p) for p in parts], dim=dim)


@pytest.mark.parametrize("name", ["autogptq_w4_g128_sym", "awq_w4_g128", "ct_w4a16_asym", "ct_w8a8_int8"])
def test_concat_qkv_fixtures(name):
    parts = _attn(name)
    fused = concat(parts)
    assert fused.shape == (sum(p.N for p in parts), parts[0].K)
    assert torch.equal(humming.dequantize(fused), _expected(parts))


def test_concat_modelopt_shared_global_scale_kept():
    """ModelOpt exports q/k/v with one shared weight_scale_2: the fused weight keeps e4m3 scales + global."""
    parts = _attn("modelopt_nvfp4")
    fused = concat(parts)
    assert fused.global_scale is not None and fused.scales.dtype == torch.float8_e4m3fn
    assert torch.equal(humming.dequantize(fused, torch.bfloat16), _expected(parts).bfloat16())


def test_concat_different_global_scales_fold_exactly():
    qws = load_checkpoint(DATA / "modelopt_nvfp4", modules=["*.mlp.*"])
    parts = [qws["model.layers.0.mlp.gate_proj"], qws["model.layers.0.mlp.up_proj"]]
    parts[1] = parts[1].replace(global_scale=parts[1].global_scale * 3)
    fused = concat(parts)
    assert fused.global_scale is None and fused.scales.dtype == torch.float32
    assert torch.equal(humming.dequantize(fused, torch.bfloat16), _expected(parts).bfloat16())


def test_concat_per_tensor_scales_become_per_channel():
    codes = torch.randint(0, 255, (3, 16, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0
    parts = [
        QuantizedWeight(shape=(16, 32), format="e4m3", qweight=pack_codes(c, 8), scales=torch.tensor([[s]]))
        for c, s in zip(codes, (0.5, 0.25, 0.125))
    ]
    fused = concat(parts)
    assert fused.group_shape == (1, -1) and fused.scales.shape == (48, 1)
    assert torch.equal(humming.dequantize(fused), _expected(parts))
    same = concat([parts[0], parts[0]])
    assert same.group_shape == (-1, -1)


def test_concat_fp8_block_partial_block_only_last():
    q, k, v = _attn("ct_fp8_block")
    fused = concat([q, k])  # k's 96 rows form the trailing partial block
    assert fused.group_shape == (128, 128)
    assert torch.equal(humming.dequantize(fused), _expected([q, k]))
    with pytest.raises(ValueError, match="not a multiple of the block height 128"):
        concat([q, k, v])


def test_concat_mixed_sym_asym():
    sym = load_checkpoint(DATA / "ct_w4a16_g128_sym", modules=["*.q_proj"])["model.layers.0.self_attn.q_proj"]
    asym = load_checkpoint(DATA / "ct_w4a16_asym", modules=["*.k_proj"])["model.layers.0.self_attn.k_proj"]
    fused = concat([sym, asym])
    assert fused.format.name == "uint4"
    assert torch.equal(humming.dequantize(fused), _expected([sym, asym]))


def test_concat_refusals():
    gptq = _attn("autogptq_w4_g128_sym")
    act_order = gptq[1].replace(g_idx=torch.randperm(256, generator=torch.Generator().manual_seed(0)).int() // 128)
    with pytest.raises(ValueError, match="different g_idx"):
        concat([gptq[0].replace(g_idx=torch.arange(256, dtype=torch.int32) // 128), act_order])
    o_proj = load_checkpoint(DATA / "autogptq_w4_g128_sym", modules=["*.o_proj"])["model.layers.0.self_attn.o_proj"]
    with pytest.raises(ValueError, match="incompatible with part 0"):
        concat([gptq[0], o_proj])
    with pytest.raises(ValueError, match="formats"):
        concat([gptq[0], _attn("ct_fp8_block")[0]])
    with pytest.raises(ValueError, match="N dimension"):
        concat(gptq, dim=1)


def test_stack_experts_and_concat_3d():
    parts = _attn("modelopt_nvfp4")[1:]  # k, v: same shape 96x320
    experts = stack(parts)
    assert experts.shape == (2, 96, 320) and experts.global_scale.shape == (2,)
    assert torch.equal(humming.dequantize(experts), torch.stack([humming.dequantize(p) for p in parts]))
    fused = concat([experts, experts], dim=1)
    assert torch.equal(humming.dequantize(fused), _expected([experts, experts]))
    with pytest.raises(ValueError, match="experts must match"):
        stack(_attn("modelopt_nvfp4"))
