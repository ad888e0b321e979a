"""``torch.nn`` modules on humming's kernels: :class:`QuantizedLinear`, :class:`FusedMoE`, and
:func:`quantize_model` to convert a float model in place."""

from .convert import quantize_model
from .linear import QuantizedLinear
from .moe import FusedMoE

__all__ = ["FusedMoE", "QuantizedLinear", "quantize_model"]
