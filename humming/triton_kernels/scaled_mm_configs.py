"""Tuning of the Triton scaled GEMM (W8A8 / W4A8 / W4A4): tile configurations per M bucket (speed only).

:func:`scaled_mm_config` is a pure function of the problem ``(M, N, K)``, the tensor-core operand width,
the promotion step, the capability (a bucket table per family) and the device's multiprocessor count and
shared memory per block (tiles shrink to fit the shared memory, as the WnA16 ones, and the registers: the
accumulators per thread); no autotuning runs in the hot path. Where a scale changes along K the compute plan
fixes the promotion step (numerics), and the tile's ``block_k`` is capped to divide it, so tuning never
moves a promotion boundary.
"""

from __future__ import annotations

import functools

from .configs import TileConfig, fit_smem

__all__ = [
    "ACC_WORDS",
    "DECODES",
    "ScaledMMConfig",
    "buckets",
    "fit_registers",
    "min_block_k",
    "scaled_mm_config",
    "smem_estimate",
]


#: The scaled GEMM launches with the WnA16 kernel's tile parameters (``dequant_first`` does not apply to it).
ScaledMMConfig = TileConfig


#: (largest M of the bucket, config) for 8-bit tensor-core operands (int8, e4m3): K tiles of 128 bytes, per
#: capability family (:func:`_family`). sm_90 (wgmma, 227 KB of shared memory): one 64-row warpgroup MMA per
#: 4 warps, four stages of cp.async but three for the 64 x 64 tiles (the faster of three to five for each
#: bucket in bench/results/h200/triton_gemm.json, fp8 per-channel and 128 x 128 blocks); sm_89 / sm_80 /
#: sm_86 (mma.sync, 99-163 KB): three stages.
_BUCKETS_8BIT = {
    "sm90": (
        (16, ScaledMMConfig(16, 64, 128, num_warps=4, num_stages=4)),
        (64, ScaledMMConfig(64, 64, 128, num_warps=4, num_stages=3)),
        (256, ScaledMMConfig(128, 128, 128, num_warps=8, num_stages=4)),
        (None, ScaledMMConfig(128, 256, 128, num_warps=8, num_stages=4)),
    ),
    "mma": (
        (16, ScaledMMConfig(16, 64, 128, num_warps=4, num_stages=4)),
        (64, ScaledMMConfig(64, 64, 128, num_warps=4, num_stages=3)),
        (256, ScaledMMConfig(128, 128, 128, num_warps=8, num_stages=3)),
        (None, ScaledMMConfig(128, 256, 128, num_warps=8, num_stages=3)),
    ),
}
#: The same for 16-bit operands (fp16 / bf16 upcasting paths) and fp32 (pre-Ampere bf16 fallback).
_BUCKETS_16BIT = {
    "sm90": (
        (16, ScaledMMConfig(16, 64, 64, num_warps=4, num_stages=4)),
        (64, ScaledMMConfig(64, 64, 64, num_warps=4, num_stages=4)),
        (256, ScaledMMConfig(128, 128, 64, num_warps=8, num_stages=3)),
        (None, ScaledMMConfig(128, 256, 64, num_warps=8, num_stages=3)),
    ),
    "mma": (
        (16, ScaledMMConfig(16, 64, 64, num_warps=4, num_stages=4)),
        (64, ScaledMMConfig(64, 64, 64, num_warps=4, num_stages=3)),
        (256, ScaledMMConfig(128, 128, 64, num_warps=8, num_stages=3)),
        (None, ScaledMMConfig(128, 256, 64, num_warps=8, num_stages=3)),
    ),
}
#: How a weight reaches the MMA (:func:`scaled_mm_config`'s ``decode``): ``"none"`` (8-bit codes fed as they
#: are), ``"lean"`` (integer codes of whole-word fields without zero points), ``"zero_points"`` (integer codes
#: with zero points), ``"other"`` (fields straddling words, lookup tables, float fields).
DECODES = ("none", "lean", "zero_points", "other")
#: sm_90 tables of 8-bit operands where the weight's decode changes what fits in registers
#: (bench/results/cpu-sass/triton_w4a8_warps.md, triton 3.6 and 3.9): a lean decode runs the 128 x 64 tile on
#: one warpgroup (64 accumulator words and the decode within 255 registers, no spills), so that two blocks
#: share a multiprocessor where the 8-warp tile holds it alone (the faster at M >= 256 in
#: bench/results/h200/triton_gemm.json, variant m128n64w4); a zero-point decode spills its zero tiles on one
#: warpgroup at up to 64 rows, so those tiles take two.
_SM90_DECODE_BUCKETS = {
    "lean": (*_BUCKETS_8BIT["sm90"][:2], (None, ScaledMMConfig(128, 64, 128, num_warps=4, num_stages=4))),
    "zero_points": (
        (16, ScaledMMConfig(16, 64, 128, num_warps=8, num_stages=4)),
        (64, ScaledMMConfig(64, 64, 128, num_warps=8, num_stages=3)),
        *_BUCKETS_8BIT["sm90"][2:],
    ),
}
#: fp32 accumulator words per thread a tile may hold, (per accumulator tile, in all): ``block_m * block_n /
#: threads`` per tile, two tiles where each K step's product is promoted into a second one. Per capability
#: family and decode (a decode's temporaries need registers too); the largest tiles whose compiled K loops
#: stay within 255 registers without spills on triton 3.6-3.9 (bench/results/cpu-sass/triton_scaled_mm.md,
#: triton_w4a8_warps.md). mma.sync also holds both operands' fragments per thread.
ACC_WORDS = {
    "sm90": {"none": (128, 128), "lean": (64, 128), "zero_points": (64, 64), "other": (64, 64)},
    "mma": {"none": (64, 128), "lean": (32, 64), "zero_points": (32, 64), "other": (32, 64)},
}


