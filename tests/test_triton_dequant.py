"""The Triton dequantization kernel against ``humming.dequantize``: bit-exact, every format and layout.

Runs under Triton's CPU interpreter without a GPU (tests/conftest.py); NaN outputs must be NaN at the same
places (their bit patterns differ between torch and the GPU's conversion instructions).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch
from helpers import assert_bit_exact

import humming
from humming.ir.formats import FORMATS
from humming.ir.packing import pack_codes

triton_dequant = pytest.importorskip("humming.triton_kernels.dequant")

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class Case:
    weight: str
    group_size: object = 128
    zero_point: object = False
    scale_dtype: torch.dtype | None = None
    act_order: bool = False
    shape: tuple[int, int] = (24, 200)

    def __str__(self) -> str:
        gs = self.group_size if not isinstance(self.group_size, tuple) else "x".join(map(str, self.group_size))
        sd = "" if self.scale_dtype is None else str(self.scale_dtype).replace("torch.", "")
        parts = [self.weight, f"g{gs}", f"zp={self.zero_point}" if self.zero_point else "", sd]
        parts += ["act-order" if self.act_order else "", "x".join(map(str, self.shape))]
        return "-".join(p for p in parts if p)


CASES = [
    Case("int4"),
    Case("int4", group_size=-1, scale_dtype=torch.bfloat16),
    Case("int8", group_size="tensor", shape=(17, 77)),
    Case("int2", group_size=16, scale_dtype=torch.float16),
    Case("int3", group_size=32),
    Case("int4", zero_point=True, group_size=64, shape=(33, 130)),
    Case("int5", zero_point=True, group_size=32),
    Case("int6", zero_point="float", group_size=64, scale_dtype=torch.bfloat16),
    Case("int7", zero_point=True),
    Case("int1", zero_point=True, group_size=-1),
    Case("int4", group_size=32, act_order=True),
    Case("int8", zero_point=True, group_size=32, act_order=True),
    Case("e2m1", group_size=32, scale_dtype=torch.float8_e8m0fnu),
    Case("nvfp4", group_size=16),
    Case("e2m3", group_size=32, scale_dtype=torch.float8_e8m0fnu),
    Case("e3m2", group_size=32, scale_dtype=torch.float8_e4m3fn),
    Case("e4m3", group_size=-1),
    Case("e4m3", group_size=(128, 128), shape=(130, 260)),
    Case("e5m2", group_size=(16, 64)),
    Case("e1m2", group_size=16),
    Case("e3m3", group_size=64, scale_dtype=torch.float16),
    Case("nf4", group_size=64, scale_dtype=torch.bfloat16),
]

#: The weights the packed 16-bit decode takes (humming/triton_kernels/_dequant16.py) for the output dtype named:
#: 4-bit integer codes with 16-bit scales of that dtype, with or without 8-bit zero points, groups larger and
#: smaller than the kernel's K tile, K not a multiple of a word; e2m1 codes with e8m0 or e4m3 scales (no global
#: scale: the dequantization keeps the fp32 decode for one).
PACKED_CASES = [
    (Case("int4", group_size=128, scale_dtype=torch.bfloat16, shape=(48, 512)), torch.bfloat16),
    (Case("int4", group_size=-1, scale_dtype=torch.float16, shape=(40, 200)), torch.float16),
    (Case("int4", zero_point=True, group_size=64, scale_dtype=torch.bfloat16, shape=(33, 130)), torch.bfloat16),
    (Case("int4", zero_point=True, group_size=32, scale_dtype=torch.float16, shape=(64, 1024)), torch.float16),
    (Case("int4", zero_point=True, group_size=512, scale_dtype=torch.bfloat16, shape=(16, 1024)), torch.bfloat16),
    (Case("e2m1", group_size=32, scale_dtype=torch.float8_e8m0fnu, shape=(48, 512)), torch.bfloat16),
    (Case("e2m1", group_size=32, scale_dtype=torch.float8_e8m0fnu, shape=(17, 96)), torch.bfloat16),
    (Case("e2m1", group_size=16, scale_dtype=torch.float8_e4m3fn, shape=(48, 512)), torch.bfloat16),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_dequant_matches_reference(case: Case, seed: int, device: str) -> None:
    w = torch.randn(case.shape, device=device) * 3
    kwargs = {"group_size": case.group_size, "zero_point": case.zero_point, "scale_dtype": case.scale_dtype}
    if case.act_order:
        n_groups = -(-case.shape[1] // case.group_size)
        kwargs["g_idx"] = torch.randint(0, n_groups, (case.shape[1],), dtype=torch.int32, device=device)
    qw = humming.quantize(w, case.weight, **kwargs)
    for dtype in OUT_DTYPES:
        assert_bit_exact(triton_dequant.dequantize(qw, dtype), humming.dequantize(qw, dtype))


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.kind != "e8m0"], ids=str)
def test_decode_every_code(fmt, device: str) -> None:
    """Every code of every format, NaN and inf included, decodes as ``NumberFormat.decode``."""
    codes = torch.arange(fmt.num_codes, device=device).reshape(1, -1).repeat(3, 1)
    qw = humming.QuantizedWeight(shape=tuple(codes.shape), format=fmt, qweight=pack_codes(codes, fmt.bits))
    assert_bit_exact(triton_dequant.dequantize(qw, torch.float32), humming.dequantize(qw, torch.float32))


def test_rejects_expert_weights(device: str) -> None:
    qw = humming.quantize(torch.randn(2, 16, 64, device=device), "int4", group_size=32)
    with pytest.raises(ValueError, match="2-D weight"):
        triton_dequant.dequantize(qw)


def test_launch_is_made_ready_once_per_weight_and_dtype(device: str) -> None:
    """The dequantize-first GEMM dequantizes on every call: later calls reuse the first one's prepared launch
    (its arguments bound once), and give the same values."""
    qw = humming.quantize(torch.randn(32, 256, device=device), "int4", group_size=128)
    first = triton_dequant.dequantize(qw, torch.bfloat16)
    kinds = triton_dequant._ready.kinds[qw]
    assert_bit_exact(triton_dequant.dequantize(qw, torch.bfloat16), first)
    assert list(kinds) == [(torch.bfloat16, qw.device)]
    triton_dequant.dequantize(qw, torch.float16)
    assert len(kinds) == 2


@pytest.mark.gpu
def test_dequant_realistic_shape(seed: int) -> None:
    qw = humming.quantize(torch.randn(4096, 4096, device="cuda"), "int4", group_size=128)
    assert_bit_exact(triton_dequant.dequantize(qw, torch.bfloat16), humming.dequantize(qw, torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("case, dtype", PACKED_CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_packed_16_bit_decode_is_bit_exact(case: Case, dtype: torch.dtype, seed: int, monkeypatch) -> None:
    """The packed 16-bit decode gives ``humming.dequantize(qw, dtype)`` bit for bit: on quantized weights, then
    with scales of random significands across the binades (2^-40 .. 2^40 for bf16; products that round) and
    random codes and zero points over their whole ranges."""
    from humming.triton_kernels._dequant16 import packed_decode

    monkeypatch.setenv("HUMMING_TRITON_PACKED_DECODE", "1")

    qw = humming.quantize(
        torch.randn(case.shape, device="cuda") * 3,
        case.weight,
        group_size=case.group_size,
        zero_point=case.zero_point,
        scale_dtype=case.scale_dtype,
    )
    assert packed_decode(qw, dtype, triton_dequant._BLOCK_K, qw.device)
    assert_bit_exact(triton_dequant.dequantize(qw, dtype), humming.dequantize(qw, dtype))
    span = 40 if dtype == torch.bfloat16 else 12  # fp16 scales stay finite (the IR takes finite scales only)
    exponents = torch.randint(-span, span + 1, qw.scales.shape, device="cuda").float()
    signs = torch.where(torch.rand(qw.scales.shape, device="cuda") < 0.5, -1.0, 1.0)
    scales = (signs * (1 + torch.rand(qw.scales.shape, device="cuda")) * 2.0**exponents).to(dtype)
    if qw.scales.dtype == torch.float8_e8m0fnu:  # every finite code: 2^-127 .. 2^127
        scales = torch.randint(0, 255, qw.scales.shape, device="cuda", dtype=torch.uint8).view(qw.scales.dtype)
    elif qw.scales.dtype == torch.float8_e4m3fn:  # every finite code, both signs, subnormals included
        codes = torch.randint(0, 256, qw.scales.shape, device="cuda", dtype=torch.uint8)
        scales = torch.where(codes & 0x7F == 0x7F, codes - 1, codes).view(qw.scales.dtype)
    zeros = None if qw.zeros is None else torch.randint(0, 256, qw.zeros.shape, device="cuda", dtype=torch.uint8)
    words = qw.qweight  # K not a multiple of a word: the last word's padding stays zero
    if qw.K % 8 == 0:
        words = torch.randint(-(2**31), 2**31, qw.qweight.shape, device="cuda", dtype=torch.int32)
    wide = dataclasses.replace(qw, qweight=words, scales=scales, zeros=zeros)
    assert_bit_exact(triton_dequant.dequantize(wide, dtype), humming.dequantize(wide, dtype))
