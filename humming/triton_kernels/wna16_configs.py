"""Tuning of the Triton WnA16 GEMM: tile configurations per M bucket (speed only, never numerics).

:func:`wna16_config` is a pure function of the problem ``(M, N, K, bits, groups)`` and the device's
multiprocessor count and shared memory per block (the callers read both through
:func:`humming.device.device_limits`); no autotuning runs in the hot path. A bucket's tile that would not
fit the shared memory loses stages, then K and N width (:func:`~.configs.fit_smem`, on the conservative
:func:`smem_estimate`). Every config computes the same function: split-K only changes the fp32 summation
order, within the tolerances the tests state.

- M = 1: the GEMV kernel (no tensor cores: at decode the weight decode, not the multiply-adds, is the
  work): 128 rows of 16 words (32 for 8-bit codes) per iteration where fields fill whole words
  (:func:`_gemv_tile`), persistent: as many programs as the multiprocessors hold (``split_k`` times that),
  which deal the K tiles of all output tiles evenly (stream-K). 4-bit codes without zero points load each K
  tile one iteration ahead (two stages: :func:`._wna16_launch.gemv_prefetch`).
- M = 2..16: the swapped-operand tensor-core kernel (the 128-row weight tile is the MMA's large side, the
  16 token slots its narrow one), split along K until the grid covers the GPU four times (2048 columns of K
  per split at least) or else twice; 8-bit weights with K tiles of 64. Weights the packed 16-bit decode reads
  take :data:`_PACKED_SMALL_M`'s tiles. ``block_m`` 2 or 4 without ``swap`` still selects the GEMV kernel
  when a config asks for it.
- M up to 128: tensor-core tiles that grow with M, split along K until the grid covers the GPU twice.
- M > 128 without bias and with ``out_dtype == x.dtype``: ``dequant_first``, the weight dequantized once per
  call to the activations' dtype and one cuBLAS GEMM: one more pass over the weight, which cuBLAS's
  large-tile efficiency pays back at large M; weights the packed 16-bit decode reads keep the fused kernel up
  to :data:`_PACKED_FUSED_MAX_M` tokens.

Which of these, or a CUDA kernel, runs a call is the dispatcher's decision (``humming/dispatch/``, per-GPU
tables from ``python -m humming tune``); ``bench/results/<gpu>/`` holds the timings.
"""

from __future__ import annotations

from .configs import TileConfig, choose_split_k, fit_smem, grouped_tile

__all__ = ["TILED_16", "grouped_config", "smem_estimate", "wna16_config"]

#: (largest M of the bucket, config); the first bucket whose bound is >= M is used. ``block_m <= 4`` selects
#: the GEMV kernel (no tensor cores: for decode the weight decode, not the MACs, is the work).
_BUCKETS = (
    (1, TileConfig(1, 128, 128, num_warps=4, num_stages=2)),
    (16, TileConfig(16, 128, 128, num_warps=4, num_stages=3, swap=True)),
    (32, TileConfig(32, 64, 128, num_warps=4, num_stages=4)),
    (64, TileConfig(64, 64, 128, num_warps=4, num_stages=4)),
    (128, TileConfig(64, 128, 64, num_warps=4, num_stages=4)),
    (512, TileConfig(128, 128, 64, num_warps=8, num_stages=4, dequant_first=True)),
    (None, TileConfig(128, 256, 64, num_warps=8, num_stages=3, dequant_first=True)),
)

#: Tiles replacing :data:`_BUCKETS`' for weights with zero points, by bucket bound: the 4-warp 32- and 64-row
#: tiles spill their zero tiles (triton 3.6 and 3.9, sm_90 and sm_80); on 8 warps (the 64-row one with K
#: tiles of 64) they do not (bench/results/cpu-sass/triton_wna16_spills.md).
_ZERO_POINT_BUCKETS = {
    32: TileConfig(32, 64, 128, num_warps=8, num_stages=4),
    64: TileConfig(64, 64, 64, num_warps=8, num_stages=4),
}


#: The tiled kernel's 16-row tile (the grouped kernel's at ``block_m`` 16, where the swapped kernel does not run).
TILED_16 = TileConfig(16, 64, 256, num_warps=4, num_stages=4)

