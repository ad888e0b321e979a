"""The weight IR: number formats, canonical packing, ``QuantizedWeight``, quantizers and the reference."""

from .activation import (
    ACT_SCHEMES,
    ActScheme,
    QuantizedActivation,
    dequantize_activation,
    quantize_activation,
)
from .formats import FORMATS, NumberFormat, get_format, list_formats
from .io import load, save
from .layout import expand_groups, group_reduce, parse_group_size
from .packing import pack_codes, packed_words, unpack_codes
from .quantize import WEIGHT_SCHEMES, dequantize, quantize, unpacked_codes
from .weight import QuantizedWeight

__all__ = [
    "ACT_SCHEMES",
    "FORMATS",
    "WEIGHT_SCHEMES",
    "ActScheme",
    "NumberFormat",
    "QuantizedActivation",
    "QuantizedWeight",
    "dequantize",
    "dequantize_activation",
    "expand_groups",
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
    "unpack_codes",
    "unpacked_codes",
]
