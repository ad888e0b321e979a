"""humming: one weight IR and one kernel library for quantized LLM inference."""

from . import moe
from .dispatch.backends import prepare
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


def warmup(layers, m_values=(1, 16, 64), **kwargs):
    """Compile every CUDA kernel ``layers`` need for token counts ``m_values`` ahead of time, in parallel,
    so that serving (and CUDA graph capture) never compiles; see ``humming.cuda_kernels.warmup``."""
    if isinstance(layers, QuantizedWeight) or not hasattr(layers, "__iter__"):
        raise TypeError(f"layers: expected an iterable of QuantizedWeight, got {type(layers).__name__}")
    layers = list(layers)
    for i, qw in enumerate(layers):
        if not isinstance(qw, QuantizedWeight):
            raise TypeError(f"layers[{i}]: expected a QuantizedWeight, got {type(qw).__name__}")
        if qw.device.type != "cuda":
            raise ValueError(f"layers[{i}]: is on {qw.device}; warmup compiles CUDA kernels for weights on a GPU")
    try:
        if isinstance(m_values, str):
            raise TypeError
        m_values = tuple(int(m) for m in m_values)
    except (TypeError, ValueError):
        raise TypeError(f"m_values: expected an iterable of token counts, got {m_values!r}") from None
    if any(m < 1 for m in m_values):
        raise ValueError(f"m_values: expected positive token counts, got {m_values}")
    from .cuda_kernels import warmup as cuda_warmup  # imports cuda-core only when asked

    return cuda_warmup(layers, m_values, **kwargs)


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
    "moe",
    "prepare",
    "quantize",
    "quantize_activation",
    "save",
    "shard",
    "stack",
    "warmup",
]
