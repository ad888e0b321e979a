"""``humming.moe``: routing (moe_align), the grouped GEMM on every backend, the fused MoE layer.

References are independent of the code under test: routing against a plain Python grouping of the slots;
grouped GEMMs against ``humming.dequantize`` of each expert in float64 (rows of blocks whose expert is -1
are not compared: they are unspecified); ``fused_moe`` against a per-token, per-slot loop in float64 (each
activation from its formula, both gate / up layouts, expert maps). Outputs of the Triton kernel are
poisoned with NaN before the call; skipped blocks must keep the poison. Tolerances (``||out - ref|| /
||ref||``): fp32 accumulation and one output rounding, 2e-6 for fp32 outputs, 2e-3 for fp16, 1e-2 for bf16
(weights rounded to x's dtype, as the tensor-core kernel does, so the reference uses
``dequantize(qw, x.dtype)``); ``fused_moe`` rounds twice more (the first GEMM's output and the activation,
to x's dtype) and runs against fp32 weights: 3e-2 for bf16, 5e-3 for fp16.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import capture, gated, rel_err

import humming
from humming import _moe_layer, moe

wna16 = pytest.importorskip("humming.triton_kernels.wna16")
from humming.dispatch.support import combination_error  # noqa: E402
from humming.ir.activation import get_act_scheme  # noqa: E402
from humming.ir.formats import get_format  # noqa: E402
from humming.triton_kernels import scaled_mm  # noqa: E402
from humming.triton_kernels.configs import TileConfig  # noqa: E402

TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1e-2}
MOE_TOL = {torch.float16: 5e-3, torch.bfloat16: 3e-2}


def _routing(t: int, topk: int, e: int, device, empty: int = 0) -> torch.Tensor:
    """Random distinct experts per token, never choosing the last ``empty`` experts."""
    return torch.stack([torch.randperm(e - empty, device=device)[:topk] for _ in range(t)]).to(torch.int32)


# ----------------------------------------------------------------------------------------------- moe_align
def _expected_routing(ids: torch.Tensor, e: int, block_m: int) -> tuple[list[int], list[int]]:
    flat = ids.reshape(-1).tolist()
    rows, blocks = [], []
    for expert in range(e):
        slots = [s for s, v in enumerate(flat) if v == expert]
        padded = -(-len(slots) // block_m) * block_m
        rows += slots + [-1] * (padded - len(slots))
        blocks += [expert] * (padded // block_m)
    return rows, blocks


@pytest.mark.parametrize(
    ("t", "topk", "e", "block_m"),
    [(1, 1, 1, 8), (5, 2, 4, 16), (33, 4, 8, 16), (7, 3, 16, 32), (64, 8, 8, 64), (40, 2, 6, 8), (3, 2, 9, 24)],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("empty", [0, 2])
def test_moe_align(t: int, topk: int, e: int, block_m: int, empty: int, seed: int, device: str) -> None:
    empty = min(empty, e - topk)
    ids = _routing(t, topk, e, device, empty)
    r = moe.moe_align(ids.long() if t % 2 else ids, e, block_m)
    m_pad = -(-(t * topk + e * (block_m - 1)) // block_m) * block_m
    assert r.src_slots.shape == (m_pad,) and r.expert_ids.shape == (m_pad // block_m,) and r.block_m == block_m
    assert r.src_slots.dtype == r.expert_ids.dtype == r.num_rows.dtype == torch.int32
    assert r.src_slots.device == r.expert_ids.device == r.num_rows.device == ids.device
    rows, blocks = _expected_routing(ids.cpu(), e, block_m)
    assert r.src_slots.tolist() == rows + [-1] * (m_pad - len(rows))
    assert r.expert_ids.tolist() == blocks + [-1] * (m_pad // block_m - len(blocks))
    assert int(r.num_rows) == len(rows)
    assert r.slot_rows.dtype == torch.int32 and r.slot_rows.shape == (t * topk,) and (r.slot_rows >= 0).all()
    assert r.src_slots[r.slot_rows.long()].tolist() == list(range(t * topk))  # the inverse of src_slots
    slots = r.src_slots[r.src_slots >= 0]
    assert sorted(slots.tolist()) == list(range(t * topk))  # every slot once
    row_expert = r.expert_ids.long().repeat_interleave(block_m)
    assert torch.equal(row_expert[r.src_slots >= 0], ids.reshape(-1).long()[slots.long()])


@pytest.mark.parametrize(
    ("ids", "e", "block_m", "match"),
    [
        (torch.zeros(2, 2), 4, 16, "integer dtype"),
        (torch.zeros(4, dtype=torch.int32), 4, 16, r"\[T, topk\]"),
        (torch.zeros(2, 2, dtype=torch.int32), 0, 16, "num_experts"),
        (torch.zeros(2, 2, dtype=torch.int32), 4, 12, "multiple of 8"),
        (torch.zeros(2, 2, dtype=torch.int32), 4, 0, "multiple of 8"),
        (torch.zeros(2, 2, dtype=torch.int32), 4, True, "multiple of 8"),
        (torch.tensor([[0, 4]]), 4, 16, r"\[0, 4\), found 4"),
        (torch.tensor([[-1, 0]]), 4, 16, r"\[0, 4\), found -1"),
    ],
    ids=["float", "1-d", "no-experts", "block-12", "block-0", "block-bool", "id-too-large", "id-negative"],
)
def test_moe_align_rejects(ids, e, block_m, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        moe.moe_align(ids, e, block_m)


@pytest.mark.gpu
def test_moe_align_out_of_range_gpu_drops_slots() -> None:
    """On a GPU, ids are not read back (no sync): out-of-range slots get no row."""
    ids = torch.tensor([[0, 7], [-3, 1]], device="cuda")
    r = moe.moe_align(ids, 4, 16)
    assert sorted(r.src_slots[r.src_slots >= 0].tolist()) == [0, 3]
    assert (r.slot_rows[[1, 2]] == -1).all() and (r.slot_rows[[0, 3]] >= 0).all()


@pytest.mark.gpu
def test_fused_moe_drops_out_of_range_slots_gpu(seed: int) -> None:
    """A slot whose id is out of range adds nothing: the same as a valid id with weight zero."""
    e, k, inter = 4, 256, 128
    w13 = humming.quantize(torch.randn(e, 2 * inter, k, device="cuda"), "int4", group_size=128)
    w2 = humming.quantize(torch.randn(e, k, inter, device="cuda"), "int4", group_size=128)
    x = torch.randn(2, k, device="cuda").bfloat16()
    weights = torch.rand(2, 2, device="cuda") + 0.5
    got = moe.fused_moe(x, w13, w2, weights, torch.tensor([[0, 7], [-3, 1]], device="cuda"), block_m=16)
    keep = torch.tensor([[1.0, 0.0], [0.0, 1.0]], device="cuda")
    valid = torch.tensor([[0, 0], [0, 1]], device="cuda")
    want = moe.fused_moe(x, w13, w2, weights * keep, valid, block_m=16, backend="reference")
    assert not torch.isnan(got).any()
    rel = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert rel < 2e-2, f"seed {seed}: rel err {rel:.3e}"


@pytest.mark.gpu
def test_moe_capture_in_cuda_graph(seed: int) -> None:
    """moe_align and fused_moe (Triton) never sync with the host: a CUDA graph captures them and a replay
    with new routing gives the eager result."""
    t, topk, e, k, inter = 24, 4, 8, 256, 128
    w13 = humming.quantize(torch.randn(e, 2 * inter, k, device="cuda"), "int4", group_size=128)
    w2 = humming.quantize(torch.randn(e, k, inter, device="cuda"), "int4", group_size=128)
    x = torch.randn(t, k, device="cuda").bfloat16()
    ids = _routing(t, topk, e, "cuda")
    weights = torch.rand(t, topk, device="cuda")
    run = lambda: moe.fused_moe(x, w13, w2, weights, ids, block_m=16, backend="triton")
    graph, (routing, out) = capture(lambda: (moe.moe_align(ids, e, 16), run()))
    ids.copy_(_routing(t, topk, e, "cuda", empty=3))
    weights.copy_(torch.rand(t, topk, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    eager = moe.moe_align(ids, e, 16)
    assert torch.equal(routing.src_slots, eager.src_slots) and torch.equal(routing.expert_ids, eager.expert_ids)
    assert rel_err(out, run().double()) <= 1e-3  # fp32 atomics: the summation order may differ


# ------------------------------------------------------------------------------------- grouped references
def _grouped_ref(x, qw, expert_ids, block_m, bias, w_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``[M_pad, N]`` of every row in a used block, and the mask of those rows."""
    row_expert = expert_ids.long().repeat_interleave(block_m)
    ref = torch.zeros(x.shape[0], qw.N, dtype=torch.float64, device=x.device)
    for e in range(qw.num_experts):
        rows = row_expert == e
        w = humming.dequantize(moe.expert_weight(qw, e), w_dtype).double()
        ref[rows] = x[rows].double() @ w.T + (0 if bias is None else bias[e].double())
    return ref, row_expert >= 0


