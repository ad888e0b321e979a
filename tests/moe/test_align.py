"""``humming.moe.moe_align``: the routing into the contiguous grouped layout on both backends, against a plain
Python grouping of the slots; the Triton kernels (the interpreter on CPU) bit for bit against the torch
reference on both of their paths (one program, and blocks of slots over three launches), with ids out of
range dropped, up to the expert limit; on the GPU real sizes, no host sync and CUDA graph capture."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import capture, rel_err
from moe_cases import random_routing

import humming
from humming import moe
from humming.moe._checks import MAX_EXPERTS
from humming.moe.align import align, padded_rows
from humming.reference import align as reference
from humming.reference.align import max_slots

wna16 = pytest.importorskip("humming.triton_kernels.wna16")
kernels = pytest.importorskip("humming.triton_kernels.align")


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
    [
        (1, 1, 1, 8),
        (5, 2, 4, 16),
        (33, 4, 8, 16),
        (7, 3, 16, 32),
        (64, 8, 8, 64),
        (40, 2, 6, 8),
        (3, 2, 9, 24),
        (90, 4, 8, 144),
    ],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("empty", [0, 2])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_moe_align(t: int, topk: int, e: int, block_m: int, empty: int, backend: str, seed: int, device: str) -> None:
    empty = min(empty, e - topk)
    ids = random_routing(t, topk, e, device, empty)
    r = moe.moe_align(ids.long() if t % 2 else ids, e, block_m, backend=backend)
    m_pad = -(-(t * topk + min(e, t * topk) * (block_m - 1)) // block_m) * block_m
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
    assert r.token_rows(topk).tolist() == [-1 if s < 0 else s // topk for s in r.src_slots.tolist()]
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
@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_moe_align_rejects(ids, e, block_m, match: str, backend: str) -> None:
    with pytest.raises(ValueError, match=match):
        moe.moe_align(ids, e, block_m, backend=backend)


def test_moe_align_backend_errors() -> None:
    ids = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="backend: expected one of"):
        moe.moe_align(ids, 4, 16, backend="cuda")
    with pytest.raises(ValueError, match=r"backend: 'triton' cannot run .*uint16"):
        align(ids.to(torch.uint16), 4, 16, "triton")  # the checked call (CPU range checks need min/max)


# --------------------------------------------------------------------------- the Triton kernels, bit for bit
_POISON = 0x5A5A5A5A  # what every int32 buffer of the kernels holds before they run


def _triton_align(monkeypatch, ids: torch.Tensor, e: int, block_m: int, block: int | None = None):
    """The kernels' outputs, with every buffer they allocate (outputs and workspace) poisoned beforehand: an
    element they do not write keeps the poison, which no output of the reference holds."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        return empty(*args, **kwargs).fill_(_POISON)

    with monkeypatch.context() as patch:
        patch.setattr(torch, "empty", poisoned)
        return kernels.align(ids, e, block_m, block)


