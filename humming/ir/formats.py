"""The one registry of element number formats.

Every part of humming (IR, quantizers, Triton and CUDA kernels, C++ code generation) names formats
through :func:`get_format`; there is no second dtype map. A format maps ``bits``-wide unsigned codes to
values and back:

- ``intN``: two's complement, values ``[-2^(N-1), 2^(N-1) - 1]``.
- ``uintN``: values ``[0, 2^N - 1]`` (used with zero points).
- ``eXmY``: sign, X exponent bits (bias ``2^(X-1) - 1``), Y mantissa bits, subnormals. NaN/inf rules
  (``nan_rule``): ``"fn"`` (e4m3: only the all-ones code is NaN, no inf, as OCP FP8 and torch's
  ``float8_e4m3fn``), ``"ieee"`` (e5m2 and every other 8-bit eXmY: an all-ones exponent is inf or NaN, as
  OCP e5m2 and ml_dtypes' ``float8_e3m4``), ``"none"`` (formats under 8 bits: every code is finite, as the
  OCP MX spec defines e2m1 / e2m3 / e3m2).
- ``e8m0``: unsigned power of two ``2^(code - 127)``; code 255 is NaN (OCP MX scale format).
- lookup tables (``nf4``): the code indexes a table of values.

Encoding rounds to nearest, ties to even (``e8m0``: ties away from zero in the mantissa, as torch), and
saturates: a finite value beyond the largest finite value becomes that value (also for e5m2, where torch
would give inf); +-inf stays inf in ``"ieee"`` formats and saturates elsewhere; NaN becomes the NaN code
where the format has one, otherwise :func:`NumberFormat.encode` raises ``ValueError``.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import torch

__all__ = ["FORMATS", "NF4_TABLE", "NumberFormat", "get_format", "list_formats"]

# QLoRA's NormalFloat4 table (Dettmers et al., 2023), as bitsandbytes ships it.
NF4_TABLE = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)


@dataclass(frozen=True)
class NumberFormat:
    """An element format: its name, bit width, value range and bit-exact codec."""

    name: str
    kind: str  # "int", "float", "e8m0" or "lut"
    bits: int
    signed: bool
    exponent_bits: int = 0
    mantissa_bits: int = 0
    nan_rule: str = "none"  # float formats: "ieee", "fn" or "none"
    table: tuple[float, ...] | None = None

    # ----------------------------------------------------------------------------------------- range
    @property
    def is_int(self) -> bool:
        return self.kind == "int"

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def bias(self) -> int:
        if self.kind == "e8m0":
            return 127
        return 2 ** (self.exponent_bits - 1) - 1 if self.exponent_bits else 0

    @property
    def num_codes(self) -> int:
        return 1 << self.bits

    @property
    def min_value(self) -> float:
        """Smallest finite value."""
        if self.kind == "int":
            return float(-(1 << (self.bits - 1))) if self.signed else 0.0
        if self.kind == "e8m0":
            return 2.0**-127
        if self.kind == "lut":
            return min(self.table)
        return -self.max_value

    @property
    def max_value(self) -> float:
        """Largest finite value."""
        if self.kind == "int":
            return float((1 << (self.bits - 1)) - 1) if self.signed else float((1 << self.bits) - 1)
        if self.kind == "e8m0":
            return 2.0**127
        if self.kind == "lut":
            return max(self.table)
        e, m = self.exponent_bits, self.mantissa_bits
        max_exp_field = (1 << e) - 1
        max_mant = (1 << m) - 1
        if self.nan_rule == "ieee":
            max_exp_field -= 1
        elif self.nan_rule == "fn":
            max_mant -= 1
        exp = max(max_exp_field, 1) - self.bias
        return (
            (1.0 + max_mant / (1 << m)) * 2.0**exp
            if max_exp_field > 0
            else max_mant / (1 << m) * 2.0 ** (1 - self.bias)
        )

    @property
    def has_nan(self) -> bool:
        return self.kind == "e8m0" or (self.kind == "float" and self.nan_rule in ("ieee", "fn"))

    @property
    def has_inf(self) -> bool:
        return self.kind == "float" and self.nan_rule == "ieee"

    @property
    def nan_code(self) -> int | None:
        """The positive NaN code (all-ones exponent and mantissa; e8m0: 255), or ``None`` without NaN."""
        if self.kind == "e8m0":
            return 255
        if not self.has_nan:
            return None
        return ((1 << self.exponent_bits) - 1) << self.mantissa_bits | ((1 << self.mantissa_bits) - 1)

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The torch dtype whose bits equal this format's codes, where torch has one."""
        return _TORCH_DTYPES.get(self.name)

    # ----------------------------------------------------------------------------------------- codec
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (any integer dtype, values in ``[0, 2^bits)``) -> float32 values, bit-exact."""
        return self.value_table(codes.device)[codes.to(torch.int64) & (self.num_codes - 1)]

    def value_table(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """float32 ``[2^bits]``: the value of every code (the decode table kernels embed)."""
        return _value_table(self, str(torch.device(device)))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Float values -> uint8 codes: round to nearest even, saturating (module docstring). Large tensors
        are encoded in slices of ``_ENCODE_SLICE`` elements: the float64 / int64 steps take a dozen times the
        input's bytes, so a whole expert-stacked layer at once would need tens of GiB."""
        if x.numel() <= _ENCODE_SLICE:
            return self._encode(x)
        flat = x.reshape(-1)
        codes = torch.empty(flat.shape, dtype=torch.uint8, device=x.device)
        for start in range(0, flat.numel(), _ENCODE_SLICE):
            codes[start : start + _ENCODE_SLICE] = self._encode(flat[start : start + _ENCODE_SLICE])
        return codes.view(x.shape)

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float64)
        nan = torch.isnan(x)
        if bool(nan.any()) and not self.has_nan:
            raise ValueError(f"encode: format {self.name} has no NaN code, but the input holds NaN")
        if self.kind == "int":
            codes = torch.round(x.nan_to_num(0.0)).clamp(self.min_value, self.max_value).to(torch.int64)
            return (codes & (self.num_codes - 1)).to(torch.uint8)
        if self.kind == "lut":
            table = torch.tensor(self.table, dtype=torch.float64, device=x.device)
            return torch.argmin((x.unsqueeze(-1) - table).abs(), dim=-1).to(torch.uint8)
        if self.kind == "e8m0":
            return _encode_e8m0(x, nan)
        return _encode_float(self, x, nan)

    def quantize_values(self, x: torch.Tensor) -> torch.Tensor:
        """``decode(encode(x))`` in float32: the representable value each input rounds to."""
        return self.decode(self.encode(x))

    def __str__(self) -> str:
        return self.name


