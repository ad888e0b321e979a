"""``torch.nn`` modules on humming's kernels: :class:`QuantizedLinear`, :class:`FusedMoE`,
:class:`QuantizedExperts`, :func:`quantize_model` to convert a float model in place, and
:func:`from_pretrained` to build a transformers model from a quantized checkpoint (the ``hf`` extra), and
:func:`save_pretrained` to write a quantized model as one (compressed-tensors where the scheme exists there)."""

from .convert import DEFAULT_IGNORE, quantize_model
from .hf import from_pretrained
from .linear import QuantizedLinear
from .moe import FusedMoE, QuantizedExperts
from .save import save_pretrained

__all__ = [
    "DEFAULT_IGNORE",
    "FusedMoE",
    "QuantizedExperts",
    "QuantizedLinear",
    "from_pretrained",
    "quantize_model",
    "save_pretrained",
]