def _grouped_input(t, topk, e, k, block_m, dtype, device, empty=1):
    r = moe.moe_align(_routing(t, topk, e, device, min(empty, e - topk)), e, block_m)
    return torch.randn(r.m_pad, k, device=device).to(dtype), r.expert_ids


WEIGHTS = {
    "int4-g32": dict(weight="int4", group_size=32),
    "int4-g128": dict(weight="int4", group_size=128),
    "fp8-block": dict(weight="fp8_block", group_size=(16, 128)),
    "uint4-zp-g128": dict(weight="int4", group_size=128, zero_point=True),
    "int8-channel": dict(weight="int8", group_size=-1),
    "e4m3-channel": dict(weight="e4m3", group_size=-1),
    "mxfp4": dict(weight="mxfp4"),
    "nvfp4": dict(weight="nvfp4"),
    "int3-g64-float-zp": dict(weight="int3", group_size=64, zero_point="float"),
}


def _quantize(name: str, e: int, n: int, k: int, device, act_order: bool = False, bias: bool = False):
    kwargs = dict(WEIGHTS[name])
    if bias:
        kwargs["bias"] = torch.randn(e, n, device=device)
    if act_order:  # a different column -> group map per expert: g_idx [E, K]
        groups = -(-k // kwargs["group_size"])
        b = kwargs.pop("bias", [None] * e)
        g_idx = lambda: torch.randint(0, groups, (k,), dtype=torch.int32, device=device)
        parts = [
            humming.quantize(torch.randn(n, k, device=device), **kwargs, g_idx=g_idx(), bias=b[i]) for i in range(e)
        ]
        return humming.stack(parts)
    return humming.quantize(torch.randn(e, n, k, device=device), **kwargs)


@pytest.mark.parametrize(
    ("name", "act"),
    [
        ("int4-g32", None),
        ("uint4-zp-g128", "int8"),
        ("int8-channel", "fp8"),
        ("e4m3-channel", "fp8_g128"),
        ("mxfp4", "mxfp4"),
        ("nvfp4", "fp8"),
        ("int4-g32", "int4"),
        ("int3-g64-float-zp", "fp8_e5m2"),
    ],
)
def test_grouped_reference_matches_per_expert_linear(name: str, act, seed: int, device: str) -> None:
    """The reference grouped GEMM = humming.linear of each block's rows with that block's expert."""
    e, n, k, block_m = 4, 40, 256, 16
    qw = _quantize(name, e, n, k, device, bias=True)
    x, expert_ids = _grouped_input(9, 2, e, k, block_m, torch.bfloat16, device)
    out = moe.grouped_linear(x, qw, expert_ids, block_m, act=act, out_dtype=torch.float32, backend="reference")
    for b, expert in enumerate(expert_ids.tolist()):
        if expert < 0:
            continue
        rows = slice(b * block_m, (b + 1) * block_m)
        ref = humming.linear(
            x[rows], moe.expert_weight(qw, expert), act=act, out_dtype=torch.float32, backend="reference"
        )
        assert rel_err(out[rows], ref.double()) <= 1e-6, f"block {b} (expert {expert})"


@pytest.mark.parametrize(
    ("name", "act"), [("int8-channel", "int8_tensor"), ("e4m3-channel", "fp8_tensor"), ("nvfp4", "nvfp4")]
)
def test_grouped_reference_per_tensor_scale_spans_all_blocks(name: str, act: str, seed: int, device: str) -> None:
    """A dynamic per-tensor activation scale (nvfp4's global scale too) is one for every row in use: with
    two blocks of one expert, the result is humming.linear of those rows."""
    qw = _quantize(name, 3, 32, 128, device)
    x = torch.randn(48, 128, device=device).bfloat16()
    expert_ids = torch.tensor([1, 1, -1], dtype=torch.int32, device=device)
    out = moe.grouped_linear(x, qw, expert_ids, 16, act=act, backend="reference", out_dtype=torch.float32)
    ref = humming.linear(x[:32], moe.expert_weight(qw, 1), act=act, backend="reference", out_dtype=torch.float32)
    assert rel_err(out[:32], ref.double()) <= 1e-6


# ------------------------------------------------------------------------------------------ Triton grouped
@pytest.mark.parametrize(
    ("name", "shape", "x_dtype", "out_dtype", "act_order", "bias"),
    [
        ("uint4-zp-g128", (4, 48, 256), torch.bfloat16, None, False, True),
        ("uint4-zp-g128", (4, 48, 256), torch.bfloat16, None, False, False),
        ("int8-channel", (4, 40, 200), torch.float16, None, False, True),
        ("e4m3-channel", (3, 64, 128), torch.bfloat16, torch.float32, False, False),
        ("mxfp4", (4, 48, 256), torch.bfloat16, None, False, True),
        ("nvfp4", (2, 32, 128), torch.float16, torch.float32, False, True),
        ("int4-g32", (3, 40, 200), torch.bfloat16, None, True, True),
        ("int3-g64-float-zp", (2, 32, 192), torch.float16, None, False, False),
    ],
    ids=lambda v: v if isinstance(v, str) else str(v),
)
def test_triton_grouped_matches_reference(name, shape, x_dtype, out_dtype, act_order, bias, seed, device) -> None:
    e, n, k = shape
    block_m = 16
    qw = _quantize(name, e, n, k, device, act_order=act_order)
    b = torch.randn(e, n, device=device) if bias else None
    x, expert_ids = _grouped_input(11, 2, e, k, block_m, x_dtype, device)
    out_dtype = out_dtype or x_dtype
    out = torch.full((x.shape[0], n), float("nan"), dtype=out_dtype, device=device)
    result = wna16.grouped_linear(x, qw, expert_ids, block_m, b, out_dtype, out=out)
    assert result.data_ptr() == out.data_ptr()
    ref, used = _grouped_ref(x, qw, expert_ids, block_m, b, x_dtype)
    assert torch.isnan(out[~used]).all(), "a block of expert -1 was written"
    err = rel_err(out[used], ref[used])
    assert err <= TOL[out_dtype], f"rel err {err:.2e} > {TOL[out_dtype]:.0e}"


@pytest.mark.parametrize(
    ("config", "block_m"),
    [(TileConfig(16, 16, 64, split_k=3), 16), (TileConfig(32, 32, 32, group_m=1), 64), (None, 48), (None, 128)],
    ids=["split-k", "tile-32-of-64", "auto-48", "auto-128"],
)
def test_triton_grouped_tiles(config, block_m: int, seed: int, device: str) -> None:
    """Split-K (per-expert bias added by the first K slice), tiles smaller than the routing block."""
    qw = _quantize("int4-g32", 3, 40, 200, device)
    b = torch.randn(3, 40, device=device)
    x, expert_ids = _grouped_input(9, 2, 3, 200, block_m, torch.bfloat16, device, empty=0)
    out = torch.full((x.shape[0], 40), float("nan"), dtype=torch.bfloat16, device=device)
    wna16.grouped_linear(x, qw, expert_ids, block_m, b, torch.bfloat16, config=config, out=out)
    ref, used = _grouped_ref(x, qw, expert_ids, block_m, b, torch.bfloat16)
    assert torch.isnan(out[~used]).all()
    assert rel_err(out[used], ref[used]) <= TOL[torch.bfloat16]


SPLIT = TileConfig(16, 32, 128, split_k=2)
SCALED_CASES = [  # weight, act, config: W8A8 fp8, DeepSeek blocks, W4A8 (int4, MXFP4), W8A8 int8, W4A4
    ("e4m3-channel", "fp8", None),
    ("fp8-block", "fp8_g128", SPLIT),
    ("int4-g128", "fp8", None),
    ("mxfp4", "fp8", None),
    ("uint4-zp-g128", "int8", SPLIT),
    ("mxfp4", "mxfp4", None),
    ("nvfp4", "fp8", None),  # per-expert global scales
]


@pytest.mark.parametrize(("name", "act", "config"), SCALED_CASES, ids=lambda v: getattr(v, "name", lambda: v)())
def test_triton_grouped_scaled_matches_reference(name: str, act: str, config, seed: int, device: str) -> None:
    """The grouped scaled GEMM (quantized activations; split-K where a config is given) against float64 of
    the quantized activations and weights."""
    e, n, k, block_m = 3, 32, 256, 16
    qw = _quantize(name, e, n, k, device)
    b = torch.randn(e, n, device=device)
    x, expert_ids = _grouped_input(7, 2, e, k, block_m, torch.bfloat16, device)
    out = torch.full((x.shape[0], n), float("nan"), dtype=torch.bfloat16, device=device)
    scaled_mm.grouped_linear(x, qw, expert_ids, block_m, b, get_act_scheme(act), torch.bfloat16, config, out)
    xq = humming.dequantize_activation(humming.quantize_activation(x, act))
    ref, used = _grouped_ref(xq, qw, expert_ids, block_m, b, torch.float32)
    assert torch.isnan(out[~used]).all(), "a block of expert -1 was written"
    assert rel_err(out[used], ref[used]) <= TOL[torch.bfloat16]


def test_triton_grouped_config_divides_block_m() -> None:
    for block_m in (16, 32, 48, 64, 96, 128, 256):
        cfg = wna16.grouped_config(4096, 2816, 2048, 4, block_m, 132, group_k=128)
        assert block_m % cfg.block_m == 0 and cfg.block_m >= 16 and not cfg.dequant_first


def test_grouped_linear_dispatch(seed: int, device: str) -> None:
    """``backend="triton"`` runs the kernel; "auto" and the reference agree with it; bias defaults to qw's."""
    qw = _quantize("uint4-zp-g128", 4, 48, 128, device, bias=True)
    x, expert_ids = _grouped_input(6, 2, 4, 128, 32, torch.bfloat16, device)
    ref, used = _grouped_ref(x, qw, expert_ids, 32, qw.bias, torch.bfloat16)
    for backend in ("triton", "auto", "reference"):
        out = moe.grouped_linear(x, qw, expert_ids, 32, backend=backend)
        assert out.shape == (x.shape[0], 48) and out.dtype == torch.bfloat16
        assert rel_err(out[used], ref[used]) <= 1e-2, backend


def test_dispatch_backend_that_cannot_run_the_grouped_call() -> None:
    """backend="cuda" on CPU tensors is refused, naming the CUDA grouped kernel and why."""
    qw = _quantize("int4-g32", 2, 32, 64, "cpu")
    with pytest.raises(ValueError, match=r"backend 'cuda' cannot run this call: cuda\.grouped: "):
        moe.grouped_linear(torch.randn(16, 64).bfloat16(), qw, torch.zeros(1, dtype=torch.int32), 16, backend="cuda")


# ------------------------------------------------------------------------------------------- gathered rows
def _gather_case(t: int, topk: int, e: int, k: int, block_m: int, device, empty: int = 1):
    """Tokens ``x [T, K]`` (bf16) and their routing: ``(x, expert_ids, rows)``."""
    r = moe.moe_align(_routing(t, topk, e, device, min(empty, e - topk)), e, block_m)
    return torch.randn(t, k, device=device).bfloat16(), r.expert_ids, r.token_rows(topk)


def _gather_ref(x, qw, expert_ids, rows, block_m, bias, act, scale=None):
    """float64 ``[M_pad, N]`` of the gathered rows in use, and their mask (rows of used blocks that are not
    padding): the ``T`` tokens quantized once by ``humming.quantize_activation`` (static ``scale`` if given),
    row ``r`` = token ``rows[r]``, times its expert dequantized (rounded to x's dtype without ``act``, as the
    WnA16 kernel's tensor cores take it)."""
    xq = x if act is None else humming.dequantize_activation(humming.quantize_activation(x, act, scale=scale))
    used = rows >= 0
    xg = torch.zeros(rows.shape[0], x.shape[1], dtype=torch.float64, device=x.device)
    xg[used] = xq[rows[used].long()].double()
    ref, in_block = _grouped_ref(xg, qw, expert_ids, block_m, bias, x.dtype if act is None else torch.float32)
    return ref, in_block & used, in_block


#: acts of the gather tests: (name, scheme, static per-tensor scale)
GATHER_ACTS = {
    "none": (None, False),
    "fp8": ("fp8", False),
    "fp8_g128": ("fp8_g128", False),
    "fp8_tensor": ("fp8_tensor", False),
    "fp8_tensor-static": ("fp8_tensor", True),
    "int8": ("int8", False),
    "nvfp4": ("nvfp4", False),
    "mxfp4": ("mxfp4", False),
}
_GATHER_FORMATS = {"int4-g128": "int4", "uint4-zp-g128": "int4", "e4m3-channel": "e4m3", "mxfp4": "e2m1"}
GATHER_CASES = [  # every weight x act combination humming computes
    (name, act)
    for name, fmt in _GATHER_FORMATS.items()
    for act, (scheme, _) in GATHER_ACTS.items()
    if scheme is None or combination_error(get_format(fmt), get_act_scheme(scheme)) is None
]


def _triton_grouped(x, qw, expert_ids, block_m, bias, act, out, rows):
    """The Triton grouped GEMM of ``act`` (WnA16 or scaled), into ``out``."""
    if act is None:
        return wna16.grouped_linear(x, qw, expert_ids, block_m, bias, out.dtype, out=out, rows=rows)
    scheme = x.scheme if isinstance(x, humming.QuantizedActivation) else get_act_scheme(act)
    return scaled_mm.grouped_linear(x, qw, expert_ids, block_m, bias, scheme, out.dtype, None, out, rows=rows)


@pytest.mark.parametrize(("name", "act"), GATHER_CASES, ids=lambda v: v)
def test_triton_grouped_gather_matches_reference(name: str, act: str, seed: int, device: str) -> None:
    """Token rows read through ``rows`` (codes and scales of the T tokens quantized once; a static per-tensor
    scale given as a QuantizedActivation) against float64 of the gathered rows; blocks of expert -1 keep the
    NaN poison. fp32 outputs of exact products: the fp32 accumulation's error only."""
    scheme, static = GATHER_ACTS[act]
    e, n, k, block_m = 3, 32, 128, 16
    qw = _quantize(name, e, n, k, device)
    bias = torch.randn(e, n, device=device)
    x, expert_ids, rows = _gather_case(5, 2, e, k, block_m, device)
    scale = x.float().abs().amax() / 300 if static else None  # some codes saturate at 448
    xin = humming.quantize_activation(x, scheme, scale=scale) if static else x
    out = torch.full((rows.shape[0], n), float("nan"), dtype=torch.float32, device=device)
    assert _triton_grouped(xin, qw, expert_ids, block_m, bias, scheme, out, rows).data_ptr() == out.data_ptr()
    ref, used, in_block = _gather_ref(x, qw, expert_ids, rows, block_m, bias, scheme, scale)
    assert torch.isnan(out[~in_block]).all(), "a block of expert -1 was written"
    err = rel_err(out[used], ref[used])
    assert err <= TOL[torch.float32], f"seed {seed}: rel err {err:.2e}"


@pytest.mark.parametrize(("t", "topk", "e", "empty"), [(5, 1, 4, 1), (2, 2, 8, 0), (3, 8, 8, 0)], ids=str)
@pytest.mark.parametrize(("name", "act"), [("uint4-zp-g128", None), ("e4m3-channel", "fp8_tensor")], ids=str)
def test_triton_grouped_gather_routings(name, act, t: int, topk: int, e: int, empty: int, seed, device) -> None:
    """top-k 1 with an expert without tokens, fewer tokens than experts, top-k 8 over 8 experts (every token
    in every expert), blocks of 32 rows cut into tiles of 16: padding rows read nothing, skipped blocks are
    not written."""
    n, k, block_m = 32, 128, 32
    qw = _quantize(name, e, n, k, device)
    x, expert_ids, rows = _gather_case(t, topk, e, k, block_m, device, empty)
    out = torch.full((rows.shape[0], n), float("nan"), dtype=torch.float32, device=device)
    _triton_grouped(x, qw, expert_ids, block_m, None, act, out, rows)
    ref, used, in_block = _gather_ref(x, qw, expert_ids, rows, block_m, None, act)
    assert (rows >= 0).sum() == t * topk and (~used & in_block).any()  # padding rows in used blocks
    assert torch.isnan(out[~in_block]).all()
    assert rel_err(out[used], ref[used]) <= TOL[torch.float32]


@pytest.mark.parametrize("act", ["fp8_tensor", "int8_tensor", "nvfp4"])
def test_triton_grouped_tensor_scale_spans_used_blocks(act: str, seed: int, device: str) -> None:
    """Without a gather, a dynamic tensor-wide scale spans the rows of blocks in use only: huge values in a
    skipped block change nothing, and the result is that of the reference backend."""
    qw = _quantize("int4-g128", 3, 32, 128, device)
    x = torch.randn(64, 128, device=device).bfloat16()
    x[48:] = 1e4  # the skipped block
    expert_ids = torch.tensor([2, 0, 0, -1], dtype=torch.int32, device=device)
    out = torch.full((64, 32), float("nan"), dtype=torch.float32, device=device)
    scaled_mm.grouped_linear(x, qw, expert_ids, 16, None, get_act_scheme(act), torch.float32, None, out)
    xq = humming.dequantize_activation(humming.quantize_activation(x[:48], act))
    ref, used = _grouped_ref(
        torch.cat([xq, torch.zeros(16, 128, device=device)]), qw, expert_ids, 16, None, torch.float32
    )
    assert torch.isnan(out[~used]).all()
    assert rel_err(out[used], ref[used]) <= TOL[torch.float32]
    reference = moe.grouped_linear(x, qw, expert_ids, 16, act=act, out_dtype=torch.float32, backend="reference")
    assert rel_err(out[used], reference[used].double()) <= TOL[torch.float32]


@pytest.mark.parametrize(
    ("act", "prequantized"),
    [(None, False), *((act, pre) for act in ("fp8", "nvfp4", "fp8_tensor") for pre in (False, True))],
    ids=str,
)
def test_grouped_linear_gather_backends_agree(act, prequantized: bool, seed: int, device: str) -> None:
    """The public entry point with ``rows``: Triton, the reference (the definition) and a kernel that cannot
    gather (the rows copied into grouped order first, as for CUDA's) agree, on 16-bit tokens and on tokens
    quantized beforehand (float8 scales gathered as bytes)."""
    e, n, k, block_m = 3, 32, 64, 16
    qw = _quantize("int4-g32", e, n, k, device, bias=True)
    x, expert_ids, rows = _gather_case(4, 2, e, k, block_m, device)
    xin = humming.quantize_activation(x, act) if prequantized else x
    kwargs = dict(rows=rows, act=act, out_dtype=torch.float32)
    used = (expert_ids >= 0).repeat_interleave(block_m) & (rows >= 0)
    ref = moe.grouped_linear(xin, qw, expert_ids, block_m, backend="reference", **kwargs)
    out = moe.grouped_linear(xin, qw, expert_ids, block_m, backend="triton", **kwargs)
    tol = TOL[torch.float32] if act is not None else TOL[torch.bfloat16]  # the reference keeps fp32 weights
    assert rel_err(out[used], ref[used].double()) <= tol
    copied = []
    kernel = moe.GROUPED_KERNELS["reference"]
    run = lambda x, *args, **gather: copied.append((x, gather)) or kernel.run(x, *args, **gather)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(moe.GROUPED_KERNELS, "reference", dataclasses.replace(kernel, gathers=False, run=run))
        out = moe.grouped_linear(xin, qw, expert_ids, block_m, backend="reference", **kwargs)
    ((grouped, gather),) = copied
    assert not gather and getattr(grouped, "codes", grouped).shape[0] == rows.shape[0]
    assert torch.equal(out[used], ref[used])


def test_gather_rows_definition(seed: int, device: str) -> None:
    """``gather_rows``: token rows in grouped order, zeros for padding rows; a quantized activation's codes and
    per-row scales alike (bit for bit, float8 scales too), its per-tensor and global scales kept."""
    x = torch.randn(3, 64, device=device).bfloat16()
    rows = torch.tensor([2, -1, 0, 0, -1, 1], dtype=torch.int32, device=device)
    want = torch.stack([x[2], torch.zeros_like(x[0]), x[0], x[0], torch.zeros_like(x[0]), x[1]])
    assert torch.equal(_moe_layer.gather_rows(x, rows), want)
    assert _moe_layer.gather_rows(x[:0], torch.full((4,), -1, dtype=torch.int32, device=device)).abs().sum() == 0
    for act in ("fp8", "nvfp4", "mxfp4", "fp8_tensor"):
        qa = humming.quantize_activation(x, act)
        got = _moe_layer.gather_rows(qa, rows)
        assert got.scales.dtype == qa.scales.dtype and got.global_scale is qa.global_scale
        values = humming.dequantize_activation(got)
        assert torch.equal(
            values, torch.where(rows[:, None] >= 0, humming.dequantize_activation(qa)[rows.clamp(0).long()], 0)
        )


@pytest.mark.parametrize("act", [None, "fp8_tensor"])
def test_grouped_linear_gather_non_finite_tokens(act, seed: int, device: str) -> None:
    """A token holding NaN or Inf gives non-finite values in every row that reads it (NaN with quantized
    activations), on Triton and the reference; the other rows are those of the zeroed token."""
    e, n, k, block_m = 2, 32, 64, 16
    qw = _quantize("int4-g32", e, n, k, device)
    x, expert_ids, rows = _gather_case(3, 2, e, k, block_m, device, empty=0)
    x[1, 5] = float("inf")
    reads = (rows == 1) & (expert_ids >= 0).repeat_interleave(block_m)
    for backend in ("triton", "reference"):
        out = moe.grouped_linear(x, qw, expert_ids, block_m, rows=rows, act=act, backend=backend)
        clean = moe.grouped_linear(
            torch.where(torch.isfinite(x), x, 0), qw, expert_ids, block_m, rows=rows, act=act, backend=backend
        )
        assert not torch.isfinite(out[reads]).any(), backend
        keep = (rows >= 0) & ~reads & (expert_ids >= 0).repeat_interleave(block_m)
        assert torch.equal(out[keep], clean[keep]), backend


# ------------------------------------------------------------------------------------------------ fused_moe
def _fused_ref(
    x,
    w13,
    w2,
    weights,
    ids,
    act=None,
    activation="silu",
    layout="concat",
    expert_map=None,
    scales=(None, None),
    **params,
):
    """A per-slot loop in float64 over fp32-dequantized experts: w13, the activation, w2, the weighted sum.
    With ``act``, w13's input is quantized over the ``T`` tokens and w2's (rounded to x's dtype, as the layer
    hands it over) over the hidden rows of every routed slot: each row alone for per-token and per-group
    schemes, one tensor-wide scale over those rows otherwise, which is the kernels' over their rows in use
    when w13 has no bias (padding rows are then zeros). With ``expert_map``, ``ids`` are global and slots of
    experts not on this rank (-1) are left out. ``scales``: static scales of w13's and w2's inputs."""
    q = lambda v, s: v if act is None else humming.dequantize_activation(humming.quantize_activation(v, act, scale=s))
    out = torch.zeros(x.shape[0], w2.N, dtype=torch.float64, device=x.device)
    xq = q(x, scales[0]).double()
    slots, hidden = [], []
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j]) if expert_map is None else int(expert_map[int(ids[t, j])])
            if e < 0:
                continue
            a = moe.expert_weight(w13, e)
            h = xq[t : t + 1] @ humming.dequantize(a).double().T + (0 if a.bias is None else a.bias.double())
            slots.append((t, j, e))
            hidden.append(gated(h, activation, layout, **params))
    if not slots:
        return out
    hidden = torch.cat(hidden).to(x.dtype if act else torch.float32)  # quantized as the layer rounds it
    for (t, j, e), h in zip(slots, q(hidden, scales[1]).double()):
        b = moe.expert_weight(w2, e)
        y = h @ humming.dequantize(b).double().T + (0 if b.bias is None else b.bias.double())
        out[t] += float(weights[t, j]) * y
    return out


