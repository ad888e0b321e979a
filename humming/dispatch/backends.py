"""The backend registry: each backend declares what it supports; dispatch and tests ask the same place.

A backend is a module exposing ``is_available() -> str | None`` (``None`` when usable, else why not),
``supports(qweight, act, x) -> str | None`` (``None`` when supported, else the reason) and
``linear(x2d, qweight, bias, act, out_dtype)``. A backend with a grouped (MoE) kernel also exposes
``supports_grouped(qweight, act, x, block_m) -> str | None`` and
``grouped_linear(x, qweight, expert_ids, block_m, bias, act, out_dtype)`` (``humming.moe``); one without
them has no grouped kernel. Modules are imported on first use so that ``import humming`` never imports
Triton or CUDA.
"""

from __future__ import annotations

import importlib
import os
import types
import warnings
import weakref

__all__ = ["BACKENDS", "backend_module", "prepare", "select_backend"]

#: name -> module, in the order "auto" tries them on a GPU.
BACKENDS = {
    "cuda": "humming.cuda_kernels",
    "triton": "humming.triton_kernels",
    "reference": "humming.dispatch.reference",
}
_warned_fallback: set[tuple] = set()
_choices: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # weight -> {call key: backend module}


def backend_module(name: str) -> types.ModuleType:
    if name not in BACKENDS:
        raise ValueError(f"backend: expected one of {['auto', *BACKENDS]}, got {name!r}")
    try:
        return importlib.import_module(BACKENDS[name])
    except ImportError as err:  # the backend's own optional dependencies are missing
        raise RuntimeError(f"backend {name!r} cannot be imported: {err}") from err


def _unusable(name: str, qweight, act, x, block_m: int | None) -> str | None:
    try:
        module = backend_module(name)
    except (RuntimeError, ValueError) as err:
        return str(err)
    missing = getattr(module, "is_available", lambda: None)()
    if missing:
        return missing
    if block_m is None:
        return module.supports(qweight, act, x)
    supports_grouped = getattr(module, "supports_grouped", None)
    if supports_grouped is None or not hasattr(module, "grouped_linear"):
        return f"no grouped kernel in backend {name}"
    return supports_grouped(qweight, act, x, block_m)


def select_backend(requested: str, qweight, act, x, block_m: int | None = None) -> types.ModuleType:
    """The backend module that runs this call; ``HUMMING_BACKEND`` replaces ``"auto"``. ``block_m``
    (not ``None``) asks for a grouped MoE kernel (``grouped_linear``) instead of ``linear``.

    Decode calls take microseconds, so the choice is made once per weight and call shape (everything the
    backends' ``supports`` reads: activation scheme, dtype, device, M, row alignment, block_m) and then
    looked up.
    """
    if requested == "auto":
        requested = os.environ.get("HUMMING_BACKEND", "auto") or "auto"
    aligned = x.dim() == 2 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0
    key = (requested, act, x.dtype, x.device, x.shape[0], aligned, block_m)
    choices = _choices.get(qweight)
    if choices is None:
        choices = _choices[qweight] = {}
    module = choices.get(key)
    if module is None:
        module = choices[key] = _select(requested, qweight, act, x, block_m)
    return module


def _select(requested: str, qweight, act, x, block_m: int | None) -> types.ModuleType:
    if requested != "auto":
        reason = _unusable(requested, qweight, act, x, block_m)
        if reason:
            raise ValueError(f"backend {requested!r} cannot run this call: {reason}")
        return backend_module(requested)
    if x.device.type != "cuda":
        return backend_module("reference")
    reasons = {}
    for name in ("cuda", "triton"):
        reasons[name] = _unusable(name, qweight, act, x, block_m)
        if reasons[name] is None:
            return backend_module(name)
    key = (qweight.describe(), getattr(act, "name", None), x.dtype, block_m)
    if key not in _warned_fallback:
        _warned_fallback.add(key)
        why = "; ".join(f"{n}: {r}" for n, r in reasons.items())
        entry = "humming.linear" if block_m is None else "humming.moe.grouped_linear"
        warnings.warn(f"{entry}: no fast kernel for {key}, running the reference ({why})", stacklevel=3)
    return backend_module("reference")


def prepare(qweight, backend: str = "cuda", act=None):
    """Repack ``qweight`` now into the layout ``backend`` runs it in with activation scheme ``act`` (cached
    per weight object), so that the first ``linear`` call does not; returns that backend's prepared form,
    or ``qweight`` itself for backends that read the IR in place (Triton, reference)."""
    from ..ir.weight import QuantizedWeight

    if not isinstance(qweight, QuantizedWeight):
        raise ValueError(f"qweight: expected a humming.QuantizedWeight, got {type(qweight).__name__}")
    module = backend_module(backend)
    return module.prepare(qweight, act) if hasattr(module, "prepare") else qweight
