"""humming.engines.vllm inside vLLM's real code (skipped where vLLM does not import; CI does not install it).

Runs on CPU with vLLM's CPU platform (``VLLM_TARGET_DEVICE=cpu``) and a one-process gloo group, so vLLM's own
layer classes (``QKVParallelLinear``, ``MergedColumnParallelLinear``, ``RowParallelLinear``,
``ReplicatedLinear``), parameter classes and weight loaders run unchanged. The one stand-in: a tensor-parallel
rank other than 0 of 1 is vLLM's ``get_tensor_model_parallel_rank`` / ``_world_size`` patched to return it (a
real TP group needs one process per rank)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # before vLLM resolves its platform
pytest.importorskip("vllm.model_executor.layers.linear", reason="vLLM is not installed (or does not import)")

import engine_layers as cases
import engine_moe as moe_cases
import vllm.model_executor.layers.linear as vllm_linear
import vllm.model_executor.parameter as vllm_parameter
from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.layers.linear import (
    UnquantizedLinearMethod,
)
from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.plugins import load_plugins_by_group
from vllm.utils.import_utils import has_humming

import humming
from humming.engines.vllm import HummingConfig, HummingLinearMethod, HummingMoEMethod, capture_sizes
from humming.engines.vllm_plugin import register

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def vllm_process():
    """What a vLLM worker sets up before it builds a model: its config and a (one-process) TP group."""
    config = VllmConfig()
    config.compilation_config.cudagraph_capture_sizes = [24, 1, 2, 4, 8, 16]  # CPU captures none: as on CUDA
    with set_current_vllm_config(config):
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0, distributed_init_method=f"file://{tempfile.mkstemp()[1]}",
            backend="gloo",
        )  # fmt: skip
        initialize_model_parallel(1)
        yield


def test_vllm_probe_and_registry():
    """With humming installed vLLM's probe for humming-kernels is false and every quantization config vLLM
    ships imports (the import path every quantized model takes)."""
    assert not has_humming()
    for method in QUANTIZATION_METHODS:
        assert issubclass(get_quantization_config(method), QuantizationConfig), method
    assert get_quantization_config("humming_ir") is HummingConfig


@pytest.mark.parametrize(
    "path",
    [cases.DATA / name for name in ("autogptq_w4_g128_sym", "ct_fp8_block", "modelopt_nvfp4")]
    + list(moe_cases.FIXTURES.values()),
    ids=lambda path: path.name,
)
def test_vllm_selects_the_method(path):
    """vLLM's own checkpoint detection (ModelConfig) keeps its choice unless humming_ir is asked for."""
    default = ModelConfig(model=str(path), skip_tokenizer_init=True)
    assert default.quantization not in (None, "humming_ir")
    chosen = ModelConfig(model=str(path), quantization="humming_ir", skip_tokenizer_init=True)
    assert chosen.quantization == "humming_ir"


@pytest.mark.parametrize("name", cases.FIXTURES)
def test_layers_equal_humming(name, seed):
    """Each of vLLM's layers, loaded through its own weight loaders, computes what humming computes on the
    checkpoint's modules."""
    cases.check_layers(vllm_linear, HummingConfig, HummingLinearMethod, name)


def test_ignored_layers_stay_unquantized():
    cases.check_ignored(vllm_linear, HummingConfig, UnquantizedLinearMethod)