@pytest.mark.parametrize(
    ("backend", "name", "act", "x_dtype", "t", "topk", "e", "block_m", "bias"),
    [
        ("triton", "uint4-zp-g128", None, torch.bfloat16, 5, 2, 4, None, False),
        ("triton", "mxfp4", None, torch.float16, 5, 3, 4, 32, True),
        ("triton", "int8-channel", None, torch.bfloat16, 1, 4, 8, 16, False),
        ("reference", "e4m3-channel", "fp8", torch.bfloat16, 6, 2, 4, 8, True),
        ("reference", "int4-g32", None, torch.float16, 4, 2, 3, None, False),
    ],
    ids=lambda v: str(v).replace("torch.", ""),
)
def test_fused_moe_matches_token_loop(backend, name, act, x_dtype, t, topk, e, block_m, bias, seed, device) -> None:
    k, inter = 256, 64
    w13 = _quantize(name, e, 2 * inter, k, device, bias=bias)
    w2 = _quantize(name, e, k, inter, device, bias=bias)
    x = torch.randn(t, k, device=device).to(x_dtype)
    ids = _routing(t, topk, e, device, empty=1 if e > topk else 0)
    weights = torch.softmax(torch.randn(t, topk, device=device), -1)
    out = moe.fused_moe(x, w13, w2, weights, ids, act=act, block_m=block_m, backend=backend)
    assert out.shape == (t, k) and out.dtype == x_dtype
    err = rel_err(out, _fused_ref(x, w13, w2, weights, ids, act))
    assert err <= MOE_TOL[x_dtype], f"rel err {err:.2e} > {MOE_TOL[x_dtype]:.0e}"


