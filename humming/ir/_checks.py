"""Argument checks shared by the IR's constructors and transforms: exact integers, and finite tensor data."""

from __future__ import annotations

import operator

import torch

from .dtypes import DEQUANTIZED_DTYPES

__all__ = ["as_index", "data_readable", "non_finite_error"]


def as_index(name: str, value) -> int:
    """``value`` as an int when it is an integer (a Python or numpy int, a 0-d integer tensor), never a bool
    or a float (``16.9`` would truncate, ``True`` would read as 1); ``ValueError`` naming ``name`` else."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise ValueError(f"{name}: expected an int, got the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: expected an int, got {type(value).__name__} {value!r}") from None


def data_readable(t: torch.Tensor) -> bool:
    """Whether a check may read ``t``'s values: a plain tensor with data (not a fake or meta tensor, not while
    dynamo traces)."""
    return type(t) is torch.Tensor and t.device.type != "meta" and not torch.compiler.is_compiling()


def non_finite_error(name: str, t: torch.Tensor) -> str | None:
    """``None`` when every value of float tensor ``t`` is finite, else a message naming ``name``, the first
    non-finite value and where it is. Reads the values (a host sync on a GPU)."""
    if not data_readable(t) or not t.numel():
        return None
    # float8 values as float32 (torch counts float8_e8m0fnu's NaN code as finite); the others as they are
    values = t if t.dtype in DEQUANTIZED_DTYPES else t.to(torch.float32)
    bad = ~torch.isfinite(values)
    if not bool(bad.any()):
        return None
    where = tuple(int(i) for i in bad.nonzero()[0])
    value = float(values[where])
    return f"{name}: expected finite values, got {value} at index {list(where)} ({int(bad.sum())} non-finite)"
