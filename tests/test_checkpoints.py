"""Every real-producer fixture loads and dequantizes bit for bit to the producer's own reference.

The fixtures (tests/data/checkpoints/, copied from shared/testdata) were written by AutoGPTQ, AutoAWQ,
llm-compressor and ModelOpt; each PRODUCER.txt states the layout and how the reference was computed.
Signed zeros are compared too: the loader reproduces ModelOpt's +0.0 for e2m1 code 8.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import assert_bit_exact
from safetensors.torch import load_file, save_file

import humming
from humming.loaders import load_checkpoint

DATA = Path(__file__).parent / "data" / "checkpoints"
FIXTURES = sorted(p.name for p in DATA.iterdir() if p.is_dir())
EXPECTED = {
    "autogptq_w4_g128_sym": "int4 g128 fp16-scales",
    "awq_w4_g128": "uint4 g128 fp16-scales zp",
    "ct_fp8_block": "e4m3 block128x128 bf16-scales",
    "ct_w4a16_asym": "uint4 g128 bf16-scales zp",
    "ct_w4a16_g128_sym": "int4 g128 bf16-scales",
    "ct_w8a8_int8": "int8 per-channel bf16-scales",
    "modelopt_nvfp4": "e2m1 g16 e4m3-scales global-scale",
}


def test_all_fixtures_are_listed():
    assert sorted(EXPECTED) == FIXTURES


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_bit_exact(name):
    ref = load_file(DATA / name / "reference.safetensors")
    qws = load_checkpoint(DATA / name)
    assert sorted(qws) == sorted(k.removesuffix(".weight") for k in ref)
    assert qws["model.layers.0.self_attn.q_proj"].describe() == EXPECTED[name]
    for key, expected in ref.items():
        qw = qws[key.removesuffix(".weight")]
        assert qw.shape == tuple(expected.shape)
        out = humming.dequantize(qw, expected.dtype)
        assert_bit_exact(out, expected, key)


def test_fixture_signed_zeros_kept():
    """ct_fp8_block's reference holds -0.0 (fp8 code 0x80); the loader keeps them."""
    ref = load_file(DATA / "ct_fp8_block" / "reference.safetensors")
    qws = load_checkpoint(DATA / "ct_fp8_block")
    negative_zeros = 0
    for key, expected in ref.items():
        out = humming.dequantize(qws[key.removesuffix(".weight")], expected.dtype)
        negative_zeros += int(((out == 0) & out.signbit()).sum())
    assert negative_zeros == 5


def test_modules_filter_and_device():
    qws = load_checkpoint(DATA / "awq_w4_g128", modules=["*.self_attn.q_proj", "model.layers.0.mlp.up_proj"])
    assert sorted(qws) == ["model.layers.0.mlp.up_proj", "model.layers.0.self_attn.q_proj"]
    assert qws["model.layers.0.mlp.up_proj"].device == torch.device("cpu")


def test_gptq_bias_and_symmetric_conversion():
    """AutoGPTQ saves an all-zero fp16 bias; symmetric v1 zeros (8) become int4 codes without zeros."""
    qw = load_checkpoint(DATA / "autogptq_w4_g128_sym")["model.layers.0.mlp.down_proj"]
    assert qw.bias is not None and qw.bias.dtype == torch.float16 and not qw.bias.any()
    assert qw.zeros is None and qw.g_idx is None and qw.format.name == "int4"


def test_sharded_checkpoint_with_index(tmp_path):
    """A checkpoint split over two safetensors files with a ``model.safetensors.index.json`` loads the same."""
    src = DATA / "ct_w4a16_asym"
    tensors = load_file(src / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / file))
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.copy(src / "config.json", tmp_path / "config.json")
    sharded, single = load_checkpoint(tmp_path), load_checkpoint(src)
    assert sorted(sharded) == sorted(single)
    for name, qw in single.items():
        assert all(torch.equal(t, sharded[name].tensors()[field]) for field, t in qw.tensors().items())
