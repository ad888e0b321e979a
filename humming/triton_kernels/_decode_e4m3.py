"""4-bit integer weights straight to e4m3 tiles for the scaled GEMM's fp8 MMA, four code words per instruction
group (private).

The scaled GEMM's fp8 path (W4A8: int4 / uint4 weights on e4m3 activations) decodes each weight in fp32 and
converts it to e4m3, with the tile stored to shared memory one byte at a time: its K loop issues several times
what the tile's wgmma takes (bench/results/cpu-sass/triton_w4a8_packed.md). Here (PTX through
``tl.inline_asm_elementwise``, four code words per invocation):

- a field is OR'd into the mantissa of an fp16 of value 1024 (``lop3`` on one field of two words at a time,
  a signed field's sign bit flipped in the same instruction): the fp16 holds ``1024 + c`` exactly;
- one ``fma`` subtracts 1024 (1032 for signed codes: ``(c ^ 8) - 8`` is the two's complement value), and with
  integer zero points one more subtracts the zero point (``q - z``, at most 9 bits: exact in fp16);
- ``cvt.rn.satfinite.e4m3x2.f16x2`` rounds both to e4m3 once, as the fp32 decode's conversion does (the
  integers -16 .. 16 are e4m3 values: int4 and uint4 codes without zero points convert exactly).

The weight scales stay where the compute plan puts them (promoted per K step, or applied at the end); a plan
that folds them into the weight keeps the fp32 decode. It applies to 4-bit integer codes without act-order on
sm_89 and later (the conversion instruction), on the GPU only (Triton's interpreter runs no inline assembly).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._env import env
from ..ir.weight import QuantizedWeight
from ._dequant16 import code_words, fields_to_tile, per_word
from ._weight_tile import KIND_INT, KIND_UINT, weight_spec
from .interpreter import INTERPRET

__all__ = ["e4m3_applies", "e4m3_asm", "e4m3_ptx", "load_weight_tile_e4m3", "packed_e4m3"]

#: fp16 bits of 1024 and of 1.0
_MAGIC, _ONE = 0x6400, 0x3C00


def e4m3_asm(signed: bool, zero_points: bool) -> str:
    """PTX of one invocation: four code words (``$8`` .. ``$11``: eight fields each, field ``j`` in bits ``4j``),
    with zero points their negated values as fp16 (``$12``: words 0 and 1, ``$13``: words 2 and 3) -> field ``j``
    of the four words as e4m3 bytes in ``$j`` (byte ``i`` from word ``i``). Every output byte depends on its own
    word's inputs only, whichever four elements Triton hands an invocation."""
    offset = 1024 + (8 if signed else 0)
    neg_offset = torch.tensor(-offset, dtype=torch.float16).view(torch.int16).item() & 0xFFFF
    pair = lambda half: f"0x{half:04X}{half:04X}"
    ops = [
        "{",
        ".reg .b32 t0, t1, u0, u1, h, one, off;",
        ".reg .b16 lo, hi;",
        f"mov.b32 one, {pair(_ONE)};",
        f"mov.b32 off, {pair(neg_offset)};",
    ]
    # lop3 LUT 0x6A: b ? a ^ c : c. Inside the field mask the code (a signed one's sign bit flipped by c's
    # bit 3), outside it the magic number's bits.
    lut_c = pair(_MAGIC | (0x0008 if signed else 0))
    for byte in range(4):
        for p, (a, b) in enumerate((("$8", "$9"), ("$10", "$11"))):
            # byte b of two words -> the low byte of each half; its high nibble -> the low nibble
            ops += [f"prmt.b32 t{p}, {a}, {b}, 0x{byte + 4:X}0{byte:X};", f"shr.u32 u{p}, t{p}, 4;"]
        for reg, field in (("t", 2 * byte), ("u", 2 * byte + 1)):
            for p, half in enumerate(("lo", "hi")):
                ops.append(f"lop3.b32 h, {reg}{p}, 0x000F000F, {lut_c}, 0x6A;")
                ops.append("fma.rn.f16x2 h, h, one, off;")
                if zero_points:
                    ops.append(f"fma.rn.f16x2 h, h, one, ${12 + p};")
                ops.append(f"cvt.rn.satfinite.e4m3x2.f16x2 {half}, h;")
            ops.append(f"mov.b32 ${field}, {{lo, hi}};")
    ops.append("}")
    return "\n".join(ops)


_ASM = {(signed, zp): e4m3_asm(signed, zp) for signed in (False, True) for zp in (False, True)}


def e4m3_applies(qw: QuantizedWeight, mma: str, w_scale: str, capability: tuple[int, int]) -> bool:
    """Whether :func:`load_weight_tile_e4m3` computes the e4m3 operand of ``qw`` for a compute plan with MMA
    operand ``mma`` and weight scales ``w_scale`` on a GPU of ``capability`` (see the module docstring)."""
    if INTERPRET or mma != "e4m3" or w_scale == "fold" or capability < (8, 9):
        return False
    spec = weight_spec(qw)
    zeros_ok = not spec.HAS_ZP or (spec.W_KIND == KIND_UINT and qw.zeros.dtype == torch.uint8)
    return spec.W_KIND in (KIND_INT, KIND_UINT) and spec.W_BITS == 4 and not spec.ACT_ORDER and zeros_ok


def e4m3_ptx(qw: QuantizedWeight, mma: str, w_scale: str, capability: tuple[int, int]) -> str:
    """The PTX of :func:`e4m3_asm` for ``qw`` where :func:`e4m3_applies`, else ``""``: the scaled GEMM's ``PACKED``
    constexpr (what the compile checks build)."""
    if not e4m3_applies(qw, mma, w_scale, capability):
        return ""
    spec = weight_spec(qw)
    return _ASM[(spec.W_KIND == KIND_INT, spec.HAS_ZP)]


def packed_e4m3(qw: QuantizedWeight, mma: str, w_scale: str, capability: tuple[int, int]) -> str:
    """A launch's ``PACKED`` constexpr: :func:`e4m3_ptx` while ``HUMMING_TRITON_PACKED_DECODE`` is on (the
    default), else ``""`` (the fp32 decode)."""
    return e4m3_ptx(qw, mma, w_scale, capability) if env("HUMMING_TRITON_PACKED_DECODE") else ""


@triton.jit
def load_weight_tile_e4m3(weight, spec, offs_n, k0, N, K, BK: tl.constexpr, EVEN_K: tl.constexpr, PACKED: tl.constexpr):
    """``[BN, BK]`` e4m3 values ``q - z`` of rows ``offs_n``, columns ``k0 .. k0 + BK`` (the fp32 decode's
    operand, bit for bit) for the weights :func:`e4m3_applies` accepts. Elements outside ``[N, K]`` are finite
    garbage, as the fp32 decode's."""
    words = code_words(weight, offs_n, k0, N, K, BK, EVEN_K)
    if spec.HAS_ZP:
        zeros = per_word(weight.z, weight.stride_zn, offs_n, k0, N, K, BK, spec, EVEN_K, tl.float16, False)
        args = [words, tl.broadcast_to(zeros, words.shape)]
        constraints: tl.constexpr = "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r"
    else:
        args = [words]
        constraints: tl.constexpr = "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r"
    f = tl.inline_asm_elementwise(PACKED, constraints, args, dtype=(tl.uint8,) * 8, is_pure=True, pack=4)
    tile = fields_to_tile(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7])
    return tile.to(tl.float8e4nv, bitcast=True)