def _assert_bit_equal(got, want, topk: int, label: str) -> None:
    """The kernels' outputs are the reference's, and their token rows the reference's ``src_slots // topk``."""
    want = (*want, torch.where(want[0] >= 0, want[0] // topk, -1).to(torch.int32))
    for name, a, b in zip(("src_slots", "expert_ids", "num_rows", "slot_rows", "token_rows"), got, want, strict=True):
        assert a.dtype == b.dtype == torch.int32 and a.shape == b.shape, f"{label}: {name} {a.shape} vs {b.shape}"
        assert torch.equal(a, b), f"{label}: {name} differs at {(a != b).nonzero().flatten()[:8].tolist()}"


#: (T, topk, E, block_m, block): ``block`` forces the three-launch path with blocks of that many slots (None:
#: the sizes choose; 130 x 8 = 1040 slots is past ONE_PROGRAM_SLOTS: two blocks of 1024).
_SIZES = [
    (1, 1, 1, 8, None),
    (5, 2, 4, 16, None),
    (33, 4, 8, 16, None),
    (64, 8, 8, 64, None),
    (3, 2, 9, 24, None),
    (128, 8, 128, 16, None),
    (7, 3, 16, 32, 16),
    (40, 2, 6, 8, 16),
    (100, 3, 16, 16, 32),
    (64, 8, 128, 16, 64),
    (130, 8, 64, 16, None),
    (90, 8, 4, 144, None),  # a block fitted to the tokens per expert (moe.default_block_m)
]


@pytest.mark.parametrize(("t", "topk", "e", "block_m", "block"), _SIZES, ids=lambda v: str(v))
@pytest.mark.parametrize("empty", [0, 3])
def test_triton_align_matches_reference(monkeypatch, t, topk, e, block_m, block, empty, seed, device) -> None:
    ids = random_routing(t, topk, e, device, min(empty, e - topk))
    ids = ids.long() if t % 2 else ids
    got = _triton_align(monkeypatch, ids, e, block_m, block)
    _assert_bit_equal(got, reference.align(ids, e, block_m), topk, f"seed {seed}")


def test_moe_align_op_outputs_do_not_alias(seed, device) -> None:
    """torch.compile refuses a custom op whose outputs alias one another: the op's outputs are separate
    tensors (eager moe_align's share one allocation) holding the eager values."""
    ids = random_routing(33, 4, 8, device, 0)
    outputs = torch.ops.humming.moe_align(ids, 8, 16, "triton")
    assert len({o.untyped_storage().data_ptr() for o in outputs}) == len(outputs) == 4
    r = moe.moe_align(ids, 8, 16, backend="triton")
    for got, want in zip(outputs, (r.src_slots, r.expert_ids, r.num_rows, r.slot_rows), strict=True):
        assert torch.equal(got, want), f"seed {seed}"


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
@pytest.mark.parametrize("block", [None, 16])
def test_triton_align_drops_out_of_range_ids(monkeypatch, dtype, block, seed, device) -> None:
    """Ids outside [0, E) get no row and slot_rows -1, as on a GPU, where moe_align does not check them; int64
    ids beyond int32 are compared before narrowing."""
    e, t, topk = 6, 20, 3
    ids = torch.randint(0, e, (t, topk), dtype=torch.int64)
    bad = torch.rand(t, topk) < 0.3
    wild = torch.tensor([-1, -7, e, 200] + ([2**40 + 2, -(2**33)] if dtype == torch.int64 else []))
    wild = wild[torch.randint(0, len(wild), (t, topk))]
    if dtype == torch.uint8:
        wild = wild.clamp(min=e)  # no negative uint8
    ids = torch.where(bad, wild, ids).to(dtype).to(device)
    got = _triton_align(monkeypatch, ids, e, 16, block)
    _assert_bit_equal(got, reference.align(ids, e, 16), topk, f"seed {seed}")
    dropped = bad.reshape(-1).to(device)
    assert dropped.any() and (got[3][dropped] == -1).all() and (got[3][~dropped] >= 0).all()


@pytest.mark.parametrize("block", [None, 16])
def test_triton_align_at_the_expert_limit(monkeypatch, block, device) -> None:
    ids = torch.tensor([[MAX_EXPERTS - 1, 0], [5, MAX_EXPERTS - 1], [40000, 5]], device=device)
    got = _triton_align(monkeypatch, ids, MAX_EXPERTS, 8, block)
    _assert_bit_equal(got, reference.align(ids, MAX_EXPERTS, 8), 2, f"E={MAX_EXPERTS}")


def test_compile_specs_reach_the_expert_limit() -> None:
    assert MAX_EXPERTS in {spec.constexprs["NUM_EXPERTS"] for spec in kernels._compile_specs()}


@pytest.mark.parametrize("t, topk, e, block_m", [(3, 2, 6, 16), (5, 3, 7, 8), (64, 8, 256, 16), (1, 1, 3, 8)])
def test_triton_align_buffer_parts_aligned_and_apart(t, topk, e, block_m) -> None:
    """The one allocation of an align call: every output (and the workspace) starts on a 16-byte boundary, as
    the launch keys assume, the outputs have their own lengths, and no two parts overlap."""
    ids = torch.randint(0, e, (t, topk), dtype=torch.int32)
    prepared = kernels.PreparedAlign(ids.shape, e, block_m, ids.device)
    outputs = prepared(ids)
    m_pad = padded_rows(t * topk, e, block_m)
    assert [tuple(o.shape) for o in outputs] == [(m_pad,), (m_pad // block_m,), (), (t * topk,), (m_pad,)]
    spans = sorted(prepared.parts)
    assert all(a % 4 == 0 for a, _ in spans) and all(b <= a for (_, b), (a, _) in itertools.pairwise(spans))
    assert all(o.data_ptr() % 16 == 0 for o in outputs) and spans[-1][1] == prepared.elements


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("t, topk, e, block_m", [(1, 8, 256, 16), (3, 2, 8, 8), (2, 4, 8, 16)])
def test_align_worst_routing_fills_m_pad(t, topk, e, block_m, backend, device) -> None:
    """M_pad is tight where there are no more slots than experts: slots on distinct experts each open a
    segment of one block, and those fill M_pad exactly (the M_pad of padding every expert is larger)."""
    slots = t * topk
    ids = torch.randperm(e)[:slots].view(t, topk).to(torch.int32).to(device)
    r = moe.moe_align(ids, e, block_m, backend=backend)
    every_expert = -(-(slots + e * (block_m - 1)) // block_m) * block_m  # each of the E experts padded
    assert r.m_pad == padded_rows(slots, e, block_m) == int(r.num_rows) == slots * block_m
    assert (r.m_pad < every_expert) == (slots < e)


@pytest.mark.parametrize("e, block_m", [(1, 8), (8, 16), (256, 16), (256, 128)])
def test_max_slots_bounds_the_slots_of_m_pad(e, block_m) -> None:
    """``max_slots`` of a routing's M_pad is at least its slots, also for M_pad padded for every expert (other
    producers' worst case), and M_pad of ``max_slots`` slots fits M_pad."""
    for slots in range(1, 3 * e * block_m, max(1, e * block_m // 37)):
        for m_pad in (padded_rows(slots, e, block_m), slots + e * (block_m - 1)):
            assert slots <= max_slots(m_pad, e, block_m), (slots, m_pad)
        tight = padded_rows(slots, e, block_m)
        assert padded_rows(max_slots(tight, e, block_m), e, block_m) <= tight


def test_triton_align_no_slots(device) -> None:
    ids = torch.zeros(0, 2, dtype=torch.int32, device=device)
    _assert_bit_equal(kernels.align(ids, 4, 16), reference.align(ids, 4, 16), 2, "T=0")


def test_layout_paths() -> None:
    """One program up to ONE_PROGRAM_SLOTS slots, blocks of CHUNK slots after, at most MAX_CHUNKS of them."""
    one, two = kernels.layout(kernels.ONE_PROGRAM_SLOTS, 256), kernels.layout(kernels.ONE_PROGRAM_SLOTS + 1, 256)
    assert one.blocks == 1 and one.block == kernels.ONE_PROGRAM_SLOTS
    assert two.blocks == 2 and two.block == kernels.CHUNK
    largest = kernels.layout(kernels.MAX_CHUNKS * kernels.MAX_CHUNK, 256)
    assert largest.blocks == kernels.MAX_CHUNKS and largest.block == kernels.MAX_CHUNK
    assert kernels.layout(kernels.MAX_CHUNKS * kernels.CHUNK + 1, 8).blocks <= kernels.MAX_CHUNKS
    big = torch.empty(kernels.MAX_CHUNKS * kernels.MAX_CHUNK + 1, 1, dtype=torch.int32, device="meta")
    assert "above the kernels'" in kernels.unsupported(big, 8)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("slots", "e", "block_m"),
    [(8, 128, 16), (1024, 128, 16), (1025, 256, 64), (16384, 256, 128), (65536, 128, 64), (1 << 20, 256, 128)],
    ids=lambda v: str(v),
)
def test_triton_align_gpu(monkeypatch, slots: int, e: int, block_m: int, seed: int) -> None:
    """Real sizes on both paths: bit for bit the reference, and no host sync (an error if one happens)."""
    ids = torch.randint(0, e, (slots // 8, 8), device="cuda")
    want = reference.align(ids, e, block_m)
    kernels.align(ids, e, block_m)  # compiled outside the check: only the steady-state call is watched
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = _triton_align(monkeypatch, ids, e, block_m)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _assert_bit_equal(got, want, 8, f"seed {seed}")


@pytest.mark.gpu
@pytest.mark.parametrize("t", [4, 4096], ids=["one-program", "blocks"])
def test_triton_align_graph_capture(t: int, seed: int) -> None:
    """Both paths in a CUDA graph: a replay on new ids gives the reference's outputs for them."""
    e, topk = 128, 8
    ids = random_routing(t, topk, e, "cuda")
    graph, got = capture(lambda: moe.moe_align(ids, e, 16, backend="triton"))
    ids.copy_(random_routing(t, topk, e, "cuda", empty=5))
    graph.replay()
    torch.cuda.synchronize()
    outputs = (got.src_slots, got.expert_ids, got.num_rows, got.slot_rows, got.token_rows(topk))
    _assert_bit_equal(outputs, reference.align(ids, e, 16), topk, "replayed")


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
