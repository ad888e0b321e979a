"""Every kernel the dispatcher can pick: what it supports, the tuning it would run, and how to run it.

A :class:`Kernel` is a thin adapter over one backend's entry points. ``unsupported(qw, act, x)`` (grouped
kernels: ``(qw, act, x, block_m)``) answers for one call with ``None`` or the reason; ``tuning(qw, act, x)``
returns the launch configuration the kernel's own pure heuristic picks (``None`` where the kernel decides
at launch); ``run`` launches with that tuning. Backends are imported on first use, so that ``import
humming`` never imports Triton or CUDA.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["BACKENDS", "DENSE_KERNELS", "GROUPED_KERNELS", "Kernel", "backend_module", "backend_unavailable"]

#: backend name -> module
BACKENDS = {
    "cuda": "humming.cuda_kernels",
    "triton": "humming.triton_kernels",
    "reference": "humming.reference",
}


_imported: dict = {}  # backend name -> module, once imported (every kernel call asks)


def backend_module(name: str):
    module = _imported.get(name)
    if module is not None:
        return module
    if name not in BACKENDS:
        raise ValueError(f"backend: expected one of {['auto', *BACKENDS]}, got {name!r}")
    try:
        module = _imported[name] = importlib.import_module(BACKENDS[name])
    except ImportError as err:  # the backend's own optional dependencies are missing
        raise RuntimeError(f"backend {name!r} cannot be imported: {err}") from err
    return module


def backend_unavailable(name: str) -> str | None:
    """``None`` when backend ``name`` can run here, else why not (a missing package, no GPU...)."""
    try:
        return backend_module(name).is_available()
    except RuntimeError as err:
        return str(err)


@dataclass(frozen=True)
class Kernel:
    """One kernel of one backend. ``layout`` names the prepared weight layout it reads (``"ir"``: the
    QuantizedWeight as it is, nothing to prepare). ``gathers``: a grouped kernel whose ``run`` takes
    ``rows=`` (token rows read through an index, ``humming.moe.grouped_linear``'s gather); the caller copies
    the rows into grouped order for the others."""

    name: str
    backend: str
    layout: str
    unsupported: Callable[..., str | None]
    run: Callable[..., torch.Tensor]
    tuning: Callable[..., object] = lambda *args: None
    gathers: bool = False


def _cuda(kernel: str, layout: str) -> Kernel:
    def unsupported(qw, act, x):
        return backend_unavailable("cuda") or backend_module("cuda").kernel_unsupported(kernel, qw, act, x)

    def run(x, qw, bias, act, out_dtype, tuning):
        return backend_module("cuda").run(kernel, x, qw, bias, act, out_dtype, tuning)

    def tuning(qw, act, x):
        return backend_module("cuda").default_tuning(kernel, qw, getattr(x, "codes", x))

    return Kernel(f"cuda.{kernel}", "cuda", layout, unsupported, run, tuning)


def _triton_wna16_unsupported(qw, act, x):
    if act is not None:
        return "the WnA16 GEMM takes 16-bit activations (act=None)"
    return backend_unavailable("triton") or backend_module("triton").supports(qw, None, x)


def _triton_scaled_unsupported(qw, act, x):
    if act is None:
        return "the scaled GEMM needs quantized activations (act=...)"
    return backend_unavailable("triton") or backend_module("triton").supports(qw, act, x)


def _triton_wna16_run(x, qw, bias, act, out_dtype, tuning):
    return importlib.import_module("humming.triton_kernels.wna16").linear(x, qw, bias, out_dtype, config=tuning)


def _triton_wna16_tuning(qw, act, x):
    return importlib.import_module("humming.triton_kernels.wna16").default_config(qw, x)


def _triton_scaled_run(x, qw, bias, act, out_dtype, tuning):
    scaled_mm = importlib.import_module("humming.triton_kernels.scaled_mm")
    return scaled_mm.linear(x, qw, bias, act, out_dtype, config=tuning)


def _reference_run(x, qw, bias, act, out_dtype, tuning):
    return backend_module("reference").linear(x, qw, bias, act, out_dtype)


#: Dense kernels by name.
DENSE_KERNELS: dict[str, Kernel] = {
    k.name: k
    for k in (
        _cuda("gemm_sm90", "fragment"),
        _cuda("decode", "fragment"),
        _cuda("fp8_gemm", "fp8_gemm"),
        _cuda("fp4_gemm", "fp4_gemm"),
        Kernel("triton.wna16", "triton", "ir", _triton_wna16_unsupported, _triton_wna16_run, _triton_wna16_tuning),
        Kernel("triton.scaled_mm", "triton", "ir", _triton_scaled_unsupported, _triton_scaled_run),
        Kernel("reference", "reference", "ir", lambda qw, act, x: None, _reference_run),
    )
}


def _grouped(backend: str, layout: str, gathers: bool = False) -> Kernel:
    def unsupported(qw, act, x, block_m):
        return backend_unavailable(backend) or backend_module(backend).supports_grouped(qw, act, x, block_m)

    def run(x, qw, expert_ids, block_m, bias, act, out_dtype, tuning, **gather):
        return backend_module(backend).grouped_linear(x, qw, expert_ids, block_m, bias, act, out_dtype, **gather)

    name = f"{backend}.grouped" if backend != "reference" else "reference"
    return Kernel(name, backend, layout, unsupported, run, gathers=gathers)


#: Grouped (MoE) kernels by name: ``unsupported(qw, act, x, block_m)``,
#: ``run(x, qw, expert_ids, block_m, bias, act, out_dtype, tuning)`` (plus ``rows=`` where ``gathers``).
GROUPED_KERNELS: dict[str, Kernel] = {
    k.name: k for k in (_grouped("cuda", "fragment"), _grouped("triton", "ir", True), _grouped("reference", "ir", True))
}
