"""The Triton packed 16-bit decode (humming/triton_kernels/_dequant16.py) without a GPU: its PTX, run
instruction by instruction by a small emulator here, gives ``humming.dequantize``'s bits for every code, sign
and zero point, over scales of random significands across the binades; and the host's choice of when it applies.

The emulator knows the instructions the decode uses (``mov``, ``prmt`` in its default mode, ``shr``, ``shl``,
``and``, ``lop3``, ``fma.rn`` on bf16 / f16 pairs, ``cvt.rn.satfinite.e4m3x2.f16x2``). The scaled GEMM's packed
e4m3 decode (humming/triton_kernels/_decode_e4m3.py) runs on it too. An ``fma`` is computed exactly in float64
(its operands are 16-bit floats and its products of these decodes fit in fp32's significand) and rounded once
to the 16-bit format through fp32, which is exact up to that last rounding. The GPU tests (tests/test_triton_dequant.py,
tests/test_triton_wna16.py) check the same bits on the hardware.
"""

from __future__ import annotations

import dataclasses
import re
import types

import pytest
import torch
import triton
import triton.language as tl

import humming
from humming.triton_kernels import _decode_e4m3, _dequant16, _weight_tile

MASK = 0xFFFFFFFF
HALF = {"bf16x2": torch.bfloat16, "f16x2": torch.float16}


def _halves(value: int, dtype: torch.dtype) -> torch.Tensor:
    """The two 16-bit floats of a 32-bit register, low half first, as float64."""
    bits = torch.tensor([value & 0xFFFF, value >> 16], dtype=torch.int32).to(torch.int16)
    return bits.view(dtype).double()


def _pack(values: torch.Tensor, dtype: torch.dtype) -> int:
    """Two float64 values rounded once to ``dtype`` (exact float64 -> fp32 first: see the module docstring)."""
    halves = values.float().to(dtype).view(torch.int16).to(torch.int32) & 0xFFFF
    return int(halves[0]) | int(halves[1]) << 16


def _prmt(a: int, b: int, selector: int) -> int:
    """``prmt.b32`` in its default mode: byte ``i`` of the result is the byte of ``b:a`` that nibble ``i`` of the
    selector picks (bits 0-2), or with the nibble's bit 3 set that byte's sign bit replicated."""
    source = (b << 32 | a).to_bytes(8, "little")
    nibbles = [(selector >> 4 * i) & 15 for i in range(4)]
    picked = [source[n & 7] if n < 8 else (0xFF if source[n & 7] & 0x80 else 0) for n in nibbles]
    return int.from_bytes(bytes(picked), "little")


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        index = ((a >> bit) & 1) << 2 | ((b >> bit) & 1) << 1 | ((c >> bit) & 1)
        out |= ((lut >> index) & 1) << bit
    return out


def run_ptx(ptx: str, operands: dict[int, int]) -> dict[int, int]:
    """Run the decode's PTX on 32-bit ``operands`` (``$n`` -> value); returns every ``$n`` it wrote."""
    regs = {f"${n}": value for n, value in operands.items()}
    read = lambda token: int(token, 16) if token.startswith("0x") else regs[token]
    for line in ptx.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        dst, *src = [t.strip() for t in args.split(",")]
        if op == "mov.b32" and src[0].startswith("{"):  # two 16-bit registers, low half first
            regs[dst] = read(src[0][1:]) | read(src[1][:-1]) << 16
        elif op == "mov.b32":
            regs[dst] = read(src[0])
        elif op == "prmt.b32":
            regs[dst] = _prmt(read(src[0]), read(src[1]), read(src[2]))
        elif op == "shr.u32":
            regs[dst] = read(src[0]) >> int(src[1])
        elif op == "shl.b32":
            regs[dst] = (read(src[0]) << int(src[1])) & MASK
        elif op == "and.b32":
            regs[dst] = read(src[0]) & read(src[1])
        elif op == "lop3.b32":
            regs[dst] = _lop3(read(src[0]), read(src[1]), read(src[2]), int(src[3], 16))
        elif op == "cvt.rn.satfinite.e4m3x2.f16x2":  # each half rounded once, clamped to +-448; low half low
            e4m3 = _halves(read(src[0]), torch.float16).clamp(-448, 448).to(torch.float8_e4m3fn)
            codes = e4m3.view(torch.uint8).to(torch.int32)
            regs[dst] = int(codes[0]) | int(codes[1]) << 8
        elif op.startswith("fma.rn."):
            dtype = HALF[op.split(".")[-1]]
            a, b, c = (_halves(read(t), dtype) for t in src)
            regs[dst] = _pack(a * b + c, dtype)
        else:
            raise AssertionError(f"the emulator does not know {op!r}")
    return {int(name[1:]): value for name, value in regs.items() if re.fullmatch(r"\$\d+", name)}


