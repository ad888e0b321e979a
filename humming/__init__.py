"""humming: one weight IR and one kernel library for quantized LLM inference."""

from .ir import (
    ACT_SCHEMES,
    FORMATS,
    WEIGHT_SCHEMES,
    ActScheme,
    NumberFormat,
    QuantizedActivation,
    QuantizedWeight,
    dequantize,
    dequantize_activation,
    get_format,
    list_formats,
    load,
    quantize,
    quantize_activation,
    save,
)
from .linear import linear
from .loaders import concat, load_checkpoint, shard, stack

__version__ = "0.1.0"

__all__ = [
    "ACT_SCHEMES",
    "FORMATS",
    "WEIGHT_SCHEMES",
    "ActScheme",
    "NumberFormat",
    "QuantizedActivation",
    "QuantizedWeight",
    "__version__",
    "concat",
    "dequantize",
    "dequantize_activation",
    "get_format",
    "linear",
    "list_formats",
    "load",
    "load_checkpoint",
    "quantize",
    "quantize_activation",
    "save",
    "shard",
    "stack",
]
