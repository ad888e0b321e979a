"""humming.nn.from_pretrained on the real-producer checkpoints of tests/data/checkpoints (tiny 1-layer Llamas)
against transformers' own LlamaForCausalLM holding the producer's dequantized weights: logits, greedy
generation, torch.compile; a synthetic MoE checkpoint (Qwen3-MoE experts); errors.

Tolerances, all norm-wise relative errors of float32 logits (``|a - b| / |b|``) or exact:

- ``REF16``, the reference model with the producer's own 16-bit weights (reference.safetensors): the producer
  rounded each exact dequantized weight once to fp16 / bf16, so each weight differs from humming's exact
  float32 value by at most ``u`` relative (``u`` = 2^-11 for fp16, 2^-8 for bf16).
  Whole-model logits of weight-only formats and every quantized linear fed the reference model's own input
  (all formats) are within ``u``. Whole-model logits of formats with quantized activations are not compared
  with REF16: requantizing activations that differ by ``u`` moves the codes next to a rounding boundary by a
  whole step, which grows the difference to the activation quantization error itself (2e-2 to 1e-1 here).
- ``REF32``, the same reference model holding float32 weights whose rounding to 16 bits is bit for bit the
  producer's (checked), with the activation scheme of the checkpoint applied to each quantized linear's input
  by humming's reference quantizer (int8 per token, fp8 per 1x128 group, nvfp4): the same arithmetic, so
  logits and greedy tokens are equal (tolerance 1e-6 for a different float32 summation order).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import humming
from humming.ir.formats import get_format
from humming.loaders import MissingTensorError, ShapeMismatchError, UnexpectedTensorError, UnsupportedFormatError

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed (pip install -e '.[hf]')")
from humming.nn import QuantizedExperts, QuantizedLinear, from_pretrained  # noqa: E402

DATA = Path(__file__).parent / "data" / "checkpoints"
#: fixture -> the activation scheme its config names (what the reference model applies; None: 16-bit)
FIXTURES = {
    "autogptq_w4_g128_sym": None,
    "awq_w4_g128": None,
    "ct_fp8_block": "fp8_g128",
    "ct_w4a16_asym": None,
    "ct_w4a16_g128_sym": None,
    "ct_w8a8_int8": "int8",
    "modelopt_nvfp4": "nvfp4",
}
#: unit roundoff of the producer's reference dtype
UNIT = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
EXACT = 1e-6


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _references(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(path / "reference.safetensors", "pt") as f:
        return {k.removesuffix(".weight"): f.get_tensor(k) for k in f.keys()}  # noqa: SIM118


def _reference_model(path: Path, weights: dict[str, torch.Tensor], act: str | None):
    """transformers' LlamaForCausalLM in float32: the checkpoint's unquantized tensors, ``weights`` for the
    quantized linears, and ``act`` applied to their inputs by humming's reference activation quantizer."""
    config = transformers.AutoConfig.from_pretrained(path)
    del config.quantization_config
    model = transformers.LlamaForCausalLM._from_config(config, dtype=torch.float32).eval()
    names = model.state_dict()
    state = {k: v.float() for k, v in load_file(path / "model.safetensors").items() if k in names}
    state.update({f"{m}.weight": w.float() for m, w in weights.items()})
    model.load_state_dict(state, strict=True)  # every tensor of the model, nothing left random
    if act is not None:

        def quantize_input(module, args):
            (x,) = args
            qa = humming.quantize_activation(x.reshape(-1, x.shape[-1]), act)
            return (humming.dequantize_activation(qa).reshape(x.shape),)

        for m in weights:
            model.get_submodule(m).register_forward_pre_hook(quantize_input)
    return model


