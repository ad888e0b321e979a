"""The weight IR: number formats, canonical packing, ``QuantizedWeight``, quantizers, the reference, and the
exact transforms of weights (``concat``, ``stack``, ``shard``, ``expert_weight``)."""

from .. import _install_check  # noqa: F401  (its import is the check)
from .activation import (
    ACT_SCHEMES,
    ActScheme,
    QuantizedActivation,
    dequantize_activation,
    quantize_activation,
)
from .concat import concat, stack
from .formats import FORMATS, NumberFormat, get_format, list_formats
from .io import load, save
from .layout import expand_groups, group_reduce, parse_group_size
from .packing import pack_codes, packed_words, unpack_codes
from .quantize import WEIGHT_SCHEMES, dequantize, quantize, unpacked_codes
from .shard import shard
from .weight import QuantizedWeight, expert_weight

__all__ = [
    "ACT_SCHEMES",
    "FORMATS",
    "WEIGHT_SCHEMES",
    "ActScheme",
    "NumberFormat",
    "QuantizedActivation",
    "QuantizedWeight",
    "concat",
    "dequantize",
    "dequantize_activation",
    "expand_groups",
    "expert_weight",
    "get_format",
    "group_reduce",
    "list_formats",
    "load",
    "pack_codes",
    "packed_words",
    "parse_group_size",
    "quantize",
    "quantize_activation",
    "save",
    "shard",
    "stack",
    "unpack_codes",
    "unpacked_codes",
]
