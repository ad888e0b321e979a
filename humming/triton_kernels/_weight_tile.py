"""Reading the weight IR inside Triton kernels: unpack, decode, zero points, scales (private).

:func:`load_weight_tile` returns a dequantized fp32 tile ``[BN, BK]`` of a :class:`~humming.QuantizedWeight`
computed exactly as :func:`humming.dequantize` does (``(decode(q) - zero) * (float32(scale) * global)``, one
fp32 rounding each), so a kernel that rounds it to bf16/fp16 matches ``dequantize(qw, dtype)`` bit for bit.
Every variation is a ``constexpr`` that :func:`weight_spec` derives from the IR: the kernels are specialised,
not copied per format.

A kernel takes the weight's tensors and row strides as flat arguments (``qw_ptr``...), bundled once inside it
into a :class:`WeightArgs`, and its layout as one constexpr, the :class:`WeightSpec` ``WEIGHT``
(:func:`weight_spec`: a tuple of numbers, which Triton specialises on like any constexpr), and hands the two
to the helpers here: ``load_weight_tile(weight, WEIGHT, offs_n, k0, N, K, BK, EVEN_K)``. Named tuples cross
``@triton.jit`` calls as Triton tuples (plain Python tuples under the interpreter); the helpers branch on the
spec's fields at compile time.

Codes decode by bit arithmetic, never a conversion instruction: a small integer ``c`` becomes a float as
``bitcast(c | 0x4B000000) - 2^23`` (exact for ``c < 2^23``), an eXmY value as its significand times a power
of two built from its exponent field. Lookup formats (nf4) read the format's value table.

The word-tile helpers (:func:`int_fields`, :func:`float_fields`) decode every field of a ``[1, BN, W]``
tile of words in place, ``[32 // bits, BN, W]`` (fields first: Triton's default layout of a new 3-D tensor
spreads its last dimension over threads and keeps its first one in each thread's registers), without
first shifting each field down to bit 0: integer fields are read where they lie in their 16-bit half of the
word (one AND-OR and one subtraction per weight, the value scaled by a power of two that the caller removes
from the activations), float fields are placed into fp32 exponent and mantissa bits straight from the word
and scaled by one exact power of two, and e2m1 fields (:func:`e2m1_fields`) become integer bytes by table
lookup, then read as integer fields.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..ir.weight import QuantizedWeight
from .interpreter import INTERPRETED, and_or

__all__ = [
    "WeightArgs",
    "WeightSpec",
    "decode_codes",
    "decode_scale",
    "decode_weight",
    "e2m1_fields",
    "field_offsets",
    "float_fields",
    "group_tile",
    "int_fields",
    "kernel_tensors",
    "load_weight_tile",
    "pointer_types",
    "scale_kind",
    "scale_tile",
    "subgroup_tile",
    "triton_type",
    "unpack_tile",
    "weight_spec",
    "with_global_scale",
    "zero_tile",
]

# Element kinds (W_KIND) and scale kinds (S_KIND) as the kernels see them.
KIND_INT, KIND_UINT, KIND_FLOAT, KIND_LUT = 0, 1, 2, 3
NAN_NONE, NAN_FN, NAN_IEEE = 0, 1, 2
SCALE_NONE, SCALE_FLOAT, SCALE_E4M3, SCALE_E8M0 = 0, 1, 2, 3
_NAN_RULES = {"none": NAN_NONE, "fn": NAN_FN, "ieee": NAN_IEEE}


class WeightSpec(NamedTuple):
    """The layout constexprs of a weight: what the kernel is specialised for (never tuning). Numbers and
    bools only (a kernel takes the whole tuple as one constexpr, ``WEIGHT``)."""

    W_KIND: int
    W_BITS: int
    W_EBITS: int
    W_MBITS: int
    W_BIAS: int
    W_NAN: int
    S_KIND: int
    GN: int  # scale group size along N; 0 = the whole N (one group)
    GK: int  # scale group size along K; 0 = the whole K
    HAS_ZP: bool
    HAS_GS: bool
    ACT_ORDER: bool


class WeightArgs(NamedTuple):
    """A weight's kernel arguments inside a kernel: the tensors of :func:`kernel_tensors` (pointers; absent
    ones are a dummy that the spec never reads) and the row strides of the codes, scales and zero points."""

    qw: object
    s: object
    z: object
    gs: object
    gidx: object
    lut: object
    stride_qn: object
    stride_sn: object
    stride_zn: object


def scale_kind(dtype: torch.dtype | None) -> int:
    """The S_KIND of scales of ``dtype`` (weights' or activations'): 8-bit float scales are decoded from their
    codes, other floats converted; ``None``: no scales."""
    if dtype is None:
        return SCALE_NONE
    return {torch.float8_e4m3fn: SCALE_E4M3, torch.float8_e8m0fnu: SCALE_E8M0}.get(dtype, SCALE_FLOAT)


def weight_spec(qw: QuantizedWeight) -> WeightSpec:
    """The constexprs that specialise a kernel for ``qw``'s format and layout."""
    fmt = qw.format
    kind = {"int": KIND_INT if fmt.signed else KIND_UINT, "float": KIND_FLOAT, "lut": KIND_LUT}[fmt.kind]
    bn, bk = qw.group_shape
    return WeightSpec(
        W_KIND=kind,
        W_BITS=fmt.bits,
        W_EBITS=fmt.exponent_bits,
        W_MBITS=fmt.mantissa_bits,
        W_BIAS=fmt.bias,
        W_NAN=_NAN_RULES[fmt.nan_rule],
        S_KIND=scale_kind(None if qw.scales is None else qw.scales.dtype),
        GN=max(bn, 0),
        GK=max(bk, 0),
        HAS_ZP=qw.zeros is not None,
        HAS_GS=qw.global_scale is not None and qw.scales is not None,
        ACT_ORDER=qw.g_idx is not None,
    )


