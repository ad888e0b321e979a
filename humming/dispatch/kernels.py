"""Every kernel the dispatcher can pick. Each kernel module exports one :class:`~humming.kernel.Kernel`
(``KERNEL``), which says what it supports, the tuning it would run, how to run it, what it compiles ahead
of time and the weight layout it reads; this module lists them by name.

Kernel modules are imported on first use, so that ``import humming`` never imports Triton or CUDA; a module
that cannot be imported (a missing optional dependency) stands for a kernel whose ``unsupported`` says so.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping

from ..kernel import Kernel

__all__ = [
    "BACKENDS",
    "DENSE_KERNELS",
    "GROUPED_KERNELS",
    "Kernel",
    "KernelList",
    "backend_module",
    "backend_unavailable",
]

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
        return backend_module(name).unavailable()
    except RuntimeError as err:
        return str(err)


class KernelList(MutableMapping):
    """Kernels by name, in the order ``backend=`` tries them: each entry names its backend and the module
    that exports the kernel as ``KERNEL``, imported the first time the kernel is looked up. A module that
    cannot be imported gives a kernel whose ``unsupported`` is the import error. Entries may be replaced
    (tests stand in their own kernels)."""

    def __init__(self, entries: dict[str, tuple[str, str]]) -> None:
        self._entries = dict(entries)
        self._kernels: dict[str, Kernel] = {}

    def backend(self, name: str) -> str:
        """The backend of kernel ``name``, without importing it."""
        return self._entries[name][0]

    def __getitem__(self, name: str) -> Kernel:
        kernel = self._kernels.get(name)
        if kernel is None:
            backend, module = self._entries[name]
            try:
                backend_module(backend)
                kernel = importlib.import_module(module).KERNEL
            except (ImportError, RuntimeError) as err:  # the backend's optional dependencies are missing
                reason = str(err) if isinstance(err, RuntimeError) else f"backend {backend!r} cannot be imported: {err}"
                kernel = _missing(name, backend, reason)
            self._kernels[name] = kernel
        return kernel

    def __setitem__(self, name: str, kernel: Kernel) -> None:
        self._entries.setdefault(name, (kernel.backend, ""))
        self._kernels[name] = kernel

    def __delitem__(self, name: str) -> None:
        del self._entries[name]
        self._kernels.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name) -> bool:
        return name in self._entries


def _missing(name: str, backend: str, reason: str) -> Kernel:
    """A kernel whose module cannot be imported: unsupported for every call, with the reason."""

    def run(*args, **kwargs):
        raise RuntimeError(reason)

    return Kernel(name, backend, "ir", lambda *args: reason, run)


#: Dense kernels by name (``unsupported(qw, act, x)``, ``run(x, qw, bias, act, out_dtype, tuning)``).
DENSE_KERNELS = KernelList(
    {
        "cuda.wna16_sm90": ("cuda", "humming.cuda_kernels.wna16_sm90"),
        "cuda.wna16_decode": ("cuda", "humming.cuda_kernels.wna16_decode"),
        "cuda.fp8_gemm": ("cuda", "humming.cuda_kernels.fp8_gemm"),
        "cuda.scaled_mm": ("cuda", "humming.cuda_kernels.scaled_mm"),
        "cuda.fp4_gemm": ("cuda", "humming.cuda_kernels.fp4_gemm"),
        "triton.wna16": ("triton", "humming.triton_kernels.wna16"),
        "triton.scaled_mm": ("triton", "humming.triton_kernels.scaled_mm"),
        "reference": ("reference", "humming.reference.gemm"),
    }
)

#: Grouped (MoE) kernels by name: ``unsupported(qw, act, x, block_m)``,
#: ``run(x, qw, expert_ids, block_m, bias, act, out_dtype, tuning)`` (plus ``rows=`` where ``gathers``).
GROUPED_KERNELS = KernelList(
    {
        "cuda.grouped_decode": ("cuda", "humming.cuda_kernels.grouped_decode"),
        "cuda.grouped": ("cuda", "humming.cuda_kernels.grouped"),
        "triton.grouped": ("triton", "humming.triton_kernels.grouped"),
        "reference": ("reference", "humming.reference.grouped"),
    }
)
