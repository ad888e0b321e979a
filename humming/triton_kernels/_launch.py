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

Every kernel compiles with floating-point contraction on (``enable_fp_fusion=True``, a multiply feeding an
add becomes one fma), whatever the Triton version's default: Triton 3.10 turns that default off, which would
change the last bits of results that humming's references, CUDA twins and tests hold to.

Under Triton's interpreter (``TRITON_INTERPRET=1``) nothing is kept: every launch goes through ``run``.
"""

from __future__ import annotations

import torch
from triton.compiler import CompiledKernel

from ..kernel import LaunchesByWeight

__all__ = ["CompiledLaunches", "LaunchesByWeight", "PreparedLaunch"]


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
            kernel = self.fn[grid](*args, num_warps=num_warps, enable_fp_fusion=True, **options)
            if isinstance(kernel, CompiledKernel):
                if len(self.compiled) >= self.keep:
                    self.compiled.clear()
                self.compiled[key] = kernel
            return
        kernel[grid](*args, stream=torch._C._cuda_getCurrentRawStream(device))


class PreparedLaunch:
    """One kind of call of Triton kernel ``fn`` made ready: its grid, launch options and every argument but the
    tensors that change between calls (``per_call``, parameter names), in the kernel's order. A call passes
    those tensors; they and the device make the launch key of :class:`CompiledLaunches` (each one's dtype and
    16-byte alignment: what Triton specializes a pointer on), so ``values`` must hold everything else a
    compiled kernel depends on, and the prepared launch is kept per such kind of call by its caller."""

    def __init__(self, fn, grid, values: dict, per_call: tuple[str, ...], num_warps: int, **options) -> None:
        names = list(fn.arg_names)
        missing = [name for name in names if name not in values and name not in per_call]
        if missing:
            raise ValueError(f"{fn.__name__}: no value for {missing}")
        self.template = [values.get(name) for name in names]
        self.slots = tuple(names.index(name) for name in per_call)
        self.grid = (*grid, 1, 1)[:3]
        self.num_warps, self.options = num_warps, options
        self.launches = CompiledLaunches(fn)

    def __call__(self, device: int | None, *tensors: torch.Tensor) -> None:
        """Launch on the current stream of CUDA device ``device`` with ``tensors`` (in ``per_call``'s order)."""
        args = self.template.copy()
        key = [device]
        for slot, tensor in zip(self.slots, tensors, strict=True):
            args[slot] = tensor
            key += (tensor.dtype, tensor.data_ptr() % 16)
        self.launches.launch(tuple(key), self.grid, tuple(args), self.num_warps, device, **self.options)
