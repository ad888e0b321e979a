"""A user's workflow end to end: quantize_model on tiny transformers models (dense and MoE), save_pretrained,
from_pretrained back, bit-identical logits; compressed-tensors exports checked against humming's own reader and
byte for byte against the real producers' fixtures (tests/data/checkpoints); humming's own format for the
schemes compressed-tensors has no form for."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import humming
from humming.loaders.export import compressed_tensors_scheme

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed (pip install -e '.[hf]')")
from humming.nn import (  # noqa: E402
    QuantizedExperts,
    QuantizedLinear,
    from_pretrained,
    quantize_model,
    save_pretrained,
)

DATA = Path(__file__).parent / "data" / "checkpoints"
_SIZES = dict(vocab_size=128, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
_MLA = dict(_SIZES, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=32)
_MLA.update(v_head_dim=32, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=0)
_MLA.update(moe_intermediate_size=128)
#: tiny configs, two layers: a dense Llama and every MoE family whose experts quantize_model converts
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(intermediate_size=256, head_dim=32, **_SIZES),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
        intermediate_size=256, moe_intermediate_size=128, num_experts=4, num_experts_per_tok=2, head_dim=32, **_SIZES
    ),
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(
        intermediate_size=256,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        num_experts=4,
        num_experts_per_tok=2,
        **_SIZES,
    ),
    "mixtral": lambda: transformers.MixtralConfig(
        intermediate_size=128, num_local_experts=4, num_experts_per_tok=2, head_dim=32, **_SIZES
    ),
    "deepseek_v2": lambda: transformers.DeepseekV2Config(intermediate_size=256, **_MLA),
    "deepseek_v3": lambda: transformers.DeepseekV3Config(intermediate_size=256, n_group=1, topk_group=1, **_MLA),
    "gpt_oss": lambda: transformers.GptOssConfig(
        intermediate_size=128, num_local_experts=4, num_experts_per_tok=2, head_dim=32, **_SIZES
    ),
}
#: (weight, act) of the done-when round trips: int4 g128, fp8 128x128 blocks, NVFP4, MXFP4
CT_SCHEMES = [("int4", None), ("fp8_block", "fp8_g128"), ("nvfp4", None), ("mxfp4", None)]


def _tiny(kind: str, seed: int):
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(CONFIGS[kind]()).eval()


def _quantized(kind: str, seed: int, weight: str, act=None, **kwargs):
    model = _tiny(kind, seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantize_model(model, weight, act=act, progress=False, **kwargs)
    return model, [str(w.message) for w in caught if "quantize_model" in str(w.message)]


def _logits(model, ids) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids).logits


def _saved(model, tmp_path, **kwargs) -> tuple[str, dict]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fmt = save_pretrained(model, tmp_path, **kwargs)
    messages = [str(w.message) for w in caught if "save_pretrained" in str(w.message)]
    return fmt, dict(qconfig=json.loads((tmp_path / "config.json").read_text())["quantization_config"], warned=messages)


@pytest.mark.parametrize("weight, act", CT_SCHEMES)
@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_quantize_save_load_is_bit_exact(kind, weight, act, tmp_path, seed):
    model, warned = _quantized(kind, seed, weight, act)
    assert warned == [f"quantize_model: 1 of {15 if kind == 'llama' else 11} modules left unquantized: lm_head "
                      "(ignore='lm_head')"]  # fmt: skip
    ids = torch.randint(0, 128, (2, 7))
    expected = _logits(model, ids)
    fmt, saved = _saved(model, tmp_path)
    assert fmt == "compressed-tensors" and not saved["warned"]
    assert saved["qconfig"]["quant_method"] == "compressed-tensors" and saved["qconfig"]["ignore"][-1] == "lm_head"
    reloaded = from_pretrained(tmp_path)
    assert torch.equal(_logits(reloaded, ids), expected)
    layer = reloaded.model.layers[1]
    assert isinstance(layer.self_attn.q_proj, QuantizedLinear) and isinstance(reloaded.lm_head, torch.nn.Linear)
    if kind == "qwen3_moe":
        assert isinstance(layer.mlp.experts, QuantizedExperts)
        assert layer.mlp.experts.w13.format == model.model.layers[1].mlp.experts.w13.format


def _dequantized_twin(model):
    """A copy of a quantize_model output with float modules holding the dequantized weights in place of
    humming's: QuantizedLinear -> nn.Linear, QuantizedExperts -> the original experts module's parameters."""
    twin = copy.deepcopy(model)
    for name, module in model.named_modules():
        parent, _, child = name.rpartition(".")
        if isinstance(module, QuantizedLinear):
            layer = torch.nn.Linear(module.in_features, module.out_features, bias=module.weight.bias is not None)
            layer.weight.data = humming.dequantize(module.weight)
            if module.weight.bias is not None:
                layer.bias.data = module.weight.bias.float()
            setattr(twin.get_submodule(parent), child, layer)
    return twin


@pytest.mark.parametrize("kind", sorted(set(CONFIGS) - {"llama"}))
def test_quantize_model_converts_the_experts(kind, seed):
    """Every MoE family's experts become QuantizedExperts that compute what the float experts module computes
    on the dequantized weights (the layout, transposition, activation and biases read right)."""
    float_model = _tiny(kind, seed)
    model, warned = _quantized(kind, seed, "int4")
    experts = [m for m in model.modules() if isinstance(m, QuantizedExperts)]
    assert len(experts) == 2 and not any(isinstance(m, torch.nn.Linear) for m in experts[0].modules())
    twin = _dequantized_twin(model)
    for name, module in model.named_modules():
        if isinstance(module, QuantizedExperts):
            original = float_model.get_submodule(name)
            transposed = getattr(original, "is_transposed", False)
            for param, qw in (("gate_up_proj", module.w13), ("down_proj", module.w2)):
                w = humming.dequantize(qw)
                getattr(original, param).data = w.transpose(1, 2) if transposed else w
                if qw.bias is not None:
                    getattr(original, f"{param}_bias").data = qw.bias.float()
            parent, _, child = name.rpartition(".")
            setattr(twin.get_submodule(parent), child, original)
    ids = torch.randint(0, 128, (2, 6))
    torch.testing.assert_close(_logits(model, ids), _logits(twin, ids), rtol=1e-4, atol=1e-5)
    assert warned and "lm_head (ignore='lm_head')" in warned[0]
    if kind == "qwen2_moe":  # Qwen2-MoE's shared-expert gate is an nn.Linear of one output: a router gate
        assert "model.layers.*.mlp.shared_expert_gate (x2) (ignore='*.shared_expert_gate')" in warned[0]


@pytest.mark.parametrize("kind", ["mixtral", "deepseek_v3", "gpt_oss"])
def test_moe_families_round_trip(kind, tmp_path, seed):
    model, _ = _quantized(kind, seed, "int4")
    ids = torch.randint(0, 128, (1, 6))
    assert _saved(model, tmp_path)[0] == "compressed-tensors"
    assert torch.equal(_logits(from_pretrained(tmp_path), ids), _logits(model, ids))


def test_quantize_model_ignore_and_modules(seed):
    model, warned = _quantized("llama", seed, "int4", ignore=["re:.*\\.mlp\\..*", "lm_head"])
    assert isinstance(model.model.layers[0].self_attn.o_proj, QuantizedLinear)
    assert isinstance(model.model.layers[0].mlp.up_proj, torch.nn.Linear)
    assert "model.layers.*.mlp.gate_proj (x2) (ignore='re:.*\\\\.mlp\\\\..*')" in warned[0]
    model, warned = _quantized("llama", seed, "int4", modules=["*.q_proj"], ignore=())
    assert isinstance(model.model.layers[1].self_attn.q_proj, QuantizedLinear)
    assert "lm_head (not in modules=)" in warned[0] and "model.layers.*.self_attn.k_proj (x2)" in warned[0]
    model, warned = _quantized("llama", seed, "int4", ignore=())
    assert isinstance(model.lm_head, QuantizedLinear) and not warned
    with pytest.raises(ValueError, match=r"ignore: expected module names or patterns"):
        quantize_model(_tiny("llama", seed), ignore=[3], progress=False)


#: schemes with no compressed-tensors form: humming's own format
HUMMING_SCHEMES = [
    dict(weight="nf4", group_size=64),
    dict(weight="mxfp6_e3m2"),
    dict(weight="int4", act="nvfp4"),
    dict(weight="int4", zero_point="float"),
]


@pytest.mark.parametrize("scheme", HUMMING_SCHEMES, ids=lambda s: "-".join(map(str, s.values())))
def test_humming_format_round_trip(scheme, tmp_path, seed):
    scheme = dict(scheme)
    model, _ = _quantized("qwen3_moe", seed, scheme.pop("weight"), scheme.pop("act", None), **scheme)
    ids = torch.randint(0, 128, (2, 5))
    fmt, saved = _saved(model, tmp_path)
    assert fmt == "humming-ir" and saved["qconfig"]["quant_method"] == "humming-ir"
    assert "saving in humming's own format" in saved["warned"][0]
    assert torch.equal(_logits(from_pretrained(tmp_path), ids), _logits(model, ids))
    with pytest.raises(ValueError, match=r"format='compressed-tensors': model\.layers\.0\.self_attn\.q_proj: "):
        save_pretrained(model, tmp_path / "ct", format="compressed-tensors")


def test_static_activation_scale_round_trips(tmp_path, seed):
    model, _ = _quantized("llama", seed, "e4m3", "fp8_tensor", group_size=-1)
    attn = model.model.layers[0].self_attn
    attn.o_proj = QuantizedLinear(attn.o_proj.weight, act="fp8_tensor", act_scale=torch.tensor(0.01))
    ids = torch.randint(0, 128, (1, 5))
    fmt, saved = _saved(model, tmp_path)
    groups = saved["qconfig"]["config_groups"]
    assert fmt == "compressed-tensors" and len(groups) == 2  # dynamic and static per-tensor fp8
    assert sorted(g["input_activations"]["dynamic"] for g in groups.values()) == [False, True]
    reloaded = from_pretrained(tmp_path)
    assert torch.equal(reloaded.model.layers[0].self_attn.o_proj.act_scale, torch.full((1, 1), 0.01))
    assert torch.equal(_logits(reloaded, ids), _logits(model, ids))
    assert _saved(model, tmp_path / "own", format="humming-ir")[0] == "humming-ir"
    assert torch.equal(_logits(from_pretrained(tmp_path / "own"), ids), _logits(model, ids))


def _same_weights(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        wa, wb = a[name], b[name]
        assert (wa.shape, wa.format, wa.group_shape) == (wb.shape, wb.format, wb.group_shape), name
        assert sorted(wa.tensors()) == sorted(wb.tensors()), name
        for field, t in wa.tensors().items():
            assert t.dtype == wb.tensors()[field].dtype and torch.equal(t, wb.tensors()[field]), f"{name}.{field}"


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.iterdir() if p.is_dir()))
def test_fixture_export_round_trips(name, tmp_path):
    """Each real-producer checkpoint, loaded and saved again, loads into the same QuantizedWeights: GPTQ and
    AWQ through compressed-tensors; the llm-compressor ones byte for byte the producer's tensors and config."""
    source = DATA / name
    fmt, saved = _saved(from_pretrained(source), tmp_path)
    _same_weights(humming.load_checkpoint(tmp_path), humming.load_checkpoint(source))
    if name == "modelopt_nvfp4":  # NVFP4 activations keep a calibrated global scale in compressed-tensors
        assert fmt == "humming-ir" and "activations 'nvfp4'" in saved["warned"][0]
        return
    assert fmt == "compressed-tensors"
    if not name.startswith("ct_"):
        return
    theirs, ours = load_file(source / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert sorted(theirs) == sorted(ours)
    for key, t in theirs.items():
        assert t.dtype == ours[key].dtype and torch.equal(t.view(torch.uint8), ours[key].view(torch.uint8)), key
    config = json.loads((source / "config.json").read_text())["quantization_config"]
    for key in ("format", "ignore", "quantization_status"):
        assert saved["qconfig"][key] == config[key], key
    group, theirs_group = saved["qconfig"]["config_groups"]["group_0"], config["config_groups"]["group_0"]
    assert group["targets"] == theirs_group["targets"]
    for part in ("weights", "input_activations"):
        mine = group[part] or {}
        assert {k: v for k, v in (theirs_group[part] or {}).items() if k in mine} == mine, part


def test_compressed_tensors_scheme_says_why_not():
    w = torch.randn(32, 128)
    assert "nf4 g64" in compressed_tensors_scheme(humming.quantize(w, "nf4", 64), None, False)
    assert "float zero points" in compressed_tensors_scheme(humming.quantize(w, "int4", 32, "float"), None, False)
    nvfp4 = humming.quantize(w, "nvfp4")
    assert compressed_tensors_scheme(nvfp4, None, False)["format"] == "nvfp4-pack-quantized"
    skipped = torch.tensor(1071225243, dtype=torch.int32).view(torch.float32)  # 1.7000002: fp32(1 / d) never is
    odd = nvfp4.replace(global_scale=skipped)
    assert "no fp32 reciprocal" in compressed_tensors_scheme(odd, None, False)
    assert "static scale" in compressed_tensors_scheme(humming.quantize(w, "int8", -1), "int8", True)


def test_save_pretrained_errors(tmp_path, seed):
    with pytest.raises(ValueError, match=r"model: no humming module to save"):
        save_pretrained(_tiny("llama", seed), tmp_path)
    with pytest.raises(ValueError, match=r"model: expected a transformers model"):
        save_pretrained(torch.nn.Linear(2, 2), tmp_path)
    with pytest.raises(ValueError, match=r"format: expected one of"):
        save_pretrained(_tiny("llama", seed), tmp_path, format="gptq")


def test_shards_with_an_index(tmp_path, seed):
    model, _ = _quantized("llama", seed, "int4")
    save_pretrained(model, tmp_path, max_shard_bytes=200_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and not (tmp_path / "model.safetensors").exists()
    ids = torch.randint(0, 128, (1, 4))
    assert torch.equal(_logits(from_pretrained(tmp_path), ids), _logits(model, ids))


def test_from_pretrained_reads_a_hub_id_from_the_local_cache(tmp_path, monkeypatch):
    """A hub id resolves to its snapshot in huggingface_hub's cache, offline (no network is touched)."""
    hub = pytest.importorskip("huggingface_hub")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--producer--tiny-gptq"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in ("config.json", "model.safetensors"):
        (snapshot / file).symlink_to(DATA / "autogptq_w4_g128_sym" / file)
    monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = from_pretrained("producer/tiny-gptq", device_map={"": "cpu"}, dtype="auto")
    expected = from_pretrained(DATA / "autogptq_w4_g128_sym")
    ids = torch.randint(0, 256, (1, 5))
    assert model.dtype == torch.float16 and torch.equal(_logits(model, ids), _logits(expected, ids))
    with pytest.raises(humming.loaders.CheckpointError, match=r"no snapshot of hub id 'producer/other'"):
        from_pretrained("producer/other")
    with pytest.raises(ValueError, match=r"device_map: expected one device for the whole model"):
        from_pretrained("producer/tiny-gptq", device_map={"model": "cpu", "lm_head": "meta"})