@pytest.mark.parametrize("mapped", [False, True], ids=["whole", "rank"])
@pytest.mark.parametrize("act", ["fp8_tensor", "int8_tensor", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_fused_moe_tensor_wide_and_fp4_acts(backend: str, act: str, mapped: bool, seed: int, device: str) -> None:
    """Per-tensor, NVFP4 and MXFP4 activations through both GEMMs (w13 gathering its tokens). w13's dynamic
    tensor-wide scale spans the T tokens, routed here or not: as one expert-parallel rank, token 0 (30 times
    larger than the others) goes to no local expert and still sets the scale of every other token."""
    e, k, inter, t, topk = 4, 64, 32, 5, 2
    w13, w2 = _quantize("int4-g32", e, 2 * inter, k, device), _quantize("int4-g32", e, k, inter, device)
    x = torch.randn(t, k, device=device)
    x[0] *= 30
    x = x.bfloat16()
    ids = _routing(t, topk, e, device)
    expert_map = None
    if mapped:  # global experts 0..3 on another rank, 4..7 here; token 0 routed to the other rank only
        expert_map = torch.tensor([-1] * e + list(range(e)), dtype=torch.int32, device=device)
        ids = torch.where(torch.arange(t, device=device)[:, None] == 0, ids, ids + e)
    weights = torch.softmax(torch.randn(t, topk, device=device), -1)
    out = moe.fused_moe(x, w13, w2, weights, ids, expert_map=expert_map, act=act, block_m=16, backend=backend)
    ref = _fused_ref(x, w13, w2, weights, ids, act, expert_map=expert_map)
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
    w13 = _quantize("int4-g32", e, 2 * inter, k, device, bias=True)
    w2 = _quantize("int4-g32", e, k, inter, device, bias=True)
    x = torch.randn(t, k, device=device).bfloat16()
    ids, weights = _routing(t, 2, e, device, empty=1), torch.softmax(torch.randn(t, 2, device=device), -1)
    maxv = 448.0 if act.startswith("fp8") else 127.0
    scales = (x.float().abs().amax() / maxv * 0.8, torch.tensor(4.0 / maxv, device=device))  # a few saturate
    kwargs = dict(act=act, w13_act_scale=scales[0], w2_act_scale=scales[1], block_m=16, backend=backend)
    out = moe.fused_moe(x, w13, w2, weights, ids, **kwargs)
    err = rel_err(out, _fused_ref(x, w13, w2, weights, ids, act, scales=scales))
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
    w13 = _quantize("int4-g32", e, 2 * inter, k, device, bias=True)
    w2 = _quantize("int4-g32", e, k, inter, device, bias=True)
    x = (torch.randn(t, k, device=device) / 2).bfloat16()  # h of std ~4: swiglu_oai clamps a few elements at 7
    ids = _routing(t, topk, e, device, empty=1)
    weights = torch.softmax(torch.randn(t, topk, device=device), -1)
    ref = _fused_ref(x, w13, w2, weights, ids, act, activation, layout)
    kwargs = dict(activation=activation, gate_up_layout=layout, act=act, block_m=16)
    for backend in ("triton", "reference"):
        out = moe.fused_moe(x, w13, w2, weights, ids, backend=backend, **kwargs)
        assert out.shape == (t, k) and out.dtype == torch.bfloat16
        err = rel_err(out, ref)
        assert err <= MOE_TOL[torch.bfloat16], f"{backend}: rel err {err:.2e} (seed {seed})"


def test_fused_moe_swiglu_oai_parameters(seed: int, device: str) -> None:
    """alpha and limit reach the activation: a small limit clamps most of h, and the result follows it."""
    e, k, inter, t = 3, 64, 32, 4
    w13, w2 = _quantize("int4-g32", e, 2 * inter, k, device), _quantize("int4-g32", e, k, inter, device)
    x = torch.randn(t, k, device=device).bfloat16()
    ids, weights = _routing(t, 2, e, device), torch.rand(t, 2, device=device)
    ref = _fused_ref(x, w13, w2, weights, ids, None, "swiglu_oai", "interleaved", alpha=1.0, limit=0.5)
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
    w13 = _quantize("int4-g32", 3, 2 * inter, k, device, bias=True)
    w2 = _quantize("int4-g32", 3, k, inter, device, bias=True)
    x = torch.randn(t, k, device=device).bfloat16()
    ids = torch.stack([torch.randperm(e_global, device=device)[:topk] for _ in range(t)]).to(torch.int32)
    ids[0] = torch.tensor([0, 2, 3, 4][:topk], device=device)  # no local expert
    weights = torch.softmax(torch.randn(t, topk, device=device), -1)
    out = moe.fused_moe(x, w13, w2, weights, ids, expert_map=expert_map.long(), block_m=16, backend=backend)
    ref = _fused_ref(x, w13, w2, weights, ids, expert_map=expert_map)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert rel_err(out, ref) <= MOE_TOL[torch.bfloat16]


@pytest.mark.parametrize("act", [None, "fp8"])
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_fused_moe_expert_map_nothing_local(backend: str, act, device: str) -> None:
    """No slot on this rank: nothing to compute, zeros out (the grouped rows are all padding)."""
    w13, w2 = _quantize("int4-g32", 2, 64, 64, device, bias=True), _quantize("int4-g32", 2, 64, 32, device)
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
    w13, w2 = _quantize("int4-g32", e, 2 * inter, k, device), _quantize("int4-g32", e, k, inter, device)
    x = torch.randn(t, k, device=device).bfloat16()
    ids = _routing(t, topk, 6, device)  # global ids in [0, 6); experts 4 and 5 live on another rank
    weights = torch.rand(t, topk, device=device) + 0.5
    expert_map = torch.tensor([0, 1, 2, 3, -1, -1], dtype=torch.int32, device=device)
    out = moe.fused_moe(x, w13, w2, weights, ids, expert_map=expert_map, block_m=16, backend="triton")
    local = ids < 4
    same = moe.fused_moe(x, w13, w2, weights * local, ids.clamp(max=3), block_m=16, backend="triton")
    assert torch.equal(out, same)


def test_fused_moe_quantizes_w2_input_in_the_activation_pass(monkeypatch, seed: int, device: str) -> None:
    """With a per-token act on the Triton path, only w13's input goes through the quantization pass: the
    activation pass hands w2 its codes and scales."""
    from humming.triton_kernels import act_quant

    calls = []
    quantize = act_quant.quantize_activation
    monkeypatch.setattr(act_quant, "quantize_activation", lambda x, act, **kw: calls.append(act) or quantize(x, act))
    e, k, inter = 3, 64, 32
    w13, w2 = _quantize("int4-g32", e, 2 * inter, k, device), _quantize("int4-g32", e, k, inter, device)
    x, ids = torch.randn(4, k, device=device).bfloat16(), _routing(4, 2, e, device)
    weights = torch.rand(4, 2, device=device)
    out = moe.fused_moe(x, w13, w2, weights, ids, act="fp8", block_m=16, backend="triton")
    assert len(calls) == 1
    assert rel_err(out, _fused_ref(x, w13, w2, weights, ids, "fp8")) <= MOE_TOL[torch.bfloat16]


@pytest.mark.parametrize("act", [None, "fp8", "int8"])
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_fused_moe_non_finite_tokens(backend: str, act, seed: int, device: str) -> None:
    """A token with NaN or Inf activations gets a non-finite output row; every other token's row is bit for
    bit the one it gets when those are zeros."""
    e, k, inter, t = 4, 64, 32, 5
    w13, w2 = _quantize("int4-g32", e, 2 * inter, k, device), _quantize("int4-g32", e, k, inter, device)
    x = torch.randn(t, k, device=device).bfloat16()
    x[1, 3], x[3, 10] = float("nan"), float("inf")
    ids, weights = _routing(t, 2, e, device), torch.rand(t, 2, device=device)
    kwargs = dict(act=act, block_m=16, backend=backend)
    out = moe.fused_moe(x, w13, w2, weights, ids, **kwargs)
    clean = moe.fused_moe(torch.where(torch.isfinite(x), x, 0), w13, w2, weights, ids, **kwargs)
    bad = torch.tensor([False, True, False, True, False], device=device)
    assert not torch.isfinite(out[bad]).any()
    assert torch.equal(out[~bad], clean[~bad])


def test_fused_moe_no_tokens() -> None:
    x, w13, w2, weights, ids = _moe_args()
    assert moe.fused_moe(x[:0], w13, w2, weights[:0], ids[:0]).shape == (0, 64)


def test_default_block_m() -> None:
    assert [moe.default_block_m(s, 64) for s in (8, 1024, 4096, 65536)] == [16, 16, 64, 128]


# ---------------------------------------------------------------------------------------------- bad input
_TRITON_INT8 = {"backend": "triton", "act": "int8"}


def _ok():
    qw = _quantize("int4-g32", 2, 32, 64, "cpu")
    return torch.randn(32, 64).bfloat16(), qw, torch.tensor([0, 1], dtype=torch.int32)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda x, qw, ids: (x.double(), qw, ids, 16, {}), "x: expected dtype"),
        (lambda x, qw, ids: (x[:, :48], qw, ids, 16, {}), r"x: expected shape \[M, 64\]"),
        (lambda x, qw, ids: (x[:24], qw, ids, 16, {}), "not a multiple of block_m=16"),
        (lambda x, qw, ids: (x, qw, ids, 12, {}), "block_m: expected a positive multiple of 8"),
        (lambda x, qw, ids: (x, qw, ids.long(), 16, {}), "expert_ids: expected an int32"),
        (lambda x, qw, ids: (x, qw, ids[:1], 16, {}), r"expert_ids: expected shape \(2,\)"),
        (lambda x, qw, ids: (x, qw, ids.to("meta"), 16, {}), "expert_ids is on meta"),
        (lambda x, qw, ids: (x, qw, torch.tensor([0, 2], dtype=torch.int32), 16, {}), r"\[-1, 2\)"),
        (lambda x, qw, ids: (x, moe.expert_weight(qw, 0), ids, 16, {}), "expected an expert-stacked weight"),
        (lambda x, qw, ids: (x, qw, ids, 16, {"bias": torch.randn(32)}), r"bias: expected .* \(2, 32\)"),
        (lambda x, qw, ids: (x, qw, ids, 16, {"out_dtype": torch.int8}), "out_dtype"),
        (lambda x, qw, ids: (x, _quantize("int4-g32", 2, 32, 64, "cpu", True), ids, 16, _TRITON_INT8), "act-order"),
        (lambda x, qw, ids: (x, qw, torch.tensor([0, 1, 1, -1], dtype=torch.int32), 8, {"backend": "triton"}), "of 16"),
        (lambda x, qw, ids: (x, qw, ids, 16, {"backend": "tpu"}), "backend: expected one of"),
    ],
    ids=[
        "x-dtype",
        "x-k",
        "rows",
        "block-m",
        "ids-dtype",
        "ids-shape",
        "ids-device",
        "ids-range",
        "dense-weight",
        "bias-shape",
        "out-dtype",
        "triton-act",
        "triton-block-8",
        "backend-name",
    ],
)
def test_grouped_linear_rejects(change, match: str) -> None:
    x, qw, ids, block_m, kwargs = change(*_ok())
    with pytest.raises(ValueError, match=match):
        moe.grouped_linear(x, qw, ids, block_m, **kwargs)


