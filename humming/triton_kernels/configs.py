"""The tile configuration both Triton GEMMs launch with (:class:`TileConfig`; the WnA16 buckets are in
:mod:`.wna16_configs`, the scaled GEMM's in :mod:`.scaled_mm_configs`) and what they share to choose one:
split-K, fitting a tile in shared memory, cutting a dense tile for the grouped (MoE) kernels."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..device import KNOWN_LIMITS, DeviceLimits

__all__ = ["CAPABILITY_LIMITS", "MIN_GROUPED_BLOCK_M", "TileConfig", "choose_split_k", "fit_smem", "grouped_tile"]

#: The smallest tile M of the grouped (MoE) kernels (``tl.dot`` needs M >= 16); tiles divide the routing block.
MIN_GROUPED_BLOCK_M = 16


#: The limits of a representative GPU of each capability the Triton path serves (A100, A10 / RTX 3090, L40S,
#: H200): what the plan checks (tests/test_triton_smem.py) and the SASS reader (bench/tools/triton_gemm_sass.py)
#: choose tiles for without the device at hand. Every capability also has 64K 32-bit registers per
#: multiprocessor and at most 255 per thread (the compiled kernels' ``n_regs`` and ``n_spills`` are checked).
CAPABILITY_LIMITS = {
    (8, 0): DeviceLimits(sm_count=108, smem_per_block=166912, smem_per_sm=167936),
    (8, 6): DeviceLimits(sm_count=84, smem_per_block=101376, smem_per_sm=102400),
    (8, 9): DeviceLimits(sm_count=142, smem_per_block=101376, smem_per_sm=102400),
    (9, 0): KNOWN_LIMITS["NVIDIA H200"],
}


@dataclass(frozen=True)
class TileConfig:
    """One launch configuration of a Triton GEMM (the WnA16 kernel, and the scaled GEMM as ScaledMMConfig)."""

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
    #: Few tokens on tensor cores with the operands swapped (the WnA16 ``_wna16_swap_kernel``: the weight tile
    #: is the MMA's large side, the ``block_m`` (16) tokens its narrow one). Same numerics as the tiled kernel.
    swap: bool = False

    def __post_init__(self) -> None:
        counts = ("block_m", "block_n", "block_k", "split_k", "group_m", "num_warps", "num_stages")
        bad = [f"{name}={getattr(self, name)!r}" for name in counts if not isinstance(getattr(self, name), int)]
        bad += [f"{name}={getattr(self, name)}" for name in counts if not bad and getattr(self, name) < 1]
        if bad:
            raise ValueError(f"TileConfig: expected positive integers, got {', '.join(bad)}")

    @property
    def gemv(self) -> bool:
        """Whether the WnA16 kernel it selects is the GEMV one (``block_m <= 4`` without ``swap``)."""
        return self.block_m <= 4 and not self.swap

    def replace(self, **overrides) -> TileConfig:
        """A copy with some fields changed; an unknown field name is an error."""
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"TileConfig: unknown field(s) {sorted(unknown)}; known: {list(self.__dict__)}")
        return dataclasses.replace(self, **overrides)

    def name(self) -> str:
        c = self
        tiles = f"m{c.block_m}n{c.block_n}k{c.block_k}s{c.split_k}g{c.group_m}w{c.num_warps}st{c.num_stages}"
        return tiles + ("-dequant-first" if c.dequant_first else "") + ("-swap" if c.swap else "")


def choose_split_k(tiles: int, k_tiles: int, sm_count: int, waves: int = 2, min_k_tiles: int = 4) -> int:
    """Split K until the grid covers the multiprocessors ``waves`` times, keeping >= ``min_k_tiles`` K tiles
    per split."""
    split = 1
    while tiles * split < waves * sm_count and k_tiles // (split * 2) >= min_k_tiles:
        split *= 2
    return split


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


def grouped_tile(cfg: TileConfig, block_m: int, m_pad: int, n: int, k: int, sm_count: int) -> TileConfig:
    """A dense tile ``cfg`` (chosen for ``block_m`` rows) made fit for a grouped MoE kernel: its ``block_m``
    cut to the largest of 16, 32, 64, 128 that divides the routing ``block_m`` (one expert per tile), and
    split-K counted over every tile of ``m_pad`` rows (the routing is never read on the host)."""
    tile_m = max(bm for bm in (16, 32, 64, 128) if block_m % bm == 0 and bm <= max(cfg.block_m, 16))
    tiles = -(-m_pad // tile_m) * -(-n // cfg.block_n)
    split = choose_split_k(tiles, -(-k // cfg.block_k), sm_count)
    return cfg.replace(block_m=tile_m, split_k=split, dequant_first=False, swap=False)