def _word_pairs(qw) -> list[tuple[int, int, int, int]]:
    """(row, first column, word, second word) for every pair of neighbouring words of ``qw``'s rows."""
    words = qw.qweight.to(torch.int64) & MASK
    return [(r, 16 * j, int(words[r, 2 * j]), int(words[r, 2 * j + 1])) for r in range(qw.N) for j in range(qw.K // 16)]


def _scale_bits(qw, dtype: torch.dtype, row: int, col: int) -> int:
    """The 16-bit scale of ``(row, col)``'s group as the kernel hands it to the PTX."""
    group = col // qw.group_shape[1] if qw.group_shape[1] > 0 else 0
    s = qw.scales[row, group]
    if s.dtype == torch.float8_e8m0fnu:
        code = int(s.view(torch.uint8))
        bits = 0x0040 if code == 0 else 0x7FC0 if code == 255 else code << 7
    else:
        bits = int(s.to(dtype).view(torch.int16)) & 0xFFFF
    return bits


CASES = [
    ("int4", 32, False, torch.bfloat16),
    ("int4", 64, False, torch.float16),
    ("int4", 32, True, torch.bfloat16),
    ("int4", -1, True, torch.float16),
    ("mxfp4", 32, False, torch.bfloat16),
    ("nvfp4", 16, False, torch.bfloat16),
]


def _group(qw, col: int) -> int:
    return col // qw.group_shape[1] if qw.group_shape[1] > 0 else 0


def _bits16(value: float, dtype: torch.dtype) -> int:
    return int(torch.tensor(value, dtype=torch.float32).to(dtype).view(torch.int16)) & 0xFFFF


@pytest.mark.parametrize("weight, group_size, zero_point, dtype", CASES, ids=str)
def test_packed_ptx_gives_the_reference_bits(weight, group_size, zero_point, dtype, seed) -> None:
    n, k = 6, 64
    if weight == "mxfp4":
        qw = humming.quantize(torch.randn(n, k), "mxfp4")
        codes = torch.randint(0, 255, qw.scales.shape, dtype=torch.uint8)  # 255 (NaN) is not a valid scale
        codes[0, :2] = torch.tensor([0, 254], dtype=torch.uint8)  # 2^-127 and 2^127
        qw = dataclasses.replace(qw, scales=codes.view(torch.float8_e8m0fnu))
    elif weight == "nvfp4":  # every finite e4m3 scale, both signs; the global scale is applied after the tile
        qw = humming.quantize(torch.randn(n, k), "nvfp4")
        codes = torch.randint(0, 256, qw.scales.shape, dtype=torch.uint8)
        codes = torch.where(codes & 0x7F == 0x7F, codes - 1, codes)
        codes[0, :2] = torch.tensor([0x01, 0x7E], dtype=torch.uint8)  # 2^-9 and 448
        qw = dataclasses.replace(qw, scales=codes.view(torch.float8_e4m3fn), global_scale=None)
    else:
        qw = humming.quantize(torch.randn(n, k), "int4", group_size, zero_point, scale_dtype=dtype)
        span = 40 if dtype == torch.bfloat16 else 12  # every binade the format holds products of 4-bit codes in
        exponents = torch.randint(-span, span + 1, qw.scales.shape).double()
        signs = torch.where(torch.rand(qw.scales.shape) < 0.5, -1.0, 1.0).double()
        scales = (signs * (1 + torch.rand(qw.scales.shape).double()) * 2.0**exponents).to(dtype)
        zeros = None if qw.zeros is None else torch.randint(0, 256, qw.zeros.shape, dtype=torch.uint8)
        qw = dataclasses.replace(qw, scales=scales, zeros=zeros)
    words = torch.randint(-(2**31), 2**31, qw.qweight.shape, dtype=torch.int32)  # every code, every sign
    qw = dataclasses.replace(qw, qweight=words)
    ptx = _dequant16.ptx_of(qw, dtype)
    dense = humming.dequantize(qw, dtype)
    ref, ref_nan = dense.view(torch.int16).to(torch.int32) & 0xFFFF, torch.isnan(dense.float())
    for row, col, w0, w1 in _word_pairs(qw):
        scale = [_scale_bits(qw, dtype, row, c) for c in (col, col + 8)]
        operands = {8: w0, 9: w1, 10: scale[0] | scale[1] << 16}
        if qw.zeros is not None:
            neg = [_bits16(-float(qw.zeros[row, _group(qw, c)]), dtype) for c in (col, col + 8)]
            operands[11] = neg[0] | neg[1] << 16
        out = run_ptx(ptx, operands)
        for field in range(8):
            for half, base in ((0, col), (1, col + 8)):
                got, c = (out[field] >> 16 * half) & 0xFFFF, base + field
                if ref_nan[row, c]:
                    assert torch.isnan(_halves(got, dtype)[0]), (row, c)
                else:
                    assert got == int(ref[row, c]), (row, c, hex(got), hex(int(ref[row, c])))


@pytest.mark.parametrize("signed, zero_points", [(True, False), (False, False), (False, True)], ids=str)
def test_packed_e4m3_ptx_gives_the_fp32_decode_bits(signed, zero_points, seed) -> None:
    """The scaled GEMM's packed e4m3 decode gives, for every 4-bit code of four random words (and any uint8 zero
    point, whose ``q - z`` may need rounding), the e4m3 byte the fp32 decode converts to: ``e4m3(q - z)``."""
    ptx = _decode_e4m3.e4m3_asm(signed, zero_points)
    for _ in range(64):
        words = [int(w) & MASK for w in torch.randint(-(2**31), 2**31, (4,), dtype=torch.int64)]
        zeros = torch.randint(0, 256, (4,)) if zero_points else torch.zeros(4, dtype=torch.int64)
        operands = dict(zip(range(8, 12), words))
        if zero_points:
            neg = [_bits16(-float(z), torch.float16) for z in zeros]
            operands.update({12: neg[0] | neg[1] << 16, 13: neg[2] | neg[3] << 16})
        out = run_ptx(ptx, operands)
        for field in range(8):
            for i, word in enumerate(words):
                code = (word >> 4 * field) & 0xF
                value = code - 16 if signed and code >= 8 else code
                expected = torch.tensor(float(value - int(zeros[i]))).to(torch.float8_e4m3fn).view(torch.uint8)
                got = (out[field] >> 8 * i) & 0xFF
                assert got == int(expected), (field, i, hex(word), int(zeros[i]), hex(got), hex(int(expected)))


def test_e2m1_byte_table_ptx_gives_twice_the_values_offset_by_12(seed) -> None:
    """The GEMV's e2m1 decode (``_weight_tile._e2m1_bytes_asm``) turns every code of random words, both signs and
    both zeros among them, into the byte ``12 + 2 * value`` (code ``i`` -> byte ``i`` of ``$0``, code ``4 + i`` ->
    byte ``i`` of ``$1``): the values of the e2m1 format."""
    values = humming.ir.get_format("e2m1").decode(torch.arange(16, dtype=torch.uint8)).double()
    words = [int(w) & MASK for w in torch.randint(-(2**31), 2**31, (62,), dtype=torch.int64)]
    words += [0x76543210, 0xFEDCBA98]  # every code in every place
    for word in words:
        out = run_ptx(_weight_tile._e2m1_bytes_asm(), {2: word})
        for field in range(8):
            got = (out[field // 4] >> 8 * (field % 4)) & 0xFF
            expected = 12 + 2 * values[(word >> 4 * field) & 15]
            assert got == expected, (hex(word), field, got, float(expected))


@triton.jit
def _e2m1_probe(words_ptr, out_ptr, W: tl.constexpr):
    """The GEMV's e2m1 fields of ``W`` words, field ``j`` of word ``w`` at ``out[j, w]``."""
    words = tl.load(words_ptr + tl.arange(0, W))[None, None, :]
    fields = _weight_tile.e2m1_fields(words)  # [8, 1, W]
    tl.store(out_ptr + tl.arange(0, 8)[:, None, None] * W + tl.arange(0, W)[None, None, :], fields)


def test_e2m1_fields_are_exact(seed, device) -> None:
    """What the GEMV multiplies for e2m1 codes: field ``j`` of each word is ``2 * value * 2^(8 (j % 2))`` exactly,
    for every code in every place (on a GPU through the byte table's PTX, on the interpreter by arithmetic)."""
    values = humming.ir.get_format("e2m1").decode(torch.arange(16, dtype=torch.uint8)).double()
    words = torch.randint(-(2**31), 2**31, (64,), dtype=torch.int64)
    words[:2] = torch.tensor([0x76543210, 0xFEDCBA98 - 2**32])
    words = words.to(torch.int32)
    out = torch.full((8, 64), float("nan"), dtype=torch.float32, device=device)
    _e2m1_probe[(1,)](words.to(device), out, 64)
    codes = (words.to(torch.int64)[None, :] >> (4 * torch.arange(8)[:, None])) & 15
    expected = 2 * values[codes] * (2.0 ** (8 * (torch.arange(8) % 2)))[:, None].double()
    assert torch.equal(out.cpu().double(), expected)


def test_the_host_takes_the_packed_e4m3_decode_where_it_is_exact(monkeypatch) -> None:
    """``e4m3_applies`` (off under the interpreter: patched here) takes int4 / uint4 codes (uint8 zero points) on
    the e4m3 MMA from sm_89 on, with the scales promoted or applied at the end, not folded into the weight;
    ``packed_e4m3`` adds ``HUMMING_TRITON_PACKED_DECODE``."""
    monkeypatch.setattr(_decode_e4m3, "INTERPRET", False)
    w = torch.randn(64, 256)
    int4 = humming.quantize(w, "int4", 128, scale_dtype=torch.bfloat16)
    applies = lambda qw, mma="e4m3", w_scale="promote", cc=(9, 0): _decode_e4m3.e4m3_applies(qw, mma, w_scale, cc)
    assert applies(int4) and applies(int4, cc=(8, 9)) and applies(int4, w_scale="end")
    assert not applies(int4, cc=(8, 0)) and not applies(int4, mma="bf16") and not applies(int4, w_scale="fold")
    assert applies(humming.quantize(w, "int4", 128, True, scale_dtype=torch.bfloat16))
    assert not applies(humming.quantize(w, "int8", -1, scale_dtype=torch.float32))
    assert not applies(humming.quantize(w, "mxfp4"))
    assert not applies(humming.quantize(w, "int4", 32, g_idx=torch.arange(256) % 8, scale_dtype=torch.bfloat16))
    monkeypatch.delenv("HUMMING_TRITON_PACKED_DECODE", raising=False)
    assert _decode_e4m3.packed_e4m3(int4, "e4m3", "promote", (9, 0)) == _decode_e4m3.e4m3_asm(True, False)
    monkeypatch.setenv("HUMMING_TRITON_PACKED_DECODE", "0")
    assert _decode_e4m3.packed_e4m3(int4, "e4m3", "promote", (9, 0)) == ""


@triton.jit
def _fields_probe(out_ptr, BN: tl.constexpr, BKW: tl.constexpr):
    """Field ``j`` of word ``w`` in row ``n`` holds ``n * 8 * BKW + 8w + j``: its place in the tile."""
    BK: tl.constexpr = 8 * BKW
    base = tl.arange(0, BN)[:, None] * BK + 8 * tl.arange(0, BKW)[None, :]
    tile = _dequant16.fields_to_tile(base, base + 1, base + 2, base + 3, base + 4, base + 5, base + 6, base + 7)
    offs = tl.arange(0, BN)[:, None] * BK + tl.arange(0, BK)[None, :]
    tl.store(out_ptr + offs, tile)


@pytest.mark.parametrize("bn, bkw", [(16, 4), (64, 16), (32, 32)])
def test_fields_land_in_their_columns(bn, bkw, device) -> None:
    """The packed decode's eight field tiles become the ``[BN, BK]`` tile with field ``j`` of word ``w`` in
    column ``8w + j`` (the PTX's outputs, checked above, are fields; this is where the kernels put them)."""
    out = torch.full((bn, 8 * bkw), -1, dtype=torch.int32, device=device)
    _fields_probe[(1,)](out, bn, bkw)
    assert torch.equal(out.cpu(), torch.arange(bn * 8 * bkw, dtype=torch.int32).view(bn, 8 * bkw))


@triton.jit
def _scales_probe(s_ptr, out_ptr, N, K, stride_sn, k0, BN: tl.constexpr, BK: tl.constexpr, WEIGHT: tl.constexpr):
    """The 16-bit scale the packed decode hands the PTX for each code word of the tile at ``k0``."""
    vals = _dequant16.per_word(s_ptr, stride_sn, tl.arange(0, BN), k0, N, K, BK, WEIGHT, True, tl.bfloat16, True)
    offs = tl.arange(0, BN)[:, None] * (BK // 8) + tl.arange(0, BK // 8)[None, :]
    tl.store(out_ptr + offs, tl.broadcast_to(vals, (BN, BK // 8)))


@pytest.mark.parametrize("weight, group_size", [("mxfp4", 32), ("nvfp4", 16), ("int4", 256)], ids=str)
def test_word_scales_are_the_scales_in_bf16(weight, group_size, device) -> None:
    """Each code word gets its group's scale as bf16, exactly: e8m0 codes (2^-127 .. 2^127) by their bits, e4m3
    codes (every finite one, subnormals included) through their value, 16-bit scales as stored; groups smaller
    than the tile (one per word pair or per word) and larger."""
    from humming.triton_kernels._weight_tile import kernel_tensors, weight_spec

    n, k, bk = 16, 512, 128
    scale_dtype = torch.bfloat16 if weight == "int4" else None
    qw = humming.quantize(torch.randn(n, k), weight, group_size, scale_dtype=scale_dtype)
    if qw.scales.dtype == torch.float8_e8m0fnu:
        codes = torch.randint(0, 255, qw.scales.shape, dtype=torch.uint8)
        qw = dataclasses.replace(qw, scales=codes.view(qw.scales.dtype))
    elif qw.scales.dtype == torch.float8_e4m3fn:
        codes = torch.randint(0, 256, qw.scales.shape, dtype=torch.uint8)
        qw = dataclasses.replace(qw, scales=torch.where(codes & 0x7F == 0x7F, codes - 1, codes).view(qw.scales.dtype))
    qw = qw.to(device)
    scales = kernel_tensors(qw)["s"]
    for k0 in (0, 256):
        out = torch.full((n, bk // 8), float("nan"), dtype=torch.bfloat16, device=device)
        _scales_probe[(1,)](scales, out, n, k, scales.stride(0), k0, n, bk, weight_spec(qw))
        groups = (k0 + 8 * torch.arange(bk // 8)) // group_size
        expected = qw.scales.float()[:, groups].to(torch.bfloat16)
        assert torch.equal(out.view(torch.int16).cpu(), expected.view(torch.int16).cpu()), (weight, k0)


def test_the_host_takes_the_packed_decode_where_it_is_exact(monkeypatch) -> None:
    """``dequant16_applies`` (off under the interpreter, which runs no PTX: patched here) accepts 4-bit integer
    codes with 16-bit scales of the activations' dtype and uint8 zero points, and MXFP4 for bf16, and nothing
    whose decode would round differently; ``packed_decode`` adds ``HUMMING_TRITON_PACKED_DECODE`` (on by
    default)."""
    monkeypatch.setattr(_dequant16, "INTERPRET", False)
    w = torch.randn(64, 256)
    applies = lambda qw, dtype=torch.bfloat16, cc=(9, 0), bk=128: _dequant16.dequant16_applies(qw, dtype, bk, cc)
    int4_bf16 = humming.quantize(w, "int4", 128, scale_dtype=torch.bfloat16)
    assert applies(int4_bf16) and applies(int4_bf16, bk=64) and not applies(int4_bf16, cc=(7, 5))
    assert not applies(int4_bf16, torch.float16)  # bf16 scales for fp16 activations: rounded twice
    assert applies(humming.quantize(w, "int4", 32, True, scale_dtype=torch.float16), torch.float16, (7, 5))
    assert applies(humming.quantize(w, "int4", -1, True, scale_dtype=torch.bfloat16))
    assert not applies(humming.quantize(w, "int4", 128))  # fp32 scales
    assert not applies(humming.quantize(w, "int4", 128, "float", scale_dtype=torch.bfloat16))
    assert not applies(humming.quantize(w, "int8", -1, scale_dtype=torch.bfloat16))
    assert not applies(humming.quantize(w, "int4", 32, g_idx=torch.arange(256) % 8, scale_dtype=torch.bfloat16))
    mxfp4 = humming.quantize(w, "mxfp4")
    assert applies(mxfp4) and not applies(mxfp4, torch.float16)
    nvfp4 = humming.quantize(w, "nvfp4")
    assert not applies(nvfp4)  # a global scale: the fp32 product rounds first, unless the kernel applies it after
    assert _dequant16.dequant16_applies(nvfp4, torch.bfloat16, 128, (9, 0), global_scale_after=True)
    assert not _dequant16.dequant16_applies(nvfp4, torch.float16, 128, (9, 0), global_scale_after=True)
    assert applies(humming.quantize(w, "e2m1", 16, scale_dtype=torch.float8_e4m3fn))  # e4m3 scales, no global one
    h200 = types.SimpleNamespace(capability=(9, 0))
    monkeypatch.setattr(_dequant16, "device_info", lambda device: h200)
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    monkeypatch.delenv("HUMMING_TRITON_PACKED_DECODE", raising=False)
    ptx = _dequant16.ptx_of(int4_bf16, torch.bfloat16)
    assert _dequant16.packed_decode(int4_bf16, torch.bfloat16, 128, gpu) == ptx  # on by default
    monkeypatch.setenv("HUMMING_TRITON_PACKED_DECODE", "0")
    assert _dequant16.packed_decode(int4_bf16, torch.bfloat16, 128, gpu) == ""
    monkeypatch.setenv("HUMMING_TRITON_PACKED_DECODE", "1")
    assert _dequant16.packed_decode(int4_bf16, torch.bfloat16, 128, gpu) == ptx
    assert _dequant16.packed_decode(int4_bf16, torch.bfloat16, 128, cpu) == ""  # the interpreter runs no PTX
