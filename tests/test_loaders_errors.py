"""Every refusal of the loaders is a clear, typed error (or a warning, for GPTQ v1 asym), each tested."""

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from humming.loaders import (
    CheckpointError,
    MissingTensorError,
    ShapeMismatchError,
    UnsupportedFormatError,
    load_checkpoint,
)
from humming.loaders.bnb import pack_bnb_nf4
from humming.loaders.compressed_tensors import pack_int_quantized
from humming.loaders.gptq import pack_gptq

DATA = Path(__file__).parent / "data" / "checkpoints"


def write(path, qconfig, tensors):
    save_file({k: v.clone() for k, v in tensors.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"quantization_config": qconfig}))
    return path


def gptq_tensors(prefix="m", n=16, k=64, bits=4, group=32):
    codes = torch.zeros(n, k, dtype=torch.uint8)
    t = pack_gptq(codes, torch.ones(n, k // group).half(), torch.full((n, k // group), 8), bits=bits, group_size=group)
    return {f"{prefix}.{name}": v for name, v in t.items()}


GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True}
CT_W4 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "version": "0.19.0",
    "config_groups": {
        "g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}}
    },
}


def ct_tensors(bits=4, n=16, k=64):
    q = torch.zeros(n, k, dtype=torch.int64)
    return {f"m.{k_}": v for k_, v in pack_int_quantized(q, torch.ones(n, k // 32), None, bits=bits).items()}


# ----------------------------------------------------------------------------------- configs and methods
@pytest.mark.parametrize(
    ("qconfig", "match"),
    [
        ({"quant_method": "exl3"}, "unknown quant_method 'exl3'; supported: gptq, awq"),
        ({"quant_method": "gptq_marlin"}, "kernel-specific repacked layout"),
        ({**GPTQ, "checkpoint_format": "marlin"}, "GPTQ checkpoint_format 'marlin'.*kernel-specific"),
        ({**GPTQ, "is_marlin_format": True}, "is_marlin_format=True.*kernel-specific"),
        ({**GPTQ, "checkpoint_format": "gptq_v3"}, "checkpoint_format 'gptq_v3' is unknown"),
        ({"quant_method": "awq", "version": "gemv"}, "AWQ version 'gemv'.*GEMV variants pack along K"),
        ({"quant_method": "awq", "version": "marlin"}, "AWQ version 'marlin' is a kernel-specific"),
        ({"quant_method": "awq", "bits": 8}, "defined for 4 bits only"),
        ({"quant_method": "awq", "zero_point": False}, "zero_point=false"),
        ({**CT_W4, "quantization_status": "frozen"}, "quantization_status 'frozen'.*stored unquantized"),
        ({**CT_W4, "sparsity_config": {"format": "sparse-24-bitmask"}}, "sparsity format 'sparse-24-bitmask'"),
        ({**CT_W4, "transform_config": {"config_groups": {"r": {}}}}, "transform_config.*rotations"),
        ({"quant_method": "fp8", "fmt": "e5m2"}, "fmt 'e5m2'"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4_AWQ"}, "NVFP4_AWQ.*pre_quant_scale"),
        ({"quant_method": "modelopt", "quant_algo": "W4A16_GPTQ"}, "W4A16_GPTQ.*supported: NVFP4, FP8"),
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "LLM.int8.*SCB / 127"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "fp4"}, "only nf4"),
    ],
)
def test_unsupported_config(tmp_path, qconfig, match):
    write(tmp_path, qconfig, gptq_tensors())
    with pytest.raises(UnsupportedFormatError, match=match):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("fmt", "match"),
    [
        ("marlin-24", "kernel-specific.*Marlin 2:4"),
        ("sparse-24-bitmask", "holds no quantized weight"),
        ("bogus-quantized", "format 'bogus-quantized' is not supported"),
    ],
)
def test_unsupported_ct_format(tmp_path, fmt, match):
    write(tmp_path, {**CT_W4, "format": fmt}, ct_tensors())
    with pytest.raises(UnsupportedFormatError, match=match):
        load_checkpoint(tmp_path)


def test_marlin_tensors_detected(tmp_path):
    write(tmp_path, GPTQ, {"m.B": torch.zeros(4, 64, dtype=torch.int32), "m.s": torch.zeros(1, 16).half()})
    with pytest.raises(UnsupportedFormatError, match=r"\['B', 's'\].*Marlin"):
        load_checkpoint(tmp_path)


def test_not_a_quantized_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        load_checkpoint(tmp_path / "nope")
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no quantization_config"):
        load_checkpoint(tmp_path)


# -------------------------------------------------------------------------------------- tensors
def test_missing_tensor(tmp_path):
    tensors = gptq_tensors()
    del tensors["m.scales"]
    write(tmp_path, GPTQ, tensors)
    with pytest.raises(MissingTensorError, match=r"m: tensor 'm\.scales' is missing"):
        load_checkpoint(tmp_path)


def test_missing_expert(tmp_path):
    tensors = {**gptq_tensors("x.experts.0.up"), **gptq_tensors("x.experts.2.up")}
    write(tmp_path, GPTQ, tensors)
    with pytest.raises(MissingTensorError, match=r"x.experts.up: experts \[1\] are missing"):
        load_checkpoint(tmp_path)


def test_shape_mismatches(tmp_path):
    tensors = gptq_tensors()
    tensors["m.scales"] = torch.ones(3, 16).half()
    write(tmp_path, GPTQ, tensors)
    with pytest.raises(ShapeMismatchError, match=r"m: tensor 'scales' has shape \(3, 16\), expected \(2, 16\)"):
        load_checkpoint(tmp_path)
    tensors = ct_tensors()
    tensors["m.weight_scale"] = torch.ones(16, 3)
    write(tmp_path, CT_W4, tensors)
    with pytest.raises(ShapeMismatchError, match=r"'weight_scale' has shape \(16, 3\), expected \(16, 2\)"):
        load_checkpoint(tmp_path)
    tensors = ct_tensors()
    tensors["m.weight_shape"] = torch.tensor([16, 80])
    write(tmp_path, CT_W4, tensors)
    with pytest.raises(ShapeMismatchError, match="8 packed words for 80 4-bit fields"):
        load_checkpoint(tmp_path)


def test_wrong_bits_in_dynamic_override(tmp_path):
    write(tmp_path, {**GPTQ, "dynamic": {".*": {"bits": 5}}}, gptq_tensors())
    with pytest.raises(UnsupportedFormatError, match="GPTQ 5-bit"):
        load_checkpoint(tmp_path)


def test_ct_padded_packing_ambiguous_without_version(tmp_path):
    """11 3-bit fields take 2 words in both packings, at different bits: only the version can decide."""
    config = {
        **CT_W4,
        "config_groups": {
            "g": {"targets": ["Linear"], "weights": {"num_bits": 3, "type": "int", "strategy": "channel"}}
        },
    }
    del config["version"]
    q = torch.zeros(4, 11, dtype=torch.int64)
    write(tmp_path, config, {f"m.{k}": v for k, v in pack_int_quantized(q, torch.ones(4, 1), None, bits=3).items()})
    with pytest.raises(UnsupportedFormatError, match="fit both the dense"):
        load_checkpoint(tmp_path)


def test_gptq_v1_zero_point_ambiguity_warns(tmp_path):
    """v1 cannot store a zero of 0: AutoGPTQ and GPTQModel write it differently, so loading warns (as vLLM);
    without such a field (or in v2) the decode is unambiguous and silent."""
    zeros = torch.full((16, 2), 3)
    zeros[5, 1] = 0
    for version, expect_warning in ((1, True), (2, False)):
        t = pack_gptq(
            torch.zeros(16, 64, dtype=torch.uint8),
            torch.ones(16, 2).half(),
            zeros,
            bits=4,
            group_size=32,
            version=version,
        )
        fmt = "gptq" if version == 1 else "gptq_v2"
        write(tmp_path, {**GPTQ, "sym": False, "checkpoint_format": fmt}, {f"m.{k}": v for k, v in t.items()})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            load_checkpoint(tmp_path)
        messages = [str(w.message) for w in caught]
        assert any("cannot represent a zero point of 0" in m for m in messages) == expect_warning, messages
    write(tmp_path, {**GPTQ, "sym": False}, gptq_tensors())  # v1 asym without a zero of 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_checkpoint(tmp_path)


def test_fixture_with_a_broken_module(tmp_path):
    shutil.copytree(DATA / "ct_w4a16_asym", tmp_path / "ckpt")
    tensors = load_file(tmp_path / "ckpt" / "model.safetensors")
    del tensors["model.layers.0.mlp.up_proj.weight_zero_point"]
    save_file(tensors, str(tmp_path / "ckpt" / "model.safetensors"))
    with pytest.raises(
        MissingTensorError, match=r"up_proj: asymmetric scheme but tensor .*weight_zero_point' is missing"
    ):
        load_checkpoint(tmp_path / "ckpt")


def test_bnb_blocks_straddling_rows(tmp_path):
    tensors = pack_bnb_nf4(torch.zeros(4, 96, dtype=torch.uint8), torch.ones(6))
    qconfig = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    write(tmp_path, qconfig, {f"m.{k}": v for k, v in tensors.items()})
    with pytest.raises(UnsupportedFormatError, match="K=96 is not a multiple of the bitsandbytes blocksize 64"):
        load_checkpoint(tmp_path)


def test_ct_transposed_scale_refused(tmp_path):
    """A ``weight_scale`` with the right element count but transposed ([K/g, N] for [N, K/g]) is refused,
    not reshaped into a different weight; a per-channel ``[N]`` or ``[N, 1]`` scale still loads."""
    tensors = ct_tensors(n=16, k=64)
    tensors["m.weight_scale"] = torch.ones(2, 16)
    write(tmp_path, CT_W4, tensors)
    with pytest.raises(ShapeMismatchError, match=r"'weight_scale' has shape \(2, 16\), expected \(16, 2\)"):
        load_checkpoint(tmp_path)
    channel = {**CT_W4, "config_groups": {"g": {"targets": ["Linear"], "weights": {**_W4_CHANNEL}}}}
    for shape in ((16,), (16, 1)):
        q = torch.zeros(16, 64, dtype=torch.int64)
        packed = pack_int_quantized(q, torch.ones(16, 1), None, bits=4)
        write(tmp_path, channel, {f"m.{k}": v for k, v in {**packed, "weight_scale": torch.ones(shape)}.items()})
        assert load_checkpoint(tmp_path)["m"].scales.shape == (16, 1)


_W4_CHANNEL = {"num_bits": 4, "type": "int", "strategy": "channel"}


@pytest.mark.parametrize(
    ("drop", "field", "match"),
    [
        ("g_idx", "g_idx", r"'g_idx' has shape \(60,\), expected \(64,\)"),
        ("qweight", "qweight", r"qweight.*7 rows.*K=56.*group_size 32"),
    ],
)
def test_gptq_truncated_tensor_refused(tmp_path, drop, field, match):
    """K comes from one tensor; a truncated ``g_idx`` or ``qweight`` must not load as a smaller weight."""
    tensors = gptq_tensors(n=16, k=64, group=32)
    if field == "g_idx":
        tensors["m.g_idx"] = tensors["m.g_idx"][:60].clone()
    else:
        tensors["m.qweight"] = tensors["m.qweight"][:7].clone()
        del tensors["m.g_idx"]
    write(tmp_path, GPTQ, tensors)
    with pytest.raises(ShapeMismatchError, match=match):
        load_checkpoint(tmp_path)


def test_awq_truncated_qweight_refused(tmp_path):
    from humming.loaders.awq import pack_awq

    zeros = torch.zeros(16, 2, dtype=torch.uint8)
    t = pack_awq(torch.zeros(16, 64, dtype=torch.uint8), torch.ones(16, 2).half(), zeros)
    t["qweight"] = t["qweight"][:63].clone()
    write(tmp_path, {"quant_method": "awq", "bits": 4, "group_size": 32}, {f"m.{k}": v for k, v in t.items()})
    with pytest.raises(ShapeMismatchError, match=r"qweight.*K=63.*group_size 32"):
        load_checkpoint(tmp_path)
