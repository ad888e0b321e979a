"""Launching a Triton kernel again without the per-launch work of ``JITFunction.run``.

``kernel[grid](...)`` binds every argument, works out what Triton specializes on (each argument's type,
the 16-byte alignment of each pointer, properties of each integer), hashes that into the key of its
compiled kernels and looks the kernel up: tens of microseconds of Python for a kernel of twenty
arguments, more than an activation-quantization pass over a few tokens takes on the GPU.
:class:`CompiledLaunches` sends the first launch of each *launch key* through ``JITFunction.run`` (which
compiles when needed), keeps the compiled kernel it returns, and launches later calls with that key on it
directly, with what ``JITFunction.run`` itself ends with. The key is the caller's: it must tell apart every
pair of calls that Triton could compile differently (argument dtypes, integer argument values, the 16-byte
alignment of each pointer, constexprs, launch options) and the device.

Under Triton's interpreter (``TRITON_INTERPRET=1``) nothing is kept: every launch goes through ``run``.
"""

from __future__ import annotations

import torch
from triton.compiler import CompiledKernel

__all__ = ["CompiledLaunches"]


class CompiledLaunches:
    """The compiled kernels of one Triton kernel ``fn`` by launch key (at most ``keep``: then they start over)."""

    def __init__(self, fn, keep: int = 1024) -> None:
        self.fn = fn
        self.keep = keep
        self.compiled: dict = {}

    def launch(self, key, grid: tuple[int, int, int], args: tuple, num_warps: int, device: int, **options) -> None:
        """Launch ``fn`` on ``grid`` with ``args`` (every parameter in order, constexprs included) on the
        current stream of CUDA device ``device``; ``key`` as the module docstring says (it covers ``options``,
        further launch options such as ``num_stages``, too)."""
        kernel = self.compiled.get(key)
        if kernel is None:
            kernel = self.fn[grid](*args, num_warps=num_warps, **options)
            if isinstance(kernel, CompiledKernel):
                if len(self.compiled) >= self.keep:
                    self.compiled.clear()
                self.compiled[key] = kernel
            return
        kernel[grid](*args, stream=torch._C._cuda_getCurrentRawStream(device))
