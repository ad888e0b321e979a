"""``python -m humming``: one parser of subcommands; ``inspect`` (modules, layouts, bytes, and what would not
load), ``explain``, ``--json``, defaults in the help, errors on stderr with an exit status."""

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from humming.__main__ import main, parser

DATA = Path(__file__).parent / "data" / "checkpoints"


def test_inspect_lists_modules(capsys):
    assert main(["inspect", str(DATA / "autogptq_w4_g128_sym")]) == 0
    out = capsys.readouterr().out
    assert "GPTQ v1 4-bit group 128 sym" in out
    line = next(line for line in out.splitlines() if line.startswith("model.layers.0.mlp.down_proj"))
    assert line.split()[:3] == ["model.layers.0.mlp.down_proj", "256x640", "int4"] and "g128 fp16-scales" in line
    assert "7 quantized modules" in out and "5 unquantized tensors" in out


def test_inspect_json(capsys):
    assert main(["inspect", str(DATA / "ct_w8a8_int8"), "--json", "--modules", "*.q_proj"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in summary["modules"]] == ["model.layers.0.self_attn.q_proj"]
    assert summary["modules"][0]["shape"] == [192, 320] and summary["failed"] == []


def test_inspect_reports_what_would_not_load(tmp_path, capsys):
    shutil.copytree(DATA / "awq_w4_g128", tmp_path / "ckpt")
    tensors = load_file(tmp_path / "ckpt" / "model.safetensors")
    del tensors["model.layers.0.self_attn.v_proj.scales"]
    save_file(tensors, str(tmp_path / "ckpt" / "model.safetensors"))
    assert main(["inspect", str(tmp_path / "ckpt"), "--modules", "*.self_attn.*"]) == 1
    captured = capsys.readouterr()
    assert "3 quantized modules" in captured.out and "NOT LOADED" not in captured.out
    assert "NOT LOADED model.layers.0.self_attn.v_proj: " in captured.err
    assert "v_proj.scales' is missing" in captured.err and "1 quantized modules would not load" in captured.err


def test_inspect_unloadable_checkpoint(tmp_path, capsys):
    assert main(["inspect", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert not captured.out
    assert captured.err.startswith("humming inspect: error: ") and "no *.safetensors files" in captured.err


def test_explain(capsys):
    assert main(["explain", "--weight", "int4", "--n", "64", "--k", "128", "--m", "3", "--device", "cpu"]) == 0
    assert "reference (backend reference" in capsys.readouterr().out
    argv = ["explain", "--weight", "fp8_block", "--n", "128", "--k", "256", "--act", "fp8_g128", "--json"]
    assert main([*argv, "--device", "cpu"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["kernel"] == "reference" and plan["weight"].startswith("e4m3 block128x128")
    assert main(["explain", "--act", "nope", "--n", "8", "--k", "32", "--device", "cpu"]) == 1
    assert "humming explain: error: act: unknown activation scheme 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["demo", "inspect", "explain", "tune", "bench"])
def test_help_shows_defaults_and_explains_every_option(command, capsys):
    sub = next(a for a in parser()._actions if a.dest == "command").choices[command]
    undocumented = [a.dest for a in sub._actions if not a.help]
    assert not undocumented, f"humming {command}: options without help: {undocumented}"
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: humming {command}")
    if command != "inspect":
        assert "(default: " in text


def test_bad_command_line_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["inspect"])
    assert exit_.value.code == 2 and "humming inspect: error:" in capsys.readouterr().err
