"""Weight layout of the FP8 GEMM (:mod:`humming.cuda_kernels.fp8_gemm`): which weights the kernel takes
(:func:`weight_unsupported`), and :func:`prepare`, which turns a ``QuantizedWeight`` into the kernel's view
(:class:`PreparedFp8`): e4m3 bytes, or 4-bit codes tiled in wgmma fragment order, MXFP4 scales folded into
table offsets and per-block fp32 scales; expert-stacked weights (the grouped variant) expert by expert."""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field

import torch

from ..ir.weight import cdiv, expert_weight

#: Weight formats (the kernel's kWFormat).
W_FORMATS = {"e4m3": 0, "int4": 1, "mxfp4": 2}
#: Weight formats (``QuantizedWeight.format.name``) of the grouped (MoE) variant.
GROUPED_W_FORMATS = ("e4m3", "int4", "e2m1")
#: Scale modes (the kernel's kScaleMode): where the scales are applied.
SCALE_MODES = {"rowcol": 0, "block128": 1, "group": 2}
_MX_SHIFTS = (-5, 6)  # e2m1 * 2^d is an e4m3 normal for these d: 0.5 * 2^-5 = 2^-6 .. 6 * 2^6 = 384
_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
    # expert-stacked weights: E parts of the above concatenated along N, each N rounded up to 128 rows (e4m3:
    # zero rows added; the others are padded already)
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
    """Where the kernel applies ``qw``'s scales (a key of :data:`SCALE_MODES`); MXFP4: as they fold."""
    if qw.format.name == "e2m1":
        per_row = _experts_mx_fold(qw)[1] if qw.num_experts is not None else getattr(_fold_mx(qw), "per_row", False)
        return "rowcol" if per_row else "group"
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


def _kernel_codes(qw, table: tuple[int, ...]) -> torch.Tensor:
    """``qw``'s 4-bit codes ``[N, K]`` as the kernel's codes (``table[code]``), zero-padded to multiples of 128
    (kernel code 0 is the value 0)."""
    from ..ir.quantize import unpacked_codes

    codes = torch.zeros(cdiv(qw.N, 128) * 128, cdiv(qw.K, 128) * 128, dtype=torch.uint8, device=qw.device)
    codes[: qw.N, : qw.K] = torch.tensor(table, dtype=torch.uint8, device=qw.device)[unpacked_codes(qw).long()]
    return codes


#: The kernel's 4-bit code of each two's-complement int4 code (0 .. 7 -> 0 .. 7, 8 .. 15 -> -8 .. -1): the
#: code ``int4x8_to_e4m3`` (fp8_gemm_sm90.cuh) turns into that value with two prmt and one xor.
_INT4_CODES = (0, 1, 2, 3, 8, 9, 10, 11, 15, 14, 13, 12, 7, 6, 5, 4)