def _family(capability: tuple[int, int]) -> str:
    """The bucket table of a capability: ``sm90`` (wgmma: Hopper) or ``mma`` (mma.sync: Turing to Ada, and
    the Blackwell parts, whose Triton 8-bit path also tiles like it)."""
    return "sm90" if capability == (9, 0) else "mma"


def buckets(operand_bits: int, capability: tuple[int, int], decode: str = "none"):
    """The (largest M, config) buckets for ``operand_bits``-wide tensor-core operands on ``capability``, for a
    weight reaching the MMA by ``decode`` (one of :data:`DECODES`)."""
    family = _family(capability)
    if operand_bits == 8 and family == "sm90" and decode in _SM90_DECODE_BUCKETS:
        return _SM90_DECODE_BUCKETS[decode]
    return (_BUCKETS_8BIT if operand_bits == 8 else _BUCKETS_16BIT)[family]


def fit_registers(cfg: ScaledMMConfig, capability: tuple[int, int], accumulators: int, decode: str) -> ScaledMMConfig:
    """``cfg`` with ``block_n`` (then ``block_m``) halved, down to 64 (``block_m``: 16), until its
    ``accumulators`` fp32 tiles fit :data:`ACC_WORDS` of ``capability`` and ``decode``."""
    per_tile, total = ACC_WORDS[_family(capability)][decode]
    words = lambda c: c.block_m * c.block_n // (32 * c.num_warps)
    while words(cfg) > per_tile or words(cfg) * accumulators > total:
        if cfg.block_n > 64 and cfg.block_n >= cfg.block_m:
            cfg = cfg.replace(block_n=cfg.block_n // 2)
        elif cfg.block_m > 16:
            cfg = cfg.replace(block_m=cfg.block_m // 2)
        else:
            break
    return cfg


def min_block_k(operand_bits: int) -> int:
    """The smallest ``block_k`` for ``operand_bits``-wide tensor-core operands: 32 bytes of K (tl.dot's
    minimum). A promotion step must be a multiple of it for power-of-two tiles to divide the step."""
    return 256 // operand_bits


def _split_k(tiles: int, k_tiles: int, sm_count: int) -> int:
    """Split K until the grid covers the multiprocessors about twice, keeping >= 4 K tiles per split."""
    split = 1
    while tiles * split < 2 * sm_count and k_tiles // (split * 2) >= 4:
        split *= 2
    return split


def smem_estimate(cfg: ScaledMMConfig, operand_bits: int, weight_bits: int, fold: bool = False) -> int:
    """Bytes of shared memory the scaled GEMM asks for with tile ``cfg``: an upper bound, as
    :func:`.wna16_configs.smem_estimate` for the WnA16 kernel. ``num_stages - 1`` copies of the K loop's loads
    (activation codes ``[BM, BK]`` bytes; weight codes as bytes or words, two ``[BN, BK]`` int32 tiles where
    fields straddle words; with ``fold``, fp8 scale tiles ``[BM, BK]`` and ``[BN, BK]``: only fp8 scales fold) plus
    both dot operands staged once in the operand type. Calibrated against ``compiled.metadata.shared``
    (tests/test_triton_smem.py checks every chooser result)."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    per_field = 32 % weight_bits or bk < 32 // weight_bits  # _weight_tile.unpack_tile's per-field path
    words = bn * bk * 8 if per_field else -(-bn * bk * weight_bits // 8)
    per_stage = bm * bk + words + bn * 8 + (bm + bn) * bk * fold
    staged = (bm + bn) * bk * operand_bits // 8
    if per_field and bm < 64:  # the per-field decode below a warpgroup's 64 rows stages the weight operand twice
        staged += bn * bk * operand_bits // 8
    return (cfg.num_stages - 1) * per_stage + staged


@functools.lru_cache(maxsize=4096)  # a pure function that every call asks (tens of microseconds of Python)
def scaled_mm_config(
    m: int,
    n: int,
    k: int,
    operand_bits: int,
    k_step: int,
    weight_bits: int = 8,
    sm_count: int = 1,
    smem_limit: int = 0,
    fold: bool = False,
    capability: tuple[int, int] = (9, 0),
    accumulators: int = 1,
    decode: str = "none",
) -> ScaledMMConfig:
    """The tile configuration for ``[m, k] x [n, k]^T`` with ``operand_bits``-wide tensor-core operands and
    ``weight_bits``-wide codes on ``sm_count`` multiprocessors with ``smem_limit`` bytes of shared memory
    per block (0: no limit; ``fold``: the plan folds scales into the operands, see :func:`smem_estimate`);
    ``k_step`` (0 = free) is the promotion step that ``block_k`` must divide; ``capability`` picks the bucket
    table with ``decode`` (one of :data:`DECODES`), ``accumulators`` and ``decode`` the register fit
    (:func:`fit_registers`). Split-K (fp32 atomics) only changes the fp32 summation order."""
    cfg = next(c for bound, c in buckets(operand_bits, capability, decode) if bound is None or m <= bound)
    cfg = fit_registers(cfg, capability, accumulators, decode)
    if 32 % weight_bits:
        # 3/5/6/7-bit codes straddle words: two int32 tiles per stage (fit the shared memory), and K tiles of
        # 64, since their decode spills at 128 on every tile and both triton 3.6 and 3.9
        # (bench/results/cpu-sass/triton_w4a8_warps.md)
        cfg = cfg.replace(
            block_n=min(cfg.block_n, 128), block_k=min(cfg.block_k, 64), num_stages=min(cfg.num_stages, 2)
        )
    block_k = cfg.block_k
    if k_step:
        block_k = min(block_k, k_step & -k_step)  # the largest power of two dividing the step
    # Small K: one tile spans it (never below the tensor cores' minimum: 32 bytes of K).
    min_k = min_block_k(operand_bits)
    cfg = cfg.replace(block_k=max(min_k, min(block_k, 1 << max(k - 1, 1).bit_length())))
    cfg = fit_smem(cfg, lambda c: smem_estimate(c, operand_bits, weight_bits, fold), smem_limit, min_k)
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    return cfg.replace(split_k=_split_k(tiles, -(-k // cfg.block_k), sm_count))
