"""4-bit weights straight to 16-bit tiles, two weights per instruction (private).

:func:`~._weight_tile.load_weight_tile` decodes every weight in fp32 and the tensor-core kernels round the tile
to the activations' dtype: several instructions per weight, more than the issue rate allows at the byte floor,
so the small-M kernels are bound by issue, not by the weight bytes (bench/results/cpu-sass/triton_dequant16.md).
Where the formats allow it, :func:`load_weight_tile_16` computes the same bits on packed pairs of 16-bit floats
instead (PTX through ``tl.inline_asm_elementwise``, two code words per invocation):

- a 4-bit field is OR'd into the mantissa of a 16-bit float of value ``2^m`` (128 for bf16, 1024 for fp16:
  ``lop3`` on two fields at a time, with the sign bit of a signed field flipped in the same instruction), so
  the float holds ``2^m + c`` exactly;
- one ``fma`` subtracts ``2^m`` (plus 8 for signed codes: ``(c ^ 8) - 8`` is the two's complement value), and
  for unsigned codes with integer zero points one more subtracts the zero point (``q - z`` is an integer of
  at most 9 bits: exact in both formats);
- one ``fma`` multiplies by the scale and adds -0: the product of a 4-bit integer and a 16-bit float is exact
  in fp32, so its one rounding to the 16-bit format is the rounding :func:`humming.dequantize` applies to
  ``(q - z) * float32(scale)``. The tile is bit-equal to the fp32 decode rounded to the activations' dtype
  (tests/test_triton_dequant.py checks it bit for bit on the GPU; the GEMMs built on it may order K
  differently inside their MMA instructions, tests/test_triton_wna16.py).

e2m1 codes with e8m0 scales (MXFP4) or e4m3 scales (NVFP4) and bf16 activations take the same path with their
own placement of the bits (:func:`_e2m1_asm`): an e2m1 value has at most 2 significant bits and an e4m3 scale 4,
so their product is exact in bf16, and so is the tile. NVFP4's fp32 global scale would round that product
again: the tile leaves it out, and the GEMM kernels multiply their fp32 accumulators by it
(:func:`times_global_scale`); the dequantization kernel, which has no accumulator, keeps the fp32 decode for it.

It applies where those steps are exact (:func:`dequant16_applies`): int4 / uint4 codes with 16-bit scales of
the activations' dtype and integer zero points of at most 8 bits, or MXFP4 / NVFP4 for bf16; no act-order; on
the GPU only (Triton's interpreter runs no inline assembly) and for bf16 on sm_80 and later (``fma.rn.bf16x2``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._env import env
from ..device import device_info
from ..ir.weight import QuantizedWeight
from ._weight_tile import (
    KIND_FLOAT,
    KIND_INT,
    KIND_UINT,
    NAN_NONE,
    SCALE_E4M3,
    SCALE_E8M0,
    SCALE_FLOAT,
    decode_scale,
    group_tile,
    load_weight_tile,
    subgroup_tile,
    weight_spec,
)
from .interpreter import INTERPRET, cast

__all__ = [
    "code_words",
    "dequant16_applies",
    "dequantized_tile",
    "fields_to_tile",
    "load_weight_tile_16",
    "packed_asm",
    "packed_codes",
    "packed_decode",
    "per_word",
    "ptx_of",
    "times_global_scale",
]

#: Per 16-bit format: (the bits of 2^m, whose mantissa holds a 4-bit field in its low bits; the bits of 1.0).
_MAGIC = {"bf16": (0x4300, 0x3F80), "f16": (0x6400, 0x3C00)}
_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def _pair(half: int) -> str:
    """A 16-bit pattern in both halves of a 32-bit PTX immediate."""
    return f"0x{half:04X}{half:04X}"


def _value(bits: int, fmt: str) -> float:
    """The value of a 16-bit pattern of the format."""
    return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(_DTYPES[fmt]).item()


def _negative_bits(value: float, fmt: str) -> int:
    """The 16-bit pattern of ``-value`` (an integer exact in the format)."""
    return torch.tensor(-value, dtype=_DTYPES[fmt]).view(torch.int16).item() & 0xFFFF


def _asm(fmt: str, signed: bool, zero_points: bool) -> str:
    """PTX of one invocation: two code words (``$8``, ``$9``: eight fields each, field ``j`` in bits ``4j``), the
    scale of each (``$10``: two 16-bit floats), with zero points their negated values (``$11``) -> field ``j`` of
    both words as two 16-bit floats in ``$j``. Every output element depends on its own word's input elements
    only, whichever two elements Triton hands an invocation."""
    magic, one = _MAGIC[fmt]
    offset = _value(magic, fmt) + (8 if signed else 0)
    kind = "bf16x2" if fmt == "bf16" else "f16x2"
    # lop3 LUT 0x6A: b ? a ^ c : c. Inside the field mask the code (its sign bit flipped by c's bit 3 for
    # signed codes), outside it the magic number's bits.
    lut_c = _pair(magic | (0x0008 if signed else 0))
    ops = [
        "{",
        ".reg .b32 t, u, one, off, nz;",
        f"mov.b32 one, {_pair(one)};",
        f"mov.b32 off, {_pair(_negative_bits(offset, fmt))};",
        f"mov.b32 nz, {_pair(0x8000)};",
    ]
    for byte in range(4):
        ops += [
            f"prmt.b32 t, $8, $9, 0x{byte + 4:X}0{byte:X};",  # byte b of each word -> the low byte of a half
            "shr.u32 u, t, 4;",
        ]
        for reg, field in (("t", 2 * byte), ("u", 2 * byte + 1)):
            ops.append(f"lop3.b32 {reg}, {reg}, 0x000F000F, {lut_c}, 0x6A;")
            ops.append(f"fma.rn.{kind} {reg}, {reg}, one, off;")
            if zero_points:
                ops.append(f"fma.rn.{kind} {reg}, {reg}, one, $11;")
            ops.append(f"fma.rn.{kind} ${field}, {reg}, $10, nz;")
    ops.append("}")
    return "\n".join(ops)


def _e2m1_asm() -> str:
    """PTX of one invocation for e2m1 codes and bf16 activations, operands as :func:`_asm`'s (``$10``: the
    scales, ``2^(c - 127)`` as bf16): a field's magnitude bits go to bf16 bits 6-8 (its exponent field's two
    low bits and its mantissa's top bit) and its sign to bit 15, which is the field's value times 2^-126
    (a zero exponent field reads as the subnormal ``m * 2^-127``, i.e. ``m * 0.5`` times 2^-126); one exact
    multiply by 2^126 and one by the scale, rounded once, follow."""
    ops = [
        "{",
        ".reg .b32 t, u, a, b, big, nz;",
        f"mov.b32 big, {_pair(0x7E80)};",  # 2^126
        f"mov.b32 nz, {_pair(0x8000)};",
    ]
    for byte in range(4):
        ops += [f"prmt.b32 t, $8, $9, 0x{byte + 4:X}0{byte:X};", "shr.u32 u, t, 4;"]
        for reg, field in (("t", 2 * byte), ("u", 2 * byte + 1)):
            ops += [
                f"shl.b32 a, {reg}, 6;",
                f"shl.b32 b, {reg}, 12;",
                "and.b32 a, a, 0x01C001C0;",
                f"lop3.b32 {reg}, a, b, 0x80008000, 0xF8;",  # a | (b & c)
                f"fma.rn.bf16x2 {reg}, {reg}, big, nz;",
                f"fma.rn.bf16x2 ${field}, {reg}, $10, nz;",
            ]
    ops.append("}")
    return "\n".join(ops)


#: The PTX of each (16-bit format, signed codes, zero points) of 4-bit integer codes, and of MXFP4 for bf16.
_INT4_ASM = {
    (fmt, signed, zp): _asm(fmt, signed, zp) for fmt in _MAGIC for signed in (False, True) for zp in (False, True)
}
_E2M1_ASM = _e2m1_asm()


def dequant16_applies(
    qw: QuantizedWeight,
    act_dtype: torch.dtype,
    block_k: int,
    capability: tuple[int, int],
    global_scale_after: bool = False,
) -> bool:
    """Whether :func:`load_weight_tile_16` computes ``qw``'s tiles of ``block_k`` columns for activations of
    ``act_dtype`` on a GPU of ``capability`` (see the module docstring); a weight with a global scale only for
    a kernel that applies it after the tile (``global_scale_after``)."""
    if INTERPRET or act_dtype not in (torch.bfloat16, torch.float16):
        return False
    if act_dtype == torch.bfloat16 and capability < (8, 0):
        return False
    spec = weight_spec(qw)
    groups_ok = spec.GK == 0 or spec.GK % block_k == 0 or (block_k % spec.GK == 0 and spec.GK % 8 == 0)
    if spec.W_BITS != 4 or spec.ACT_ORDER or not groups_ok or block_k < 32:
        return False
    if spec.W_KIND == KIND_FLOAT:  # e2m1 with e8m0 (MXFP4) or e4m3 scales (NVFP4), bf16 activations
        e2m1 = (spec.W_EBITS, spec.W_MBITS, spec.W_BIAS, spec.W_NAN) == (2, 1, 1, NAN_NONE)
        scales_ok = spec.S_KIND == SCALE_E8M0 or (spec.S_KIND == SCALE_E4M3 and (global_scale_after or not spec.HAS_GS))
        return e2m1 and scales_ok and not spec.HAS_ZP and act_dtype == torch.bfloat16
    if spec.HAS_GS:
        return False
    zeros_ok = not spec.HAS_ZP or (spec.W_KIND == KIND_UINT and qw.zeros.dtype == torch.uint8)
    return (
        spec.W_KIND in (KIND_INT, KIND_UINT)
        and spec.S_KIND == SCALE_FLOAT
        and qw.scales.dtype == act_dtype
        and zeros_ok
    )


def packed_asm(
    qw: QuantizedWeight,
    act_dtype: torch.dtype,
    block_k: int,
    capability: tuple[int, int],
    global_scale_after: bool = False,
) -> str:
    """The PTX of ``qw``'s packed decode for ``act_dtype`` activations where it is exact
    (:func:`dequant16_applies`), else ``""``: the kernels' ``PACKED`` constexpr (what the compile checks build)."""
    applies = dequant16_applies(qw, act_dtype, block_k, capability, global_scale_after)
    return ptx_of(qw, act_dtype) if applies else ""


