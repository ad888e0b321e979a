"""``humming.save`` / ``humming.load``: the standard representation in safetensors, bit-exact.

Tensors are stored as ``<name>.<field>``; the metadata holds the format version and, per weight, a JSON
record of the non-tensor fields (shape, format, group shape).
"""

from __future__ import annotations

import json
import os

import safetensors
import safetensors.torch

from .weight import QuantizedWeight

__all__ = ["FORMAT_VERSION", "load", "save"]

FORMAT_VERSION = "1"
_SINGLE = "__single__"


def save(weights: QuantizedWeight | dict[str, QuantizedWeight], path: str | os.PathLike) -> None:
    """Write one weight or a ``{name: weight}`` dict to a safetensors file."""
    single = isinstance(weights, QuantizedWeight)
    items = {_SINGLE: weights} if single else dict(weights)
    tensors, meta = {}, {"humming_format_version": FORMAT_VERSION}
    for name, qw in items.items():
        if not isinstance(qw, QuantizedWeight):
            raise ValueError(f"weights[{name!r}]: expected a QuantizedWeight, got {type(qw).__name__}")
        for field, t in qw.tensors().items():
            tensors[f"{name}.{field}"] = t.detach().contiguous().cpu()
        meta[f"{name}.__meta__"] = json.dumps(
            {"shape": list(qw.shape), "format": qw.format.name, "group_shape": list(qw.group_shape)}
        )
    safetensors.torch.save_file(tensors, os.fspath(path), metadata=meta)


def load(path: str | os.PathLike, device="cpu") -> QuantizedWeight | dict[str, QuantizedWeight]:
    """Read what :func:`save` wrote: a single weight, or the ``{name: weight}`` dict."""
    with safetensors.safe_open(os.fspath(path), framework="pt", device=str(device)) as f:
        meta = f.metadata() or {}
        version = meta.get("humming_format_version")
        if version is None:
            raise ValueError(f"{path}: not a humming file (no humming_format_version in its metadata)")
        if version != FORMAT_VERSION:
            raise ValueError(f"{path}: humming format version {version}, this humming reads {FORMAT_VERSION}")
        keys = set(f.keys())
        out = {}
        for key, value in meta.items():
            if not key.endswith(".__meta__"):
                continue
            name = key[: -len(".__meta__")]
            record = json.loads(value)
            fields = {
                field: f.get_tensor(f"{name}.{field}")
                for field in ("qweight", "scales", "zeros", "global_scale", "g_idx", "bias")
                if f"{name}.{field}" in keys
            }
            out[name] = QuantizedWeight(
                shape=tuple(record["shape"]),
                format=record["format"],
                group_shape=tuple(record["group_shape"]),
                **fields,
            )
    return out[_SINGLE] if set(out) == {_SINGLE} else out