#: Elements :meth:`NumberFormat.encode` encodes at a time (about 1.5 GiB of float64 / int64 steps).
_ENCODE_SLICE = 1 << 24

_TORCH_DTYPES = {
    "int8": torch.int8,
    "uint8": torch.uint8,
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
    "e8m0": torch.float8_e8m0fnu,
}


@functools.cache
def _value_table(fmt: NumberFormat, device: str) -> torch.Tensor:
    return torch.tensor(_decode_all(fmt), dtype=torch.float32, device=device)


def _decode_all(fmt: NumberFormat) -> list[float]:
    """The value of every code, computed in Python floats (exact for <= 8-bit formats)."""
    values = []
    for code in range(fmt.num_codes):
        if fmt.kind == "int":
            values.append(float(code - fmt.num_codes if fmt.signed and code >> (fmt.bits - 1) else code))
        elif fmt.kind == "lut":
            values.append(float(fmt.table[code]))
        elif fmt.kind == "e8m0":
            values.append(math.nan if code == 255 else 2.0 ** (code - 127))
        else:
            e, m = fmt.exponent_bits, fmt.mantissa_bits
            sign = -1.0 if code >> (e + m) else 1.0
            exp_field = (code >> m) & ((1 << e) - 1)
            mant = code & ((1 << m) - 1)
            all_ones_exp = exp_field == (1 << e) - 1
            if fmt.nan_rule == "ieee" and all_ones_exp:
                values.append(sign * math.inf if mant == 0 else math.nan)
            elif fmt.nan_rule == "fn" and all_ones_exp and mant == (1 << m) - 1:
                values.append(math.nan)
            elif exp_field == 0:
                values.append(sign * mant / (1 << m) * 2.0 ** (1 - fmt.bias))
            else:
                values.append(sign * (1.0 + mant / (1 << m)) * 2.0 ** (exp_field - fmt.bias))
    return values


def floor_log2(x: torch.Tensor) -> torch.Tensor:
    """Exponent of float64 ``x`` (``floor(log2(x))`` for normal positive values), read from its bits.

    Bit operations are exact on every device; ``torch.frexp`` / ``torch.ldexp`` are avoided: their CUDA
    kernels are not exact for every input."""
    return ((x.view(torch.int64) >> 52) & 0x7FF) - 1023


def exact_pow2(exp: torch.Tensor) -> torch.Tensor:
    """``2.0 ** exp`` in float64 for integer ``exp`` in [-1022, 1023], built from bits (exact)."""
    return ((exp + 1023) << 52).view(torch.float64)