def test_grouped_linear_rejects_combination() -> None:
    qw = humming.quantize(torch.randn(2, 32, 64), "nf4", group_size=32)
    with pytest.raises(ValueError, match="nf4 with act=int8 is not supported"):
        moe.grouped_linear(torch.randn(16, 64).bfloat16(), qw, torch.zeros(1, dtype=torch.int32), 16, act="int8")


def test_linear_rejects_experts() -> None:
    with pytest.raises(ValueError, match="expert-stacked"):
        humming.linear(torch.randn(2, 64).bfloat16(), _quantize("int4-g32", 2, 32, 64, "cpu"))


def _moe_args():
    e, k, inter = 3, 64, 32
    w13, w2 = _quantize("int4-g32", e, 2 * inter, k, "cpu"), _quantize("int4-g32", e, k, inter, "cpu")
    ids = torch.tensor([[0, 2], [1, 0]], dtype=torch.int32)
    return torch.randn(2, k).bfloat16(), w13, w2, torch.rand(2, 2), ids


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda x, a, b, w, i: ((x, moe.expert_weight(a, 0), b, w, i), {}), "w13: expected an expert-stacked"),
        (lambda x, a, b, w, i: ((x, a, a, w, i), {}), r"w2: expected shape \(3, 64, 32\)"),
        (lambda x, a, b, w, i: ((x[:, :32], a, b, w, i), {}), r"x: expected shape \[M, 64\]"),
        (lambda x, a, b, w, i: ((x, a, b, w, i[:1]), {}), r"topk_ids: expected shape \[T=2, topk\]"),
        (lambda x, a, b, w, i: ((x, a, b, w.long(), i), {}), "topk_weights: expected a float"),
        (lambda x, a, b, w, i: ((x, a, b, w[:, :1], i), {}), r"topk_weights: expected shape \(2, 2\)"),
        (lambda x, a, b, w, i: ((x, a, b, w, i.float()), {}), "topk_ids: expected an integer"),
        (lambda x, a, b, w, i: ((x, a, b, w, i + 2), {}), r"topk_ids: values must lie in \[0, 3\)"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"activation": "relu"}), "activation: expected one of"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"gate_up_layout": "split"}), "gate_up_layout: expected one of"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"alpha": 1.0}), "alpha: parameters of activation='swiglu_oai'"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"activation": "gelu", "limit": 7}), "limit: parameters of"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"activation": "swiglu_oai", "limit": 0.0}), "limit: expected a pos"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"activation": "swiglu_oai", "alpha": float("nan")}), "alpha: exp"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"activation": "swiglu_oai", "alpha": True}), "alpha: expected"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"expert_map": [0, 1, 2]}), "expert_map: expected a torch.Tensor"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"expert_map": torch.zeros(3)}), "expert_map: expected an integer"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"expert_map": torch.zeros(2, 3, dtype=torch.int32)}), "E_global"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"expert_map": torch.arange(2)}), r"E_global >= 3"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"expert_map": torch.arange(3, device="meta")}), "expert_map is on"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"expert_map": torch.tensor([0, 1, 3])}), r"expert_map: .* \[-1, 3\)"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"expert_map": torch.tensor([0, -2, 1])}), r"found -2"),
        (lambda x, a, b, w, i: ((x, a, b, w, i + 2), {"expert_map": torch.arange(4)}), r"topk_ids: .* \[0, 4\)"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"block_m": 20}), "block_m"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"w13_act_scale": torch.ones(1)}), "w13_act_scale: a static"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"act": "mxfp4", "w2_act_scale": torch.ones(1)}), "w2_act_scale"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"act": "fp8", "w2_act_scale": torch.ones(2)}), "one-element"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"act": "fp8", "w13_act_scale": 0.5}), "one-element float"),
    ],
    ids=[
        "dense-w13",
        "w2-shape",
        "x-k",
        "ids-shape",
        "weights-dtype",
        "weights-shape",
        "ids-dtype",
        "ids-range",
        "activation",
        "gate-up-layout",
        "alpha-not-swiglu",
        "limit-not-swiglu",
        "limit-zero",
        "alpha-nan",
        "alpha-bool",
        "map-list",
        "map-float",
        "map-2d",
        "map-short",
        "map-device",
        "map-value-large",
        "map-value-negative",
        "map-ids-range",
        "block-m",
        "scale-no-act",
        "scale-mxfp4",
        "scale-two",
        "scale-float",
    ],
)
def test_fused_moe_rejects(change, match: str) -> None:
    args, kwargs = change(*_moe_args())
    with pytest.raises(ValueError, match=match):
        moe.fused_moe(*args, **kwargs)