def ptx_of(qw: QuantizedWeight, act_dtype: torch.dtype) -> str:
    """The packed decode's PTX for ``qw``'s format and ``act_dtype`` activations (a weight
    :func:`dequant16_applies` accepts)."""
    spec = weight_spec(qw)
    if spec.W_KIND == KIND_FLOAT:
        return _E2M1_ASM
    return _INT4_ASM[("bf16" if act_dtype == torch.bfloat16 else "f16", spec.W_KIND == KIND_INT, spec.HAS_ZP)]


def packed_decode(
    qw: QuantizedWeight,
    act_dtype: torch.dtype,
    block_k: int,
    device: torch.device,
    global_scale_after: bool = False,
) -> str:
    """A launch's ``PACKED`` constexpr on ``device``: :func:`packed_asm` while ``HUMMING_TRITON_PACKED_DECODE`` is
    on (the default), else ``""`` (the fp32 decode)."""
    if not env("HUMMING_TRITON_PACKED_DECODE") or device.type != "cuda":
        return ""
    return packed_asm(qw, act_dtype, block_k, device_info(device).capability, global_scale_after)


def packed_codes(qw: QuantizedWeight, act_dtype: torch.dtype, device: torch.device) -> str:
    """The kind of codes (``"int"``, ``"float"``) the GEMM kernels' packed decode reads of ``qw`` for ``act_dtype``
    activations on ``device`` with K tiles of 128, or ``""`` where it does not apply: the tile chooser's input."""
    if not packed_decode(qw, act_dtype, 128, device, global_scale_after=True):
        return ""
    return "float" if weight_spec(qw).W_KIND == KIND_FLOAT else "int"


