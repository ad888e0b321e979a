"""The number-format registry: bit-exact decode/encode against torch, ml_dtypes and the OCP MX tables."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from humming.ir.formats import FORMATS, NF4_TABLE, get_format

ALL_CODES = torch.arange(256, dtype=torch.uint8)

# Independent decoders: torch's float8 dtypes and ml_dtypes (one code per byte).
TORCH_VIEWS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e8m0": torch.float8_e8m0fnu}
ML_DTYPES = {
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e3m4": ml_dtypes.float8_e3m4,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
}

# OCP Microscaling Formats (MX) v1.0, section 5.3: positive values of each element format.
OCP_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
OCP_LIMITS = {  # name: (max normal, min normal, max subnormal, min subnormal)
    "e2m1": (6.0, 1.0, 0.5, 0.5),
    "e2m3": (7.5, 1.0, 0.875, 0.125),
    "e3m2": (28.0, 0.25, 0.1875, 0.0625),
}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values with NaN == NaN and signed zeros distinguished."""
    a, b = a.to(torch.float64), b.to(torch.float64)
    both_nan = torch.isnan(a) & torch.isnan(b)
    equal = (a == b) & (torch.signbit(a) == torch.signbit(b))
    return bool((both_nan | equal).all())


@pytest.mark.parametrize("name", sorted(TORCH_VIEWS))
def test_decode_matches_torch_on_all_codes(name):
    fmt = get_format(name)
    assert _same(fmt.decode(ALL_CODES), ALL_CODES.view(TORCH_VIEWS[name]).to(torch.float32))


@pytest.mark.parametrize("name", sorted(ML_DTYPES))
def test_decode_matches_ml_dtypes_on_all_codes(name):
    fmt = get_format(name)
    codes = np.arange(fmt.num_codes, dtype=np.uint8)
    expected = torch.from_numpy(codes.view(ML_DTYPES[name]).astype(np.float32))
    assert _same(fmt.decode(torch.from_numpy(codes)), expected)


def test_e2m1_matches_ocp_table():
    values = get_format("e2m1").value_table().tolist()
    assert values[:8] == OCP_E2M1
    assert values[8:] == [-v for v in OCP_E2M1]


@pytest.mark.parametrize("name", sorted(OCP_LIMITS))
def test_ocp_mx_limits(name):
    fmt = get_format(name)
    table = fmt.value_table()
    positive = table[(table > 0)]
    max_normal, min_normal, max_sub, min_sub = OCP_LIMITS[name]
    assert fmt.max_value == max_normal == float(table.max())
    assert float(positive.min()) == min_sub
    subnormals = positive[positive < min_normal]
    assert float(subnormals.max()) == max_sub
    assert not fmt.has_nan and not fmt.has_inf and bool(torch.isfinite(table).all())


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.kind in ("float", "int", "lut")], ids=str)
def test_encode_inverts_decode(fmt):
    codes = torch.arange(fmt.num_codes, dtype=torch.uint8)
    values = fmt.decode(codes)
    finite = ~torch.isnan(values)
    if fmt.kind == "lut":
        assert torch.equal(fmt.encode(values), codes)
        return
    assert torch.equal(fmt.encode(values[finite]), codes[finite])


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.kind in ("float", "int", "lut", "e8m0")], ids=str)
def test_encode_in_slices_is_the_whole_encode(fmt, monkeypatch, seed):
    """A tensor past the slice size is encoded slice by slice (bounded memory), to the same codes, with
    the same refusal of NaN where the format has no NaN code."""
    from humming.ir import formats

    x = (torch.randn(5, 37, 11) * 8).to(torch.float32)
    whole = fmt.encode(x)
    monkeypatch.setattr(formats, "_ENCODE_SLICE", 100)
    assert torch.equal(fmt.encode(x), whole)
    x[4, 36, 10] = math.nan  # in the last slice
    if fmt.has_nan:
        assert torch.equal(fmt.encode(x)[:4], whole[:4])
    else:
        with pytest.raises(ValueError, match="NaN"):
            fmt.encode(x)


