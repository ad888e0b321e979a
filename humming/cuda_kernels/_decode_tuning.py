"""Tuning of the small-M weight-only GEMM (:mod:`.wna16_decode`): :class:`DecodeTuning`, the speed-only
knobs, and :func:`choose_decode_tuning`, a pure function of the problem and the device's limits."""

from __future__ import annotations

from dataclasses import dataclass

from ..device import device_limits
from .jit import per_call_cache

__all__ = ["DecodeTuning", "candidate_tunings", "choose_decode_tuning", "default_tuning", "stream_k_blocks_per_sm"]


@dataclass(frozen=True)
class DecodeTuning:
    """Speed-only knobs: token tiles of 8 (``mt``), 16-row tiles per warp (``r``), ``warps`` per block,
    cp.async pipeline ``stages`` (chunks in flight per thread), blocks along K (``splits``),
    ``stream_k``: 0 for one block per ``r`` row tiles, else the blocks per SM of the persistent stream-K
    grid (also the kernel's ``__launch_bounds__`` minimum, so registers allow that many), and ``read_back``:
    split-K with several token tiles reads back too (:attr:`reads_back`)."""

    mt: int
    r: int
    warps: int
    stages: int
    splits: int
    stream_k: int = 0
    read_back: bool = False

    def __post_init__(self) -> None:
        if self.stream_k < 0 or (self.stream_k and (self.splits != 1 or 8 % self.r)):
            raise ValueError(f"stream_k: expected 0, or > 0 with splits=1 and r dividing 8; got {self}")
        if self.read_back and self.splits == 1:
            raise ValueError(f"read_back: the read-back is split-K's, got {self}")

    @property
    def reads_back(self) -> bool:
        """Split-K with one token tile (or ``read_back``): the blocks add into the fp32 workspace and the
        tile's last block writes the output (one launch). With more token tiles that single block's read-back
        measured costlier than the memset, the fp32 output and the rounding copy it saves on the GPU, so those
        add into an fp32 output unless ``read_back`` (which saves the host those two torch calls; the default for
        two token tiles, :func:`candidate_tunings`)."""
        return self.splits > 1 and (self.mt == 1 or self.read_back)

    def smem_bytes(self, bits: int) -> int:
        """Dynamic shared memory: the pipeline (``Pipeline`` in decode.cuh), which the tile grid's warps
        reuse for their partial sums (``run_tiles``)."""
        per_thread = self.r * (bits // 4) * 16 + self.mt * 32 + self.r * 8 + self.r * 4
        partials = self.r * self.mt * 16
        return self.warps * 32 * max(self.stages * per_thread, partials)


@per_call_cache
def choose_decode_tuning(
    m: int, n: int, k: int, bits: int, sm_count: int, smem_per_block: int, smem_per_sm: int
) -> DecodeTuning:
    """Tuning for ``out[m, n] = x[m, k] @ W^T`` with ``bits``-bit weights: a pure function of the problem
    and the device's SM count, shared memory per block (``sharedMemPerBlockOptin``) and per SM.

    Tile grid or its stream-K twin (:func:`candidate_tunings`): stream-K with eight token tiles where the tile
    grid takes more than one wave (its persistent warps balance the last wave of the largest tiles), the tile
    grid otherwise, where several small blocks per SM hide the weight stream's latency better than the
    persistent grid and its fp32 workspace (bench/results/h100/decode_2026-12-06/decode_*.json). Split-K
    tile grids keep split-K."""
    tiles, stream_k = candidate_tunings(m, n, k, bits, sm_count, smem_per_block, smem_per_sm)
    if tiles.mt < 8 or tiles.splits > 1:
        return tiles
    waves = (n // (16 * tiles.r)) / (stream_k.stream_k * sm_count)
    return stream_k if waves > 1 else tiles


def candidate_tunings(
    m: int, n: int, k: int, bits: int, sm_count: int, smem_per_block: int, smem_per_sm: int
) -> tuple[DecodeTuning, DecodeTuning]:
    """The tile-grid tuning (split-K when there are too few row tiles) and its stream-K twin (the same
    token tiles, row tiles, warps and stages on a persistent grid)."""
    mt = 1
    while mt * 8 < m:
        mt *= 2
    # Two row tiles per warp halve the per-chunk overhead (activation fragments, pipeline bookkeeping)
    # per weight byte; one with one token tile when that would leave SMs without a block (split-K fills
    # them better with single row tiles), and with eight token tiles of 8-bit weights (registers); four
    # with four token tiles where every SM still gets two blocks.
    r = 2 if n % 32 == 0 and (n // 32 >= sm_count or mt > 1) and (mt < 8 or bits == 4) else 1
    if mt == 4 and n % 64 == 0 and n // 64 >= 2 * sm_count:
        r = 4
    # Four warps, and pipelines as deep as the activation fragments allow: several small blocks per SM
    # interleave their loads. Fewer stages, then fewer row tiles, where shared memory is short.
    warps = 4
    stages = {1: 4, 2: 3, 4: 2, 8: 2}[mt]
    while stages > 2 and DecodeTuning(mt, r, warps, stages, 1).smem_bytes(bits) > smem_per_block:
        stages -= 1
    while r > 1 and DecodeTuning(mt, r, warps, stages, 1).smem_bytes(bits) > smem_per_block:
        r //= 2
    chunks = k // 64
    splits = 1
    if n // (16 * r) < sm_count:  # too few row tiles to fill the GPU: split K until 16-row tiles fill it twice
        splits = max(1, min(-(-2 * sm_count // (n // 16)), chunks // (warps * 2)))
    # Two token tiles read back too: one launch instead of the memset, the kernel and the rounding copy, at the
    # same GPU time; with four the read-back costs GPU time (bench/results/h100/dequant16_2026-12-07/
    # decode_read_back.json).
    tiles = DecodeTuning(mt, r, warps, stages, splits, read_back=splits > 1 and mt == 2)
    stream_k = DecodeTuning(mt, r, warps, stages, 1, stream_k_blocks_per_sm(tiles, bits, smem_per_sm))
    return tiles, stream_k


def stream_k_blocks_per_sm(tuning: DecodeTuning, bits: int, smem_per_sm: int) -> int:
    """Blocks per SM of the persistent grid: as many as shared memory (1 KiB reserved per block) and the
    SM's 64 warps allow, at most 2 (the kernel is built with ``__launch_bounds__(threads, that)``, so
    registers allow them; 2 x 8 warps with 3 stages is the tile grid's best occupancy on Hopper)."""
    return max(1, min(2, smem_per_sm // (tuning.smem_bytes(bits) + 1024), 64 // tuning.warps))


def default_tuning(m: int, n: int, k: int, bits: int, device: int) -> DecodeTuning:
    """:func:`choose_decode_tuning` with the limits of CUDA device ``device``."""
    return choose_decode_tuning(m, n, k, bits, *device_limits(device))
