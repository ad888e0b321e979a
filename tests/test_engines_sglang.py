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
import engine_moe as moe_cases
import sglang.srt.layers.linear as sglang_linear
import torch
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
from sglang.srt.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

from humming.engines.sglang import HummingConfig, HummingLinearMethod, HummingMoEMethod, register


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


@pytest.mark.parametrize("name", list(moe_cases.FIXTURES))
def test_moe_experts_equal_fused_moe(name, seed):
    """SGLang's FusedMoE on each MoE fixture, loaded expert by expert through SGLang's expert weight loader,
    computes humming.moe.fused_moe on the checkpoint's experts (apply on SGLang's standard dispatch output)."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput
    from sglang.srt.runtime_context import get_parallel

    hf = moe_cases.model_config(name)
    with get_parallel().override(moe_ep_rank=0, moe_tp_rank=0, moe_dp_rank=0):  # one rank's MoE groups
        experts = FusedMoE(
            num_experts=hf["num_experts"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["moe_intermediate_size"],
            layer_id=0,
            top_k=hf["num_experts_per_tok"],
            params_dtype=torch.bfloat16,
            quant_config=HummingConfig(hf["quantization_config"]),
            prefix=moe_cases.PREFIX,
        )
    assert isinstance(experts.quant_method, HummingMoEMethod)
    mapping = FusedMoE.make_expert_params_mapping("gate_proj", "down_proj", "up_proj", hf["num_experts"])
    moe_cases.load(experts, dict(experts.named_parameters()), mapping, name)

    def run(x, topk_weights, topk_ids):
        topk = StandardTopKOutput(topk_weights, topk_ids, torch.empty(0))
        return experts.quant_method.apply(experts, StandardDispatchOutput(x, None, topk)).hidden_states

    moe_cases.check_experts(run, name)