# ------------------------------------------------------------------------------------ GPU, real MoE shapes
GPU_WEIGHTS = ["uint4-zp-g128", "int4-g32", "int8-channel", "e4m3-channel", "mxfp4"]


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 256])
@pytest.mark.parametrize(("e", "topk"), [(8, 2), (64, 8)])
@pytest.mark.parametrize("name", GPU_WEIGHTS)
def test_triton_grouped_gpu_realistic(name: str, e: int, topk: int, t: int, seed: int) -> None:
    """A Qwen-MoE-like w13 (N = 2 * 1408, K = 2048), bf16, every block size the heuristic picks."""
    n, k = 2 * 1408, 2048
    block_m = moe.default_block_m(t * topk, e)
    qw = _quantize(name, e, n, k, "cuda")
    x, expert_ids = _grouped_input(t, topk, e, k, block_m, torch.bfloat16, "cuda", empty=0)
    bias = torch.randn(e, n, device="cuda")
    out = torch.full((x.shape[0], n), float("nan"), dtype=torch.bfloat16, device="cuda")
    wna16.grouped_linear(x, qw, expert_ids, block_m, bias, torch.bfloat16, out=out)
    ref, used = _grouped_ref(x, qw, expert_ids, block_m, bias, torch.bfloat16)
    assert torch.isnan(out[~used]).all()
    assert rel_err(out[used], ref[used]) <= TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 256])
