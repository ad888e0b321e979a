"""``humming.moe.MoeCall``: what ``humming.warmup`` makes ready for a fused_moe layer. Its list of launches
(routing, the two grouped GEMMs, the activation pass with or without w2's quantization, the combine) must
name every kernel the call launches: checked against the Triton kernels a real call launches (under the
interpreter on CPU) and against the dispatcher's plans."""

from __future__ import annotations

import pytest
import torch

import humming
from humming import moe
from humming.nn import FusedMoE, QuantizedExperts

pytest.importorskip("humming.triton_kernels.moe_layer")
from humming.triton_kernels._launch import CompiledLaunches

E, K, INTER = 8, 64, 32
DEEPSEEK = dict(scoring="sigmoid", renormalize=True, num_groups=4, topk_groups=2, routed_scaling=2.5)
#: the Triton kernel function behind each launch name of MoeCall.launches
TRITON_FUNCTIONS = {
    "triton.topk_routing": "_topk_routing_kernel",
    "triton.moe_align": "_align_one_kernel",
    "triton.moe_align_count": "_align_count_kernel",
    "triton.moe_align_offsets": "_align_offsets_kernel",
    "triton.moe_align_scatter": "_align_scatter_kernel",
    "triton.act_quant": "_act_quant_kernel",
    "triton.moe_act": "_moe_act_kernel",
    "triton.moe_combine": "_combine_kernel",
}


def _experts(bias: bool = False, e: int = E):
    b = (lambda n: torch.randn(e, n)) if bias else (lambda n: None)
    w13 = humming.quantize(torch.randn(e, 2 * INTER, K), "int4", group_size=32, bias=b(2 * INTER))
    w2 = humming.quantize(torch.randn(e, K, INTER), "int4", group_size=32, bias=b(K))
    return w13, w2


@pytest.mark.parametrize("act", [None, "fp8", "mxfp4"])
def test_launches_on_triton(act, seed):
    """backend="triton": Triton routing, grouped GEMMs, activation pass (writing w2's codes with a per-token or
    per-group act) and combine; the GEMM launches are the dispatcher's plans at the call's rows."""
    w13, w2 = _experts()
    routing = DEEPSEEK | dict(correction_bias=torch.rand(E))
    call = moe.MoeCall(
        w13, w2, 2, activation="swiglu_oai", gate_up_layout="interleaved", act=act, backend="triton", routing=routing
    )
    launches = {la.step: la for la in call.launches(5)}
    assert launches["align"].detail == f"E={E} block_m=16 slots=10"
    quantized = act is not None
    assert [(step, la.kernel) for step, la in launches.items()] == [
        ("routing", "triton.topk_routing"),
        ("align", "triton.moe_align"),
        *([("w13 input", "triton.act_quant")] if quantized else []),  # w2's input comes quantized
        ("w13", "triton.grouped"),
        ("activation", "triton.moe_act"),
        ("w2", "triton.grouped"),
        ("combine", "triton.moe_combine"),
    ]
    block_m, m_pad = call.grouped_shape(5)
    assert (block_m, m_pad) == (16, moe.padded_rows(10, E, 16))
    assert f"rows={m_pad}" in launches["w13"].detail and "swiglu_oai interleaved" in launches["activation"].detail
    assert launches["activation"].detail.endswith(f"-> {act} codes") == quantized
    assert f"x {torch.uint8 if quantized else torch.bfloat16} act" in launches["w2"].detail