@pytest.mark.parametrize(("rank", "world", "kind"), [(3, 5, "mlp"), (1, 2, "qkv"), (3, 4, "qkv"), (5, 8, "qkv")])
def test_tensor_parallel_rank_and_replicated_kv_heads(monkeypatch, rank, world, kind, seed):
    """Rank ``rank`` of ``world``: q, gate / up take their part along N, down along K; with more ranks than
    the fixture's 2 KV heads vLLM replicates each on ``world // 2`` ranks and gives rank r head ``r // (world //
    2)``."""
    for module in (vllm_linear, vllm_parameter):
        monkeypatch.setattr(module, "get_tensor_model_parallel_rank", lambda: rank)
        monkeypatch.setattr(module, "get_tensor_model_parallel_world_size", lambda: world)
    name = "autogptq_w4_g128_sym"
    config, tensors = cases.humming_config(HummingConfig, name), load_file(cases.DATA / name / "model.safetensors")
    qws = humming.load_checkpoint(cases.DATA / name)
    kv_heads = json.loads((cases.DATA / name / "config.json").read_text())["num_key_value_heads"]
    kv_part = (0, rank // (world // kv_heads), kv_heads) if world > kv_heads else (0, rank, world)
    parts = {"q": (0, rank, world), "k": kv_part, "v": kv_part, 0: (0, rank, world), 1: (0, rank, world)}
    for layer, shards in cases.layers(vllm_linear, config, name, kind):
        cases.load(layer, shards, tensors)
        x = torch.randn(3, layer.input_size_per_partition, dtype=torch.bfloat16)
        expect = cases.expected(x, [qws[m].shard(*parts.get(s, (1, rank, world))) for m, s in shards.items()], None)
        assert torch.equal(layer.quant_method.apply(layer, x), expect), shards


def test_warmup_sizes_are_vllm_capture_sizes():
    assert capture_sizes() == (1, 2, 4, 8, 16, 24)


@pytest.mark.parametrize("name", list(moe_cases.FIXTURES))
def test_moe_experts_equal_fused_moe(name, seed):
    """vLLM's routed experts (FusedMoEFactory's RoutedExperts) on each MoE fixture, loaded expert by expert
    through vLLM's expert weight loader, compute humming.moe.fused_moe on the checkpoint's experts."""
    from vllm.model_executor.layers.fused_moe import FusedMoEFactory, fused_moe_make_expert_params_mapping

    hf = moe_cases.model_config(name)
    with set_current_vllm_config(VllmConfig()):  # a model's layer names are its config's: one model per test
        runner = FusedMoEFactory(
            num_experts=hf["num_experts"],
            top_k=hf["num_experts_per_tok"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["moe_intermediate_size"],
            params_dtype=torch.bfloat16,
            quant_config=HummingConfig(hf["quantization_config"]),
            prefix=moe_cases.PREFIX,
        )
    experts = runner.routed_experts
    assert isinstance(experts.quant_method, HummingMoEMethod)
    mapping = fused_moe_make_expert_params_mapping(experts, "gate_proj", "down_proj", "up_proj", hf["num_experts"])
    moe_cases.load(experts, dict(experts.named_parameters()), mapping, name)
    moe_cases.check_experts(lambda x, w, ids: experts.quant_method.apply(experts, x, w, ids, None, None), name)


def test_plugin_entry_point_is_found_and_run(tmp_path, monkeypatch):
    """pyproject's ``vllm.general_plugins`` entry point, as pip installs it (a dist-info's entry_points.txt),
    is what vLLM's plugin loader finds; running it keeps the probe false and registers humming_ir."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dist = tmp_path / "humming-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: humming\nVersion: 0.1.0\n")
    points = project["entry-points"]["vllm.general_plugins"]
    (dist / "entry_points.txt").write_text(
        "[vllm.general_plugins]\n" + "".join(f"{k} = {v}\n" for k, v in points.items())
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = load_plugins_by_group("vllm.general_plugins")
    assert plugins["humming"] is register
    plugins["humming"]()
    assert not has_humming() and get_quantization_config("humming_ir") is HummingConfig


def test_spawned_worker_unpickles_its_quantization_config(tmp_path):
    """A worker started with ``spawn`` unpickles its config, importing vLLM's quantization modules (which call
    has_humming() when imported), before it loads vLLM's plugins: humming's import inside that probe fails, so
    the probe answers False there too and the worker starts."""
    qconfig = json.loads((cases.DATA / "autogptq_w4_g128_sym" / "config.json").read_text())["quantization_config"]
    (tmp_path / "config.pkl").write_bytes(pickle.dumps(get_quantization_config("auto_gptq").from_config(qconfig)))
    code = (
        "import pickle, sys; config = pickle.loads(open(sys.argv[1], 'rb').read()); "
        "from vllm.utils.import_utils import has_humming; print(type(config).__name__, has_humming())"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "config.pkl")],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == ["AutoGPTQConfig", "False"], result.stdout
