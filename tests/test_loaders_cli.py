"""``inspect_main`` (``python -m humming inspect PATH``): modules, layouts, bytes, and what would not load."""

import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from humming.loaders.cli import inspect_main

DATA = Path(__file__).parent / "data" / "checkpoints"


def test_inspect_lists_modules(capsys):
    assert inspect_main([str(DATA / "autogptq_w4_g128_sym")]) == 0
    out = capsys.readouterr().out
    assert "GPTQ v1 4-bit group 128 sym" in out
    assert "model.layers.0.mlp.down_proj     256x640" in out and "int4 g128 fp16-scales" in out
    assert "7 quantized modules" in out and "5 unquantized tensors" in out


def test_inspect_reports_what_would_not_load(tmp_path, capsys):
    shutil.copytree(DATA / "awq_w4_g128", tmp_path / "ckpt")
    tensors = load_file(tmp_path / "ckpt" / "model.safetensors")
    del tensors["model.layers.0.self_attn.v_proj.scales"]
    save_file(tensors, str(tmp_path / "ckpt" / "model.safetensors"))
    assert inspect_main([str(tmp_path / "ckpt"), "--modules", "*.self_attn.*"]) == 1
    captured = capsys.readouterr()
    assert "3 quantized modules" in captured.out and "NOT LOADED" not in captured.out
    assert "NOT LOADED model.layers.0.self_attn.v_proj: " in captured.err
    assert "v_proj.scales' is missing" in captured.err and "1 quantized modules would not load" in captured.err


def test_inspect_unloadable_checkpoint(tmp_path, capsys):
    assert inspect_main([str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert not captured.out
    assert captured.err.startswith("cannot load: ") and "no *.safetensors files" in captured.err
