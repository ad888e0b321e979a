"""Tuning of the Triton WnA16 GEMM: tile configurations per M bucket (speed only, never numerics).

:func:`wna16_config` is a pure function of the problem ``(M, N, K, bits)`` and the device's multiprocessor
count; no autotuning runs in the hot path. Every config computes the same function: split-K only changes
the fp32 summation order, within the tolerances the tests state.

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

__all__ = ["MIN_GROUPED_BLOCK_M", "TileConfig", "choose_split_k", "finish_split_k", "grouped_tile", "wna16_config"]

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


def choose_split_k(tiles: int, k_tiles: int, sm_count: int, waves: int = 2) -> int:
    """Split K until the grid covers the multiprocessors ``waves`` times, keeping >= 4 K tiles per split."""
    split = 1
    while tiles * split < waves * sm_count and k_tiles // (split * 2) >= 4:
        split *= 2
    return split


def _gemv_tile(cfg: TileConfig, group_k: int) -> TileConfig:
    """GEMV tiles that hold whole scale groups of one value per row (``block_k <= group_k``), so the
    kernel applies one scale per row and never changes layouts; ~1024 words per iteration."""
    block_k = min(cfg.block_k, group_k) if group_k else cfg.block_k
    block_k = max(block_k, 32)
    block_n = max(8, min(64, 8192 // block_k)) // cfg.block_m
    return cfg.replace(block_k=block_k, block_n=max(block_n, 8))


def wna16_config(m: int, n: int, k: int, bits: int, sm_count: int, group_k: int = 0) -> TileConfig:
    """The tile configuration for ``x [m, k] @ W[n, k]^T`` with ``bits``-bit weights in scale groups of
    ``group_k`` along K (0: one group per row) on a device with ``sm_count`` multiprocessors."""
    cfg = next(c for bound, c in _BUCKETS if bound is None or m <= bound)
    if cfg.block_m <= 4:
        cfg = _gemv_tile(cfg, group_k)
    if 32 % bits:  # fields straddle words: each element reads its two words, so keep the staged tiles small
        cfg = cfg.replace(block_k=min(cfg.block_k, 64))
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
