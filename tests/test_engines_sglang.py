"""humming.engines.sglang inside SGLang's real code (skipped where SGLang does not import; CI does not install
it). Runs on CPU: SGLang's published server config (an unquantized Llama config in ``tmp_path``, as a server
process publishes its own), a one-process gloo group, then SGLang's own ``QKVParallelLinear``,
``MergedColumnParallelLinear``, ``RowParallelLinear`` and ``ReplicatedLinear``, parameter classes and weight
loaders, unchanged."""

from __future__ import annotations

import json
import tempfile

import pytest

pytest.importorskip("sglang.srt.layers.linear", reason="SGLang is not installed (or does not import)")

import engine_layers as cases
import sglang.srt.layers.linear as sglang_linear
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
from sglang.srt.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

from humming.engines.sglang import HummingConfig, HummingLinearMethod, register


@pytest.fixture(scope="module", autouse=True)
def sglang_process(tmp_path_factory):
    """What an SGLang scheduler process sets up before it builds a model: its published server args and a
    (one-process) TP group; then humming's plugin hook, as SGLang's load_plugins calls it."""
    model = tmp_path_factory.mktemp("llama")
    config = json.loads((cases.DATA / "autogptq_w4_g128_sym" / "config.json").read_text())
    config.pop("quantization_config")
    (model / "config.json").write_text(json.dumps(config))
    set_global_server_args_for_scheduler(ServerArgs(model_path=str(model), device="cpu", skip_tokenizer_init=True))
    init_distributed_environment(
        world_size=1, rank=0, local_rank=0, distributed_init_method=f"file://{tempfile.mkstemp()[1]}",
        backend="gloo",
    )  # fmt: skip
    initialize_model_parallel(backend="gloo")
    register()


def test_registered_with_sglang():
    from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES

    assert QUANTIZATION_METHODS["humming_ir"] is HummingConfig and "humming_ir" in QUANTIZATION_CHOICES
    assert get_quantization_config("humming_ir") is HummingConfig
    qconfig = json.loads((cases.DATA / "ct_fp8_block" / "config.json").read_text())["quantization_config"]
    assert HummingConfig.override_quantization_method(qconfig, "humming_ir") == "humming_ir"
    assert all(
        method.override_quantization_method(qconfig, None) != "humming_ir" for method in QUANTIZATION_METHODS.values()
    )


@pytest.mark.parametrize("name", cases.FIXTURES)
def test_layers_equal_humming(name, seed):
    """Each of SGLang's layers, loaded through its own weight loaders, computes what humming computes on the
    checkpoint's modules."""
    cases.check_layers(sglang_linear, HummingConfig, HummingLinearMethod, name)


def test_ignored_layers_stay_unquantized():
    cases.check_ignored(sglang_linear, HummingConfig, UnquantizedLinearMethod)