def _prepare_int4(qw, kp: int, scales: torch.Tensor) -> PreparedFp8:
    n, k = qw.N, qw.K
    n_pad, k_pad = cdiv(n, 128) * 128, cdiv(k, 128) * 128
    codes = _kernel_codes(qw, _INT4_CODES)
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
    table (``offsets``, the byte d + 6; 0 for groups without a nonzero code) times an fp32 ``scale`` per row
    (``per_row``: the row's groups span at most 12 binades, and the scale is applied in the epilogue, as a
    per-channel one) or per (row, 128-K block) (applied at each K block's promotion)."""

    offsets: torch.Tensor  # uint8 [round_up(N, 128), round_up(K, 128) / 32]
    # fp32, zero past N (and K): per_row [round_up(N, 128)], else [round_up(K, 128) / 128, round_up(N, 128)]
    scale: torch.Tensor
    per_row: bool


_mx_folds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _fold_mx(qw) -> _MxFold | str:
    """The folded scales of a 2-D MXFP4 weight (:func:`_compute_mx_fold`), or why they cannot be folded
    exactly; computed once per weight."""
    fold = _mx_folds.get(qw)
    if fold is None:
        fold = _mx_folds[qw] = _compute_mx_fold(qw)
    return fold


_mx_expert_verdicts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # weight -> ("" or why not, per row)


def _experts_mx_fold(qw) -> tuple[str, bool]:
    """:func:`_compute_mx_fold`'s verdict on each expert of an expert-stacked MXFP4 weight ("" when every
    expert folds) and whether every expert folds per row (then all do: one kernel runs them); computed once
    per weight."""
    verdict = _mx_expert_verdicts.get(qw)
    if verdict is None:
        why, per_row = "", True
        for e in range(qw.num_experts):
            fold = _compute_mx_fold(expert_weight(qw, e), per_row)
            if isinstance(fold, str):
                why = f"expert {e}: {fold}"
                break
            per_row = fold.per_row
        verdict = _mx_expert_verdicts[qw] = (why, per_row)
    return verdict


def _compute_mx_fold(qw, per_row: bool = True) -> _MxFold | str:
    """Split ``qw``'s e8m0 exponents: the top exponent ``t`` of the groups holding a nonzero code goes into the
    fp32 scale as ``2^(t - 6)``; each such group keeps ``d = e - t + 6``, exact in the table while ``d >= -5``
    (all-zero groups need no shift). ``t`` is the row's where every row's groups span at most 12 binades and
    ``per_row`` allows it (one scale per row: the kernel sums several K blocks per promotion, as for per-channel
    weights), else each (row, 128-K block)'s. Blocks whose groups span more than 12 binades are refused (e8m0 NaN
    scales cannot occur: QuantizedWeight refuses non-finite scales)."""
    from ..ir.quantize import live_exponents

    n, k = qw.N, qw.K
    n_pad, k_pad, groups = cdiv(n, 128) * 128, cdiv(k, 128) * 128, cdiv(k, 32)
    dead = -(1 << 20)  # below every e8m0 exponent: groups without a nonzero code, and the padding
    e = torch.full((n_pad, k_pad // 32), dead, dtype=torch.int32, device=qw.device)
    e[:n, :groups] = live_exponents(qw, dead).repeat_interleave(qw.group_size // 32, dim=1)[:, :groups]
    live = e > dead
    if per_row:
        top = e.amax(-1, keepdim=True)
        d = e - top + _MX_SHIFTS[1]
        if not bool((live & (d < _MX_SHIFTS[0])).any()):
            return _MxFold(_mx_offsets(d, live), _mx_scale(qw, top.view(n_pad), dead), True)
    e, live = e.view(n_pad, k_pad // 128, 4), live.view(n_pad, k_pad // 128, 4)
    top = e.amax(-1, keepdim=True)
    d = e - top + _MX_SHIFTS[1]
    bad = live & (d < _MX_SHIFTS[0])
    if bool(bad.any()):
        row, kb, _ = (int(i) for i in bad.nonzero()[0])
        span = int(top[row, kb, 0]) - int(e[row, kb][live[row, kb]].min())
        return (
            f"MXFP4 scales of row {row}, K {128 * kb}..{128 * kb + 127} span {span + 1} binades; the W4A8 GEMM"
            f" folds at most {_MX_SHIFTS[1] - _MX_SHIFTS[0] + 1} per 128 of K exactly"
        )
    offsets = _mx_offsets(d, live).view(n_pad, k_pad // 32)
    return _MxFold(offsets, _mx_scale(qw, top.view(n_pad, k_pad // 128).T, dead), False)


def _mx_offsets(d: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """Table offsets (uint8 ``d + 6``) of shifts ``d``; 0 for the groups that are not ``live``."""
    return torch.where(live, d - _MX_SHIFTS[0] + 1, 0).to(torch.uint8)


def _mx_scale(qw, top: torch.Tensor, dead: int) -> torch.Tensor:
    """fp32 ``2^(top - 6)`` (times ``qw``'s global scale: exact in fp32), 0 where ``top`` is ``dead``."""
    scale = torch.where(top > dead, torch.ldexp(torch.ones_like(top, dtype=torch.float64), top - 6), 0.0)
    scale = scale.to(torch.float32).contiguous()
    if qw.global_scale is not None:
        scale = scale * qw.global_scale.to(torch.float32)
    return scale


def _pack_mx_signs(tiles: torch.Tensor) -> torch.Tensor:
    """Tiles of e2m1 codes (:func:`_pack_nibbles`: nibble p of a word, row r + 8 (p // 4), sign bit 3) with the
    signs moved for ``e2m1x8_to_e4m3`` (fp8_gemm_sm90.cuh): bits 0-2 of each nibble keep its magnitude; bit 3
    of nibble 2j holds the sign of nibble j (row r, byte j of the low result), of nibble 2j + 1 that of nibble
    4 + j (row r + 8, byte j of the high one)."""
    words = tiles.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    out = words & 0x77777777
    for j in range(4):
        out |= ((words >> (4 * j + 3)) & 1) << (8 * j + 3)
        out |= ((words >> (16 + 4 * j + 3)) & 1) << (8 * j + 7)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32).view(torch.uint8)


def _prepare_mxfp4(qw, kp: int, per_row: bool | None) -> PreparedFp8:
    """``per_row``: None for a 2-D weight (its cached fold), else an expert's (the stacked weight's choice)."""
    reason = weight_unsupported(qw) if per_row is None else None
    if reason is not None:
        raise ValueError(f"qw: {reason}")
    fold = _fold_mx(qw) if per_row is None else _compute_mx_fold(qw, per_row)
    if isinstance(fold, str):
        raise ValueError(f"qw: {fold}")
    n, k = qw.N, qw.K
    n_pad, k_pad = cdiv(n, 128) * 128, cdiv(k, 128) * 128
    codes = _kernel_codes(qw, tuple(range(16)))  # the e2m1 codes as they are
    # offset byte of (row r of a tile, k-step g) at 4 r + g after the tile's codes
    offsets = fold.offsets.view(n_pad // 64, 64, k_pad // 128, 4).permute(0, 2, 1, 3).reshape(n_pad // 64, -1, 256)
    weight = torch.cat((_pack_mx_signs(_pack_nibbles(codes)), offsets), dim=-1).contiguous()
    if fold.per_row:
        return PreparedFp8(n, k, kp, "mxfp4", "rowcol", weight, fold.scale, None, None)
    return PreparedFp8(n, k, kp, "mxfp4", "group", weight, None, None, fold.scale)


def prepare(qw) -> PreparedFp8:
    """The kernel's view of an e4m3, int4 or MXFP4 ``QuantizedWeight`` (see :func:`weight_unsupported`), or
    of an expert-stacked e4m3 / int4 one (see :func:`grouped_unsupported`); cached."""
    prep = _prepared.get(qw)
    if prep is None:
        prep = _prepared[qw] = _prepare_stacked(qw) if qw.num_experts is not None else _prepare_2d(qw)
    return prep


def _prepare_stacked(qw) -> PreparedFp8:
    """Each expert prepared as a 2-D weight and written into its slice of the stacked result along N (rows, or
    columns of the ``[num_kb, N]`` group scales), one expert at a time: the peak extra memory is one expert's
    temporaries, not a second copy of the layer. Each expert takes N rounded up to 128 rows, so that no
    weight tile straddles two experts: the e4m3 bytes get zero rows, the other parts are padded already."""
    if qw.format.name not in GROUPED_W_FORMATS:
        raise ValueError(f"qw: the grouped FP8 GEMM takes e4m3 / int4 / MXFP4 experts, not {qw.describe()}")
    experts = qw.num_experts
    per_row = None
    if qw.format.name == "e2m1":  # one scale mode for all experts, decided over all of them
        reason = _layout_unsupported(qw)
        if reason is not None:
            raise ValueError(f"qw: {reason}")
        per_row = _experts_mx_fold(qw)[1]
    first = _prepare_2d(expert_weight(qw, 0), per_row)
    dims = {"weight": 0, "w_scale": 0, "w_block_scale": 0, "w_group_scale": 1}
    slots, stacked = {}, {}  # each expert's extent along the stacked dimension, the stacked tensors
    for name, dim in dims.items():
        part = getattr(first, name)
        if part is not None:
            slots[name] = cdiv(qw.N, 128) * 128 if name == "weight" and first.w_format == "e4m3" else part.shape[dim]
            shape = list(part.shape)
            shape[dim] = slots[name] * experts
            padded = slots[name] != part.shape[dim]
            stacked[name] = (torch.zeros if padded else torch.empty)(shape, dtype=part.dtype, device=part.device)
    for e in range(experts):
        part = first if e == 0 else _prepare_2d(expert_weight(qw, e), per_row)
        for name, out in stacked.items():
            piece = getattr(part, name)
            out.narrow(dims[name], e * slots[name], piece.shape[dims[name]]).copy_(piece)
        del part
    return dataclasses.replace(first, **stacked, maps={}, num_experts=experts)


def _prepare_2d(qw, mx_per_row: bool | None = None) -> PreparedFp8:
    """``mx_per_row``: an MXFP4 expert's fold (:func:`_prepare_mxfp4`); None for 2-D weights."""
    n, k = qw.N, qw.K
    kp = cdiv(k, 16) * 16
    if qw.format.name == "int4":
        return _prepare_int4(qw, kp, _weight_scales(qw))
    if qw.format.name == "e2m1":
        return _prepare_mxfp4(qw, kp, mx_per_row)
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
        if qw.num_experts is not None:
            return _experts_mx_fold(qw)[0] or None
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
