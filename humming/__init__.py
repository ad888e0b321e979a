"""humming: one weight IR and one kernel library for quantized LLM inference."""

from . import (
    _install_check,  # noqa: F401  (first: its import is the check)
    moe,
    nn,
    norm,
    ops,
)
from .deterministic import is_deterministic, set_deterministic
from .dispatch.plan import Plan, explain, prepare
from .ir import (
    ACT_SCHEMES,
    FORMATS,
    WEIGHT_SCHEMES,
    ActScheme,
    NumberFormat,
    QuantizedActivation,
    QuantizedWeight,
    concat,
    dequantize,
    dequantize_activation,
    get_format,
    list_formats,
    load,
    quantize,
    quantize_activation,
    save,
    shard,
    stack,
)
from .linear import linear
from .loaders import load_checkpoint
from .norm import rmsnorm, rmsnorm_quantize
from .warmup import warmup

__version__ = "0.1.0"

__all__ = [
    "ACT_SCHEMES",
    "FORMATS",
    "WEIGHT_SCHEMES",
    "ActScheme",
    "NumberFormat",
    "Plan",
    "QuantizedActivation",
    "QuantizedWeight",
    "__version__",
    "concat",
    "dequantize",
    "dequantize_activation",
    "explain",
    "get_format",
    "is_deterministic",
    "linear",
    "list_formats",
    "load",
    "load_checkpoint",
    "moe",
    "nn",
    "norm",
    "ops",
    "prepare",
    "quantize",
    "quantize_activation",
    "rmsnorm",
    "rmsnorm_quantize",
    "save",
    "set_deterministic",
    "shard",
    "stack",
    "warmup",
]
