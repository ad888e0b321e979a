"""Tuning of the Triton WnA16 GEMM: tile configurations per M bucket (speed only, never numerics).

:func:`wna16_config` is a pure function of the problem ``(M, N, K, bits, groups)`` and the device's
multiprocessor count and shared memory per block (the callers read both through :func:`device_limits`); no
autotuning runs in the hot path. A bucket's tile that would not fit the shared memory loses stages, then
K and N width (:func:`fit_smem`, on the conservative :func:`smem_estimate`). Every config computes the same
function: split-K only changes the fp32 summation order, within the tolerances the tests state.

- M = 1: the GEMV kernel (no tensor cores: at decode the weight decode, not the multiply-adds, is the
  work), with tiles that hold whole scale groups (:func:`_gemv_tile`). M = 2..4 take the 16-row tensor-core
  tile: a GEMV accumulator of more than one row needs layout conversions that cost more than the idle
  tensor-core rows (``block_m`` 2 or 4 still selects the GEMV kernel when a config asks for it).
- M up to 128: tensor-core tiles that grow with M, split along K until the grid covers the GPU twice.
- M > 128 without bias and with ``out_dtype == x.dtype``: ``dequant_first``, the weight dequantized once per
  call to the activations' dtype and one cuBLAS GEMM: one more pass over the weight, which cuBLAS's
  large-tile efficiency pays back at large M.

Which of these, or a CUDA kernel, runs a call is the dispatcher's decision (``humming/dispatch/``, per-GPU
tables from ``python -m humming tune``); ``bench/results/<gpu>/`` holds the timings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..device import device_info

__all__ = [
    "MIN_GROUPED_BLOCK_M",
    "TileConfig",
    "choose_split_k",
    "device_limits",
    "finish_split_k",
    "fit_smem",
    "grouped_tile",
    "smem_estimate",
    "wna16_config",
]

#: The smallest tile M of the grouped (MoE) kernels (``tl.dot`` needs M >= 16); tiles divide the routing block.
MIN_GROUPED_BLOCK_M = 16


@dataclass(frozen=True)
class TileConfig:
    """One launch configuration of the WnA16 kernel."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    #: Large M: dequantize W to the activations' dtype once per call (Triton), then one cuBLAS GEMM. Same
    #: numerics as the tensor-core kernel (bf16/fp16 weights, fp32 accumulation, one output rounding); used
    #: only without bias and with ``out_dtype == x.dtype`` (otherwise the Triton kernel runs).
    dequant_first: bool = False

    def replace(self, **overrides) -> TileConfig:
        """A copy with some fields changed; an unknown field name is an error."""
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"TileConfig: unknown field(s) {sorted(unknown)}; known: {list(self.__dict__)}")
        return dataclasses.replace(self, **overrides)

    def name(self) -> str:
        c = self
        tiles = f"m{c.block_m}n{c.block_n}k{c.block_k}s{c.split_k}g{c.group_m}w{c.num_warps}st{c.num_stages}"
        return tiles + ("-dequant-first" if c.dequant_first else "")


#: (largest M of the bucket, config); the first bucket whose bound is >= M is used. ``block_m <= 4`` selects
#: the GEMV kernel (no tensor cores: for decode the weight decode, not the MACs, is the work).
_BUCKETS = (
    (1, TileConfig(1, 32, 256, num_warps=4, num_stages=1)),
    (16, TileConfig(16, 64, 256, num_warps=4, num_stages=4)),
    (32, TileConfig(32, 64, 128, num_warps=4, num_stages=4)),
    (64, TileConfig(64, 64, 128, num_warps=4, num_stages=4)),
    (128, TileConfig(64, 128, 64, num_warps=4, num_stages=4)),
    (512, TileConfig(128, 128, 64, num_warps=8, num_stages=4, dequant_first=True)),
    (None, TileConfig(128, 256, 64, num_warps=8, num_stages=3, dequant_first=True)),
)


def device_limits(device) -> tuple[int, int]:
    """What the callers pass the tile choosers for a launch on ``device`` (a ``torch.device``): its
    multiprocessor count and shared memory per block (``humming.device``). The interpreter has no limit
    (0) and any multiprocessor count (1 keeps split-K exercised on small shapes)."""
    if device.type != "cuda":
        return 1, 0
    limits = device_info(device).limits
    return limits.sm_count, limits.smem_per_block


def choose_split_k(tiles: int, k_tiles: int, sm_count: int, waves: int = 2) -> int:
    """Split K until the grid covers the multiprocessors ``waves`` times, keeping >= 4 K tiles per split."""
    split = 1
    while tiles * split < waves * sm_count and k_tiles // (split * 2) >= 4:
        split *= 2
    return split