#: The M = 2..16 tiles of weights the packed 16-bit decode reads (:mod:`._dequant16`), by the kind of their codes:
#: decoding two weights per instruction, the swapped kernel keeps pace with 64-row weight tiles (more programs
#: in flight) for integer codes; e2m1 codes take the tiled kernel's 16-row tile
#: (bench/results/h100/dequant16_2026-12-07/: triton_packed_ab.json, triton_decode_flag_on_old_tiles.json). At
#: M = 1 both take the GEMV, whose e2m1 byte table outran the 16-row tile by 7-14%
#: (bench/results/h100/sweep_2026-12-07b/decode.json).
_PACKED_SMALL_M = {
    "int": TileConfig(16, 64, 128, num_warps=4, num_stages=3, swap=True),
    "float": TILED_16,
}

#: Up to this many tokens above 128, weights the packed decode reads stay on the fused 128-row tile: one pass over
#: the packed weight against dequantize-first's two over the 16-bit one, which at M = 256 ran as fast or faster;
#: at M = 1024 cuBLAS's tile efficiency wins (bench/results/h100/triton_2026-12-07/: triton_gemm.json,
#: triton_gemm_8192.json).
_PACKED_FUSED_MAX_M = 256
_PACKED_FUSED = TileConfig(128, 128, 64, num_warps=8, num_stages=3)


