"""FP8 GEMMs for Hopper (``include/humming/fp8_gemm_sm90.cuh``): e4m3 activations x e4m3 weights (W8A8)
or x 4-bit weights turned into e4m3 in registers (W4A8): int4, or MXFP4 (e2m1 with e8m0 scales per 32).

``out[M, N] = x[M, K] @ dequantize(W)^T + bias`` with activations quantized to e4m3 (per token, per tensor,
or 1x128 groups) by the Triton activation pass, bit-exact with :func:`humming.quantize_activation`.
Dense integer-weight x per-token / per-tensor fp8 calls run here or on the WnA16 kernels' fp8-values route,
as the dispatcher decides (``humming/dispatch/plan.py``); grouped W4A8 and MXFP4 x fp8 always run here.

Configs come in the three kinds of the house style:

- layout (:class:`PreparedFp8`): the e4m3 weight bytes ``[N, Kp]`` (K padded to 16 for the TMA row-stride
  rule), or 4-bit codes pre-tiled in wgmma fragment order (:func:`_pack_nibbles`), and fp32 scales; MXFP4
  tiles carry per-(row, 32-K group) shifts of the kernel's e2m1 -> e4m3 table, the rest of each e8m0
  scale is a per-row fp32 scale of each 128-K block (:func:`_fold_mx`, exact); built once per
  ``QuantizedWeight`` by :func:`prepare`;
- compute: fp32 accumulation on wgmma, promoted into an fp32 total every 128 of K; scales in fp32 either
  in the epilogue (per-tensor / per-channel weights x per-token / per-tensor activations) or at each
  promotion (``block``: 128x128 weight blocks x 1x128 activation groups, the DeepSeek-V3 recipe;
  ``group``: int4 weight groups of a multiple of 128 along K, or folded MXFP4 scales, per row);
- tuning (:class:`Fp8Tuning`): warpgroups, tokens per block, pipeline stages, blocks per SM, raster
  grouping, K splits; a pure function of the problem and the device limits (:func:`choose_tuning`). A
  tuning change never changes results beyond fp32 summation order across K blocks (split-K: ``splits``
  contiguous ranges of K blocks, grid.z, whose scaled fp32 partial sums are added with ``red.add`` into a
  zero-filled fp32 workspace, then rounded to the output dtype; :func:`choose_split_tuning`).

The grouped (MoE) variant (:func:`run_grouped`, ``humming.moe.grouped_linear(act="fp8" | "fp8_g128")``) is
the same kernel with a compile-time flag: e4m3 or int4 experts ``[E, N, K]`` (N % 128 == 0) stacked along N
(:func:`prepare`), activations ``[M_pad, K]`` in the contiguous grouped layout of :mod:`humming.moe`, each
token tile reading its ``block_m`` segment's expert id (-1: skipped, rows not written). The whole
``[M_pad, K]`` is quantized by the same activation pass: padding rows hold whatever the caller left there
(their outputs are garbage, NaN / inf included) but cannot reach valid rows, since every scale is per row
(per token, or per 1x128 group) and each output column depends on one token only. Per-tensor activation
scales are refused: one scale over ``M_pad`` rows would mix in the padding.
"""

from __future__ import annotations

import ctypes
import dataclasses
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..device import DeviceLimits, device_index, device_info
from ..ir.weight import cdiv, expert_weight
from ._driver import tensor_map_2d
from ._layout import CPP_DTYPE, DTYPE_CODE
from ._support import device_unsupported
from .jit import KernelSpec, per_call_cache

__all__ = [
    "FP8_CCS",
    "GROUPED_W_FORMATS",
    "SCALE_MODES",
    "W_FORMATS",
    "DeviceLimits",
    "Fp8Tuning",
    "PreparedFp8",
    "choose_grouped_tuning",
    "choose_split_tuning",
    "choose_tile_tuning",
    "choose_tuning",
    "fp8_spec",
    "grouped_unsupported",
    "grouped_warmup_jobs",
    "linear",
    "prepare",
    "run",
    "run_grouped",
    "smem_bytes",
    "supports",
    "warmup_jobs",
]

#: Compute capabilities the kernel is built for (wgmma and setmaxnreg need sm_90a).
FP8_CCS = ((9, 0),)
_BK = 128  # K per pipeline stage
_TILE_BYTES = 4096  # one 64-row x 128-K tile of 4-bit codes
_SHIFT_BYTES = 256  # MXFP4: the table shifts of a tile's 64 rows x 4 k-steps, after its codes
#: Weight formats (the kernel's kWFormat) and their kernel-name tokens.
W_FORMATS = {"e4m3": 0, "int4": 1, "mxfp4": 2}
_W_NAMES = {"e4m3": "w8a8", "int4": "w4a8", "mxfp4": "wmxfp4a8"}
_MX_SHIFTS = (-5, 6)  # e2m1 * 2^d is an e4m3 normal for these d: 0.5 * 2^-5 = 2^-6 .. 6 * 2^6 = 384
_BLOCK_M_CHOICES = (8, 16, 32, 64, 128)
_MIN_SPLIT_KB = 8  # K blocks of 128 per split at least: a split still fills a few pipeline stages
#: Weight formats of the grouped (MoE) variant.
GROUPED_W_FORMATS = ("e4m3", "int4")
_PRODUCER_REGS = 40
_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def device_limits(device_index: int) -> DeviceLimits:
    """SM count and shared memory per block / per SM of CUDA device ``device_index``."""
    return device_info(device_index).limits


