"""Errors raised by the checkpoint loaders.

All derive from :class:`CheckpointError` (a ``ValueError``), so callers can catch one type; the subclasses
say what kind of problem it is. Messages name the module, the tensor and what was expected.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "MissingTensorError",
    "ShapeMismatchError",
    "UnexpectedTensorError",
    "UnsupportedFormatError",
]


class CheckpointError(ValueError):
    """A checkpoint that cannot be converted into the weight IR."""


class UnsupportedFormatError(CheckpointError):
    """An unknown ``quant_method``, a variant humming does not read, or a kernel-specific (repacked) layout."""


class MissingTensorError(CheckpointError):
    """A quantized module lacks a tensor its format needs."""


class UnexpectedTensorError(CheckpointError):
    """A checkpoint tensor that the model being loaded has no place for."""


class ShapeMismatchError(CheckpointError):
    """A tensor's shape or dtype disagrees with the config or with the module's other tensors."""
