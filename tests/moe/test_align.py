"""``humming.moe.moe_align``: the routing into the contiguous grouped layout, against a plain Python grouping
of the slots; out-of-range ids and CUDA graph capture on the GPU."""

from __future__ import annotations

import pytest
import torch
from helpers import capture, rel_err
from moe_cases import random_routing

import humming
from humming import moe

wna16 = pytest.importorskip("humming.triton_kernels.wna16")


# ----------------------------------------------------------------------------------------------- moe_align
def _expectedrouting(ids: torch.Tensor, e: int, block_m: int) -> tuple[list[int], list[int]]:
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
    ids = random_routing(t, topk, e, device, empty)
    r = moe.moe_align(ids.long() if t % 2 else ids, e, block_m)
    m_pad = -(-(t * topk + e * (block_m - 1)) // block_m) * block_m
    assert r.src_slots.shape == (m_pad,) and r.expert_ids.shape == (m_pad // block_m,) and r.block_m == block_m
    assert r.src_slots.dtype == r.expert_ids.dtype == r.num_rows.dtype == torch.int32
    assert r.src_slots.device == r.expert_ids.device == r.num_rows.device == ids.device
    rows, blocks = _expectedrouting(ids.cpu(), e, block_m)
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
        (torch.zeros(2, 2, dtype=torch.uint16), 4, 16, "int8, int16, int32, int64 or uint8 ids, got torch.uint16"),
        (torch.zeros(2, 2, dtype=torch.uint32), 4, 16, "got torch.uint32"),
    ],
    ids=[
        "float",
        "1-d",
        "no-experts",
        "block-12",
        "block-0",
        "block-bool",
        "id-too-large",
        "id-negative",
        "uint16",
        "uint32",
    ],
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
    ids = random_routing(t, topk, e, "cuda")
    weights = torch.rand(t, topk, device="cuda")
    run = lambda: moe.fused_moe(x, w13, w2, weights, ids, block_m=16, backend="triton")
    graph, (routing, out) = capture(lambda: (moe.moe_align(ids, e, 16), run()))
    ids.copy_(random_routing(t, topk, e, "cuda", empty=3))
    weights.copy_(torch.rand(t, topk, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    eager = moe.moe_align(ids, e, 16)
    assert torch.equal(routing.src_slots, eager.src_slots) and torch.equal(routing.expert_ids, eager.expert_ids)
    assert rel_err(out, run().double()) <= 1e-3  # fp32 atomics: the summation order may differ
