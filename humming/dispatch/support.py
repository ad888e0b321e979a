"""What humming computes at all: weight format x activation scheme combinations.

Kernels declare narrower support of their own (``Kernel.unsupported``); this table is the outer bound that
every backend, the reference included, shares, and the text users see when a combination is refused.
"""

from __future__ import annotations

from ..ir.activation import ActScheme
from ..ir.formats import NumberFormat

__all__ = ["SUPPORT_MATRIX", "combination_error"]


def _int_up_to(bits: int):
    return lambda f: f.is_int and f.bits <= bits


def _low_bit(f: NumberFormat) -> bool:
    return f.bits <= 8 and f.kind in ("int", "float", "lut")


#: activation element format -> (predicate on the weight format, what it accepts in words)
SUPPORT_MATRIX = {
    None: (_low_bit, "any weight format (WnA16)"),
    "int8": (_int_up_to(8), "int/uint weights of 1..8 bits (W8A8, W4A8 int)"),
    "int4": (_int_up_to(4), "int/uint weights of 1..4 bits (W4A4 int)"),
    "e4m3": (_low_bit, "int/uint, float (eXmY) and nf4 weights of <= 8 bits (W8A8 fp8, W4A8)"),
    "e5m2": (_low_bit, "int/uint, float (eXmY) and nf4 weights of <= 8 bits"),
    "e2m1": (
        lambda f: (f.is_float and f.bits <= 4) or (f.is_int and f.bits <= 4),
        "fp4 (e2m1 and other <= 4-bit eXmY) and int/uint weights of <= 4 bits (W4A4)",
    ),
}


def combination_error(fmt: NumberFormat, act: ActScheme | None) -> str | None:
    """``None`` if humming computes weight ``fmt`` with activations ``act``, else the reason."""
    key = None if act is None else act.format
    accepts, _ = SUPPORT_MATRIX[key]
    if accepts(fmt):
        return None
    lines = "; ".join(f"act {k or 'None'}: {text}" for k, (_, text) in SUPPORT_MATRIX.items())
    act_name = "None" if act is None else act.name
    return f"weight format {fmt.name} with act={act_name} is not supported. Supported: {lines}"