@dataclass(frozen=True)
class Fp8Tuning:
    """Speed-only knobs: consumer warpgroups (``wgs``, 64 weight rows each), tokens per block
    (``block_m``, the wgmma N), pipeline ``stages``, blocks per SM the registers are sized for
    (``min_blocks``), token tiles per raster group (``group_m``), the epilogue's store (``tma_store``:
    stmatrix + TMA store, else plain global stores) and the number of contiguous K ranges (``splits``,
    grid.z; above 1 the kernel adds fp32 partial sums into a workspace, with plain stores)."""

    wgs: int
    block_m: int
    stages: int
    min_blocks: int
    group_m: int = 8
    tma_store: bool = True
    splits: int = 1

    def __post_init__(self):
        if isinstance(self.splits, bool) or not isinstance(self.splits, int) or self.splits < 1:
            raise ValueError(f"splits: expected an int >= 1, got {self.splits!r}")

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
    tile = 64 * _BK if w_format == "e4m3" else _TILE_BYTES + (_SHIFT_BYTES if w_format == "mxfp4" else 0)
    stage = cdiv(wgs * tile, 1024) * 1024 + block_m * _BK  # weight tiles padded to whole swizzle atoms
    return 1024 + stages * stage + wgs * block_m * 128 + 16 * stages


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
    holds."""
    block_m = next((b for b in _BLOCK_M_CHOICES if b >= m), _BLOCK_M_CHOICES[-1])
    return _fill_tuning(block_m, cdiv(n, 128) * cdiv(m, block_m), limits, w_format)


def choose_split_tuning(m: int, n: int, k: int, limits: DeviceLimits, w_format: str = "e4m3") -> Fp8Tuning:
    """:func:`choose_tile_tuning` plus split-K where its tile grid leaves block slots empty: a pure function.

    ``splits`` = how many copies of the tile grid fit in the block slots (``sm_count * min_blocks // tiles``,
    one wave), at most one split per ``_MIN_SPLIT_KB`` K blocks; 1 when the tiles fill the slots.
    """
    tuning = choose_tile_tuning(m, n, k, limits, w_format)
    tiles = cdiv(n, tuning.block_n) * cdiv(m, tuning.block_m)
    splits = min(limits.sm_count * tuning.min_blocks // tiles, cdiv(k, _BK) // _MIN_SPLIT_KB)
    return dataclasses.replace(tuning, splits=max(1, splits))


def choose_grouped_tuning(
    block_m: int, m_pad: int, n: int, num_experts: int, limits: DeviceLimits, w_format: str = "e4m3"
) -> Fp8Tuning:
    """Tuning of the grouped kernel for ``M_pad`` grouped rows in segments of ``block_m``: a pure function.

    Tokens per block: the largest wgmma N (at most 128) that divides ``block_m``, so that a tile never spans
    two segments. Warpgroups and stages as :func:`choose_tuning`, over the segments in use at most (the
    routing is not read on the host): ``M_pad`` is the worst case of ``S`` slots, ``S + E (block_m - 1)``
    rounded up, and ``S`` slots fill at most ``S // block_m + min(E, S)`` segments.
    """
    tile = next(b for b in reversed(_BLOCK_M_CHOICES) if block_m % b == 0)
    slots = max(1, m_pad - num_experts * (block_m - 1))
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


#: Scale modes (the kernel's kScaleMode): where the scales are applied.
SCALE_MODES = {"rowcol": 0, "block128": 1, "group": 2}


@per_call_cache
def fp8_spec(
    w_format: str, scale_mode: str, out: str, bias: str, tuning: Fp8Tuning, grouped: bool = False
) -> KernelSpec:
    """The kernel spec for a weight format (a key of :data:`W_FORMATS`), a scale mode, output / bias dtype
    codes, tuning, and the grouped (MoE) flag. Split-K kernels (``tuning.splits > 1``, one kernel for any
    count: the count is grid.z) write fp32 with plain stores and are not grouped."""
    split = tuning.splits > 1
    if split and (out != "f32" or tuning.tma_store or grouped):
        raise ValueError(
            f"tuning: split-K (splits={tuning.splits}) adds fp32 partial sums with plain stores, not grouped;"
            f" got out={out!r}, tma_store={tuning.tma_store}, grouped={grouped} (call_spec sets these)"
        )
    producer, consumer = tuning.registers()
    kind = "grouped_" if grouped else ""
    name = (
        f"humming_fp8_gemm_sm90_{kind}{_W_NAMES[w_format]}_{scale_mode}_o{out}_b{bias}_w{tuning.wgs}"
        f"_m{tuning.block_m}"
        f"_s{tuning.stages}_mb{tuning.min_blocks}" + ("_sk" if split else "") + ("" if tuning.tma_store else "_stg")
    )
    args = ", ".join(
        (
            str(tuning.wgs),
            str(tuning.block_m),
            str(tuning.stages),
            str(W_FORMATS[w_format]),
            str(SCALE_MODES[scale_mode]),
            "true" if tuning.tma_store else "false",
            "true" if grouped else "false",
            "true" if split else "false",
            CPP_DTYPE[out],
            CPP_DTYPE[bias],
            str(producer),
            str(consumer),
        )
    )
    return KernelSpec(
        family="fp8_gemm_sm90",
        name=name,
        header="humming/fp8_gemm_sm90.cuh",
        entry=f"humming::fp8_sm90::run<{args}>",
        params="humming::fp8_sm90::Params",
        threads=tuning.threads,
        ccs=FP8_CCS,
        min_blocks=tuning.min_blocks,
        arch_specific=True,
    )


@dataclass(frozen=True, eq=False)
class PreparedFp8:
    """Weights as the kernel reads them; built once per QuantizedWeight (:func:`prepare`)."""

    n: int
    k: int
    kp: int  # K padded to a multiple of 16 (TMA row strides are multiples of 16 bytes)
    w_format: str  # a key of W_FORMATS
    scale_mode: str  # a key of SCALE_MODES
    # e4m3: uint8 [N, Kp] zero-padded along K; int4: uint8 [N/64, K/128, 4096] (padded); mxfp4: the same
    # with each tile's 256 shift bytes after its codes, uint8 [N/64, K/128, 4352]
    weight: torch.Tensor
    w_scale: torch.Tensor | None  # fp32 [round_up(N, 128)]: per-channel (per-tensor expanded), zero-padded
    w_block_scale: torch.Tensor | None  # fp32 [ceil(N / 128), ceil(K / 128)], one per 128 x 128 block
    # fp32 [ceil(K / 128), round_up(N, 128)]: int4 group scales / folded MXFP4 scales per K block and row
    w_group_scale: torch.Tensor | None
    maps: dict = field(default_factory=dict)  # block_n -> encoded tensor map of ``weight``
    # expert-stacked weights: E parts of the above concatenated along N (N % 128 == 0, so no padding rows)
    num_experts: int | None = None

    @property
    def w_bits(self) -> int:
        return 8 if self.w_format == "e4m3" else 4


def _weight_scales(qw) -> torch.Tensor:
    """fp32 scales of ``qw`` in its own grid (``global_scale`` folded in with one fp32 rounding)."""
    if qw.scales is None:
        return torch.ones(1, 1, dtype=torch.float32, device=qw.device)
    s = qw.scales.to(torch.float32)
    if qw.global_scale is not None:
        s = s * qw.global_scale.to(torch.float32)
    return s


def _scale_mode(qw) -> str:
    """Where the kernel applies ``qw``'s scales (a key of :data:`SCALE_MODES`)."""
    if qw.layout == "block":
        return "block128"
    return "group" if qw.layout == "group" else "rowcol"