def _encode_float(fmt: NumberFormat, x: torch.Tensor, nan: torch.Tensor) -> torch.Tensor:
    e_bits, m_bits = fmt.exponent_bits, fmt.mantissa_bits
    sign = torch.signbit(x)
    mag = x.abs().nan_to_num(0.0, posinf=math.inf)
    inf = torch.isinf(mag)
    mag = mag.clamp(max=fmt.max_value)
    min_normal_exp = 1 - fmt.bias
    # Exponent of the binade; subnormals (and zero) share the lowest normal binade's quantum.
    exp = floor_log2(mag).clamp(min=min_normal_exp)
    quantum = exact_pow2(exp - m_bits)
    rounded = (torch.round(mag / quantum) * quantum).clamp(max=fmt.max_value)  # round half to even
    # Re-derive fields from the rounded value (rounding may carry into the next binade).
    exp = floor_log2(rounded).clamp(min=min_normal_exp)
    normal = rounded >= 2.0**min_normal_exp
    scaled = (rounded * exact_pow2(m_bits - exp)).to(torch.int64)
    exp_field = torch.where(normal, exp + fmt.bias, torch.zeros_like(exp))
    mant = torch.where(normal, scaled - (1 << m_bits), scaled)
    code = (exp_field << m_bits) | mant
    if fmt.nan_rule == "ieee":
        code = torch.where(inf, torch.full_like(code, ((1 << e_bits) - 1) << m_bits), code)
    if fmt.has_nan:
        code = torch.where(nan, torch.full_like(code, fmt.nan_code), code)
    code = code | (sign.to(torch.int64) << (e_bits + m_bits))
    return code.to(torch.uint8)


def _encode_e8m0(x: torch.Tensor, nan: torch.Tensor) -> torch.Tensor:
    mag = x.abs().nan_to_num(0.0).clamp(min=2.0**-127, max=2.0**127)
    # Round the significand (in [1, 2)) to 1 or 2, ties up: its top fraction bit says >= 1.5.
    exp = floor_log2(mag) + ((mag.view(torch.int64) >> 51) & 1)
    code = (exp + 127).clamp(0, 254)
    return torch.where(nan, torch.full_like(code, 255), code).to(torch.uint8)


# --------------------------------------------------------------------------------------------- registry
_FLOAT_RE = re.compile(r"^e(\d)m(\d)$")
_INT_RE = re.compile(r"^(u?)int([1-8])$")
_ALIASES = {
    "fp4": "e2m1",
    "float4_e2m1": "e2m1",
    "float4_e2m1fn": "e2m1",
    "fp6_e2m3": "e2m3",
    "fp6_e3m2": "e3m2",
    "float6_e2m3fn": "e2m3",
    "float6_e3m2fn": "e3m2",
    "fp8": "e4m3",
    "e4m3fn": "e4m3",
    "fp8_e4m3": "e4m3",
    "float8_e4m3fn": "e4m3",
    "fp8_e5m2": "e5m2",
    "float8_e5m2": "e5m2",
    "float8_e8m0fnu": "e8m0",
    "ue8m0": "e8m0",
}


def _build(name: str) -> NumberFormat:
    if m := _INT_RE.match(name):
        return NumberFormat(name=name, kind="int", bits=int(m.group(2)), signed=not m.group(1))
    if m := _FLOAT_RE.match(name):
        e, mant = int(m.group(1)), int(m.group(2))
        if name == "e8m0":
            return NumberFormat(name="e8m0", kind="e8m0", bits=8, signed=False, exponent_bits=8)
        bits = 1 + e + mant
        if e < 1 or bits > 8:
            raise ValueError(f"format {name!r}: need at least 1 exponent bit and at most 8 bits in all")
        nan_rule = "none" if bits < 8 else ("fn" if name == "e4m3" else "ieee")
        return NumberFormat(
            name=name,
            kind="float",
            bits=bits,
            signed=True,
            exponent_bits=e,
            mantissa_bits=mant,
            nan_rule=nan_rule,
        )
    if name == "nf4":
        return NumberFormat(name="nf4", kind="lut", bits=4, signed=True, table=NF4_TABLE)
    raise ValueError(
        f"unknown number format {name!r}: expected intN / uintN (N = 1..8), eXmY (1 + X + Y <= 8), "
        f"e8m0, nf4, or an alias ({', '.join(sorted(_ALIASES))})"
    )


@functools.cache
def _get(name: str) -> NumberFormat:
    return _build(name)


def get_format(fmt: str | NumberFormat | torch.dtype) -> NumberFormat:
    """The registered format for a name (``"int4"``, ``"e2m1"``, ``"fp8"``...), a format or a torch dtype."""
    if isinstance(fmt, NumberFormat):
        return fmt
    if isinstance(fmt, torch.dtype):
        for name, dtype in _TORCH_DTYPES.items():
            if dtype == fmt:
                return _get(name)
        raise ValueError(f"torch dtype {fmt} is not a quantized element format")
    if not isinstance(fmt, str):
        raise ValueError(f"format: expected a name, a NumberFormat or a torch dtype, got {type(fmt).__name__}")
    name = fmt.lower()
    return _get(_ALIASES.get(name, name))


#: The formats every part of humming is tested on; ``get_format`` also builds any other eXmY.
FORMATS = tuple(
    get_format(n)
    for n in (
        *(f"int{b}" for b in range(1, 9)),
        *(f"uint{b}" for b in range(1, 9)),
        *("e2m1", "e2m2", "e1m2", "e2m3", "e3m2", "e3m3", "e4m3", "e5m2", "e3m4", "e8m0", "nf4"),
    )
)


def list_formats() -> list[str]:
    return [f.name for f in FORMATS]
