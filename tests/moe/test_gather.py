"""``humming.moe.grouped_linear`` with ``rows``: token rows read through the routing's index (fused_moe's
``w13``), in the Triton kernels and copied into grouped order for the others, against the same float64
reference of the gathered rows; the gather's torch definition."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import rel_err
from moe_cases import TOL, grouped_ref, quantize_experts, random_routing

import humming
from humming import moe
from humming.reference import moe_layer as _moe_layer

wna16 = pytest.importorskip("humming.triton_kernels.wna16")
from humming.dispatch.kernels import GROUPED_KERNELS  # noqa: E402
from humming.dispatch.support import combination_error  # noqa: E402
from humming.ir.activation import get_act_scheme  # noqa: E402
from humming.ir.formats import get_format  # noqa: E402
from humming.kernel import never_gathers  # noqa: E402
from humming.triton_kernels import scaled_mm  # noqa: E402


# ------------------------------------------------------------------------------------------- gathered rows
def _gather_case(t: int, topk: int, e: int, k: int, block_m: int, device, empty: int = 1):
    """Tokens ``x [T, K]`` (bf16) and their routing: ``(x, expert_ids, rows)``."""
    r = moe.moe_align(random_routing(t, topk, e, device, min(empty, e - topk)), e, block_m)
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
    ref, in_block = grouped_ref(xg, qw, expert_ids, block_m, bias, x.dtype if act is None else torch.float32)
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
    qw = quantize_experts(name, e, n, k, device)
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
    qw = quantize_experts(name, e, n, k, device)
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
    qw = quantize_experts("int4-g128", 3, 32, 128, device)
    x = torch.randn(64, 128, device=device).bfloat16()
    x[48:] = 1e4  # the skipped block
    expert_ids = torch.tensor([2, 0, 0, -1], dtype=torch.int32, device=device)
    out = torch.full((64, 32), float("nan"), dtype=torch.float32, device=device)
    scaled_mm.grouped_linear(x, qw, expert_ids, 16, None, get_act_scheme(act), torch.float32, None, out)
    xq = humming.dequantize_activation(humming.quantize_activation(x[:48], act))
    ref, used = grouped_ref(
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
    qw = quantize_experts("int4-g32", e, n, k, device, bias=True)
    x, expert_ids, rows = _gather_case(4, 2, e, k, block_m, device)
    xin = humming.quantize_activation(x, act) if prequantized else x
    kwargs = dict(rows=rows, act=act, out_dtype=torch.float32)
    used = (expert_ids >= 0).repeat_interleave(block_m) & (rows >= 0)
    ref = moe.grouped_linear(xin, qw, expert_ids, block_m, backend="reference", **kwargs)
    out = moe.grouped_linear(xin, qw, expert_ids, block_m, backend="triton", **kwargs)
    tol = TOL[torch.float32] if act is not None else TOL[torch.bfloat16]  # the reference keeps fp32 weights
    assert rel_err(out[used], ref[used].double()) <= tol
    copied = []
    kernel = GROUPED_KERNELS["reference"]
    run = lambda x, *args, **gather: copied.append((x, gather)) or kernel.run(x, *args, **gather)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(GROUPED_KERNELS, "reference", dataclasses.replace(kernel, gathers=never_gathers, run=run))
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
    qw = quantize_experts("int4-g32", e, n, k, device)
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("t, k", [(3, 64), (37, 7168), (5, 40)])
def test_gather_rows_kernel_matches_the_definition(dtype, t, k, seed: int, device: str) -> None:
    """The one-pass Triton copy (what fused_moe runs on CUDA): the torch definition bit for bit, tokens of
    every float dtype, odd K, padding rows, rows read many times, and quantized activations' codes and
    per-row scales (float32 and 8-bit float scales)."""
    from humming.triton_kernels import gather_rows as triton_gather

    x = torch.randn(t, k, device=device).to(dtype)
    rows = torch.randint(-1, t, (8 * t + 5,), dtype=torch.int32, device=device)
    out = triton_gather.gather_rows(x, rows)
    assert out.shape == (rows.shape[0], k) and out.dtype == dtype
    assert torch.equal(out, _moe_layer.gather_rows(x, rows))
    assert triton_gather.gather_rows(x[:0], torch.full((4,), -1, dtype=torch.int32, device=device)).abs().sum() == 0
    if dtype != torch.float32:
        for act in ("fp8", "mxfp4", "nvfp4", "fp8_tensor"):
            qa = humming.quantize_activation(x, act)
            got, want = triton_gather.gather_rows(qa, rows), _moe_layer.gather_rows(qa, rows)
            assert torch.equal(got.codes, want.codes), act
            assert torch.equal(got.scales.view(torch.uint8), want.scales.view(torch.uint8)), act
            assert got.global_scale is qa.global_scale


def test_gather_rows_kernel_widths_one_after_another(seed: int, device: str) -> None:
    """Widths whose launches Triton specializes alike (multiples of 16) but which take other column tiles, one
    after the other in one process: each call runs its own kernel (a kept kernel of another tile would leave
    columns unwritten)."""
    from humming.triton_kernels import gather_rows as triton_gather

    for k in (64, 7168, 512, 2048, 40):
        x = torch.randn(37, k, device=device).bfloat16()
        rows = torch.randint(-1, 37, (301,), dtype=torch.int32, device=device)
        assert torch.equal(triton_gather.gather_rows(x, rows), _moe_layer.gather_rows(x, rows)), k