def kernel_tensors(qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """The weight's tensors as kernel arguments (contiguous): fp8 scales as uint8 codes, absent ones as a dummy.

    Keys: ``qw``, ``s``, ``z``, ``gs``, ``gidx``, ``lut`` (the format's fp32 value table, or a dummy).
    """
    dummy = qw.qweight.contiguous()
    scales = None if qw.scales is None else qw.scales.contiguous()
    if scales is not None and scales.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu):
        scales = scales.view(torch.uint8)
    lut = qw.format.value_table(qw.device) if qw.format.kind == "lut" else dummy
    return {
        "qw": dummy,
        "s": dummy if scales is None else scales,
        "z": dummy if qw.zeros is None else qw.zeros.contiguous(),
        "gs": dummy if qw.global_scale is None else qw.global_scale,
        "gidx": dummy if qw.g_idx is None else qw.g_idx,
        "lut": lut,
    }


def pointer_args(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weight's pointer parameters of every kernel that reads the IR (``qw_ptr`` ... ``lut_ptr``), from
    :func:`kernel_tensors`."""
    return {f"{name}_ptr": t[name] for name in ("qw", "s", "z", "gs", "gidx", "lut")}


_TRITON_TYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
}


def triton_type(dtype: torch.dtype) -> str:
    """Triton's name of a torch dtype (``torch.bfloat16`` -> ``"bf16"``), for signatures."""
    return _TRITON_TYPES[dtype]


def pointer_types(qw: QuantizedWeight) -> dict[str, str]:
    """Pointer signature of :func:`kernel_tensors` as kernel arguments ``qw_ptr``, ``s_ptr``..."""
    return {f"{name}_ptr": "*" + triton_type(t.dtype) for name, t in kernel_tensors(qw).items()}


@triton.jit
def _small_int_to_float(c):
    """int32 ``c`` in ``[0, 2^23)`` -> its fp32 value, by the exponent trick (no conversion instruction)."""
    return (c | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def decode_codes(
    c,
    lut_ptr,
    W_KIND: tl.constexpr,
    W_BITS: tl.constexpr,
    W_EBITS: tl.constexpr,
    W_MBITS: tl.constexpr,
    W_BIAS: tl.constexpr,
    W_NAN: tl.constexpr,
):
    """int32 codes (values in ``[0, 2^W_BITS)``) -> fp32 values, bit-exact with ``NumberFormat.decode``."""
    if W_KIND == 0:  # two's complement: flip the sign bit, then subtract its weight
        half: tl.constexpr = 1 << (W_BITS - 1)
        v = ((c ^ half) | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + half)
    elif W_KIND == 1:
        v = _small_int_to_float(c)
    elif W_KIND == 2:
        exp_field = (c >> W_MBITS) & ((1 << W_EBITS) - 1)
        mant = c & ((1 << W_MBITS) - 1)
        significand = tl.where(exp_field == 0, mant, mant | (1 << W_MBITS))
        # 2^(e - bias - mbits) as fp32 bits; the exponent stays within the normal fp32 range for <= 8 bits.
        pow2 = ((tl.maximum(exp_field, 1) + (127 - W_BIAS - W_MBITS)) << 23).to(tl.float32, bitcast=True)
        v = _small_int_to_float(significand) * pow2
        v = (v.to(tl.int32, bitcast=True) | ((c >> (W_EBITS + W_MBITS)) << 31)).to(tl.float32, bitcast=True)
        if W_NAN == 1:  # "fn": only the all-ones magnitude is NaN
            magnitude_mask: tl.constexpr = (1 << (W_EBITS + W_MBITS)) - 1
            v = tl.where((c & magnitude_mask) == magnitude_mask, float("nan"), v)
        elif W_NAN == 2:  # "ieee": all-ones exponent is inf (mantissa 0) or NaN
            inf = tl.where(v < 0, float("-inf"), float("inf"))
            special = tl.where(mant == 0, inf, float("nan"))
            v = tl.where(exp_field == (1 << W_EBITS) - 1, special, v)
    else:
        v = tl.load(lut_ptr + c)
    return v


@triton.jit
def field_offsets(W_BITS: tl.constexpr):
    """``[32 // W_BITS]`` int32: the bit offset of each field of a word inside its 16-bit half (fields
    ``0 .. n/2 - 1`` lie in the low half, the others in the high half). 1, 2, 4 and 8 bits only."""
    PER_WORD: tl.constexpr = 32 // W_BITS
    return (tl.arange(0, PER_WORD) % (PER_WORD // 2)) * W_BITS


@triton.jit
def int_fields(words, spec, zoff):
    """Integer fields (1, 2, 4, 8 bits) of a word tile ``[1, BN, W]`` -> fp32 ``[32 // bits, BN, W]``: field ``j``
    of each word is ``(value - zoff) * 2^o_j`` exactly, ``o_j`` its :func:`field_offsets` (the caller
    multiplies the activation of field ``j`` by ``2^-o_j``; products and sums stay exact).

    ``zoff``: what to subtract from the unsigned field (the zero point; a scalar or a tensor broadcastable to
    the result); a signed field is first made unsigned by flipping its sign bit, which adds ``2^(bits-1)`` to
    its offset. The field is OR'd into the mantissa of 2^23 in place (it never leaves its half word), and one
    subtraction of ``2^23 + zoff * 2^o_j`` (exact: integers below 2^23) leaves the value."""
    W_BITS: tl.constexpr = spec.W_BITS
    PER_WORD: tl.constexpr = 32 // W_BITS
    if spec.W_KIND == 0:
        # bit (W_BITS - 1) of every field, as an int32 constant
        SIGNS: tl.constexpr = ((0xFFFFFFFF // ((1 << W_BITS) - 1)) << (W_BITS - 1)) - (1 << 32)
        words = words ^ SIGNS
        zoff = zoff + (1 << (W_BITS - 1))
    offset = field_offsets(W_BITS)[:, None, None]
    high = (tl.arange(0, PER_WORD) >= PER_WORD // 2)[:, None, None]
    w = words
    half = tl.where(high, w >> 16, w)
    bits = and_or(half, ((1 << W_BITS) - 1) << offset, 0x4B000000)
    pow2 = ((offset + 127) << 23).to(tl.float32, bitcast=True)
    return bits.to(tl.float32, bitcast=True) - (8388608.0 + zoff * pow2)


#: e2m1 magnitude codes 0..7 as twice their value, 0 1 2 3 4 6 8 12, offset by 12 for positive (+) and negative (-)
#: codes: the byte tables of :data:`_E2M1_BYTES_ASM`, four bytes to a register, code 0 in the low byte.
_E2M1_PLUS = (0x0F0E0D0C, 0x18141210)
_E2M1_MINUS = (0x090A0B0C, 0x00040608)


def _e2m1_bytes_asm() -> str:
    """PTX of one invocation: a word of eight e2m1 codes (``$2``, code ``j`` in bits ``4j``) -> byte ``i`` of ``$0``
    (of ``$1``) is ``12 + 2 * value`` of code ``i`` (of code ``4 + i``). Per half word: ``prmt`` looks the four
    magnitudes up in both tables at once (its selector's four nibbles are the codes with their sign bits
    cleared), a third ``prmt`` in sign-replicate mode turns each code's sign into a byte mask (0x80 or 0xFF:
    every table byte is below 0x80), and one ``lop3`` picks each byte's table by it."""
    plus, minus = _E2M1_PLUS, _E2M1_MINUS
    ops = [
        "{",
        ".reg .b32 sel, raw, p0, p1, n0, n1, h, p, n, m;",
        f"mov.b32 p0, 0x{plus[0]:08X};",
        f"mov.b32 p1, 0x{plus[1]:08X};",
        f"mov.b32 n0, 0x{minus[0]:08X};",
        f"mov.b32 n1, 0x{minus[1]:08X};",
        "mov.b32 h, 0x80808080;",
        "and.b32 sel, $2, 0x77777777;",
        "mov.b32 raw, $2;",
    ]
    for half in range(2):
        if half:
            ops += ["shr.u32 sel, sel, 16;", "shr.u32 raw, raw, 16;"]
        ops += [
            "prmt.b32 p, p0, p1, sel;",
            "prmt.b32 n, n0, n1, sel;",
            "prmt.b32 m, h, h, raw;",
            f"lop3.b32 ${half}, p, n, m, 0xD8;",  # m ? n : p
        ]
    ops.append("}")
    return "\n".join(ops)


_E2M1_BYTES_ASM = tl.constexpr(_e2m1_bytes_asm())


@triton.jit
def e2m1_fields(words):
    """e2m1 fields (sign, 2 exponent bits with bias 1, 1 mantissa bit) of a word tile ``[1, BN, W]`` -> fp32
    ``[8, BN, W]``: field ``j`` is ``2 * value * 2^(8 (j % 2))``, exact (the caller multiplies the activation of
    field ``j`` by ``2^-(8 (j % 2) + 1)``). Each code becomes the byte ``12 + 2 * value`` by table lookup
    (:func:`_e2m1_bytes_asm`: a few instructions per word), and the bytes are read in place as
    :func:`int_fields` reads 8-bit fields, where :func:`float_fields` shifts, masks and signs every field."""
    j = tl.arange(0, 8)[:, None, None]
    offset = 8 * (j % 2)
    if INTERPRETED:  # no inline assembly: the same bytes by integer arithmetic
        low, high = _e2m1_bytes(words, 0), _e2m1_bytes(words, 16)
    else:
        low, high = tl.inline_asm_elementwise(
            _E2M1_BYTES_ASM, "=r,=r,r", [words], dtype=(tl.int32, tl.int32), is_pure=True, pack=1
        )
    both = tl.where(j < 4, low, high)
    half = tl.where((j % 4) >= 2, both >> 16, both)
    bits = and_or(half, 0xFF << offset, 0x4B000000)
    return bits.to(tl.float32, bitcast=True) - (8388608.0 + 12.0 * (1 << offset).to(tl.float32))


@triton.jit
def _e2m1_bytes(words, SHIFT: tl.constexpr):
    """What :func:`_e2m1_bytes_asm` puts in one register: byte ``i`` is ``12 + 2 * value`` of the code in bits
    ``SHIFT + 4i`` of each word."""
    out = tl.zeros(words.shape, tl.int32)
    for i in tl.static_range(4):
        code = (words >> (SHIFT + 4 * i)) & 15
        e, m = (code >> 1) & 3, code & 1
        twice = tl.where(e == 0, m, (1 << e) + (m << tl.maximum(e - 1, 0)))
        out |= (12 + tl.where(code >= 8, -twice, twice)) << (8 * i)
    return out


@triton.jit
def float_fields(words, spec):
    """eXmY fields (1, 2, 4, 8 bits; at most 7 exponent bits) of a word tile ``[1, BN, W]`` -> fp32
    ``[32 // bits, BN, W]``, bit-exact with ``NumberFormat.decode``: the exponent and mantissa bits are
    placed as the low exponent and high mantissa bits of an fp32 (subnormals land as fp32 subnormals), the
    sign as its sign, and one multiply by ``2^(127 - bias)`` (exact) gives the value."""
    W_BITS: tl.constexpr = spec.W_BITS
    EBITS: tl.constexpr = spec.W_EBITS
    MBITS: tl.constexpr = spec.W_MBITS
    PER_WORD: tl.constexpr = 32 // W_BITS
    MAG: tl.constexpr = ((1 << (EBITS + MBITS)) - 1) << (23 - MBITS)
    pos = (tl.arange(0, PER_WORD) * W_BITS)[:, None, None]
    w = words
    up = 23 - MBITS - pos  # shift of the field's magnitude bits into place (either way)
    mag = tl.where(up >= 0, w << tl.maximum(up, 0), w >> tl.maximum(-up, 0)) & MAG
    sign = (w << (32 - W_BITS - pos)) & -2147483648
    SCALE: tl.constexpr = 2.0 ** (127 - spec.W_BIAS)
    v = (mag | sign).to(tl.float32, bitcast=True) * SCALE
    if spec.W_NAN == 1:  # "fn": only the all-ones magnitude is NaN
        v = tl.where(mag == MAG, float("nan"), v)
    elif spec.W_NAN == 2:  # "ieee": all-ones exponent is inf (mantissa 0) or NaN
        EXP: tl.constexpr = ((1 << EBITS) - 1) << 23
        special = tl.where((mag & ~EXP) == 0, tl.where(sign != 0, float("-inf"), float("inf")), float("nan"))
        v = tl.where((mag & EXP) == EXP, special, v)
    return v


@triton.jit
def decode_scale(s, S_KIND: tl.constexpr):
    """Loaded scales -> fp32 (``float32(scale)`` of docs/ir.md)."""
    if S_KIND == 1:
        out = s.to(tl.float32)
    elif S_KIND == 2:
        out = decode_codes(s.to(tl.int32), s, 2, 8, 4, 3, 7, 1)
    else:  # e8m0: 2^(c - 127); c = 0 is the subnormal 2^-127, c = 255 is NaN
        c = s.to(tl.int32)
        out = (c << 23).to(tl.float32, bitcast=True)
        out = tl.where(c == 0, tl.full(c.shape, 0x00400000, tl.int32).to(tl.float32, bitcast=True), out)
        out = tl.where(c == 255, float("nan"), out)
    return out


@triton.jit
def decode_weight(codes, weight, spec):
    """The weight's int32 codes -> fp32 values (:func:`decode_codes` for the weight's format)."""
    return decode_codes(
        codes, weight.lut, spec.W_KIND, spec.W_BITS, spec.W_EBITS, spec.W_MBITS, spec.W_BIAS, spec.W_NAN
    )


@triton.jit
def unpack_tile(weight, spec, offs_n, k0, N, K, BK: tl.constexpr, EVEN_K: tl.constexpr = False):
    """int32 codes ``[BN, BK]`` of columns ``k0 .. k0 + BK`` (the canonical little-endian bit stream)."""
    W_BITS: tl.constexpr = spec.W_BITS
    n_words = (K * W_BITS + 31) // 32
    row = weight.qw + offs_n.to(tl.int64)[:, None] * weight.stride_qn
    n_ok = offs_n[:, None] < N
    if 32 % W_BITS == 0 and BK >= 32 // W_BITS:
        # Fields never straddle words: load whole words (vectorised), then spread each into its fields.
        PER_WORD: tl.constexpr = 32 // W_BITS
        BKW: tl.constexpr = BK // PER_WORD
        offs_w = tl.multiple_of(k0 // PER_WORD, BKW) + tl.arange(0, BKW)
        words_ok = n_ok if EVEN_K else n_ok & (offs_w[None, :] < n_words)
        words = tl.load(row + offs_w[None, :], mask=words_ok, other=0)
        shifts = tl.arange(0, PER_WORD) * W_BITS
        codes = (words[:, :, None] >> shifts[None, None, :]) & ((1 << W_BITS) - 1)
        codes = tl.reshape(codes, (words.shape[0], BK))
    else:
        # 3, 5, 6, 7 bits: a field may straddle two words; read both (the second only where needed). Also
        # tiles narrower than a word (1-bit codes, BK = 16): each field reads its own word, none straddles.
        pos = (k0 + tl.arange(0, BK)) * W_BITS
        word = pos >> 5
        shift = pos & 31
        ok = n_ok if EVEN_K else n_ok & (word[None, :] < n_words)
        lo = tl.load(row + word[None, :], mask=ok, other=0).to(tl.uint32, bitcast=True)
        straddles = (shift + W_BITS > 32)[None, :]
        hi = tl.load(row + word[None, :] + 1, mask=ok & straddles, other=0).to(tl.uint32, bitcast=True)
        # (hi << 1) << (31 - shift) == hi << (32 - shift) without a shift by 32 when shift == 0.
        both = (lo >> shift[None, :]) | ((hi << 1) << (31 - shift)[None, :])
        codes = (both & ((1 << W_BITS) - 1)).to(tl.int32, bitcast=True)
    return codes


@triton.jit
def group_tile(
    ptr,
    stride_n,
    offs_n,
    offs_k,
    k0,
    N,
    K,
    gidx_ptr,
    BK: tl.constexpr,
    GN: tl.constexpr,
    GK: tl.constexpr,
    ACT_ORDER: tl.constexpr,
    EVEN_K: tl.constexpr = False,
):
    """Per-group values (scales or zeros) for the tile, broadcastable to ``[BN, BK]``."""
    gn = offs_n // GN if GN > 0 else offs_n * 0
    row = ptr + gn.to(tl.int64)[:, None] * stride_n
    n_ok = offs_n[:, None] < N
    if ACT_ORDER:
        k_ok = offs_k < K
        g = tl.load(gidx_ptr + offs_k, mask=k_ok, other=0)
        vals = tl.load(row + g[None, :], mask=n_ok & k_ok[None, :], other=0)
    elif GK == 0:
        vals = tl.load(row, mask=n_ok, other=0)
    elif GK % BK == 0:  # the tile lies inside one group along K (k0 is a multiple of BK)
        vals = tl.load(row + k0 // GK, mask=n_ok, other=0)
    else:
        vals = tl.load(row + (offs_k // GK)[None, :], mask=n_ok & (offs_k[None, :] < K), other=0)
    return vals


@triton.jit
def zero_tile(weight, spec, offs_n, offs_k, k0, N, K, BK: tl.constexpr, EVEN_K: tl.constexpr = False):
    """The weight's zero points (as stored) for the tile ``offs_n`` x ``offs_k``, broadcastable to ``[BN, BK]``."""
    return group_tile(
        weight.z, weight.stride_zn, offs_n, offs_k, k0, N, K, weight.gidx, BK, spec.GN, spec.GK, spec.ACT_ORDER, EVEN_K
    )


@triton.jit
def scale_tile(weight, spec, offs_n, offs_k, k0, N, K, BK: tl.constexpr, EVEN_K: tl.constexpr = False):
    """``float32(scale)`` for the tile ``offs_n`` x ``offs_k``, broadcastable to ``[BN, BK]``; without the global
    scale (:func:`with_global_scale`), which the scaled GEMM applies elsewhere when it folds scales."""
    s = group_tile(
        weight.s, weight.stride_sn, offs_n, offs_k, k0, N, K, weight.gidx, BK, spec.GN, spec.GK, spec.ACT_ORDER, EVEN_K
    )
    return decode_scale(s, spec.S_KIND)


@triton.jit
def with_global_scale(scales, weight, spec):
    """fp32 ``scales`` times the weight's global scale where it has one: ``float32(scale) * global``, one fp32
    rounding, as :func:`humming.dequantize` computes it before the product meets the codes or an accumulator."""
    if spec.HAS_GS:
        scales = scales * tl.load(weight.gs)
    return scales


@triton.jit
def subgroup_tile(ptr, stride_n, offs_n, k0, N, K, BK: tl.constexpr, GN: tl.constexpr, GK: tl.constexpr, EVEN_K):
    """Per-group values for a tile that holds whole groups along K (``BK % GK == 0``): ``[BN, BK // GK]``."""
    gn = offs_n // GN if GN > 0 else offs_n * 0
    gk = k0 // GK + tl.arange(0, BK // GK)
    ok = offs_n[:, None] < N
    if not EVEN_K:
        ok = ok & (gk[None, :] * GK < K)
    return tl.load(ptr + gn.to(tl.int64)[:, None] * stride_n + gk[None, :], mask=ok, other=0)


@triton.jit
def load_weight_tile(weight, spec, offs_n, k0, N, K, BK: tl.constexpr, EVEN_K: tl.constexpr = False):
    """fp32 ``[BN, BK]``: rows ``offs_n``, columns ``k0 .. k0 + BK`` of ``humming.dequantize(qw)``.

    ``weight``: the :class:`WeightArgs` of ``qw``; ``spec``: its :class:`WeightSpec`. ``EVEN_K`` (K % BK == 0)
    drops the masks along K. Elements outside ``[N, K]`` are garbage but finite (for finite scales): a dot
    product whose activations are masked to 0 past K gets nothing from them.
    """
    GN: tl.constexpr = spec.GN
    GK: tl.constexpr = spec.GK
    offs_k = k0 + tl.arange(0, BK)
    w = decode_weight(unpack_tile(weight, spec, offs_n, k0, N, K, BK, EVEN_K), weight, spec)
    # Groups smaller than the tile: view the tile as [BN, groups, GK] and apply one value per group.
    SUBGROUPS: tl.constexpr = (not spec.ACT_ORDER) and GK > 0 and GK < BK and BK % GK == 0
    BN: tl.constexpr = w.shape[0]
    if SUBGROUPS:
        w = tl.reshape(w, (BN, BK // GK, GK))
    if spec.HAS_ZP:
        if SUBGROUPS:
            z = subgroup_tile(weight.z, weight.stride_zn, offs_n, k0, N, K, BK, GN, GK, EVEN_K)
            z = z.to(tl.float32)[:, :, None]
        else:
            z = zero_tile(weight, spec, offs_n, offs_k, k0, N, K, BK, EVEN_K)
        w = w - z.to(tl.float32)
    if spec.S_KIND != 0:
        if SUBGROUPS:
            s = subgroup_tile(weight.s, weight.stride_sn, offs_n, k0, N, K, BK, GN, GK, EVEN_K)
            s = decode_scale(s, spec.S_KIND)
        else:
            s = scale_tile(weight, spec, offs_n, offs_k, k0, N, K, BK, EVEN_K)
        s = with_global_scale(s, weight, spec)
        w = w * (s[:, :, None] if SUBGROUPS else s)
    if SUBGROUPS:
        w = tl.reshape(w, (BN, BK))
    return w