@pytest.mark.parametrize("name", ["e2m1", "e2m3", "e3m2", "e3m4", "e4m3", "e5m2"])
def test_encode_matches_ml_dtypes_on_random_values(name, seed):
    fmt = get_format(name)
    x = torch.randn(20000, dtype=torch.float32) * fmt.max_value / 3
    x = x.clamp(-fmt.max_value, fmt.max_value)
    expected = torch.from_numpy(x.numpy().astype(ML_DTYPES[name]).astype(np.float32))
    assert _same(fmt.quantize_values(x), expected)


@pytest.mark.parametrize("name,dtype", [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)])
def test_encode_matches_torch_cast(name, dtype, seed):
    fmt = get_format(name)
    x = torch.randn(20000) * 50
    x = x.clamp(-fmt.max_value, fmt.max_value)
    assert torch.equal(fmt.encode(x), x.to(dtype).view(torch.uint8))


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.kind == "float"], ids=str)
def test_encode_rounds_ties_to_even_and_saturates(fmt):
    table = fmt.value_table().to(torch.float64)
    positive = torch.unique(table[torch.isfinite(table) & (table >= 0)])
    midpoints = (positive[:-1] + positive[1:]) / 2
    codes = fmt.encode(midpoints).to(torch.int64)
    assert bool((codes & 1 == 0).all()), "ties must round to the even code"
    big = torch.tensor([fmt.max_value * 4, -fmt.max_value * 4, 1e30], dtype=torch.float64)
    assert fmt.quantize_values(big).tolist() == [fmt.max_value, -fmt.max_value, fmt.max_value]


def test_inf_and_nan_rules():
    inf = torch.tensor([math.inf, -math.inf, math.nan])
    e5m2 = get_format("e5m2").quantize_values(inf)
    assert e5m2[0] == math.inf and e5m2[1] == -math.inf and math.isnan(e5m2[2])
    e4m3 = get_format("e4m3").quantize_values(inf)
    assert e4m3[:2].tolist() == [448.0, -448.0] and math.isnan(e4m3[2])
    with pytest.raises(ValueError, match="no NaN"):
        get_format("e2m1").encode(torch.tensor([math.nan]))


def test_e8m0_encode_matches_torch():
    x = torch.tensor([2.0**-127, 0.25, 0.3, 0.75, 1.0, 1.49, 1.5, 3.0, 1000.0, 2.0**127])
    assert torch.equal(get_format("e8m0").encode(x), x.to(torch.float8_e8m0fnu).view(torch.uint8))


@pytest.mark.parametrize("bits", range(1, 9))
def test_int_formats(bits):
    signed, unsigned = get_format(f"int{bits}"), get_format(f"uint{bits}")
    assert signed.min_value == -(2 ** (bits - 1)) and signed.max_value == 2 ** (bits - 1) - 1
    assert unsigned.min_value == 0 and unsigned.max_value == 2**bits - 1
    values = torch.arange(signed.min_value, signed.max_value + 1)
    codes = signed.encode(values)
    assert torch.equal(codes.to(torch.int64), values.to(torch.int64) & (2**bits - 1))  # two's complement
    assert torch.equal(signed.decode(codes), values.to(torch.float32))
    saturated = signed.decode(signed.encode(torch.tensor([-1e9, 1e9])))
    assert saturated.tolist() == [signed.min_value, signed.max_value]
    if bits >= 3:  # round half to even
        assert unsigned.decode(unsigned.encode(torch.tensor([2.5, 3.5]))).tolist() == [2.0, 4.0]


def test_nf4_table():
    fmt = get_format("nf4")
    assert fmt.value_table().tolist() == [float(np.float32(v)) for v in NF4_TABLE]
    assert fmt.encode(torch.tensor([-0.98, 0.01, 0.99])).tolist() == [0, 7, 15]


def test_arbitrary_exmy_formats():
    for name, max_value in [("e1m2", 3.5), ("e2m2", 7.0), ("e3m3", 30.0), ("e2m4", 7.75), ("e2m5", 3.9375)]:
        fmt = get_format(name)
        assert fmt.max_value == max_value, name
        table = fmt.value_table()
        finite = table[torch.isfinite(table)]
        assert float(finite.max()) == max_value


def test_aliases_and_errors():
    assert get_format("fp4") is get_format("e2m1")
    assert get_format("float8_e4m3fn") is get_format("e4m3")
    assert get_format(torch.float8_e5m2) is get_format("e5m2")
    for bad in ["int9", "e5m3", "e0m3", "bogus"]:
        with pytest.raises(ValueError, match="format"):
            get_format(bad)
