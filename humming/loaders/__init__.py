"""Checkpoint loaders: every export format into ``humming.QuantizedWeight``, bit-exact against the producers.

``load_checkpoint(path)`` reads a checkpoint folder; ``concat`` / ``stack`` join weights; ``shard`` splits
one for tensor / expert parallelism. Errors are ``CheckpointError`` subclasses (``humming.loaders.errors``).
"""

from ..ir.concat import concat, stack
from ..ir.shard import deinterleave_rows, shard
from .checkpoint import load_checkpoint
from .errors import CheckpointError, MissingTensorError, ShapeMismatchError, UnsupportedFormatError

__all__ = [
    "CheckpointError",
    "MissingTensorError",
    "ShapeMismatchError",
    "UnsupportedFormatError",
    "concat",
    "deinterleave_rows",
    "load_checkpoint",
    "shard",
    "stack",
]
