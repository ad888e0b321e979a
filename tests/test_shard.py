"""``shard``: every rank's part dequantizes to its slice of the full weight, bit for bit; bad splits raise.
Plus a 2-process gloo run: column- and row-parallel ``humming.linear`` equal the unsharded layer."""

from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import humming
from humming.cuda_kernels._layout import gate_up_rows
from humming.ir.packing import pack_codes
from humming.ir.shard import deinterleave_rows, permute_rows, shard
from humming.ir.weight import QuantizedWeight


@dataclass(frozen=True)
class Case:
    fmt: str
    shape: tuple
    group_shape: tuple
    zeros: bool = False
    act_order: bool = False
    global_scale: bool = False
    scale_dtype: torch.dtype = torch.bfloat16


def random_qw(case: Case, seed: int = 0) -> QuantizedWeight:
    gen = torch.Generator().manual_seed(seed)
    *lead, n, k = case.shape
    fmt = humming.get_format(case.fmt)
    bn, bk = case.group_shape
    rows = 1 if bn == -1 else -(-n // bn)
    cols = 1 if bk == -1 else -(-k // bk)
    codes = torch.randint(0, 2**fmt.bits, (*lead, n, k), generator=gen, dtype=torch.uint8)
    if fmt.is_float:
        codes[fmt.decode(codes).isnan()] = 0
    scales = (torch.rand(*lead, rows, cols, generator=gen) + 0.5).to(case.scale_dtype)
    zeros = torch.randint(0, 2**fmt.bits, scales.shape, generator=gen, dtype=torch.uint8) if case.zeros else None
    g_idx = None
    if case.act_order:
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[torch.randperm(k, generator=gen)] = (torch.arange(k) // bk).to(torch.int32)
    return QuantizedWeight(
        shape=case.shape,
        format=fmt,
        qweight=pack_codes(codes, fmt.bits),
        scales=scales,
        group_shape=case.group_shape,
        zeros=zeros,
        global_scale=torch.rand(tuple(lead), generator=gen) if case.global_scale else None,
        g_idx=g_idx,
        bias=torch.randn(*lead, n, generator=gen).bfloat16(),
    )


CASES = [
    Case("int4", (64, 256), (1, 32)),
    Case("uint4", (64, 256), (1, 64), zeros=True),
    Case("uint3", (48, 96), (1, 16), zeros=True),  # K parts of 48 3-bit codes are not word-aligned: repacked
    Case("int8", (40, 80), (1, -1)),
    Case("e4m3", (256, 512), (128, 128), scale_dtype=torch.float32),
    Case("e4m3", (30, 50), (-1, -1)),
    Case("e2m1", (32, 64), (1, 16), global_scale=True, scale_dtype=torch.float8_e4m3fn),
    Case("uint4", (24, 128), (1, 32), zeros=True, act_order=True),
    Case("int2", (16, 64), (1, 16)),
    Case("e2m1", (4, 32, 64), (1, 32), scale_dtype=torch.float8_e8m0fnu),
    Case("uint4", (2, 16, 128), (1, 32), zeros=True, global_scale=True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.fmt}-{c.shape}-{c.group_shape}")
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_shard_parts_equal_slices(case, world_size):
    qw = random_qw(case)
    full = humming.dequantize(qw)
    ndim = len(qw.shape)
    for dim in range(ndim):
        size = qw.shape[dim]
        part_size = size // world_size
        block = {ndim - 2: qw.group_shape[0], ndim - 1: -1 if case.act_order else qw.group_shape[1]}.get(dim, 1)
        if size % world_size or (world_size > 1 and block > 1 and part_size % block):
            with pytest.raises(ValueError, match=r"equal parts|straddle"):
                shard(qw, dim, 0, world_size)
            continue
        for rank in range(world_size):
            part = shard(qw, dim, rank, world_size)
            sl = [slice(None)] * len(qw.shape)
            sl[dim] = slice(rank * size // world_size, (rank + 1) * size // world_size)
            assert torch.equal(humming.dequantize(part), full[tuple(sl)]), (dim, rank)
            if dim == len(qw.shape) - 1:
                assert (part.bias is not None) == (rank == 0)


def test_shard_errors():
    qw = random_qw(Case("int4", (64, 256), (1, 128)))
    with pytest.raises(ValueError, match="not a multiple of the K group/block size 128"):
        shard(qw, 1, 0, 4)
    with pytest.raises(ValueError, match="does not split into 3 equal parts"):
        shard(qw, 0, 0, 3)
    with pytest.raises(ValueError, match="rank"):
        shard(qw, 0, 2, 2)
    with pytest.raises(ValueError, match="out of range"):
        shard(qw, 2, 0, 2)
    block = random_qw(Case("e4m3", (256, 256), (128, 128)))
    with pytest.raises(ValueError, match="N group/block size 128"):
        shard(block, 0, 1, 4)


def test_act_order_row_parallel_keeps_groups():
    qw = random_qw(Case("uint4", (24, 128), (1, 32), zeros=True, act_order=True))
    part = shard(qw, 1, 1, 4)  # 32 columns drawn from any groups
    assert part.scales.shape == qw.scales.shape and torch.equal(part.g_idx, qw.g_idx[32:64])


def test_deinterleave_rows():
    qw = random_qw(Case("e2m1", (2, 32, 64), (1, 32), scale_dtype=torch.float8_e8m0fnu))
    gate, up = deinterleave_rows(qw)
    full = humming.dequantize(qw)
    assert torch.equal(humming.dequantize(gate), full[:, 0::2]) and torch.equal(humming.dequantize(up), full[:, 1::2])


@pytest.mark.parametrize("case", [c for c in CASES if c.group_shape[0] in (1, -1)], ids=lambda c: f"{c.fmt}-{c.shape}")
def test_permute_rows_takes_the_rows_of_every_expert(case):
    qw = random_qw(case)
    rows = torch.randperm(qw.N, generator=torch.Generator().manual_seed(3))
    permuted = permute_rows(qw, rows)
    assert torch.equal(humming.dequantize(permuted), humming.dequantize(qw)[..., rows, :])
    assert torch.equal(permuted.bias, qw.bias[..., rows])


def test_permute_rows_errors():
    with pytest.raises(ValueError, match="per-row scales or one for all N"):
        permute_rows(random_qw(Case("e4m3", (256, 512), (128, 128), scale_dtype=torch.float32)), torch.arange(256))
    with pytest.raises(ValueError, match="rows: expected a permutation of the 64 rows"):
        permute_rows(random_qw(CASES[0]), torch.arange(32))


@pytest.mark.parametrize("layout", ["concat", "interleaved"])
def test_gate_up_rows_put_a_features_gate_and_up_eight_rows_apart(layout):
    """The gated epilogue's order: in every 16-row tile, row g is the gate and row g + 8 the up of feature
    64 * block + 8 * tile + g (concat: rows f and I + f of w13; interleaved: 2f and 2f + 1); a permutation."""
    two_i = 384
    rows = gate_up_rows(two_i, layout)
    assert sorted(rows.tolist()) == list(range(two_i))
    for j in range(two_i):
        f = j // 16 * 8 + j % 8
        up = j % 16 >= 8
        want = (2 * f + up) if layout == "interleaved" else (f + up * two_i // 2)
        assert rows[j] == want, (j, rows[j], want)
    with pytest.raises(ValueError, match="2I % 128 == 0"):
        gate_up_rows(192, layout)


def _worker(rank, world_size, init_file, results):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        qw = random_qw(Case("uint4", (64, 256), (1, 32), zeros=True), seed=1)
        x = torch.randn(5, 256, generator=torch.Generator().manual_seed(2))
        full = humming.linear(x, qw)
        # column-parallel: every rank computes its outputs, gathered along N
        y = humming.linear(x, shard(qw, 0, rank, world_size))
        parts = [torch.empty_like(y) for _ in range(world_size)]
        dist.all_gather(parts, y)
        column_exact = torch.equal(torch.cat(parts, dim=-1), full)
        # row-parallel: each rank takes its K slice of x; partial sums are all-reduced (bias on rank 0)
        k_part = qw.K // world_size
        y = humming.linear(x[:, rank * k_part : (rank + 1) * k_part].contiguous(), shard(qw, 1, rank, world_size))
        dist.all_reduce(y)
        row_error = float((y - full).abs().max() / full.abs().max())
        results[rank] = (column_exact, row_error)
    finally:
        dist.destroy_process_group()


def test_distributed_gloo_two_ranks(tmp_path):
    ctx = mp.get_context("spawn")
    results = ctx.Manager().dict()
    mp.start_processes(_worker, args=(2, str(tmp_path / "rendezvous"), results), nprocs=2, start_method="spawn")
    for rank in range(2):
        column_exact, row_error = results[rank]
        assert column_exact, rank
        assert row_error < 1e-5, (rank, row_error)  # fp32 sums in a different order