def _gemv_tile(cfg: TileConfig, group_k: int) -> TileConfig:
    """GEMV tiles inside one scale group along K (``block_k`` divides ``group_k``), so the kernel applies one
    scale per row and never changes layouts; ~1024 words per iteration. ``block_k`` is a power of two of at
    least 32 (the kernel's tiles are powers of two, and 32 holds a word of 1-bit codes): for groups without
    such a divisor (16, 24, 48...) tiles span groups and read a scale per word or element."""
    block_k = min(cfg.block_k, group_k & -group_k) if group_k else cfg.block_k
    block_k = max(block_k, 32)
    block_n = max(8, min(64, 8192 // block_k)) // cfg.block_m
    return cfg.replace(block_k=block_k, block_n=max(block_n, 8))


def smem_estimate(cfg: TileConfig, bits: int, group_k: int = 0, act_order: bool = False) -> int:
    """Bytes of shared memory the WnA16 kernel asks for with tile ``cfg``: an upper bound (the chooser
    keeps it under the device's limit, so it must never be below what the compiler allocates).

    Triton keeps ``num_stages - 1`` copies of every load of the K loop in shared memory (activations
    ``[BM, BK]``; weight words ``[BN, BK * bits / 32]``, or two ``[BN, BK]`` int32 tiles where fields
    straddle words; per-group scales and zero points, counted here as 4 bytes each, whatever their type,
    and with ``act_order`` their gathered ``[BN, BK]`` tiles, which Triton pipelines at 2 stages) and
    stages both dot operands through it (``(BM + BN) * BK`` 16-bit values). Calibrated against
    ``compiled.metadata.shared`` of ahead-of-time compiles for sm_80 and sm_90 (exact for the tiled buckets
    without act-order; tests/test_triton_smem.py checks the chooser's results). The GEMV
    kernel (``block_m <= 4``) keeps its fp32 products in registers and reduces them through shared memory
    once: at most ``[BM, BN, BK]`` fp32.
    """
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    if bm <= 4:
        return bm * bn * bk * 4
    words = bn * bk * 8 if 32 % bits else bn * bk * bits // 8
    if act_order:
        groups = bn * bk * 8
    else:
        groups = bn * max(bk // group_k, 1) * 8 if group_k else bn * 8
    per_stage = bm * bk * 2 + words + groups
    return (cfg.num_stages - 1) * per_stage + (bm + bn) * bk * 2


def fit_smem(cfg: TileConfig, estimate, smem_limit: int, min_block: int = 32) -> TileConfig:
    """``cfg`` with fewer stages (down to 2), then a smaller ``block_k``, then ``block_n`` (down to
    ``min_block``), then a single stage, until ``estimate(cfg)`` fits in ``smem_limit`` bytes (0: no
    limit, the interpreter). Tuning only: every tile computes the same function."""
    if not smem_limit:
        return cfg
    while estimate(cfg) > smem_limit:
        if cfg.num_stages > 2:
            cfg = cfg.replace(num_stages=cfg.num_stages - 1)
        elif cfg.block_k > min_block:
            cfg = cfg.replace(block_k=cfg.block_k // 2)
        elif cfg.block_n > min_block:
            cfg = cfg.replace(block_n=cfg.block_n // 2)
        elif cfg.num_stages > 1:
            cfg = cfg.replace(num_stages=1)
        else:
            raise ValueError(f"smem_limit={smem_limit}: no tile fits (smallest: {cfg.name()}, {estimate(cfg)} bytes)")
    return cfg


def wna16_config(
    m: int,
    n: int,
    k: int,
    bits: int,
    sm_count: int,
    group_k: int = 0,
    smem_limit: int = 0,
    act_order: bool = False,
) -> TileConfig:
    """The tile configuration for ``x [m, k] @ W[n, k]^T`` with ``bits``-bit weights in scale groups of
    ``group_k`` along K (0: one group per row, or ``act_order`` groups read through ``g_idx``) on a device
    with ``sm_count`` multiprocessors and ``smem_limit`` bytes of shared memory per block (0: no limit);
    :func:`smem_estimate` of the result fits."""
    cfg = next(c for bound, c in _BUCKETS if bound is None or m <= bound)
    if cfg.block_m <= 4:
        cfg = _gemv_tile(cfg, group_k)
    if 32 % bits:  # fields straddle words: each element reads its two words, so keep the staged tiles small
        cfg = cfg.replace(block_k=min(cfg.block_k, 64))
    cfg = fit_smem(cfg, lambda c: smem_estimate(c, bits, group_k, act_order), smem_limit)
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    k_tiles = -(-k // cfg.block_k)
    # GEMV programs are small (no staged tiles): several per multiprocessor keep enough loads in flight.
    waves = 4 if cfg.block_m <= 4 else 2
    return cfg.replace(split_k=choose_split_k(tiles, k_tiles, sm_count, waves))


def grouped_tile(cfg: TileConfig, block_m: int, m_pad: int, n: int, k: int, sm_count: int) -> TileConfig:
    """A dense tile ``cfg`` (chosen for ``block_m`` rows) made fit for a grouped MoE kernel: its ``block_m``
    cut to the largest of 16, 32, 64, 128 that divides the routing ``block_m`` (one expert per tile), and
    split-K counted over every tile of ``m_pad`` rows (the routing is never read on the host)."""
    tile_m = max(bm for bm in (16, 32, 64, 128) if block_m % bm == 0 and bm <= max(cfg.block_m, 16))
    tiles = -(-m_pad // tile_m) * -(-n // cfg.block_n)
    split = choose_split_k(tiles, -(-k // cfg.block_k), sm_count)
    return cfg.replace(block_m=tile_m, split_k=split, dequant_first=False)


def finish_split_k(workspace, out, bias, expert_ids, route_bm: int) -> None:
    """Write the fp32 split-K ``workspace`` ``[M, N]`` into ``out``: plus ``bias`` for a dense call (a grouped
    kernel adds its per-expert bias itself); rows of skipped grouped blocks (expert -1) keep what ``out`` held."""
    if expert_ids is None:
        if bias is not None:
            workspace += bias.to(workspace.dtype)
        out.copy_(workspace)
    else:
        rows = (expert_ids >= 0).repeat_interleave(route_bm)[:, None]
        out.copy_(workspace.where(rows, out))