def _w_format(qw) -> str:
    """The kernel's weight format (a key of :data:`W_FORMATS`) of a weight :func:`weight_unsupported` takes."""
    return "mxfp4" if qw.format.name == "e2m1" else qw.format.name


def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes ``[N, K]`` (uint8 nibbles, N and K multiples of 128) -> uint8 ``[N/64, K/128, 4096]``.

    Each 64-row x 128-K tile is laid out as the consumer warpgroup reads it (fp8_gemm_sm90.cuh):
    ``[warp 4][half 2][lane 32][word 4]``; word j of half h holds k-step s = 2h + j // 2 (32 of K) at
    offset 16 (j % 2), its nibble p row ``16 warp + lane / 4 + 8 (p // 4)``, column ``4 (lane % 4) + p % 4``
    of that 16 — the wgmma A fragments a0..a3 (low half of a word: a0 or a2, high half: a1 or a3).
    """
    n, k = codes.shape
    v = codes.to(torch.int64).reshape(n // 64, 4, 2, 8, k // 128, 2, 2, 2, 4, 4)  # t w r8 g kb h jj q c e
    v = v.permute(0, 4, 1, 5, 3, 8, 6, 7, 2, 9)  # t kb w h g c jj q r8 e
    shifts = 4 * torch.arange(8, device=codes.device)
    words = (v.reshape(*v.shape[:8], 8) << shifts).sum(-1)  # [t, kb, w, h, g, c, jj, q]
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.reshape(n // 64, k // 128, -1).contiguous().view(torch.uint8)


def _prepare_int4(qw, kp: int, scales: torch.Tensor) -> PreparedFp8:
    from ..ir.quantize import unpacked_codes

    n, k = qw.N, qw.K
    n_pad, k_pad = cdiv(n, 128) * 128, cdiv(k, 128) * 128
    codes = torch.zeros(n_pad, k_pad, dtype=torch.uint8, device=qw.device)
    codes[:n, :k] = unpacked_codes(qw)
    w_scale = w_group = None
    if qw.layout == "group":
        blocks = torch.arange(0, k_pad, 128, device=qw.device) // qw.group_size
        w_group = torch.zeros(k_pad // 128, n_pad, dtype=torch.float32, device=qw.device)
        w_group[:, :n] = scales[:, blocks].T
    else:
        w_scale = torch.zeros(n_pad, dtype=torch.float32, device=qw.device)
        w_scale[:n] = scales.expand(n, 1).reshape(n)
    return PreparedFp8(n, k, kp, "int4", _scale_mode(qw), _pack_nibbles(codes), w_scale, None, w_group)


@dataclass(frozen=True)
class _MxFold:
    """MXFP4 scales split for the kernel: ``2^e`` of each (row, 32-K group) = ``2^d`` in the e2m1 -> e4m3
    table (``shifts``, the byte 8 (d + 5)) times a per-(row, 128-K block) fp32 ``block_scale``."""

    shifts: torch.Tensor  # uint8 [round_up(N, 128), round_up(K, 128) / 32]
    block_scale: torch.Tensor  # fp32 [round_up(K, 128) / 128, round_up(N, 128)], zero past N and K


_mx_folds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _fold_mx(qw) -> _MxFold | str:
    """The folded scales of an MXFP4 weight, or why they cannot be folded exactly; computed once per weight.

    Per (row, 128-K block) the top exponent ``t`` of the groups holding a nonzero code goes into the block
    scale as ``2^(t - 6)``; each such group keeps ``d = e - t + 6``, exact in the table while ``d >= -5``
    (all-zero groups need no shift). Blocks whose groups span more than 12 binades are refused, as are
    e8m0 NaN scales (0xFF: dequantize gives NaN for the whole group, which the kernel does not reproduce).
    """
    fold = _mx_folds.get(qw)
    if fold is None:
        fold = _mx_folds[qw] = _compute_mx_fold(qw)
    return fold


def _compute_mx_fold(qw) -> _MxFold | str:
    from ..ir.quantize import unpacked_codes

    n, k = qw.N, qw.K
    n_pad, k_pad, groups = cdiv(n, 128) * 128, cdiv(k, 128) * 128, cdiv(k, 32)
    raw = qw.scales.view(torch.uint8)
    if bool((raw == 0xFF).any()):
        row, group = (int(i) for i in (raw == 0xFF).nonzero()[0])
        return f"MXFP4 scale ({row}, {group}) is the e8m0 NaN (0xFF); the W4A8 GEMM does not compute NaN weights"
    exps = raw.to(torch.int32).repeat_interleave(qw.group_size // 32, dim=1)[:, :groups] - 127
    magnitudes = F.pad(unpacked_codes(qw) & 7, (0, groups * 32 - k)).view(n, groups, 32)
    dead = -(1 << 20)  # below every e8m0 exponent: groups without a nonzero code, and the padding
    e = torch.full((n_pad, k_pad // 32), dead, dtype=torch.int32, device=qw.device)
    e[:n, :groups] = torch.where(magnitudes.any(-1).bool(), exps, dead)
    e = e.view(n_pad, k_pad // 128, 4)
    top = e.amax(-1, keepdim=True)
    d = e - top + _MX_SHIFTS[1]
    live = e > dead
    bad = live & (d < _MX_SHIFTS[0])
    if bool(bad.any()):
        row, kb, _ = (int(i) for i in bad.nonzero()[0])
        span = int(top[row, kb, 0]) - int(e[row, kb][live[row, kb]].min())
        return (
            f"MXFP4 scales of row {row}, K {128 * kb}..{128 * kb + 127} span {span + 1} binades; the W4A8 GEMM"
            f" folds at most {_MX_SHIFTS[1] - _MX_SHIFTS[0] + 1} per 128 of K exactly"
        )
    shifts = torch.where(live, 8 * (d - _MX_SHIFTS[0]), 0).to(torch.uint8).view(n_pad, k_pad // 32)
    top = top.view(n_pad, k_pad // 128)
    scale = torch.where(top > dead, torch.ldexp(torch.ones_like(top, dtype=torch.float64), top - 6), 0.0)
    scale = scale.to(torch.float32)
    if qw.global_scale is not None:
        scale = scale * qw.global_scale.to(torch.float32)
    return _MxFold(shifts, scale.T.contiguous())


def _prepare_mxfp4(qw, kp: int) -> PreparedFp8:
    from ..ir.quantize import unpacked_codes

    fold = _fold_mx(qw)
    n, k = qw.N, qw.K
    n_pad, k_pad = cdiv(n, 128) * 128, cdiv(k, 128) * 128
    codes = torch.zeros(n_pad, k_pad, dtype=torch.uint8, device=qw.device)
    codes[:n, :k] = unpacked_codes(qw)
    # shift byte of (row r of a tile, k-step g) at 4 r + g after the tile's codes
    shifts = fold.shifts.view(n_pad // 64, 64, k_pad // 128, 4).permute(0, 2, 1, 3).reshape(n_pad // 64, -1, 256)
    weight = torch.cat((_pack_nibbles(codes), shifts), dim=-1).contiguous()
    return PreparedFp8(n, k, kp, "mxfp4", "group", weight, None, None, fold.block_scale)


def prepare(qw) -> PreparedFp8:
    """The kernel's view of an e4m3, int4 or MXFP4 ``QuantizedWeight`` (see :func:`weight_unsupported`), or
    of an expert-stacked e4m3 / int4 one (see :func:`grouped_unsupported`); cached."""
    prep = _prepared.get(qw)
    if prep is None:
        prep = _prepared[qw] = _prepare_stacked(qw) if qw.num_experts is not None else _prepare_2d(qw)
    return prep


def _prepare_stacked(qw) -> PreparedFp8:
    """Each expert prepared as a 2-D weight, the parts concatenated along N (rows, or columns of the
    ``[num_kb, N]`` group scales); N % 128 == 0 leaves no padding between experts."""

    if qw.N % 128 or qw.format.name not in GROUPED_W_FORMATS:
        raise ValueError(f"qw: the grouped FP8 GEMM takes e4m3 / int4 experts with N % 128 == 0, not {qw.describe()}")
    parts = [_prepare_2d(expert_weight(qw, e)) for e in range(qw.num_experts)]

    def cat(name: str, dim: int) -> torch.Tensor | None:
        return None if getattr(parts[0], name) is None else torch.cat([getattr(p, name) for p in parts], dim)

    return dataclasses.replace(
        parts[0],
        weight=cat("weight", 0),
        w_scale=cat("w_scale", 0),
        w_block_scale=cat("w_block_scale", 0),
        w_group_scale=cat("w_group_scale", 1),
        maps={},
        num_experts=qw.num_experts,
    )


def _prepare_2d(qw) -> PreparedFp8:
    n, k = qw.N, qw.K
    kp = cdiv(k, 16) * 16
    if qw.format.name == "int4":
        return _prepare_int4(qw, kp, _weight_scales(qw))
    if qw.format.name == "e2m1":
        reason = weight_unsupported(qw)
        if reason is not None:
            raise ValueError(f"qw: {reason}")
        return _prepare_mxfp4(qw, kp)
    weight = torch.zeros(n, kp, dtype=torch.uint8, device=qw.device)
    weight[:, :k] = qw.qweight.contiguous().view(torch.uint8)[:, :k]  # little-endian: byte i is element i
    scales = _weight_scales(qw)
    block_scale = qw.layout == "block"
    w_scale = w_block = None
    if block_scale:  # one scale per 128 x 128 block (exact: every such block lies inside one weight block)
        bn, bk = qw.block_shape
        rows = torch.arange(0, n, 128, device=qw.device) // bn
        cols = torch.arange(0, kp, 128, device=qw.device) // bk
        w_block = scales[rows][:, cols].contiguous()
    else:
        w_scale = torch.zeros(cdiv(n, 128) * 128, dtype=torch.float32, device=qw.device)
        w_scale[:n] = scales.expand(n, 1).reshape(n)
    return PreparedFp8(n, k, kp, "e4m3", _scale_mode(qw), weight, w_scale, w_block, None)


def weight_unsupported(qw) -> str | None:
    """``None`` when the kernel takes this weight, else why not."""
    if qw.format.name not in ("e4m3", "int4", "e2m1"):
        return f"the FP8 GEMM takes e4m3, int4 or MXFP4 (e2m1) weights, not {qw.format.name}"
    if qw.num_experts is not None:
        return "the FP8 GEMM takes 2-D weights, not expert-stacked ones (grouped_linear runs those)"
    return _layout_unsupported(qw)


def _layout_unsupported(qw) -> str | None:
    """The checks of :func:`weight_unsupported` past format and shape (they hold per expert as well)."""
    if qw.zeros is not None or qw.g_idx is not None:
        return "the FP8 GEMM takes symmetric weights without act-order"
    if qw.format.name == "e2m1":
        if qw.scales is None or qw.scales.dtype != torch.float8_e8m0fnu or qw.layout != "group" or qw.group_size % 32:
            return f"the W4A8 GEMM takes e2m1 weights with e8m0 scales in groups of 32 (MXFP4), not {qw.describe()}"
        fold = _fold_mx(qw)
        return fold if isinstance(fold, str) else None
    if qw.format.name == "int4":
        if qw.layout == "group" and qw.group_size % 128 == 0:
            return None
        if qw.layout not in ("tensor", "channel"):
            return f"the W4A8 GEMM takes per-tensor, per-channel or 128-multiple group scales, not {qw.describe()}"
        return None
    if qw.layout == "block":
        if any(b % 128 and b < d for b, d in zip(qw.block_shape, (qw.N, qw.K))):
            return f"the FP8 GEMM takes weight blocks that are multiples of 128 x 128, not {qw.describe()}"
    elif qw.layout not in ("tensor", "channel"):
        return f"the FP8 GEMM takes per-tensor, per-channel or 128x128-block weight scales, not {qw.describe()}"
    return None


def _act_unsupported(qw, act) -> str | None:
    if act is None:
        return "the FP8 GEMM needs fp8 activations (act='fp8', 'fp8_tensor' or 'fp8_g128')"
    if act.format != "e4m3" or act.scale_dtype != torch.float32 or act.global_scale:
        return f"the FP8 GEMM takes e4m3 activations with float32 scales, not act={act.name}"
    if qw.format.name in ("int4", "e2m1") and act.group not in ("token", "tensor"):
        return f"{qw.format.name} weights need per-token or per-tensor activations, not act={act.name}"
    if qw.layout == "block":
        if act.group != 128:
            return f"128x128-block weights need 1x128 activation groups (act='fp8_g128'), not act={act.name}"
    elif act.group not in ("token", "tensor"):
        return f"per-tensor / per-channel weights need per-token or per-tensor activations, not act={act.name}"
    return None


def supports(qweight, act, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> str | None:
    """``None`` when the FP8 kernel runs ``linear(x, qweight, act=act)``, else the reason it does not.

    ``x`` is the 2-D activation ``[M, K]`` (a float tensor, or the uint8 codes of a pre-quantized one).
    """
    return (
        weight_unsupported(qweight)
        or _act_unsupported(qweight, act)
        or device_unsupported("FP8 GEMM", x, FP8_CCS, "sm_90a", out_dtype)
    )


def grouped_unsupported(
    qweight, act, x: torch.Tensor, block_m: int, out_dtype: torch.dtype | None = None
) -> str | None:
    """``None`` when the grouped kernel runs ``run_grouped(prepare(qweight), x, act, ..., block_m)``, else why
    not. ``x`` is the grouped activation ``[M_pad, K]`` (float; its device matters)."""
    reason = _grouped_combination_unsupported(qweight, act)
    if reason is not None:
        return reason
    if isinstance(block_m, bool) or not isinstance(block_m, int) or block_m <= 0 or block_m % 8:
        return f"the grouped FP8 GEMM needs block_m % 8 == 0 (token tiles of 8 to 128 dividing it), got {block_m!r}"
    return device_unsupported("grouped FP8 GEMM", x, FP8_CCS, "sm_90a", out_dtype)


def _grouped_combination_unsupported(qweight, act) -> str | None:
    """The weight and activation checks of :func:`grouped_unsupported`."""
    if qweight.num_experts is None:
        return "the grouped FP8 GEMM needs expert-stacked weights [E, N, K]"
    if qweight.format.name not in GROUPED_W_FORMATS:
        return (
            f"the grouped FP8 GEMM takes e4m3 (W8A8) or int4 (W4A8) experts, not {qweight.format.name}"
            " (MXFP4 W4A8 has no grouped variant)"
        )
    reason = _layout_unsupported(qweight) or _act_unsupported(qweight, act)
    if reason is not None:
        return reason
    if act.group == "tensor":
        return (
            f"the grouped FP8 GEMM takes per-token or 1x128-group activation scales, not act={act.name}: one"
            " per-tensor scale over the grouped rows would mix in padding rows and skipped blocks"
        )
    if qweight.N % 128:
        return f"the grouped FP8 GEMM needs N % 128 == 0 (no weight tile straddles two experts), got N={qweight.N}"
    return None


@dataclass(frozen=True)
class _Activations:
    codes: torch.Tensor  # uint8 [M, Kp], e4m3 bytes
    x_scale: torch.Tensor | None  # fp32 per-token [M] or per-tensor [1]
    x_block_scale: torch.Tensor | None  # fp32 [ceil(K / 128), tiles_m * block_m]


def _activations(x, act, kp: int, block_m: int) -> _Activations:
    """Quantize ``x`` (a float ``[M, K]``, or take a ``QuantizedActivation``) into the kernel's layout."""
    from ..ir.activation import QuantizedActivation

    if isinstance(x, QuantizedActivation):
        qa = x
    else:
        from ..triton_kernels.act_quant import quantize_activation

        qa = quantize_activation(x, act)
    m, k = qa.codes.shape
    codes = qa.codes if kp == k else F.pad(qa.codes, (0, kp - k))
    scales = qa.scales.to(torch.float32)
    if qa.scheme.group == 128:
        # [num_kb, M padded to the token tile], row-major: F.pad with nothing to pad returns a clone that keeps
        # the transposed strides, which the kernel would read as row-major, hence .contiguous()
        blocks = F.pad(scales.T, (0, cdiv(m, block_m) * block_m - m)).contiguous()
        return _Activations(codes.contiguous(), None, blocks)
    return _Activations(codes.contiguous(), scales.reshape(-1).contiguous(), None)


class _Params(ctypes.Structure):
    """Mirror of ``humming::fp8_sm90::Params`` (512 bytes, 64-byte aligned in the kernel)."""

    _fields_ = (
        ("w_map", ctypes.c_uint8 * 128),
        ("x_map", ctypes.c_uint8 * 128),
        ("out_map", ctypes.c_uint8 * 128),
        ("w_scale", ctypes.c_void_p),
        ("x_scale", ctypes.c_void_p),
        ("w_block_scale", ctypes.c_void_p),
        ("x_block_scale", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("M", ctypes.c_int),
        ("N", ctypes.c_int),
        ("num_kb", ctypes.c_int),
        ("x_scale_stride", ctypes.c_int),
        ("x_block_stride", ctypes.c_int),
        ("tiles_m", ctypes.c_int),
        ("tiles_n", ctypes.c_int),
        ("group_m", ctypes.c_int),
        ("out", ctypes.c_void_p),
        ("out_stride", ctypes.c_int),
        ("w_packed", ctypes.c_void_p),
        ("w_group_scale", ctypes.c_void_p),
        ("w_group_stride", ctypes.c_int),
        ("expert_ids", ctypes.c_void_p),
        ("block_m", ctypes.c_int),
        ("_tail", ctypes.c_uint8 * 4),
    )


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


@per_call_cache
def call_spec(
    w_format: str,
    scale_mode: str,
    bias_dtype: torch.dtype | None,
    out_dtype: torch.dtype,
    tuning: Fp8Tuning,
    grouped: bool = False,
) -> KernelSpec:
    """The spec of one call: weight format, scale mode, bias dtype (``None``: no bias), output dtype, tuning
    (fp32 output: the plain-store epilogue; split-K: that epilogue into the fp32 workspace), grouped flag."""
    bias_code = DTYPE_CODE[bias_dtype] if bias_dtype is not None else DTYPE_CODE[out_dtype]
    if tuning.splits > 1:
        out_dtype = torch.float32
    if out_dtype == torch.float32:  # the TMA-store epilogue writes 16-bit floats only
        tuning = dataclasses.replace(tuning, tma_store=False)
    return fp8_spec(w_format, scale_mode, DTYPE_CODE[out_dtype], bias_code, tuning, grouped)


def warmup_jobs(
    qweight,
    act,
    m_values,
    out_dtype: torch.dtype,
    bias_dtype: torch.dtype | None,
    limits: DeviceLimits,
) -> list[tuple[KernelSpec, str]]:
    """``(spec, "sm_90a")`` of every kernel :func:`linear` runs for ``qweight`` and ``act`` at the token
    counts ``m_values`` (for ``humming.warmup``); empty when the combination has no kernel."""
    if weight_unsupported(qweight) or _act_unsupported(qweight, act) or out_dtype not in DTYPE_CODE:
        return []
    w_format = _w_format(qweight)
    jobs = []
    for m in m_values:
        tuning = choose_tuning(m, qweight.N, qweight.K, limits, w_format)
        spec = call_spec(w_format, _scale_mode(qweight), bias_dtype, out_dtype, tuning)
        if (spec, "sm_90a") not in jobs:
            jobs.append((spec, "sm_90a"))
    return jobs


def grouped_warmup_jobs(
    qweight,
    act,
    m_values,
    block_ms,
    out_dtype: torch.dtype,
    bias_dtype: torch.dtype | None,
    limits: DeviceLimits,
) -> list[tuple[KernelSpec, str]]:
    """``(spec, "sm_90a")`` of every grouped kernel :func:`run_grouped` runs for the expert-stacked
    ``qweight`` and ``act`` at the grouped row counts ``m_values`` (``M_pad``) and each ``block_m`` of
    ``block_ms``; empty when the combination has no grouped kernel."""
    if _grouped_combination_unsupported(qweight, act) is not None or out_dtype not in DTYPE_CODE:
        return []
    jobs = []
    for block_m in block_ms:
        for m in m_values:
            if block_m <= 0 or block_m % 8:
                continue
            tuning = choose_grouped_tuning(block_m, m, qweight.N, qweight.num_experts, limits, qweight.format.name)
            spec = call_spec(qweight.format.name, _scale_mode(qweight), bias_dtype, out_dtype, tuning, grouped=True)
            if (spec, "sm_90a") not in jobs:
                jobs.append((spec, "sm_90a"))
    return jobs


def run(
    prep: PreparedFp8,
    x,
    act,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    tuning: Fp8Tuning | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x [M, K]`` (float, quantized here with ``act``, or a ``QuantizedActivation``) ``@ W^T + bias``
    -> ``[M, N]`` of ``out_dtype`` (bf16, fp16, fp32) on the current stream. Unless ``N`` fills whole
    16-byte rows the result is a view with a padded row stride (TMA needs 16-byte row strides).

    ``out``: an optional ``[M, N]`` tensor of ``out_dtype`` to write into (unit column stride, row stride
    and address multiples of 16 bytes)."""
    if prep.num_experts is not None:
        raise ValueError("prep: expert-stacked weights run through run_grouped")
    codes = getattr(x, "codes", x)
    if tuning is None and codes.shape[0]:
        tuning = choose_tuning(codes.shape[0], prep.n, prep.k, device_limits(_device_index(codes)), prep.w_format)
    return _launch(prep, x, act, bias, out_dtype, tuning, out, None, 0)


def run_grouped(
    prep: PreparedFp8,
    x,
    act,
    expert_ids: torch.Tensor,
    block_m: int,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    tuning: Fp8Tuning | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Grouped ``x [M_pad, K]`` (float, quantized here with ``act``, or a ``QuantizedActivation``) times the
    expert-stacked ``prep`` -> ``[M_pad, N]`` of ``out_dtype`` on the current stream.

    Row ``r`` uses expert ``expert_ids[r // block_m]`` (int32 ``[M_pad // block_m]`` on the device, values
    in [-1, E), not checked: that would need a host sync); rows of segments whose id is -1 are not written.
    ``bias`` is ``[E, N]`` or ``None``; ``out`` as :func:`run`."""
    if prep.num_experts is None:
        raise ValueError("prep: expected expert-stacked weights (prepare of an [E, N, K] weight)")
    codes = getattr(x, "codes", x)
    m = codes.shape[0]
    if m % block_m or tuple(expert_ids.shape) != (m // block_m,) or expert_ids.dtype != torch.int32:
        raise ValueError(f"expert_ids: expected int32 of shape ({m // block_m},) for M_pad={m}, block_m={block_m}")
    if bias is not None and tuple(bias.shape) != (prep.num_experts, prep.n):
        raise ValueError(f"bias: expected shape ({prep.num_experts}, {prep.n}), got {tuple(bias.shape)}")
    if tuning is None:
        limits = device_limits(_device_index(codes))
        tuning = choose_grouped_tuning(block_m, m, prep.n, prep.num_experts, limits, prep.w_format)
    if tuning.splits != 1:
        raise ValueError(f"tuning: the grouped FP8 GEMM has no split-K (splits must be 1, got {tuning.splits})")
    if block_m % tuning.block_m:
        raise ValueError(f"tuning: the token tile block_m={tuning.block_m} must divide the segment {block_m}")
    return _launch(prep, x, act, bias, out_dtype, tuning, out, expert_ids.contiguous(), block_m)


def _device_index(t: torch.Tensor) -> int:
    return device_index(t.device)


def _launch(
    prep: PreparedFp8,
    x,
    act,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    tuning: Fp8Tuning | None,
    out: torch.Tensor | None,
    expert_ids: torch.Tensor | None,
    block_m: int,
) -> torch.Tensor:
    from ._driver import get_kernel

    codes = getattr(x, "codes", x)
    m = codes.shape[0]
    device = _device_index(codes)
    if out is None:
        n_pad = cdiv(prep.n, 16 // out_dtype.itemsize) * (16 // out_dtype.itemsize)
        out = torch.empty(m, n_pad, dtype=out_dtype, device=codes.device)[:, : prep.n]
    elif (
        tuple(out.shape) != (m, prep.n)
        or out.dtype != out_dtype
        or out.stride(1) != 1
        or (out.stride(0) * out.element_size()) % 16
        or out.data_ptr() % 16
    ):
        raise ValueError(f"out: expected a [{m}, {prep.n}] {out_dtype} tensor, unit column stride, 16-byte rows")
    if m == 0:
        return out
    if out_dtype == torch.float32 or tuning.splits > 1:  # the TMA-store epilogue writes 16-bit floats only
        tuning = dataclasses.replace(tuning, tma_store=False)
    grouped = expert_ids is not None
    spec = call_spec(prep.w_format, prep.scale_mode, None if bias is None else bias.dtype, out_dtype, tuning, grouped)
    kernel = get_kernel(spec, device)
    a = _activations(x, act, prep.kp, tuning.block_m)
    if bias is not None:
        bias = bias.contiguous()
    if prep.w_bits == 8 and tuning.block_n not in prep.maps:
        prep.maps[tuning.block_n] = tensor_map_2d(prep.weight, _BK, tuning.block_n)
    tiles_m, tiles_n = cdiv(m, tuning.block_m), cdiv(prep.n, tuning.block_n)
    params = _Params()
    if prep.w_bits == 8:
        params.w_map[:] = prep.maps[tuning.block_n]
    params.x_map[:] = tensor_map_2d(a.codes, _BK, tuning.block_m)
    if tuning.tma_store:
        params.out_map[:] = tensor_map_2d(out, 64, tuning.block_m)
    params.w_scale = _ptr(prep.w_scale)
    params.x_scale = _ptr(a.x_scale)
    params.w_block_scale = _ptr(prep.w_block_scale)
    params.x_block_scale = _ptr(a.x_block_scale)
    params.bias = _ptr(bias)
    params.M, params.N, params.num_kb = m, prep.n, cdiv(prep.kp, _BK)
    params.x_scale_stride = 1 if a.x_scale is not None and a.x_scale.numel() > 1 else 0
    params.x_block_stride = a.x_block_scale.shape[1] if a.x_block_scale is not None else 0
    params.tiles_m, params.tiles_n, params.group_m = tiles_m, tiles_n, tuning.group_m
    # split-K: the splits add into a zero-filled fp32 workspace (fp32 out: ``out`` itself), rounded afterwards;
    # the memset and the copy are stream work, so CUDA-graph capture records them
    acc = out
    if tuning.splits > 1 and out_dtype == torch.float32:
        acc = out.zero_()
    elif tuning.splits > 1:
        acc = torch.zeros(m, prep.n, dtype=torch.float32, device=out.device)
    params.out, params.out_stride = acc.data_ptr(), acc.stride(0)
    if prep.w_bits == 4:
        params.w_packed = prep.weight.data_ptr()
        params.w_group_scale = _ptr(prep.w_group_scale)
        params.w_group_stride = prep.w_group_scale.shape[1] if prep.w_group_scale is not None else 0
    if grouped:
        params.expert_ids, params.block_m = expert_ids.data_ptr(), block_m
    smem = smem_bytes(tuning.wgs, tuning.block_m, tuning.stages, prep.w_format)
    kernel.launch((tiles_m * tiles_n, 1, tuning.splits), smem, params, torch.cuda.current_stream(device).cuda_stream)
    if acc is not out:
        out.copy_(acc)
    return out


def linear(x, qweight, bias: torch.Tensor | None, act, out_dtype: torch.dtype) -> torch.Tensor:
    """``x [M, K] @ dequantize(qweight)^T + bias`` -> ``[M, N]`` of ``out_dtype`` (see :func:`supports`).

    ``x`` is a float tensor (quantized with ``act`` by the Triton activation pass) or a
    ``QuantizedActivation`` of scheme ``act``.
    """
    codes = getattr(x, "codes", x)
    reason = supports(qweight, act, codes, out_dtype)
    if reason is not None:
        raise ValueError(f"humming FP8 GEMM: {reason}")
    return run(prepare(qweight), x, act, bias, out_dtype)
