"""``torch.nn`` modules on humming's kernels: :class:`QuantizedLinear`, :class:`FusedMoE`,
:class:`QuantizedExperts`, :func:`quantize_model` to convert a float model in place, and
:func:`from_pretrained` to build a transformers model from a quantized checkpoint (the ``hf`` extra)."""

from .convert import quantize_model
from .hf import from_pretrained
from .linear import QuantizedLinear
from .moe import FusedMoE, QuantizedExperts

__all__ = ["FusedMoE", "QuantizedExperts", "QuantizedLinear", "from_pretrained", "quantize_model"]
