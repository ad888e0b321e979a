"""``humming.moe.fused_moe`` against a per-token, per-slot loop in float64 (each activation from its formula,
both gate / up layouts, expert maps, static and dynamic activation scales); GPU runs at real MoE shapes."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from helpers import needs_sm90, rel_err
from moe_cases import MOE_TOL, fused_ref, moe_args, quantize_experts, random_routing

import humming
from humming import moe

wna16 = pytest.importorskip("humming.triton_kernels.wna16")


@pytest.mark.parametrize(
    ("backend", "name", "act", "x_dtype", "t", "topk", "e", "block_m", "bias"),
    [
        ("triton", "uint4-zp-g128", None, torch.bfloat16, 5, 2, 4, None, False),
        ("triton", "mxfp4", None, torch.float16, 5, 3, 4, 32, True),
        ("triton", "int8-channel", None, torch.bfloat16, 1, 4, 8, 16, False),
        ("reference", "e4m3-channel", "fp8", torch.bfloat16, 6, 2, 4, 8, True),
        ("reference", "int4-g32", None, torch.float16, 4, 2, 3, None, False),
        # routing blocks fitted to the tokens per expert (default_block_m(fitted=True) takes such multiples of 16)
        ("reference", "int4-g128", None, torch.bfloat16, 20, 4, 4, 144, True),
        ("triton", "int4-g128", None, torch.bfloat16, 6, 2, 4, 48, False),
    ],
    ids=lambda v: str(v).replace("torch.", ""),
)
def test_fused_moe_matches_token_loop(backend, name, act, x_dtype, t, topk, e, block_m, bias, seed, device) -> None:
    k, inter = 256, 64
    w13 = quantize_experts(name, e, 2 * inter, k, device, bias=bias)
    w2 = quantize_experts(name, e, k, inter, device, bias=bias)
    x = torch.randn(t, k, device=device).to(x_dtype)
    ids = random_routing(t, topk, e, device, empty=1 if e > topk else 0)
    weights = torch.softmax(torch.randn(t, topk, device=device), -1)
    out = moe.fused_moe(x, w13, w2, weights, ids, act=act, block_m=block_m, backend=backend)
    assert out.shape == (t, k) and out.dtype == x_dtype
    err = rel_err(out, fused_ref(x, w13, w2, weights, ids, act))
    assert err <= MOE_TOL[x_dtype], f"rel err {err:.2e} > {MOE_TOL[x_dtype]:.0e}"


@pytest.mark.parametrize("mapped", [False, True], ids=["whole", "rank"])
@pytest.mark.parametrize("act", ["fp8_tensor", "int8_tensor", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_fused_moe_tensor_wide_and_fp4_acts(backend: str, act: str, mapped: bool, seed: int, device: str) -> None:
    """Per-tensor, NVFP4 and MXFP4 activations through both GEMMs (w13 gathering its tokens). w13's dynamic
    tensor-wide scale spans the T tokens, routed here or not: as one expert-parallel rank, token 0 (30 times
    larger than the others) goes to no local expert and still sets the scale of every other token."""
    e, k, inter, t, topk = 4, 64, 32, 5, 2
    w13, w2 = quantize_experts("int4-g32", e, 2 * inter, k, device), quantize_experts("int4-g32", e, k, inter, device)
    x = torch.randn(t, k, device=device)
    x[0] *= 30
    x = x.bfloat16()
    ids = random_routing(t, topk, e, device)
    expert_map = None
    if mapped:  # global experts 0..3 on another rank, 4..7 here; token 0 routed to the other rank only
        expert_map = torch.tensor([-1] * e + list(range(e)), dtype=torch.int32, device=device)
        ids = torch.where(torch.arange(t, device=device)[:, None] == 0, ids, ids + e)
    weights = torch.softmax(torch.randn(t, topk, device=device), -1)
    out = moe.fused_moe(x, w13, w2, weights, ids, expert_map=expert_map, act=act, block_m=16, backend=backend)
    ref = fused_ref(x, w13, w2, weights, ids, act, expert_map=expert_map)
    if mapped:
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        ref, out = ref[1:], out[1:]
    err = rel_err(out, ref)
    assert err <= MOE_TOL[torch.bfloat16], f"seed {seed}: rel err {err:.2e}"


@pytest.mark.parametrize("act", ["fp8_tensor", "fp8", "int8"])
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_fused_moe_static_act_scales(backend: str, act: str, seed: int, device: str) -> None:
    """Static scales of both GEMMs' inputs (a checkpoint's ``input_scale``): the codes are ``x / scale``,
    saturating beyond it, for per-tensor and per-token schemes alike; w2's input is quantized after the
    activation pass (its per-token quantization is then not fused)."""
    e, k, inter, t = 4, 64, 32, 5
    w13 = quantize_experts("int4-g32", e, 2 * inter, k, device, bias=True)
    w2 = quantize_experts("int4-g32", e, k, inter, device, bias=True)
    x = torch.randn(t, k, device=device).bfloat16()
    ids, weights = random_routing(t, 2, e, device, empty=1), torch.softmax(torch.randn(t, 2, device=device), -1)
    maxv = 448.0 if act.startswith("fp8") else 127.0
    scales = (x.float().abs().amax() / maxv * 0.8, torch.tensor(4.0 / maxv, device=device))  # a few saturate
    kwargs = dict(act=act, w13_act_scale=scales[0], w2_act_scale=scales[1], block_m=16, backend=backend)
    out = moe.fused_moe(x, w13, w2, weights, ids, **kwargs)
    err = rel_err(out, fused_ref(x, w13, w2, weights, ids, act, scales=scales))
    assert err <= MOE_TOL[torch.bfloat16], f"seed {seed}: rel err {err:.2e}"
    dynamic = moe.fused_moe(x, w13, w2, weights, ids, act=act, block_m=16, backend=backend)
    assert not torch.equal(out, dynamic)


ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "swiglu_oai")


@pytest.mark.parametrize("act", [None, "fp8", "int8"])
@pytest.mark.parametrize("layout", ["concat", "interleaved"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_fused_moe_activations(activation: str, layout: str, act, seed: int, device: str) -> None:
    """Every activation and gate / up layout, 16-bit and quantized activations (the Triton path quantizes
    w2's input in its activation pass), per-expert biases, an expert without tokens."""
    e, k, inter, t, topk = 4, 64, 32, 5, 2
    w13 = quantize_experts("int4-g32", e, 2 * inter, k, device, bias=True)
    w2 = quantize_experts("int4-g32", e, k, inter, device, bias=True)
    x = (torch.randn(t, k, device=device) / 2).bfloat16()  # h of std ~4: swiglu_oai clamps a few elements at 7
    ids = random_routing(t, topk, e, device, empty=1)
    weights = torch.softmax(torch.randn(t, topk, device=device), -1)
    ref = fused_ref(x, w13, w2, weights, ids, act, activation, layout)
    kwargs = dict(activation=activation, gate_up_layout=layout, act=act, block_m=16)
    for backend in ("triton", "reference"):
        out = moe.fused_moe(x, w13, w2, weights, ids, backend=backend, **kwargs)
        assert out.shape == (t, k) and out.dtype == torch.bfloat16
        err = rel_err(out, ref)
        assert err <= MOE_TOL[torch.bfloat16], f"{backend}: rel err {err:.2e} (seed {seed})"


def test_fused_moe_swiglu_oai_parameters(seed: int, device: str) -> None:
    """alpha and limit reach the activation: a small limit clamps most of h, and the result follows it."""
    e, k, inter, t = 3, 64, 32, 4
    w13, w2 = quantize_experts("int4-g32", e, 2 * inter, k, device), quantize_experts("int4-g32", e, k, inter, device)
    x = torch.randn(t, k, device=device).bfloat16()
    ids, weights = random_routing(t, 2, e, device), torch.rand(t, 2, device=device)
    ref = fused_ref(x, w13, w2, weights, ids, None, "swiglu_oai", "interleaved", alpha=1.0, limit=0.5)
    kwargs = dict(activation="swiglu_oai", gate_up_layout="interleaved", alpha=1.0, limit=0.5, block_m=16)
    for backend in ("triton", "reference"):
        out = moe.fused_moe(x, w13, w2, weights, ids, backend=backend, **kwargs)
        assert rel_err(out, ref) <= MOE_TOL[torch.bfloat16], backend
    default = moe.fused_moe(x, w13, w2, weights, ids, activation="swiglu_oai", backend="reference")
    assert rel_err(default, ref) > 0.1  # the defaults (1.702, 7.0) give another result


@pytest.mark.parametrize("topk", [1, 2, 4])
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_fused_moe_expert_map(backend: str, topk: int, seed: int, device: str) -> None:
    """Expert parallelism: 8 global experts, 3 on this rank (global 5, 1, 6 at local 0, 1, 2). Fewer tokens
    than experts; the output is the reference restricted to the local experts, with their biases; a token
    routed to no local expert gets zeros."""
    e_global, k, inter, t = 8, 128, 32, 3
    expert_map = torch.full((e_global,), -1, dtype=torch.int32, device=device)
    expert_map[torch.tensor([5, 1, 6])] = torch.arange(3, dtype=torch.int32, device=device)
    w13 = quantize_experts("int4-g32", 3, 2 * inter, k, device, bias=True)
    w2 = quantize_experts("int4-g32", 3, k, inter, device, bias=True)
    x = torch.randn(t, k, device=device).bfloat16()
    ids = torch.stack([torch.randperm(e_global, device=device)[:topk] for _ in range(t)]).to(torch.int32)
    ids[0] = torch.tensor([0, 2, 3, 4][:topk], device=device)  # no local expert
    weights = torch.softmax(torch.randn(t, topk, device=device), -1)
    out = moe.fused_moe(x, w13, w2, weights, ids, expert_map=expert_map.long(), block_m=16, backend=backend)
    ref = fused_ref(x, w13, w2, weights, ids, expert_map=expert_map)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert rel_err(out, ref) <= MOE_TOL[torch.bfloat16]


@pytest.mark.parametrize("act", [None, "fp8"])
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_fused_moe_expert_map_nothing_local(backend: str, act, device: str) -> None:
    """No slot on this rank: nothing to compute, zeros out (the grouped rows are all padding)."""
    w13, w2 = (
        quantize_experts("int4-g32", 2, 64, 64, device, bias=True),
        quantize_experts("int4-g32", 2, 64, 32, device),
    )
    expert_map = torch.tensor([-1, 0, -1, 1], device=device)
    ids = torch.tensor([[0, 2], [2, 0], [0, 2]], dtype=torch.int32, device=device)
    x = torch.randn(3, 64, device=device).bfloat16()
    out = moe.fused_moe(
        x, w13, w2, torch.rand(3, 2, device=device), ids, expert_map=expert_map, act=act, backend=backend
    )
    assert torch.equal(out, torch.zeros_like(out))


def test_fused_moe_expert_map_equals_dropping_slots(seed: int, device: str) -> None:
    """A slot of an expert off this rank adds exactly nothing: the same output as the local experts alone,
    routed with those slots' weights set to zero (and every expert mapped to itself)."""
    e, k, inter, t, topk = 4, 128, 32, 6, 2
    w13, w2 = quantize_experts("int4-g32", e, 2 * inter, k, device), quantize_experts("int4-g32", e, k, inter, device)
    x = torch.randn(t, k, device=device).bfloat16()
    ids = random_routing(t, topk, 6, device)  # global ids in [0, 6); experts 4 and 5 live on another rank
    weights = torch.rand(t, topk, device=device) + 0.5
    expert_map = torch.tensor([0, 1, 2, 3, -1, -1], dtype=torch.int32, device=device)
    out = moe.fused_moe(x, w13, w2, weights, ids, expert_map=expert_map, block_m=16, backend="triton")
    local = ids < 4
    same = moe.fused_moe(x, w13, w2, weights * local, ids.clamp(max=3), block_m=16, backend="triton")
    assert torch.equal(out, same)


def test_fused_moe_quantizes_w2_input_in_the_activation_pass(monkeypatch, seed: int, device: str) -> None:
    """With a per-token act on the Triton path, only w13's input goes through the quantization pass: the
    activation pass hands w2 its codes and scales."""
    from humming.triton_kernels import _act_quant_pass

    calls = []
    quantize = _act_quant_pass._Pass.__call__
    monkeypatch.setattr(
        _act_quant_pass._Pass, "__call__", lambda self, x, *a: calls.append(x.shape) or quantize(self, x, *a)
    )
    e, k, inter = 3, 64, 32
    w13, w2 = quantize_experts("int4-g32", e, 2 * inter, k, device), quantize_experts("int4-g32", e, k, inter, device)
    x, ids = torch.randn(4, k, device=device).bfloat16(), random_routing(4, 2, e, device)
    weights = torch.rand(4, 2, device=device)
    out = moe.fused_moe(x, w13, w2, weights, ids, act="fp8", block_m=16, backend="triton")
    assert calls == [x.shape]
    assert rel_err(out, fused_ref(x, w13, w2, weights, ids, "fp8")) <= MOE_TOL[torch.bfloat16]


@pytest.mark.parametrize("act", [None, "fp8", "int8"])
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_fused_moe_non_finite_tokens(backend: str, act, seed: int, device: str) -> None:
    """A token with NaN or Inf activations gets a non-finite output row; every other token's row is bit for
    bit the one it gets when those are zeros."""
    e, k, inter, t = 4, 64, 32, 5
    w13, w2 = quantize_experts("int4-g32", e, 2 * inter, k, device), quantize_experts("int4-g32", e, k, inter, device)
    x = torch.randn(t, k, device=device).bfloat16()
    x[1, 3], x[3, 10] = float("nan"), float("inf")
    ids, weights = random_routing(t, 2, e, device), torch.rand(t, 2, device=device)
    kwargs = dict(act=act, block_m=16, backend=backend)
    out = moe.fused_moe(x, w13, w2, weights, ids, **kwargs)
    clean = moe.fused_moe(torch.where(torch.isfinite(x), x, 0), w13, w2, weights, ids, **kwargs)
    bad = torch.tensor([False, True, False, True, False], device=device)
    assert not torch.isfinite(out[bad]).any()
    assert torch.equal(out[~bad], clean[~bad])


def test_fused_moe_no_tokens() -> None:
    x, w13, w2, weights, ids = moe_args()
    assert moe.fused_moe(x[:0], w13, w2, weights[:0], ids[:0]).shape == (0, 64)


def test_default_block_m() -> None:
    assert [moe.default_block_m(s, 64) for s in (8, 1024, 4096, 65536)] == [16, 16, 64, 128]
    # where both grouped GEMMs take blocks of 8 (the CUDA grouped decode kernel): 8 up to 4 rows per expert
    assert [moe.default_block_m(s, 64, True) for s in (8, 256, 257, 1024, 4096)] == [8, 8, 16, 16, 64]
    # where both take any multiple of 16 (the grouped sm_90a GEMM): the blocks that measured fastest on the H100
    # (bench/results/h100/fine_tiles_2026-12-06): DeepSeek-V3 / Qwen3-30B-A3B at 8192 and 1024 tokens, top-8
    fitted = [
        moe.default_block_m(t * 8, e, fitted=True) for t, e in ((8192, 256), (8192, 128), (1024, 256), (1024, 128))
    ]
    assert fitted == [144, 192, 48, 80]
    assert moe.default_block_m(64 * 16, 64, fitted=True) == 16  # decode sizes keep their blocks
    # one expert takes every slot: 100 rows fit one block of 112
    assert moe.default_block_m(100, 1, fitted=True) == 112


@pytest.mark.parametrize(("slots", "e", "block_m"), [(8192, 256, 48), (65536, 256, 144), (4000, 7, 256), (300, 64, 16)])
def test_expected_segments_is_the_binomial_expectation(slots, e, block_m) -> None:
    """The normal approximation against the exact sum over the binomial's pmf of ceil(rows / block_m)."""
    from humming.moe.align import expected_segments

    p = 1 / e
    log_pmf = lambda r: (
        math.lgamma(slots + 1)
        - math.lgamma(r + 1)
        - math.lgamma(slots - r + 1)
        + r * math.log(p)
        + (slots - r) * math.log1p(-p)
    )
    exact = e * sum(math.exp(log_pmf(r)) * -(-r // block_m) for r in range(slots + 1))
    assert expected_segments(slots, e, block_m) == pytest.approx(exact, rel=0.01)


def test_blocks_of_8_only_where_the_grouped_decode_kernel_runs_both_gemms() -> None:
    """takes_blocks_of_8: never for quantized activations, the Triton or reference backend, or CPU tensors
    (no other grouped kernel takes blocks of 8)."""
    from humming.moe.grouped import takes_blocks_of_8

    w = humming.quantize(torch.randn(4, 128, 128, dtype=torch.bfloat16), weight="int4", group_size=128)
    x = torch.empty(0, 128, dtype=torch.bfloat16)
    assert not takes_blocks_of_8(w, w, x, None, "auto")  # CPU tensors
    assert not takes_blocks_of_8(w, w, x, None, "triton")
    assert not takes_blocks_of_8(w, w, x, humming.ir.activation.get_act_scheme("fp8"), "cuda")


def test_fitted_blocks_only_where_the_grouped_gemm_runs_both_gemms() -> None:
    """takes_fitted_blocks (any multiple of 16): never for quantized activations, the Triton or reference
    backend, or CPU tensors; where it holds the layer's block follows the tokens per expert."""
    from humming.moe.grouped import layer_block_m, takes_fitted_blocks

    w = humming.quantize(torch.randn(4, 128, 128, dtype=torch.bfloat16), weight="int4", group_size=128)
    x = torch.empty(0, 128, dtype=torch.bfloat16)
    assert not takes_fitted_blocks(w, w, x, None, "auto")  # CPU tensors
    assert not takes_fitted_blocks(w, w, x, None, "triton")
    assert not takes_fitted_blocks(w, w, x, humming.ir.activation.get_act_scheme("fp8"), "cuda")
    assert layer_block_m(4 * 256, w, w, x, None, "auto") == 128  # 256 rows per expert, standard blocks


@needs_sm90
def test_fitted_blocks_on_the_grouped_gemm() -> None:
    from humming.moe.grouped import layer_block_m, takes_fitted_blocks

    w13 = humming.quantize(torch.randn(4, 256, 128, device="cuda"), weight="int4", group_size=128)
    w2 = humming.quantize(torch.randn(4, 128, 128, device="cuda"), weight="int4", group_size=128)
    x = torch.empty(0, 128, dtype=torch.bfloat16, device="cuda")
    assert takes_fitted_blocks(w13, w2, x, None, "auto")
    assert layer_block_m(4 * 256, w13, w2, x, None, "auto") == 144  # 256 +- 14 rows per expert: two segments


# ------------------------------------------------------------------------------------ GPU, real MoE shapes
@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 256, 1024])
@pytest.mark.parametrize(
    "name", ["uint4-zp-g128", pytest.param("int8-channel", marks=pytest.mark.heavy_memory), "mxfp4"]
)  # int8 experts: 13.5 GiB at the peak, with the float reference's dequantized experts
def test_fused_moe_gpu_realistic(name: str, t: int, seed: int) -> None:
    """fused_moe (auto: CUDA or Triton) against the reference backend at E=64, topk=8, K=2048, I=768."""
    e, topk, k, inter = 64, 8, 2048, 768
    w13 = quantize_experts(name, e, 2 * inter, k, "cuda")
    w2 = quantize_experts(name, e, k, inter, "cuda")
    x = torch.randn(t, k, device="cuda").bfloat16()
    ids = random_routing(t, topk, e, "cuda")
    weights = torch.softmax(torch.randn(t, topk, device="cuda"), -1)
    out = moe.fused_moe(x, w13, w2, weights, ids)
    ref = moe.fused_moe(x.float(), w13, w2, weights, ids, backend="reference")
    assert rel_err(out, ref.double()) <= MOE_TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.big_memory
@pytest.mark.parametrize("t", [1, 16, 256])
@pytest.mark.parametrize("act", [None, "fp8"])
@pytest.mark.parametrize("mapped", [False, True], ids=["whole", "rank-of-4"])
def test_fused_moe_gpu_gpt_oss(mapped: bool, act, t: int, seed: int) -> None:
    """gpt-oss-20b's MoE layer (32 experts, top-4, K = I = 2880, interleaved clamped SwiGLU, biases, MXFP4
    experts), whole or as one expert-parallel rank of four (8 local experts, global ids): auto against the
    reference backend."""
    e_global, topk, k, inter = 32, 4, 2880, 2880
    e = 8 if mapped else e_global
    w13 = quantize_experts("mxfp4", e, 2 * inter, k, "cuda", bias=True)
    w2 = quantize_experts("mxfp4", e, k, inter, "cuda", bias=True)
    expert_map = None
    if mapped:
        expert_map = torch.full((e_global,), -1, dtype=torch.int32, device="cuda")
        expert_map[8:16] = torch.arange(8, dtype=torch.int32, device="cuda")
    x = (torch.randn(t, k, device="cuda") / 16).bfloat16()  # h of a few units, around the clamp at 7
    ids = random_routing(t, topk, e_global, "cuda")
    weights = torch.softmax(torch.randn(t, topk, device="cuda"), -1)
    kwargs = dict(activation="swiglu_oai", gate_up_layout="interleaved", expert_map=expert_map, act=act)
    out = moe.fused_moe(x, w13, w2, weights, ids, **kwargs)
    ref = moe.fused_moe(x.float(), w13, w2, weights, ids, backend="reference", **kwargs)
    assert rel_err(out, ref.double()) <= MOE_TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.heavy_memory  # two formats' E64 experts and their float references: 11-14 GiB
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("t", [1, 256])
def test_fused_moe_gpu_gelu(activation: str, t: int, seed: int) -> None:
    """GeGLU experts at E = 64, topk = 8, K = 2048, I = 768, int4 and fp8-activated e4m3 (CUDA or Triton)."""
    e, topk, k, inter = 64, 8, 2048, 768
    x = (torch.randn(t, k, device="cuda") / 16).bfloat16()
    ids = random_routing(t, topk, e, "cuda")
    weights = torch.softmax(torch.randn(t, topk, device="cuda"), -1)
    for name, act in (("int4-g128", None), ("e4m3-channel", "fp8")):
        w13, w2 = quantize_experts(name, e, 2 * inter, k, "cuda"), quantize_experts(name, e, k, inter, "cuda")
        out = moe.fused_moe(x, w13, w2, weights, ids, activation=activation, act=act)
        ref = moe.fused_moe(x.float(), w13, w2, weights, ids, activation=activation, act=act, backend="reference")
        assert rel_err(out, ref.double()) <= MOE_TOL[torch.bfloat16], name


def test_cuda_grouped_copies_w13_input_from_prefill_sizes() -> None:
    """The sm_90a WnA16 grouped GEMM gathers fused_moe's w13 tokens below COPY_FROM_TOKENS and reads them
    copied into grouped order from there; the FP8 GEMM always reads grouped rows."""
    from humming.cuda_kernels import grouped as cuda_grouped

    limit = cuda_grouped.COPY_FROM_TOKENS
    assert cuda_grouped.gathers(None, None, limit - 1, 8 * limit)
    assert not cuda_grouped.gathers(None, None, limit, 8 * limit)
    assert not cuda_grouped.gathers(None, humming.ir.activation.get_act_scheme("fp8"), 1, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_fused_moe_gpu_w13_copied_equals_gathered(activation: str, monkeypatch, seed: int) -> None:
    """fused_moe with w13's tokens copied into grouped order (the Triton copy, then the TMA-reading kernel,
    gated epilogue included) against the same layer gathering them in the kernel: bit for bit, and the
    copy listed among the call's launches."""
    from humming.cuda_kernels import grouped as cuda_grouped

    e, topk, k, inter, t = 16, 4, 512, 256, 96
    w13 = quantize_experts("int4-g128", e, 2 * inter, k, "cuda")
    w2 = quantize_experts("int4-g128", e, k, inter, "cuda")
    x = torch.randn(t, k, device="cuda").bfloat16()
    ids = random_routing(t, topk, e, "cuda")
    weights = torch.softmax(torch.randn(t, topk, device="cuda"), -1)
    outs = []
    for copy_from in (t + 1, t):  # gathered, then copied (fresh weight objects: launches are kept per weight)
        monkeypatch.setattr(cuda_grouped, "COPY_FROM_TOKENS", copy_from)
        w13_, w2_ = dataclasses.replace(w13), dataclasses.replace(w2)
        outs.append(moe.fused_moe(x, w13_, w2_, weights, ids, activation=activation))
        steps = [(la.step, la.kernel) for la in moe.MoeCall(w13_, w2_, topk, activation=activation).launches(t)]
        assert (("w13 input", "triton.gather_rows") in steps) == (copy_from == t), steps
    assert torch.equal(outs[0], outs[1])
    ref = moe.fused_moe(x.float(), w13, w2, weights, ids, activation=activation, backend="reference")
    assert rel_err(outs[1], ref.double()) <= MOE_TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["int4-g128", "mxfp4"])
def test_fused_moe_gpu_one_token_slot_route(name: str, seed: int) -> None:
    """One token with int32 ids runs in slot-major rows (no alignment: fused.slot_route): the same bits as
    the aligned route (int64 ids); ids out of range (an expert off the rank, an id past E) drop their slots
    in both; a CUDA graph of the call replays it; MoeCall lists no alignment launch for it."""
    from humming.moe.fused import slot_route_rows
    from humming.reference.moe_layer import check_activation

    e, topk, k, inter = 64, 8, 2048, 768
    mxfp4 = name == "mxfp4"  # gpt-oss's layer: biases, interleaved clamped SwiGLU
    w13 = quantize_experts(name, e, 2 * inter, k, "cuda", bias=mxfp4)
    w2 = quantize_experts(name, e, k, inter, "cuda", bias=mxfp4)
    kwargs = dict(activation="swiglu_oai", gate_up_layout="interleaved") if mxfp4 else {}
    activation = check_activation(kwargs.get("activation", "silu"), None, None, kwargs.get("gate_up_layout", "concat"))
    x = (torch.randn(1, k, device="cuda") / (16 if mxfp4 else 1)).bfloat16()
    weights = torch.softmax(torch.randn(1, topk, device="cuda"), -1)
    call = moe.MoeCall(w13, w2, topk, **kwargs)
    block_m, m_pad = call.grouped_shape(1)
    assert (
        m_pad
        == topk * block_m
        == slot_route_rows(x, w13, w2, topk, torch.int32, False, None, block_m, "auto", activation)
    )
    assert not any(launch.step == "align" for launch in call.launches(1))
    assert call.launches(1)[-1].kernel == "cuda.moe_combine"
    for ids in (random_routing(1, topk, e, "cuda"), torch.tensor([[3, e, 7, -1, 9, e + 5, 11, 0]], device="cuda")):
        ids = ids.to(torch.int32)
        out = moe.fused_moe(x, w13, w2, weights, ids, **kwargs)
        assert torch.equal(out, moe.fused_moe(x, w13, w2, weights, ids.long(), **kwargs))
        kept = (ids >= 0) & (ids < e)
        ref = moe.fused_moe(x.float(), w13, w2, weights * kept, ids.clamp(0, e - 1), backend="reference", **kwargs)
        assert rel_err(out, ref.double()) <= MOE_TOL[torch.bfloat16]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = moe.fused_moe(x, w13, w2, weights, ids, **kwargs)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, moe.fused_moe(x, w13, w2, weights, ids.long(), **kwargs))