@triton.jit
def _as_16_bit(vals, spec, DTYPE: tl.constexpr, SCALES: tl.constexpr):
    """Scales (``SCALES``) or zero points as stored -> ``DTYPE``: e8m0 codes ``c`` as the bf16 bits of ``2^(c - 127)``
    (``c = 0`` the subnormal 2^-127, 255 NaN), e4m3 scales by their fp32 value (exact in bf16), 16-bit scales
    as they are, zero points negated (exact: 8 bits)."""
    if SCALES and spec.S_KIND == 2:  # e4m3
        out = decode_scale(vals, spec.S_KIND).to(DTYPE)
    elif SCALES and spec.S_KIND == 3:  # e8m0
        c = vals.to(tl.int32)
        bits = tl.where(c == 0, 0x0040, tl.where(c == 255, 0x7FC0, c << 7))
        out = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
    elif SCALES:
        out = vals.to(DTYPE)
    else:
        out = (-(vals.to(tl.float32))).to(DTYPE)
    return out


@triton.jit
def per_word(
    ptr,
    stride_n,
    offs_n,
    k0,
    N,
    K,
    BK: tl.constexpr,
    spec,
    EVEN_K: tl.constexpr,
    DTYPE: tl.constexpr,
    SCALES: tl.constexpr,
):
    """The scales (``SCALES``) or negated zero points of each code word of the tile as ``DTYPE``
    (:func:`_as_16_bit`, converted once per group): ``[BN, 1]`` where the tile lies in one group along K, else
    ``[BN, BK // 8]``."""
    BN: tl.constexpr = offs_n.shape[0]
    if spec.GK > 0 and spec.GK < BK:
        vals = _as_16_bit(
            subgroup_tile(ptr, stride_n, offs_n, k0, N, K, BK, spec.GN, spec.GK, EVEN_K), spec, DTYPE, SCALES
        )
        vals = tl.reshape(tl.broadcast_to(vals[:, :, None], (BN, BK // spec.GK, spec.GK // 8)), (BN, BK // 8))
    else:
        vals = group_tile(ptr, stride_n, offs_n, offs_n, k0, N, K, offs_n, BK, spec.GN, spec.GK, False, EVEN_K)
        vals = _as_16_bit(vals, spec, DTYPE, SCALES)
    return vals


@triton.jit
def code_words(weight, offs_n, k0, N, K, BK: tl.constexpr, EVEN_K: tl.constexpr):
    """The int32 code words ``[BN, BK // 8]`` of 4-bit fields holding columns ``k0 .. k0 + BK`` of rows ``offs_n``
    (0 outside ``[N, K]``)."""
    BKW: tl.constexpr = BK // 8
    rows = weight.qw + offs_n.to(tl.int64)[:, None] * weight.stride_qn
    offs_w = tl.multiple_of(k0 // 8, BKW) + tl.arange(0, BKW)
    ok = offs_n[:, None] < N
    if not EVEN_K:
        ok = ok & (offs_w[None, :] < (K + 7) // 8)
    return tl.load(rows + offs_w[None, :], mask=ok, other=0)


@triton.jit
def load_weight_tile_16(
    weight, spec, offs_n, k0, N, K, BK: tl.constexpr, EVEN_K: tl.constexpr, DTYPE: tl.constexpr, PACKED: tl.constexpr
):
    """``[BN, BK]`` of ``humming.dequantize(qw, DTYPE)``: rows ``offs_n``, columns ``k0 .. k0 + BK``, for the weights
    :func:`dequant16_applies` accepts (the same bits as rounding :func:`~._weight_tile.load_weight_tile`'s tile
    to ``DTYPE``), without the global scale (the caller applies it after the dot). Elements outside ``[N, K]``
    are finite garbage, as there."""
    words = code_words(weight, offs_n, k0, N, K, BK, EVEN_K)
    scales = per_word(weight.s, weight.stride_sn, offs_n, k0, N, K, BK, spec, EVEN_K, DTYPE, True)
    if spec.HAS_ZP:
        zeros = per_word(weight.z, weight.stride_zn, offs_n, k0, N, K, BK, spec, EVEN_K, DTYPE, False)
        args = [words, scales, zeros]
        constraints: tl.constexpr = "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r"
    else:
        args = [words, scales]
        constraints: tl.constexpr = "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r"
    f = tl.inline_asm_elementwise(PACKED, constraints, args, dtype=(scales.dtype,) * 8, is_pure=True, pack=2)
    return fields_to_tile(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7])


@triton.jit
def fields_to_tile(f0, f1, f2, f3, f4, f5, f6, f7):
    """``[BN, BKW]`` tiles of fields 0..7 of each code word -> the ``[BN, 8 * BKW]`` tile, field ``j`` of word
    ``w`` in column ``8w + j``."""
    BN: tl.constexpr = f0.shape[0]
    BK: tl.constexpr = 8 * f0.shape[1]
    # tl.join adds its axis last, so the innermost join's axis varies slowest: [BN, BKW, a, b, c] holds field
    # 4a + 2b + c, and [BKW, a, b, c] flattens to 8w + 4a + 2b + c.
    w = tl.join(tl.join(tl.join(f0, f4), tl.join(f2, f6)), tl.join(tl.join(f1, f5), tl.join(f3, f7)))
    # Made [BK, BN] and transposed back: reshaped to [BN, BK] directly, the tile fails to compile as the shared
    # B operand of sm_90's wgmma (Triton 3.9: "Illegal shared layout" in TritonGPUOptimizeDotOperands).
    return tl.trans(tl.reshape(tl.permute(w, (1, 2, 3, 4, 0)), (BK, BN)))


@triton.jit
def dequantized_tile(
    weight, spec, offs_n, k0, N, K, BK: tl.constexpr, EVEN_K: tl.constexpr, DTYPE: tl.constexpr, PACKED: tl.constexpr
):
    """``[BN, BK]`` of ``humming.dequantize(qw, DTYPE)``: by :func:`load_weight_tile_16` with the PTX the host chose
    (``PACKED``, :func:`packed_decode`; the global scale left out, see :func:`times_global_scale`), else (``""``)
    the fp32 decode rounded once."""
    if len(PACKED) > 0:
        w = load_weight_tile_16(weight, spec, offs_n, k0, N, K, BK, EVEN_K, DTYPE, PACKED)
    else:
        w = cast(load_weight_tile(weight, spec, offs_n, k0, N, K, BK, EVEN_K), DTYPE)
    return w


@triton.jit
def times_global_scale(acc, weight, spec, PACKED: tl.constexpr):
    """A GEMM's fp32 accumulator of :func:`dequantized_tile`'s tiles times the weight's global scale where the
    packed tiles left it out (``PACKED`` non-empty and the weight has one), else ``acc`` as it is."""
    if len(PACKED) > 0 and spec.HAS_GS:
        acc = acc * tl.load(weight.gs)
    return acc
