"""Checkpoint loaders: every export format into ``humming.QuantizedWeight``, bit-exact against the producers.

``load_checkpoint(path)`` reads a checkpoint folder; ``activation_schemes(path)`` says how the producer
quantizes its activations; ``concat`` / ``stack`` join weights; ``shard`` splits one for tensor / expert
parallelism. Errors are ``CheckpointError`` subclasses (``humming.loaders.errors``).
"""

from ..ir.concat import concat, stack
from ..ir.shard import deinterleave_rows, shard
from .activations import ActivationSpec
from .checkpoint import activation_schemes, load_checkpoint
from .errors import (
    CheckpointError,
    MissingTensorError,
    ShapeMismatchError,
    UnexpectedTensorError,
    UnsupportedFormatError,
)

__all__ = [
    "ActivationSpec",
    "CheckpointError",
    "MissingTensorError",
    "ShapeMismatchError",
    "UnexpectedTensorError",
    "UnsupportedFormatError",
    "activation_schemes",
    "concat",
    "deinterleave_rows",
    "load_checkpoint",
    "shard",
    "stack",
]