def _exact_weights(model, refs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """humming's float32 weights of ``model``'s quantized linears, checked to round to the producer's bits."""
    out = {}
    for name, ref in refs.items():
        w = humming.dequantize(model.get_submodule(name).weight)
        rounded = w.to(ref.dtype)
        same = (rounded == ref) | (rounded.isnan() & ref.isnan())  # -0.0 == +0.0 (ModelOpt: code 8 is +0)
        assert bool(same.all()), f"{name}: {int((~same).sum())} weights do not round to the producer's"
        out[name] = w
    return out


@pytest.fixture(scope="module")
def loaded():
    """``name -> (humming model in float32, REF32, REF16)``, built once per fixture."""
    cache = {}

    def get(name):
        if name not in cache:
            path, act = DATA / name, FIXTURES[name]
            model = from_pretrained(path, dtype=torch.float32)
            refs = _references(path)
            ref32 = _reference_model(path, _exact_weights(model, refs), act)
            ref16 = _reference_model(path, refs, act)
            cache[name] = (model, ref32, ref16)
        return cache[name]

    return get


def test_every_fixture_is_tested():
    assert sorted(FIXTURES) == sorted(p.name for p in DATA.iterdir() if p.is_dir())


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_modules_and_activation_schemes(name, loaded):
    model, _, _ = loaded(name)
    quantized = {n: m for n, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    assert sorted(quantized) == sorted(_references(DATA / name))
    for layer in quantized.values():
        assert (None if layer.act is None else layer.act.name) == FIXTURES[name]
    assert isinstance(model.lm_head, torch.nn.Linear) and not model.training
    assert all(p.device.type == "cpu" for p in model.parameters())


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_logits_match_the_producers_weights(name, loaded, seed):
    model, ref32, ref16 = loaded(name)
    ids = torch.randint(0, model.config.vocab_size, (2, 11))
    with torch.no_grad():
        logits = model(ids).logits
        err32 = _rel(logits, ref32(ids).logits)
        assert err32 <= EXACT, f"seed {seed}: {err32:.2e} from the reference model with float32 weights"
        unit = UNIT[next(iter(_references(DATA / name).values())).dtype]
        if FIXTURES[name] is None:
            err16 = _rel(logits, ref16(ids).logits)
            assert err16 <= unit, f"seed {seed}: {err16:.2e} from the producer's 16-bit weights (u = {unit:.1e})"
        # every quantized linear, fed the (float) input its twin in the producer-weight model receives
        seen = {}
        hooks = []
        for n in _references(DATA / name):
            module = ref16.get_submodule(n)
            hooks.append(module.register_forward_pre_hook(lambda m, a, n=n: seen.__setitem__(n, a[0]), prepend=True))
            hooks.append(module.register_forward_hook(lambda m, a, o, n=n: seen.__setitem__(n, (seen[n], o))))
        ref16(ids)
        for h in hooks:
            h.remove()
        for n, (x, expect) in seen.items():
            err = _rel(model.get_submodule(n)(x), expect)
            assert err <= unit, f"seed {seed}: {n}: {err:.2e} from the producer's weights (u = {unit:.1e})"


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_greedy_generation(name, loaded, seed):
    """model.generate (KV cache: prefill then decode steps of one token) gives the reference's tokens."""
    model, ref32, _ = loaded(name)
    ids = torch.randint(0, model.config.vocab_size, (2, 6))
    kwargs = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": model.config.pad_token_id}
    with torch.no_grad():
        out = model.generate(ids, **kwargs)
        expect = ref32.generate(ids, **kwargs)
    assert out.shape == (2, 11)
    assert torch.equal(out, expect), f"seed {seed}: {out.tolist()} vs {expect.tolist()}"


@pytest.mark.parametrize("name", ["awq_w4_g128", "ct_w4a16_g128_sym"])
def test_checkpoint_dtype(name, loaded, seed):
    """In the checkpoint's own dtype (fp16 / bf16), against transformers' model in that dtype holding the
    producer's weights: both round every intermediate result to the dtype, so within 4 u."""
    path = DATA / name
    refs = _references(path)
    dtype = next(iter(refs.values())).dtype
    model = from_pretrained(path)  # dtype=None: the config's
    assert model.dtype == dtype and model.lm_head.weight.dtype == dtype
    ref = _reference_model(path, refs, None).to(dtype)
    ids = torch.randint(0, model.config.vocab_size, (2, 11))
    with torch.no_grad():
        err = _rel(model(ids).logits, ref(ids).logits)
    assert err <= 4 * UNIT[dtype], f"seed {seed}: {err:.2e} (u = {UNIT[dtype]:.1e})"


@pytest.mark.parametrize("name", ["autogptq_w4_g128_sym", "ct_fp8_block", "ct_w8a8_int8", "modelopt_nvfp4"])
def test_compiled_fullgraph(name, loaded, seed):
    """torch.compile(fullgraph=True) with a dynamic sequence length: the same logits as eager for every
    length without recompiling, and greedy decoding (no cache) through the compiled forward gives the eager
    tokens. The aot_eager backend traces exactly what inductor gets (dynamo, the custom ops' fake
    implementations, AOT autograd) without inductor's minutes of C++ compilation on CPU; the inductor
    backend runs humming's ops in tests/test_ops.py and tests/test_nn.py."""
    model, _, _ = loaded(name)
    torch._dynamo.reset()
    forward = torch.compile(
        lambda ids: model(input_ids=ids, use_cache=False).logits, fullgraph=True, backend="aot_eager"
    )
    ids = torch.randint(0, model.config.vocab_size, (2, 5))
    with torch._dynamo.config.patch(error_on_recompile=True), torch.no_grad():
        eager_ids, compiled_ids = ids, ids
        for _ in range(4):
            x = compiled_ids.clone()
            torch._dynamo.mark_dynamic(x, 1)
            logits = forward(x)
            expect = model(input_ids=eager_ids, use_cache=False).logits
            assert torch.equal(logits, expect), f"seed {seed}: {_rel(logits, expect):.2e}"
            eager_ids = torch.cat([eager_ids, expect[:, -1].argmax(-1, keepdim=True)], 1)
            compiled_ids = torch.cat([compiled_ids, logits[:, -1].argmax(-1, keepdim=True)], 1)
        assert torch.equal(compiled_ids, eager_ids)
    torch._dynamo.reset()


# ----------------------------------------------------------------------------------------------------- MoE
#: MoE_INPUT_SCALES[proj](e): the static input_scale of expert e's projection in the FP8 MoE checkpoint (gate
#: and up equal, as vLLM requires; different across experts)
MOE_INPUT_SCALES = {
    "gate_proj": lambda e: 0.01 * (e + 1),
    "up_proj": lambda e: 0.01 * (e + 1),
    "down_proj": lambda e: 0.05 / (e + 1),
}


def _moe_checkpoint(path: Path, seed: int, fp8_static: bool = False) -> dict[str, torch.Tensor]:
    """A 1-layer Qwen3-MoE in compressed-tensors pack-quantized int4 (group 32) for the experts, or with
    ``fp8_static`` float-quantized FP8 experts (per-channel weight scales) with static per-tensor input scales
    (``MOE_INPUT_SCALES``); returns the experts' dequantized float32 weights by per-expert module name."""
    from humming.loaders.compressed_tensors import pack_int_quantized

    config = transformers.Qwen3MoeConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        max_position_embeddings=64,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = transformers.Qwen3MoeForCausalLM(config)
    state = {k: v for k, v in model.state_dict().items() if ".experts." not in k}
    dense = {}
    for e in range(config.num_experts):
        for proj, (n, k) in (("gate_proj", (32, 64)), ("up_proj", (32, 64)), ("down_proj", (64, 32))):
            name = f"model.layers.0.mlp.experts.{e}.{proj}"
            if fp8_static:
                codes = (torch.randn(n, k) * 64).to(torch.float8_e4m3fn)
                scales = (torch.rand(n, 1) * 0.002 + 0.001).to(torch.bfloat16)
                dense[name] = codes.float() * scales.float()
                state.update({f"{name}.weight": codes, f"{name}.weight_scale": scales})
                state[f"{name}.input_scale"] = torch.tensor([MOE_INPUT_SCALES[proj](e)])
                continue
            q = torch.randint(-8, 8, (n, k))
            scales = (torch.rand(n, k // 32) * 0.02 + 0.01).to(torch.bfloat16)
            dense[name] = (q.float() * scales.float().repeat_interleave(32, 1)).float()
            state.update({f"{name}.{t}": v for t, v in pack_int_quantized(q, scales, None, bits=4).items()})
    save_file({k: v.contiguous() for k, v in state.items()}, path / "model.safetensors")
    group = {"targets": ["re:.*experts.*"]}
    if fp8_static:
        group["weights"] = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"}
        group["input_activations"] = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor"}
        group["input_activations"]["dynamic"] = False
    else:
        group["weights"] = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
    qconfig = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized" if fp8_static else "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": group},
        "ignore": ["lm_head"],
    }
    config_dict = config.to_dict() | {"quantization_config": qconfig, "architectures": ["Qwen3MoeForCausalLM"]}
    (path / "config.json").write_text(json.dumps(config_dict))
    return dense


def test_moe_experts(tmp_path, seed):
    """Per-expert quantized projections become one QuantizedExperts (humming.moe.fused_moe) in place of
    transformers' Qwen3MoeExperts; the logits match the float model holding the dequantized experts."""
    dense = _moe_checkpoint(tmp_path, seed)
    model = from_pretrained(tmp_path, dtype=torch.float32)
    experts = model.model.layers[0].mlp.experts
    assert isinstance(experts, QuantizedExperts) and experts.w13.shape == (4, 64, 64)
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    del config.quantization_config
    ref = transformers.Qwen3MoeForCausalLM._from_config(config, dtype=torch.float32).eval()
    state = {k: v for k, v in load_file(tmp_path / "model.safetensors").items() if ".experts." not in k}
    p = "model.layers.0.mlp.experts"
    state[f"{p}.gate_up_proj"] = torch.stack(
        [torch.cat([dense[f"{p}.{e}.gate_proj"], dense[f"{p}.{e}.up_proj"]]) for e in range(4)]
    )
    state[f"{p}.down_proj"] = torch.stack([dense[f"{p}.{e}.down_proj"] for e in range(4)])
    ref.load_state_dict(state, strict=True)
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        err = _rel(model(ids).logits, ref(ids).logits)
    # the same float32 products; transformers sums the experts in another order
    assert err <= 1e-5, f"seed {seed}: {err:.2e}"


def test_moe_experts_static_input_scales(tmp_path, seed):
    """An FP8 MoE checkpoint with static per-expert input scales (compressed-tensors, strategy "tensor",
    dynamic false): QuantizedExperts runs fp8_tensor with one scale per GEMM input, the max over the experts
    (and over gate and up for w13), as vLLM does; activation_schemes says the same. The module is fused_moe
    with those scales, bit for bit, on the checkpoint's exact weights."""
    dense = _moe_checkpoint(tmp_path, seed, fp8_static=True)
    model = from_pretrained(tmp_path, dtype=torch.bfloat16)
    experts = model.model.layers[0].mlp.experts
    assert isinstance(experts, QuantizedExperts) and experts.act.name == "fp8_tensor"
    w13_scale = max(MOE_INPUT_SCALES[p](e) for p in ("gate_proj", "up_proj") for e in range(4))
    w2_scale = max(MOE_INPUT_SCALES["down_proj"](e) for e in range(4))
    scale = lambda v: torch.tensor([[v]], dtype=torch.float32)
    assert torch.equal(experts.w13_act_scale, scale(w13_scale)) and torch.equal(experts.w2_act_scale, scale(w2_scale))
    p = "model.layers.0.mlp.experts"
    w13 = torch.stack([torch.cat([dense[f"{p}.{e}.gate_proj"], dense[f"{p}.{e}.up_proj"]]) for e in range(4)])
    assert torch.equal(humming.dequantize(experts.w13), w13)
    assert torch.equal(humming.dequantize(experts.w2), torch.stack([dense[f"{p}.{e}.down_proj"] for e in range(4)]))
    acts = humming.loaders.activation_schemes(tmp_path)
    gate_scale = max(MOE_INPUT_SCALES["gate_proj"](e) for e in range(4))
    assert acts[f"{p}.gate_proj"][0] == "fp8_tensor" and float(acts[f"{p}.gate_proj"][1]) == pytest.approx(gate_scale)
    assert float(acts[f"{p}.down_proj"][1]) == pytest.approx(w2_scale)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    weights, ids = humming.moe.topk_routing(torch.randn(5, 4), 2)
    statics = dict(w13_act_scale=scale(w13_scale), w2_act_scale=scale(w2_scale))
    expect = humming.moe.fused_moe(x, experts.w13, experts.w2, weights, ids, act="fp8_tensor", **statics)
    assert torch.isfinite(expect).all() and torch.equal(experts(x, ids, weights), expect)
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(0, 128, (1, 6))).logits).all()


def test_merged_static_scales_on_all_or_none():
    """Modules run as one (stacked experts; gate and up) take one static scale: on every module or none."""
    from humming.loaders.activations import ActivationSpec, merged_activation

    static, dynamic = ActivationSpec("fp8_tensor", "a.input_scale"), ActivationSpec("fp8_tensor")
    merged = merged_activation("m", [static, ActivationSpec("fp8_tensor", ("b.input_scale", "c.input_scale"))])
    assert merged == ActivationSpec("fp8_tensor", ("a.input_scale", "b.input_scale", "c.input_scale"))
    assert merged_activation("m", [dynamic, dynamic]) == dynamic
    with pytest.raises(UnsupportedFormatError, match="m: 1 of 2 modules have static activation scales"):
        merged_activation("m", [static, dynamic])
    with pytest.raises(UnsupportedFormatError, match="m: modules with different activation schemes"):
        merged_activation("m", [dynamic, ActivationSpec("fp8")])


def _gpt_oss_checkpoint(path: Path, seed: int) -> tuple[dict[str, torch.Tensor], object]:
    """A 1-layer gpt-oss with MXFP4 experts (``*_blocks`` / ``*_scales`` / ``*_bias``, interleaved gate / up
    rows) and a non-default ``swiglu_limit``; returns the experts' float32 weights ``[E, out, in]`` and biases
    by tensor name, and the config."""
    from humming.loaders.gpt_oss import pack_gpt_oss

    config = transformers.GptOssConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        swiglu_limit=2.0,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(config)
    state = {k: v for k, v in model.state_dict().items() if ".experts." not in k}
    dense = {}
    p = "model.layers.0.mlp.experts"
    for proj, (n, k) in (("gate_up_proj", (64, 64)), ("down_proj", (64, 32))):
        codes = torch.randint(0, 16, (4, n, k), dtype=torch.uint8)
        exps = torch.randint(122, 128, (4, n, k // 32), dtype=torch.uint8)
        blocks, scales = pack_gpt_oss(codes, exps)
        bias = torch.randn(4, n).bfloat16()
        e2m1 = get_format("e2m1").decode(codes)
        dense[f"{p}.{proj}"] = torch.ldexp(e2m1, exps.repeat_interleave(32, -1).float() - 127)
        dense[f"{p}.{proj}_bias"] = bias.float()
        state.update({f"{p}.{proj}_blocks": blocks, f"{p}.{proj}_scales": scales, f"{p}.{proj}_bias": bias})
    save_file({k: v.contiguous() for k, v in state.items()}, path / "model.safetensors")
    qconfig = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}
    config_dict = config.to_dict() | {"quantization_config": qconfig, "architectures": ["GptOssForCausalLM"]}
    (path / "config.json").write_text(json.dumps(config_dict))
    return dense, config


def test_gpt_oss_experts(tmp_path, seed):
    """gpt-oss's fused MXFP4 experts become a QuantizedExperts running its clamped SwiGLU (alpha and limit as
    the transformers module computes with them: from the config, or fixed by versions that ignore it) on
    interleaved gate / up rows, with the experts' biases; the logits match transformers' GptOssForCausalLM
    holding the dequantized experts."""
    dense, config = _gpt_oss_checkpoint(tmp_path, seed)
    model = from_pretrained(tmp_path, dtype=torch.float32)
    experts = model.model.layers[0].mlp.experts
    ref = transformers.GptOssForCausalLM._from_config(config, dtype=torch.float32).eval()
    own = ref.model.layers[0].mlp.experts
    assert isinstance(experts, QuantizedExperts) and experts.w13.shape == (4, 64, 64)
    assert (experts.activation, experts.alpha, experts.limit) == ("swiglu_oai", own.alpha, own.limit)
    assert experts.gate_up_layout == "interleaved" and experts.w13.bias is not None
    state = {k: v for k, v in load_file(tmp_path / "model.safetensors").items() if ".experts." not in k}
    p = "model.layers.0.mlp.experts"
    for proj in ("gate_up_proj", "down_proj"):  # transformers holds them [E, in, out]
        state[f"{p}.{proj}"] = dense[f"{p}.{proj}"].transpose(1, 2)
        state[f"{p}.{proj}_bias"] = dense[f"{p}.{proj}_bias"]
    ref.load_state_dict(state, strict=True)
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        err = _rel(model(ids).logits, ref(ids).logits)
    assert err <= 1e-5, f"seed {seed}: {err:.2e}"


def test_clamped_swiglu_reads_what_the_experts_module_computes_with():
    """gpt-oss's alpha and limit come from the experts module when it holds them (transformers 5.17 fixes them
    at 1.702 / 7.0 whatever the config says), else from the config."""
    from types import SimpleNamespace

    from torch import nn

    from humming.nn.hf import _expert_activation

    module = type("GptOssExperts", (nn.Module,), {})()
    module.is_concatenated = False
    module.config = SimpleNamespace(swiglu_alpha=1.5, swiglu_limit=2.0)
    assert _expert_activation(module) == dict(
        activation="swiglu_oai", alpha=1.5, limit=2.0, gate_up_layout="interleaved"
    )
    module.alpha, module.limit = 1.702, 7.0
    assert _expert_activation(module)["alpha"] == 1.702 and _expert_activation(module)["limit"] == 7.0
    del module.is_concatenated  # transformers 5.0 leaves the flag out: gpt-oss's rows are interleaved all the same
    assert _expert_activation(module)["gate_up_layout"] == "interleaved"


def test_expert_activation_of_transformers_modules():
    """The activation read from an experts module: the default gate's act_fn in the module's gate / up layout;
    experts without a gate, with an unknown act_fn or a gate of their own are refused with the reason."""
    from torch import nn

    from humming.nn.hf import _expert_activation

    activations = transformers.activations

    def experts(act_fn=None, gate=None, **flags):
        cls = type("SomeExperts", (nn.Module,), {} if gate is None else {"_apply_gate": gate})
        module = cls()
        module.act_fn = act_fn
        module.__dict__.update(flags)
        return module

    assert _expert_activation(experts(nn.SiLU())) == dict(activation="silu", gate_up_layout="concat")
    assert _expert_activation(experts(activations.GELUActivation()))["activation"] == "gelu"
    assert _expert_activation(experts(nn.GELU(approximate="tanh")))["activation"] == "gelu_tanh"
    assert _expert_activation(experts(activations.NewGELUActivation()))["activation"] == "gelu_tanh"
    assert _expert_activation(experts(nn.SiLU(), is_concatenated=False))["gate_up_layout"] == "interleaved"
    assert _expert_activation(experts(nn.SiLU(), has_gate=False)) == "experts without a gate (up_proj only)"
    assert _expert_activation(experts(nn.ReLU())) == "act_fn ReLU"
    assert _expert_activation(experts(nn.SiLU(), gate=lambda self, h: h)) == "its own gate SomeExperts._apply_gate"


# -------------------------------------------------------------------------------------------------- errors
def _copy(tmp_path: Path, name: str = "ct_w4a16_g128_sym") -> Path:
    dst = tmp_path / name
    shutil.copytree(DATA / name, dst)
    return dst


def _edit_config(path: Path, **changes) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def _edit_tensors(path: Path, drop=(), add=None) -> None:
    state = {k: v for k, v in load_file(path / "model.safetensors").items() if k not in drop}
    save_file(state | (add or {}), path / "model.safetensors")


def test_transformers_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"pip install 'humming\[hf\]'"):
        from_pretrained(DATA / "awq_w4_g128")


def test_unknown_or_no_format(tmp_path):
    path = _copy(tmp_path)
    _edit_config(path, quantization_config={"quant_method": "quux"})
    with pytest.raises(UnsupportedFormatError, match=r"unknown quant_method 'quux'"):
        from_pretrained(path)
    _edit_config(path, quantization_config=None)
    with pytest.raises(humming.loaders.CheckpointError, match=r"not a quantized checkpoint"):
        from_pretrained(path)


def test_missing_and_unexpected_tensors(tmp_path):
    path = _copy(tmp_path)
    _edit_tensors(path, drop={"model.norm.weight"}, add={"model.extra.weight": torch.ones(3)})
    with pytest.raises(UnexpectedTensorError, match=r"1 checkpoint tensors have no place .*model\.extra\.weight"):
        from_pretrained(path)
    with (
        pytest.warns(UserWarning, match=r"model\.extra\.weight"),
        pytest.raises(MissingTensorError, match=r"not in the checkpoint: model\.norm\.weight"),
    ):
        from_pretrained(path, strict=False)


def test_shape_mismatch(tmp_path):
    path = _copy(tmp_path)
    _edit_config(path, intermediate_size=512)
    with pytest.raises(ShapeMismatchError, match=r"mlp\.down_proj: the checkpoint's weight is \(256, 640\)"):
        from_pretrained(path)


def test_tied_embeddings(tmp_path):
    path = _copy(tmp_path)
    _edit_tensors(path, drop={"lm_head.weight"})
    _edit_config(path, tie_word_embeddings=True)
    model = from_pretrained(path, dtype=torch.float32)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_static_activation_scale(tmp_path, seed):
    """A ModelOpt FP8 checkpoint's static input_scale: QuantizedLinear quantizes x / input_scale per tensor."""
    path = tmp_path / "fp8"
    path.mkdir()
    src = DATA / "ct_w4a16_g128_sym"
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head"]}
    (path / "config.json").write_text(json.dumps(config))
    state = {k: v for k, v in load_file(src / "model.safetensors").items() if "proj" not in k}
    refs = _references(src)
    for name, w in refs.items():
        scale = w.float().abs().amax() / 448
        state[f"{name}.weight"] = (w.float() / scale).to(torch.float8_e4m3fn)
        state[f"{name}.weight_scale"] = scale.reshape(())
        state[f"{name}.input_scale"] = torch.tensor(0.02)
    save_file(state, path / "model.safetensors")
    model = from_pretrained(path, dtype=torch.bfloat16)
    layer = model.model.layers[0].self_attn.q_proj
    assert layer.act.name == "fp8_tensor" and float(layer.act_scale) == pytest.approx(0.02)
    x = torch.randn(2, 3, 256, dtype=torch.bfloat16)
    qa = humming.quantize_activation(x.reshape(6, 256), "fp8_tensor", scale=torch.tensor(0.02))
    expect = humming.linear(qa, layer.weight, out_dtype=torch.bfloat16).reshape(2, 3, -1)
    assert torch.equal(layer(x), expect)
    model.half()  # the static scale stays float32
    assert layer.act_scale.dtype == torch.float32
