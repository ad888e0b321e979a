"""``quantize_model``: replace a float model's ``nn.Linear`` layers with :class:`QuantizedLinear`."""

from __future__ import annotations

import fnmatch

from torch import nn
from tqdm.auto import tqdm

from ..ir.activation import ActScheme
from .linear import QuantizedLinear

__all__ = ["quantize_model"]


def quantize_model(
    model: nn.Module,
    weight: str = "int4",
    group_size=None,
    act: str | ActScheme | None = None,
    modules=None,
    *,
    zero_point: bool = False,
    backend: str = "auto",
    progress: bool = True,
) -> nn.Module:
    """Replace, in place, every ``nn.Linear`` of ``model`` whose qualified name matches one of ``modules``
    (``fnmatch`` patterns such as ``"*.mlp.*"``; ``None``: every one) with a :class:`QuantizedLinear`
    quantized by round to nearest on the layer's device. ``group_size=None``: a named scheme's own
    (``nvfp4``: 16...), else 128. Returns ``model``."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if isinstance(modules, str):
        modules = [modules]
    if modules is not None and not all(isinstance(p, str) for p in modules):
        raise ValueError(f"modules: expected fnmatch patterns (strings) or None, got {modules!r}")
    # Every name, a layer registered under several (shared or tied) included: each gets the one quantized layer.
    names = [
        name
        for name, module in model.named_modules(remove_duplicate=False)
        if isinstance(module, nn.Linear) and (modules is None or any(fnmatch.fnmatchcase(name, p) for p in modules))
    ]
    if modules is not None and not names:
        raise ValueError(f"modules: no nn.Linear of the model matches {modules}")
    quantized: dict[int, QuantizedLinear] = {}  # id(nn.Linear) -> its layer
    for name in tqdm(names, desc=f"quantizing to {weight}", disable=not progress):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        linear = getattr(parent, child)
        if id(linear) not in quantized:
            quantized[id(linear)] = QuantizedLinear.from_float(
                linear, weight, group_size, zero_point=zero_point, act=act, backend=backend
            )
        setattr(parent, child, quantized[id(linear)])
    return model
