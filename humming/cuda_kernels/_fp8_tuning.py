"""Tuning of the FP8 GEMM (:mod:`humming.cuda_kernels.fp8_gemm`): the speed-only knobs (:class:`Fp8Tuning`),
the shared memory they take (:func:`smem_bytes`), and the heuristics that choose them, pure functions of the
problem and the device limits."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..device import DeviceLimits
from ..ir.weight import cdiv
from ..reference.align import max_slots
from .jit import per_call_cache

_BK = 128  # K per pipeline stage
_TILE_BYTES = 4096  # one 64-row x 128-K tile of 4-bit codes
_OFFSET_BYTES = 256  # MXFP4: the table offsets of a tile's 64 rows x 4 k-steps, after its codes
_BLOCK_M_CHOICES = (8, 16, 32, 64, 128)
_MIN_SPLIT_KB = 8  # K blocks of 128 per split at least: a split still fills a few pipeline stages
#: K blocks of 128 below which one split runs: a short K's tiles are quick, and the split's fixed costs (the
#: workspace's memset, the red.adds, the rounding copy) outweigh the slots it fills
_MIN_SPLIT_K_BLOCKS = 32
_PRODUCER_REGS = 40
#: Up to this many tokens, 4-bit weights' 128-token tiles promoted at every K block run as two 64-token halves:
#: faster there, slower at large M where the tiles keep the tensor core busy without them
#: (bench/results/h100/token_halves_2026-12-06/fp8_near_defaults.json)
_TOKEN_HALVES_MAX_M = 1024


@dataclass(frozen=True)
class Fp8Tuning:
    """Speed-only knobs: consumer warpgroups (``wgs``, 64 weight rows each), tokens per block
    (``block_m``, the wgmma N), pipeline ``stages``, blocks per SM the registers are sized for
    (``min_blocks``), token tiles per raster group (``group_m``), the epilogue's store (``tma_store``:
    stmatrix + TMA store, else plain global stores), the number of contiguous K ranges (``splits``,
    grid.z; above 1 the kernel adds fp32 partial sums into a workspace, with plain stores) and whether the
    grid is ``persistent``: one block per block slot (``sm_count * min_blocks``), each walking the tiles
    ``b, b + grid, ...`` with its stage ring running on across them, so that a tile's first loads overlap the
    epilogue of the one before (one split only; grouped blocks skip the tiles of unused segments), and the K
    blocks of 128 the tensor core sums before each promotion to fp32 (``promote_blocks``, 1, 2 or 4; above 1 applies
    where the scales wait for the epilogue and tiles are 128 tokens, :meth:`promotes_every`), and whether 4-bit
    weights' conversions read the next K block's codes from shared memory (``prefetch_codes``), so that the loads'
    latency passes behind the wgmma issue rather than at the start of the next conversion (tiles of more than 64
    tokens: with two accumulator sets ptxas moves the decoding out from under the wgmmas), and whether 128-token tiles
    promoted at every K block issue each block's wgmmas as two groups of 64 tokens (``token_halves``), so that each
    half's promotion runs while the other half's wgmmas do, and whether split-K's last split to finish a tile reads
    its sums back from a workspace that stays zero between calls and writes the output (``read_back``), which saves
    the host's memset and rounding copy."""

    wgs: int
    block_m: int
    stages: int
    min_blocks: int
    group_m: int = 8
    tma_store: bool = True
    splits: int = 1
    persistent: bool = False
    promote_blocks: int = 1
    prefetch_codes: bool = False
    token_halves: bool = False
    read_back: bool = False

    def __post_init__(self):
        if isinstance(self.splits, bool) or not isinstance(self.splits, int) or self.splits < 1:
            raise ValueError(f"splits: expected an int >= 1, got {self.splits!r}")
        if self.persistent and self.splits > 1:
            raise ValueError(f"persistent: a persistent grid runs one split, got splits={self.splits}")
        if self.promote_blocks not in (1, 2, 4):
            raise ValueError(f"promote_blocks: expected 1, 2 or 4, got {self.promote_blocks!r}")
        if self.read_back and self.splits == 1:
            raise ValueError("read_back: the read-back is split-K's, got splits=1")

    def promotes_every(self, scale_mode: str) -> int:
        """K blocks per promotion for weights of ``scale_mode``: ``promote_blocks`` with scales applied in the
        epilogue (``rowcol``) and 128-token tiles (one accumulator set), else 1."""
        return self.promote_blocks if scale_mode == "rowcol" and self.block_m == 128 else 1

    def reads_codes_ahead(self, w_format: str) -> bool:
        """Whether conversions read the next K block's codes ahead for weights of ``w_format``:
        ``prefetch_codes`` for 4-bit weights on tiles of more than 64 tokens (one accumulator set), else no."""
        return self.prefetch_codes and w_format != "e4m3" and self.block_m > 64

    def issues_token_halves(self, w_format: str, scale_mode: str) -> bool:
        """Whether K blocks' wgmmas run as two groups of 64 tokens for weights of ``w_format`` / ``scale_mode``:
        ``token_halves`` on 128-token tiles promoted at every K block (scales that change along K, or one K block
        per promotion), else no; not for MXFP4 with codes read ahead, whose tables and codes in flight then leave
        too few registers (ptxas spills)."""
        return (
            self.token_halves
            and self.block_m == 128
            and self.promotes_every(scale_mode) == 1
            and not (w_format == "mxfp4" and self.reads_codes_ahead(w_format))
        )

    def grid_blocks(self, tiles: int, limits: DeviceLimits) -> int:
        """Blocks along grid.x for ``tiles`` tiles: one per tile, or one per block slot when persistent."""
        return min(tiles, limits.sm_count * self.min_blocks) if self.persistent else tiles

    @property
    def block_n(self) -> int:
        return 64 * self.wgs

    @property
    def threads(self) -> int:
        return 128 * (self.wgs + 1)

    def registers(self) -> tuple[int, int]:
        """(producer, consumer) registers per thread after ``setmaxnreg``: the producer gives up what the
        consumers take, within the per-thread cap that ``__launch_bounds__`` sets."""
        cap = min(255, 65536 // (self.threads * self.min_blocks)) // 8 * 8
        consumer = (cap * self.threads - _PRODUCER_REGS * 128) // (128 * self.wgs) // 8 * 8
        return _PRODUCER_REGS, min(240, consumer)


def smem_bytes(wgs: int, block_m: int, stages: int, w_format: str = "e4m3") -> int:
    """Dynamic shared memory of one block (mirrors ``SmemLayout`` in the header)."""
    tile = 64 * _BK if w_format == "e4m3" else _TILE_BYTES + (_OFFSET_BYTES if w_format == "mxfp4" else 0)
    stage = cdiv(wgs * tile, 1024) * 1024 + block_m * _BK  # weight tiles padded to whole swizzle atoms
    table = 16 if w_format == "int4" else 0  # int4: the code table's words
    return 1024 + stages * stage + wgs * block_m * 128 + 16 * stages + table


@per_call_cache
def choose_tuning(m: int, n: int, k: int, limits: DeviceLimits, w_format: str = "e4m3") -> Fp8Tuning:
    """Tuning for ``out[m, n] = x[m, k] @ W[n, k]^T``: a pure function of the problem and the device.

    The tile tuning (:func:`choose_tile_tuning`), split along K (:func:`choose_split_tuning`) for the 4-bit
    weight formats, whose tiles are cheap to read, so that splits fill the block slots a small grid leaves
    empty; e4m3 weights keep one split, where the fp32 reduction of splits costs more than the fill gains.
    """
    if w_format in ("int4", "mxfp4"):
        return choose_split_tuning(m, n, k, limits, w_format)
    return choose_tile_tuning(m, n, k, limits, w_format)


def choose_tile_tuning(m: int, n: int, k: int, limits: DeviceLimits, w_format: str = "e4m3") -> Fp8Tuning:
    """One split: tokens per block, the smallest wgmma N that covers ``m`` (at most 128). Two consumer
    warpgroups (128 weight rows) when that still gives every SM a block, else one (64 rows, two blocks per
    SM) so that small-M calls spread the weight stream over the whole GPU. Stages: as many as shared memory
    holds. 128-token tiles: a persistent grid where they outnumber the block slots (a tile's first loads
    overlap the epilogue of the one before); 4-bit weights sum four K blocks per promotion (applied where the
    scales wait for the epilogue: int4 per channel, MXFP4 folded per row), and where they promote at every K
    block, run each block as two 64-token halves up to ``_TOKEN_HALVES_MAX_M`` tokens. Measured:
    bench/results/h100/fp8_persistent_2026-12-06/, bench/results/h100/token_halves_2026-12-06/."""
    block_m = next((b for b in _BLOCK_M_CHOICES if b >= m), _BLOCK_M_CHOICES[-1])
    tuning = _fill_tuning(block_m, cdiv(n, 128) * cdiv(m, block_m), limits, w_format)
    if block_m == _BLOCK_M_CHOICES[-1]:
        walks = cdiv(n, tuning.block_n) * cdiv(m, block_m) > limits.sm_count * tuning.min_blocks
        halves = w_format in ("int4", "mxfp4") and m <= _TOKEN_HALVES_MAX_M
        promote = 4 if w_format in ("int4", "mxfp4") else 1
        tuning = dataclasses.replace(tuning, persistent=walks, promote_blocks=promote, token_halves=halves)
    return tuning


def choose_split_tuning(m: int, n: int, k: int, limits: DeviceLimits, w_format: str = "e4m3") -> Fp8Tuning:
    """:func:`choose_tile_tuning` plus split-K where its tile grid leaves block slots empty: a pure function.

    ``splits`` = how many copies of the tile grid fit in the block slots (``sm_count * min_blocks // tiles``,
    one wave), at most one split per ``_MIN_SPLIT_KB`` K blocks; 1 when the tiles fill the slots or K has fewer
    than ``_MIN_SPLIT_K_BLOCKS`` blocks (bench/results/h100/fp8_prefetch_2026-12-06/fp8_splitk.json).
    """
    tuning = choose_tile_tuning(m, n, k, limits, w_format)
    tiles = cdiv(n, tuning.block_n) * cdiv(m, tuning.block_m)
    k_blocks = cdiv(k, _BK)
    if k_blocks < _MIN_SPLIT_K_BLOCKS:
        return tuning
    splits = min(limits.sm_count * tuning.min_blocks // tiles, k_blocks // _MIN_SPLIT_KB)
    return dataclasses.replace(tuning, splits=max(1, splits))


def choose_grouped_tuning(
    block_m: int, m_pad: int, n: int, num_experts: int, limits: DeviceLimits, w_format: str = "e4m3"
) -> Fp8Tuning:
    """Tuning of the grouped kernel for ``M_pad`` grouped rows in segments of ``block_m``: a pure function.

    Tokens per block: the largest wgmma N (at most 128) that divides ``block_m``, so that a tile never spans
    two segments. Warpgroups and stages as :func:`choose_tuning`, over the segments in use at most (the
    routing is not read on the host): ``M_pad`` holds at most ``S`` slots (``max_slots``), and ``S`` slots
    fill at most ``S // block_m + min(E, S)`` segments.
    """
    tile = next(b for b in reversed(_BLOCK_M_CHOICES) if block_m % b == 0)
    slots = max(1, max_slots(m_pad, num_experts, block_m))
    segments = min(m_pad // block_m, slots // block_m + min(num_experts, slots))
    return _fill_tuning(tile, cdiv(n, 128) * segments * (block_m // tile), limits, w_format)


def _fill_tuning(block_m: int, tiles: int, limits: DeviceLimits, w_format: str) -> Fp8Tuning:
    """Two consumer warpgroups when ``tiles`` 128-row tiles give every SM a block, else one (two blocks per
    SM); as many stages as shared memory holds."""
    wgs = 2 if tiles >= limits.sm_count else 1
    min_blocks = 1 if wgs == 2 else 2
    budget = min(limits.smem_per_block, limits.smem_per_sm // min_blocks - 1024)
    stages = 2
    while stages < 16 and smem_bytes(wgs, block_m, stages + 1, w_format) <= budget:
        stages += 1
    return Fp8Tuning(wgs, block_m, stages, min_blocks)