def test_launches_align_in_blocks_past_one_program() -> None:
    """Past ONE_PROGRAM_SLOTS routed slots, moe_align's three launches are listed."""
    from humming.triton_kernels.align import ONE_PROGRAM_SLOTS

    w13, w2 = _experts()
    call = moe.MoeCall(w13, w2, 2, backend="triton")
    kernels = [la.kernel for la in call.launches(ONE_PROGRAM_SLOTS // 2 + 1) if la.step == "align"]
    assert kernels == ["triton.moe_align_count", "triton.moe_align_offsets", "triton.moe_align_scatter"]
    assert [la.kernel for la in call.launches(ONE_PROGRAM_SLOTS // 2) if la.step == "align"] == ["triton.moe_align"]


@pytest.mark.parametrize("backend", ["triton", "auto"])
def test_launches_with_static_scales(backend, seed):
    """Static activation scales quantize each GEMM's input before it (Triton's quantizer where the activation
    pass is Triton's, else torch's reference): the T tokens for w13, the grouped rows for w2, which the
    activation pass then leaves unquantized."""
    w13, w2 = _experts()
    scales = dict(w13_act_scale=torch.tensor(0.02), w2_act_scale=torch.tensor(4.0))
    call = moe.MoeCall(w13, w2, 2, act="fp8", backend=backend, **scales)
    launches = call.launches(5)
    quant, gemm = ("triton.act_quant", "triton.grouped") if backend == "triton" else ("torch", "reference")
    activation, combine = ("triton.moe_act", "triton.moe_combine") if backend == "triton" else ("torch", "torch")
    align = "triton.moe_align" if backend == "triton" else "torch"
    assert [(la.step, la.kernel) for la in launches] == [
        ("align", align),
        ("w13 input", quant),
        ("w13", gemm),
        ("activation", activation),
        ("w2 input", quant),
        ("w2", gemm),
        ("combine", combine),
    ]
    m_pad = call.grouped_shape(5)[1]
    assert launches[1].detail == "fp8 static rows=5" and launches[4].detail == f"fp8 static rows={m_pad}"
    assert "codes" not in launches[3].detail and all(f"x {torch.uint8}" in launches[i].detail for i in (2, 5))


def test_launches_on_cpu_auto(seed):
    """ "auto" on CPU tensors: the reference routing and GEMMs, the activation and combine in torch."""
    w13, w2 = _experts()
    call = moe.MoeCall(w13, w2, 2, routing={})
    assert [(la.step, la.kernel) for la in call.launches(3)] == [
        ("routing", "reference"),
        ("align", "torch"),
        ("w13", "reference"),
        ("activation", "torch"),
        ("w2", "reference"),
        ("combine", "torch"),
    ]
    assert [la.step for la in moe.MoeCall(w13, w2, 2).launches(3)] == ["align", "w13", "activation", "w2", "combine"]


@pytest.mark.parametrize(("act", "t", "static"), [(None, 3, False), ("fp8", 1, False), ("fp8", 2, True)])
def test_launches_name_every_triton_kernel_the_call_runs(act, t, static, monkeypatch, seed):
    """Running the call (what warmup does) launches exactly the Triton kernels of routing, activation and
    combine that MoeCall.launches lists, and one grouped GEMM per GEMM step it lists; static activation scales
    (``static``) quantize the GEMMs' inputs in passes of their own."""
    launched = []
    launch = CompiledLaunches.launch
    monkeypatch.setattr(
        CompiledLaunches,
        "launch",
        lambda self, *a, **options: launched.append(self.fn.__name__) or launch(self, *a, **options),
    )
    w13, w2 = _experts(bias=True, e=2)  # few experts: few grouped rows for the interpreter
    scales = dict(w13_act_scale=torch.tensor(0.02), w2_act_scale=torch.tensor(4.0)) if static else {}
    call = moe.MoeCall(w13, w2, 2, act=act, backend="triton", routing=dict(renormalize=True), **scales)
    listed = [TRITON_FUNCTIONS[la.kernel] for la in call.launches(t) if la.kernel in TRITON_FUNCTIONS]
    out = call.run(t)
    assert out.shape == (t, K) and torch.isfinite(out).all()
    gemms = {"_scaled_mm_kernel", "_wna16_kernel"}
    assert [name for name in launched if name not in gemms] == listed
    assert sum(name in gemms for name in launched) == sum(la.step in ("w13", "w2") for la in call.launches(t))


def test_modules_describe_their_calls(seed):
    """FusedMoE.moe_call() carries its routing (the correction bias itself) and options; QuantizedExperts'
    routing is the caller's. The call runs the module's computation."""
    w13, w2 = _experts()
    bias = torch.rand(E)
    layer = FusedMoE(w13, w2, 2, correction_bias=bias, activation="gelu", **DEEPSEEK)
    call = layer.moe_call()
    assert call.routing["correction_bias"] is layer.correction_bias and call.routing["num_groups"] == 4
    assert call.activation == "gelu" and call.top_k == 2 and call.w13 is layer.w13
    torch.manual_seed(seed)
    out = call.run(4)
    torch.manual_seed(seed)
    x = torch.randn(4, K, dtype=torch.bfloat16)
    logits = torch.randn(4, E)
    assert torch.equal(out, layer(x, logits))
    experts = QuantizedExperts(w13, w2, activation="gelu_tanh").moe_call(3)
    assert experts.routing is None and experts.top_k == 3 and experts.activation == "gelu_tanh"
    assert experts.w13_act_scale is None and experts.w2_act_scale is None
    static = FusedMoE(w13, w2, 2, act="fp8", w13_act_scale=torch.tensor(0.02), w2_act_scale=torch.tensor(4.0))
    call = static.moe_call()
    assert call.w13_act_scale is static.w13_act_scale and call.w2_act_scale is static.w2_act_scale
    torch.manual_seed(seed)
    out = call.run(3)
    torch.manual_seed(seed)
    assert torch.equal(out, static(torch.randn(3, K, dtype=torch.bfloat16), torch.randn(3, E)))
    experts = QuantizedExperts(w13, w2, act="fp8", w2_act_scale=torch.tensor(4.0)).moe_call(2)
    assert experts.w13_act_scale is None and experts.w2_act_scale.item() == 4.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(top_k=9), r"top_k: expected an int in \[1, 8\]"),
        (dict(top_k=2, routing=dict(topk=2)), "routing: expected a dict of topk_routing's keyword arguments"),
        (dict(top_k=2, routing=dict(num_groups=3, topk_groups=1)), "num_groups: expected a positive int"),
        (dict(top_k=2, activation="relu"), "activation: expected one of"),
        (dict(top_k=2, alpha=1.0), "alpha: parameters of activation='swiglu_oai'"),
        (dict(top_k=2, act="fp9"), "act: unknown activation scheme"),
        (dict(top_k=2, expert_map=torch.arange(4)), r"expert_map: .* E_global >= 8"),
        (dict(top_k=2, w13_act_scale=torch.tensor(0.1)), "w13_act_scale: a static scale needs an act"),
        (dict(top_k=2, act="fp8", w2_act_scale=torch.ones(2)), "w2_act_scale: expected a one-element float tensor"),
    ],
    ids=["top-k", "routing-key", "routing-groups", "activation", "alpha", "act", "map", "static-act", "static-shape"],
)
def test_moe_call_rejects(kwargs, match):
    w13, w2 = _experts()
    with pytest.raises(ValueError, match=match):
        moe.MoeCall(w13, w2, **kwargs)


def test_warmup_refuses_cpu_moe_calls():
    w13, w2 = _experts()
    with pytest.raises(ValueError, match=r"layers\[0\]: is on cpu"):
        humming.warmup([moe.MoeCall(w13, w2, 2)])
    with pytest.raises(TypeError, match=r"layers: expected an iterable of QuantizedWeight or MoeCall"):
        humming.warmup(moe.MoeCall(w13, w2, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("act, hidden", [(None, 256), ("fp8", 256), ("fp8", 264)], ids=["bf16", "fp8", "fp8-k264"])
def test_launches_name_the_cuda_passes(act, hidden, seed):
    """On CUDA (backend "auto") the combine, and the activation pass of an FP8 grouped GEMM, are CUDA kernels
    where they apply, and MoeCall.launches names them so; with backend="triton" they are Triton's. A hidden size
    of 264 (K % 16 = 8: the GEMM pads K, so Triton's pass runs) asks for per-channel int4 experts."""
    group = 128 if hidden % 128 == 0 else -1
    w13 = humming.quantize(torch.randn(E, 2 * 128, hidden, device="cuda"), "int4", group_size=group)
    w2 = humming.quantize(torch.randn(E, hidden, 128, device="cuda"), "int4", group_size=128)
    for backend, combine in (("auto", "cuda.moe_combine"), ("triton", "triton.moe_combine")):
        call = moe.MoeCall(w13, w2, 2, act=act, backend=backend)
        launches = call.launches(24)
        assert launches[-1].kernel == combine, launches
        gemms = {la.step: la.kernel for la in launches if la.step in ("w13", "w2")}
        for la in launches:
            if "act_quant" in la.kernel:  # a GEMM's input pass: the CUDA one before a CUDA GEMM of K % 16 = 0
                step = la.step.split()[0]
                k = hidden if step == "w13" else 128
                cuda = gemms[step].startswith("cuda.") and backend == "auto" and k % 16 == 0
                assert la.kernel == ("cuda.act_quant" if cuda else "triton.act_quant"), launches
        assert (act is not None) == any("act_quant" in la.kernel for la in launches), launches
        out = call.run(24)
        assert out.shape == (24, hidden) and torch.isfinite(out).all()