def _gemv_tile(cfg: TileConfig, bits: int, group_k: int, act_order: bool) -> TileConfig:
    """The GEMV tile. Fields that fill whole words in groups of whole words (the kernel's packed path): 16
    words of each of ``block_n`` rows per iteration, four per thread (16-byte loads), whatever the group
    (the kernel reads one scale per row and tile, group, or word, whichever is largest); 32 words for 8-bit
    fields, whose four per word leave the iteration's fixed work (the activations, the scales) too few
    weights at 16 (bench/results/h100/gemv_2026-12-07/decode_new.json: ``gemv-k*2``). Otherwise
    (3/5/6/7-bit fields, act-order): tiles inside one scale group along K (``block_k`` a power of two of at
    least 32 that divides ``group_k``), ~1024 weights per iteration."""
    per_word = 32 // bits if 32 % bits == 0 else 0
    if per_word and not act_order and group_k % per_word == 0:
        return cfg.replace(block_k=(32 if per_word <= 4 else 16) * per_word)
    block_k = min(256, group_k & -group_k) if group_k else 256
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
    without act-order; tests/test_triton_smem.py checks the chooser's results). The swapped-operand kernel
    stages the same tiles, its activations one stage more on some Triton versions, and a conversion of its
    weight tile or its accumulator (Triton's scratch space, counted as the larger of the two). The GEMV kernel
    (``block_m <= 4``) keeps its fp32 products in registers and reduces them through shared memory once: at
    most ``[BM, BN, BK]`` fp32; on its packed path (whole-word fields, one row) per-word sums
    ``[BN, BK / fields]`` and the activation tile it redistributes, counted twice.
    """
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    if bm <= 4 and not cfg.swap:
        per_word = 32 // bits if 32 % bits == 0 else 0
        if bm == 1 and per_word and not act_order and group_k % per_word == 0:
            return 2 * (bn * (bk // per_word) + bk) * 4
        return bm * bn * bk * 4
    words = bn * bk * 8 if 32 % bits else bn * bk * bits // 8
    if act_order:
        groups = bn * bk * 8
    else:
        groups = bn * max(bk // group_k, 1) * 8 if group_k else bn * 8
    per_stage = bm * bk * 2 + words + groups
    swapped = 0
    if cfg.swap:
        # triton 3.8 pipelines the activation tile one stage deeper than the weight's; the decoded tile may pass
        # through shared memory on its way to the MMA's register operand, or the accumulator on its way out
        swapped = bm * bk * 2 + max(bn * bk * 2, bm * bn * 4)
    return (cfg.num_stages - 1) * per_stage + swapped + (bm + bn) * bk * 2


def wna16_config(
    m: int,
    n: int,
    k: int,
    bits: int,
    sm_count: int,
    group_k: int = 0,
    smem_limit: int = 0,
    act_order: bool = False,
    zero_points: bool = False,
    packed: str = "",
) -> TileConfig:
    """The tile configuration for ``x [m, k] @ W[n, k]^T`` with ``bits``-bit weights in scale groups of
    ``group_k`` along K (0: one group per row, or ``act_order`` groups read through ``g_idx``), with or without
    ``zero_points``, read by the packed 16-bit decode (``packed``: ``"int"`` or ``"float"``, the kind of its
    codes) or not (``""``), on a device with ``sm_count`` multiprocessors and ``smem_limit`` bytes of shared
    memory per block (0: no limit); :func:`smem_estimate` of the result fits."""
    if packed and packed not in _PACKED_SMALL_M:
        raise ValueError(f"packed: expected '', 'int' or 'float' (the kind of codes decoded), got {packed!r}")
    bound, cfg = next((bound, c) for bound, c in _BUCKETS if bound is None or m <= bound)
    if zero_points:
        cfg = _ZERO_POINT_BUCKETS.get(bound, cfg)
    if packed and bound == 16:
        cfg = _PACKED_SMALL_M[packed]
    elif packed and cfg.dequant_first and m <= _PACKED_FUSED_MAX_M:
        cfg = _PACKED_FUSED
    elif cfg.swap and bits == 8:  # the weight bytes of the 4-bit tile (bench/results/h100/dequant16_2026-12-07/)
        cfg = cfg.replace(block_k=64)
    if cfg.block_m <= 4:
        cfg = _gemv_tile(cfg, bits, group_k, act_order)
        # loading ahead measured on 4-bit codes without zero points only (2-7% at M = 1 on an H100,
        # bench/results/h100/sweep_2026-12-07b/decode.json: gemv-st2)
        if bits != 4 or zero_points:
            cfg = cfg.replace(num_stages=1)
    if 32 % bits:  # fields straddle words: each element reads its two words, so keep the staged tiles small
        cfg = cfg.replace(block_k=min(cfg.block_k, 64))
    cfg = fit_smem(cfg, lambda c: smem_estimate(c, bits, group_k, act_order), smem_limit)
    if cfg.block_m <= 4 and not cfg.swap:
        return cfg.replace(split_k=1)  # the persistent GEMV: one wave
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    k_tiles = -(-k // cfg.block_k)
    # The swapped kernel's small programs (16 token slots): several per multiprocessor keep enough loads in
    # flight (bench/results/h200/triton_decode.json: the split variants at M = 1 .. 16). It goes to four
    # waves only while each split keeps 2048 columns of K (its partial sums are 16 rows wide), else to two
    # (bench/results/h100/triton_2026-12-07/triton_decode_split1024.json: shorter splits measured slower at
    # 8192 x 8192).
    if cfg.swap:
        split = max(
            choose_split_k(tiles, k_tiles, sm_count, waves=4, min_k_tiles=max(1, 2048 // cfg.block_k)),
            choose_split_k(tiles, k_tiles, sm_count, waves=2),
        )
    else:
        split = choose_split_k(tiles, k_tiles, sm_count, waves=2)
    return cfg.replace(split_k=split)


def grouped_config(
    m_pad: int,
    n: int,
    k: int,
    bits: int,
    block_m: int,
    sm_count: int,
    smem_limit: int = 0,
    group_k: int = 0,
    act_order: bool = False,
    zero_points: bool = False,
    e2m1: bool = False,
) -> TileConfig:
    """The tile of the grouped kernel: the dense tile for ``block_m`` rows (within ``smem_limit`` bytes of
    shared memory; 0: no limit), cut by :func:`grouped_tile` (a smaller ``block_m`` needs less); for e2m1
    codes (MXFP4, NVFP4) up to 64 rows, K tiles of :data:`E2M1_GROUPED_BLOCK_K`."""
    dense = wna16_config(block_m, n, k, bits, sm_count, group_k, smem_limit, act_order, zero_points)
    if dense.swap:
        dense = fit_smem(TILED_16, lambda c: smem_estimate(c, bits, group_k, act_order), smem_limit)
    tile = grouped_tile(dense, block_m, m_pad, n, k, sm_count)
    if e2m1 and tile.block_m <= 64 and tile.block_k > E2M1_GROUPED_BLOCK_K:
        capped = dense.replace(block_k=E2M1_GROUPED_BLOCK_K, num_warps=8 if tile.block_m == 64 else 4)
        tile = grouped_tile(capped, block_m, m_pad, n, k, sm_count)
    return tile


#: The grouped kernel's K tile for e2m1 codes up to 64 rows (8 warps at 64). With the dense heuristic's K tiles
#: of 128 and 256 the MXFP4 kernel spills its decoded tile to local memory; with these it does not, and it
#: measured faster; integer codes keep their tiles, for which the same cap measured mixed
#: (bench/results/cpu-sass/triton_grouped_spills.md).
E2M1_GROUPED_BLOCK_K = 64