@pytest.mark.parametrize(("name", "act"), [("e4m3-channel", "fp8"), ("fp8-block", "fp8_g128"), ("int4-g128", "fp8")])
def test_triton_grouped_scaled_gpu_realistic(name: str, act: str, t: int, seed: int) -> None:
    """The grouped scaled GEMM at E=64, topk=8, N = 2 * 1408, K = 2048, bf16 out."""
    e, topk, n, k = 64, 8, 2 * 1408, 2048
    block_m = moe.default_block_m(t * topk, e)
    qw = _quantize(name, e, n, k, "cuda")
    x, expert_ids = _grouped_input(t, topk, e, k, block_m, torch.bfloat16, "cuda", empty=0)
    bias = torch.randn(e, n, device="cuda")
    out = torch.full((x.shape[0], n), float("nan"), dtype=torch.bfloat16, device="cuda")
    scaled_mm.grouped_linear(x, qw, expert_ids, block_m, bias, get_act_scheme(act), torch.bfloat16, None, out)
    xq = humming.dequantize_activation(humming.quantize_activation(x, act))
    ref, used = _grouped_ref(xq, qw, expert_ids, block_m, bias, torch.float32)
    assert torch.isnan(out[~used]).all()
    assert rel_err(out[used], ref[used]) <= TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 256])
