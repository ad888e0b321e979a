"""fused_moe's CUDA combine (``humming.cuda_kernels.moe_combine``): the Triton combine's bits, rows by slot or
slot-major, and the Triton combine wherever the CUDA one does not apply (``humming.moe.fused.prepared_combine``)."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_bit_exact

from humming.cuda_kernels import moe_combine
from humming.moe.fused import prepared_combine
from humming.reference import moe_layer as reference
from humming.triton_kernels import moe_layer


@pytest.mark.parametrize(
    ("y", "weights", "dtype", "reason"),
    [
        (torch.zeros(8, 64), torch.ones(2, 4), torch.bfloat16, "16-bit y and output"),
        (torch.zeros(8, 64, dtype=torch.bfloat16), torch.ones(2, 4), torch.float32, "16-bit y and output"),
        (torch.zeros(8, 60, dtype=torch.bfloat16), torch.ones(2, 4), torch.bfloat16, "H % 8 == 0"),
        (torch.zeros(8, 68, dtype=torch.bfloat16)[:, :64], torch.ones(2, 4), torch.bfloat16, "16-byte rows"),
        (torch.zeros(8, 64, dtype=torch.bfloat16), torch.ones(2, 4), torch.bfloat16, "compute capabilities"),
    ],
)
def test_calls_the_cuda_combine_leaves_to_triton(y, weights, dtype, reason):
    assert reason in moe_combine.cuda_unsupported(y, weights, dtype)


def _routing(t: int, topk: int, rows: int, device) -> torch.Tensor:
    """Slot rows as the alignment makes them: distinct rows, some slots without one (-1)."""
    slot_rows = torch.randperm(rows, device=device)[: t * topk].to(torch.int32)
    slot_rows[::3] = -1
    return slot_rows


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("t", "topk", "h"), [(1, 8, 2048), (7, 4, 2880), (64, 8, 7168), (3, 1, 8), (66000, 2, 8)])
def test_rows_by_slot_are_the_triton_bits(dtype, weights_dtype, t, topk, h):
    """Against the Triton combine, bit for bit, and the float reference; rows of slots without a row hold NaN,
    which must not reach the output."""
    rows = 2 * t * topk + 8
    y = torch.randn(rows, h, device="cuda").to(dtype)
    slot_rows = _routing(t, topk, rows, "cuda")
    used = slot_rows[slot_rows >= 0].long()
    unused = torch.ones(rows, dtype=torch.bool, device="cuda")
    unused[used] = False
    y[unused] = float("nan")
    weights = torch.rand(t, topk, device="cuda").to(weights_dtype)
    combine = prepared_combine(y, slot_rows, weights, dtype, "auto")
    assert isinstance(combine, moe_combine.CudaCombine)
    torch.full((4 * t * h,), 0x7FFF, dtype=torch.int16, device="cuda")  # freed NaN bits where out will come from
    out = combine(y, slot_rows, weights)
    want = moe_layer.PreparedCombine(y, slot_rows, weights, dtype)(y, slot_rows, weights)
    assert_bit_exact(out, want, "against the Triton combine")
    ref = reference.combine(y.double(), slot_rows, weights.double(), torch.float64)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("topk", [1, 4, 8])
def test_slot_major_rows_are_the_triton_bits(topk):
    """One token's slot-major rows: slot j's row is j * block where its expert id is in [0, E)."""
    e, block, h = 16, 8, 1024
    ids = torch.randperm(e, device="cuda")[:topk].to(torch.int32)
    ids[0] = e + 3  # out of range: the slot adds nothing
    if topk > 2:
        ids[2] = -1
    y = torch.randn(topk * block, h, device="cuda", dtype=torch.bfloat16)
    weights = torch.rand(1, topk, device="cuda")
    combine = prepared_combine(y, ids, weights, torch.bfloat16, "auto", block, e)
    assert isinstance(combine, moe_combine.CudaCombine)
    out = combine(y, ids, weights)
    want = moe_layer.PreparedCombine(y, ids, weights, torch.bfloat16, block, e)(y, ids, weights)
    assert_bit_exact(out, want, "against the Triton combine")


@pytest.mark.gpu
def test_unaligned_y_goes_through_the_triton_combine():
    t, topk, h = 2, 4, 64
    base = torch.randn(16 * h + 4, device="cuda", dtype=torch.bfloat16)
    y = base[4:].view(16, h)  # 8-byte aligned
    slot_rows = _routing(t, topk, 16, "cuda")
    weights = torch.rand(t, topk, device="cuda")
    combine = prepared_combine(base[: 16 * h].view(16, h), slot_rows, weights, torch.bfloat16, "auto")
    assert isinstance(combine, moe_combine.CudaCombine) and y.data_ptr() % 16
    want = moe_layer.PreparedCombine(y, slot_rows, weights, torch.bfloat16)(y, slot_rows, weights)
    assert_bit_exact(combine(y, slot_rows, weights), want, "unaligned y")