@pytest.mark.parametrize("name", ["uint4-zp-g128", "int8-channel", "mxfp4"])
def test_fused_moe_gpu_realistic(name: str, t: int, seed: int) -> None:
    """fused_moe (auto: CUDA or Triton) against the reference backend at E=64, topk=8, K=2048, I=768."""
    e, topk, k, inter = 64, 8, 2048, 768
    w13 = _quantize(name, e, 2 * inter, k, "cuda")
    w2 = _quantize(name, e, k, inter, "cuda")
    x = torch.randn(t, k, device="cuda").bfloat16()
    ids = _routing(t, topk, e, "cuda")
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
    w13 = _quantize("mxfp4", e, 2 * inter, k, "cuda", bias=True)
    w2 = _quantize("mxfp4", e, k, inter, "cuda", bias=True)
    expert_map = None
    if mapped:
        expert_map = torch.full((e_global,), -1, dtype=torch.int32, device="cuda")
        expert_map[8:16] = torch.arange(8, dtype=torch.int32, device="cuda")
    x = (torch.randn(t, k, device="cuda") / 16).bfloat16()  # h of a few units, around the clamp at 7
    ids = _routing(t, topk, e_global, "cuda")
    weights = torch.softmax(torch.randn(t, topk, device="cuda"), -1)
    kwargs = dict(activation="swiglu_oai", gate_up_layout="interleaved", expert_map=expert_map, act=act)
    out = moe.fused_moe(x, w13, w2, weights, ids, **kwargs)
    ref = moe.fused_moe(x.float(), w13, w2, weights, ids, backend="reference", **kwargs)
    assert rel_err(out, ref.double()) <= MOE_TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("t", [1, 256])
def test_fused_moe_gpu_gelu(activation: str, t: int, seed: int) -> None:
    """GeGLU experts at E = 64, topk = 8, K = 2048, I = 768, int4 and fp8-activated e4m3 (CUDA or Triton)."""
    e, topk, k, inter = 64, 8, 2048, 768
    x = (torch.randn(t, k, device="cuda") / 16).bfloat16()
    ids = _routing(t, topk, e, "cuda")
    weights = torch.softmax(torch.randn(t, topk, device="cuda"), -1)
    for name, act in (("int4-g128", None), ("e4m3-channel", "fp8")):
        w13, w2 = _quantize(name, e, 2 * inter, k, "cuda"), _quantize(name, e, k, inter, "cuda")
        out = moe.fused_moe(x, w13, w2, weights, ids, activation=activation, act=act)
        ref = moe.fused_moe(x.float(), w13, w2, weights, ids, activation=activation, act=act, backend="reference")
        assert rel_err(out, ref.double()) <= MOE_TOL[torch.bfloat16], name
