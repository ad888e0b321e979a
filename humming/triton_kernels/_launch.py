"""Launching a Triton kernel again without the per-launch work of ``JITFunction.run``.

``kernel[grid](...)`` binds every argument, works out what Triton specializes on (each argument's type,
the 16-byte alignment of each pointer, properties of each integer), hashes that into the key of its
compiled kernels and looks the kernel up: tens of microseconds of Python for a kernel of twenty
arguments, more than an activation-quantization pass over a few tokens takes on the GPU.
:class:`CompiledLaunches` sends the first launch of each *launch key* through ``JITFunction.run`` (which
compiles when needed), keeps the compiled kernel it returns, and launches later calls with that key on it
directly, with what ``JITFunction.run`` itself ends with. The key is the caller's, with the constexpr
arguments and the warps added: it must tell apart every other pair of calls that Triton could compile
differently (argument dtypes, integer argument values, the 16-byte alignment of each pointer, launch options)
and the device.

Every kernel compiles with floating-point contraction on (``enable_fp_fusion=True``, a multiply feeding an
add becomes one fma), whatever the Triton version's default: Triton 3.10 turns that default off, which would
change the last bits of results that humming's references, CUDA twins and tests hold to.

Later launches skip Triton's launcher too where they can (:class:`DirectLaunch`): a compiled kernel's
parameters are its non-constexpr arguments in order, then Triton's global and profile scratch pointers (the
ABI of Triton's own launcher, checked against the kernel's PTX entry), so a launch writes them into one
packed struct and calls ``cuLaunchKernel`` on the kernel's function. A kernel with scratch memory, clusters,
programmatic dependent launch, a cooperative grid or tensor descriptors, or without ``cuda-bindings`` keeps
Triton's launcher, and so does every launch while a launch hook (a profiler) is installed.

Under Triton's interpreter (``TRITON_INTERPRET=1``) nothing is kept: every launch goes through ``run``.
"""

from __future__ import annotations

import ctypes
import operator
import re
import threading

import torch
from triton import knobs
from triton.compiler import CompiledKernel

from ..kernel import LaunchesByWeight

__all__ = ["CompiledLaunches", "DirectLaunch", "LaunchesByWeight", "PreparedLaunch", "launch_hook_set"]

#: ctypes of the scalar parameter types of a Triton signature (pointers, ``*...``, are 64-bit addresses).
_SCALARS = {
    "i1": ctypes.c_int8,
    "i8": ctypes.c_int8,
    "u8": ctypes.c_uint8,
    "i16": ctypes.c_int16,
    "u16": ctypes.c_uint16,
    "i32": ctypes.c_int32,
    "u32": ctypes.c_uint32,
    "i64": ctypes.c_int64,
    "u64": ctypes.c_uint64,
    "fp32": ctypes.c_float,
    "fp64": ctypes.c_double,
}
_PTX_ENTRY = re.compile(r"\.entry\s+[\w$]+\s*\(([^)]*)\)")
_PTX_PARAM = re.compile(r"\.param\s+\.[a-z]+(\d+)\b")
_SCRATCH_PARAMS = 2  # Triton's launcher appends the global and the profile scratch pointers


def launch_hook_set() -> bool:
    """Whether a launch hook is installed (a profiler such as proton): launches then go through Triton, which
    calls it. Checked on every launch (a profiler may start at any time)."""
    runtime = knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    # a function or None (Triton 3.6), or a chain of them (later Tritons), empty when none is installed
    return (enter is not None and bool(getattr(enter, "calls", True))) or (
        leave is not None and bool(getattr(leave, "calls", True))
    )


class DirectLaunch:
    """Launches of one compiled Triton kernel through ``cuLaunchKernel``, its parameters packed in one struct.

    Made by :meth:`of`, which returns ``None`` for a kernel this cannot launch as Triton's launcher would.
    :meth:`set` writes every parameter from the kernel's arguments (all of them, constexprs included, as
    ``kernel[grid](*args)`` takes them) into :attr:`values`, where a caller may also write single fields
    (:meth:`field`); a launch uses the parameters as they are (callers hold ``lock`` from their first write
    to the launch)."""

    def __init__(self, kernel, params: list[tuple[int, type, bool]], scratch: int) -> None:
        from cuda.bindings import driver

        fields = [(f"p{i}", ctype) for i, ctype, _ in params] + [(f"s{j}", ctypes.c_uint64) for j in range(scratch)]
        struct = type("TritonParams", (ctypes.Structure,), {"_fields_": fields})
        self.values = struct()
        base = ctypes.addressof(self.values)
        self._argv = (ctypes.c_void_p * len(fields))(*[base + getattr(struct, name).offset for name, _ in fields])
        self._scalars = tuple((i, f"p{i}") for i, _, pointer in params if not pointer)
        self._pointers = tuple((i, f"p{i}") for i, _, pointer in params if pointer)
        ranges = {ctypes.c_int32: (-(2**31), 2**31 - 1), ctypes.c_uint32: (0, 2**32 - 1)}
        self._int32 = tuple((i, *ranges[ctype]) for i, ctype, _ in params if ctype in ranges)
        self._names = {i: f"p{i}" for i, _, _ in params}
        self.lock = threading.Lock()
        self._function = driver.CUfunction(kernel.function)
        self._threads, self._smem = 32 * kernel.metadata.num_warps, kernel.metadata.shared
        self._launch, self._stream, self._success = driver.cuLaunchKernel, driver.CUstream, driver.CUresult.CUDA_SUCCESS
        self._streams: dict[int, object] = {}

    @classmethod
    def of(cls, kernel) -> DirectLaunch | None:
        """The direct launch of compiled ``kernel``, or ``None`` where Triton's launcher must run it."""
        try:
            import cuda.bindings.driver  # noqa: F401 (the direct launch's driver calls)
        except ImportError:
            return None
        src, meta = getattr(kernel, "src", None), getattr(kernel, "metadata", None)
        signature = getattr(src, "signature", None)
        if not isinstance(signature, dict) or meta is None or not isinstance(kernel.function, int):
            return None  # not a kernel compiled from Triton source and loaded
        if getattr(meta, "num_ctas", 1) != 1 or getattr(meta, "tensordesc_meta", None):
            return None
        if getattr(meta, "launch_pdl", False) or getattr(meta, "launch_cooperative_grid", False):
            return None
        if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
            return None
        if list(signature) != list(getattr(src.fn, "arg_names", ())):
            return None
        params = []
        for i, ty in enumerate(signature.values()):
            if ty == "constexpr":
                continue
            if not isinstance(ty, str) or not (ty.startswith("*") or ty in _SCALARS):
                return None  # tuples, tensor descriptors, 16-bit float scalars: Triton packs those
            pointer = ty.startswith("*")
            params.append((i, ctypes.c_uint64 if pointer else _SCALARS[ty], pointer))
        entry = _PTX_ENTRY.search(getattr(kernel, "asm", {}).get("ptx", ""))
        if entry is None:
            return None
        sizes = [int(bits) // 8 for bits in _PTX_PARAM.findall(entry.group(1))]
        scratch = sizes[len(params) :]
        if sizes[: len(params)] != [ctypes.sizeof(ctype) for _, ctype, _ in params]:
            return None
        if len(scratch) > _SCRATCH_PARAMS or any(size != 8 for size in scratch):
            return None
        return cls(kernel, params, len(scratch))

    def set(self, args) -> None:
        """Write every parameter from ``args``, the kernel's arguments in order (tensors by address). An integer
        that its 32-bit field cannot hold raises (ctypes would wrap it): Triton compiles such a value as a
        64-bit parameter, another kernel, which the caller's launch key failed to tell apart."""
        for i, lo, hi in self._int32:
            if not lo <= args[i] <= hi:
                raise ValueError(f"argument {i}: {args[i]} does not fit the compiled kernel's 32-bit parameter")
        values = self.values
        for i, name in self._scalars:
            setattr(values, name, args[i])
        for i, name in self._pointers:
            setattr(values, name, args[i].data_ptr())

    def field(self, i: int) -> str:
        """The name of argument ``i``'s field of :attr:`values` (its index among all the kernel's arguments)."""
        return self._names[i]

    def __call__(self, grid: tuple[int, int, int], stream: int) -> None:
        """Launch on ``grid`` and ``stream`` (a ``cudaStream_t`` as int) with the parameters as they are."""
        if grid[0] * grid[1] * grid[2] == 0:
            return
        handle = self._streams.get(stream)
        if handle is None:
            if len(self._streams) >= 64:
                self._streams.clear()
            handle = self._streams[stream] = self._stream(stream)
        argv = ctypes.addressof(self._argv)
        result = self._launch(self._function, *grid, self._threads, 1, 1, self._smem, handle, argv, 0)
        if result[0] != self._success:
            from cuda.bindings import driver

            _, name = driver.cuGetErrorName(result[0])
            raise RuntimeError(f"CUDA driver error {name.decode() if name else result[0]} launching a Triton kernel")


class CompiledLaunches:
    """The compiled kernels of one Triton kernel ``fn`` by launch key (at most ``keep``: then they start over)."""

    def __init__(self, fn, keep: int = 1024) -> None:
        self.fn = fn
        self.keep = keep
        self.compiled: dict = {}
        self.direct: dict = {}  # key -> the DirectLaunch of its compiled kernel, or None: Triton's launcher
        # the constexpr arguments' positions: they join every key, so that a caller's key that leaves out a
        # tile size (or the warps) cannot send a call to a kernel compiled for another
        slots = tuple(param.num for param in getattr(fn, "params", ()) if param.is_constexpr)
        self._constexprs = operator.itemgetter(*slots, slots[0]) if slots else lambda args: ()  # always a tuple

    def kept(self, key, args: tuple, num_warps: int) -> bool:
        """Whether a launch with ``key``, ``args`` and ``num_warps`` finds its kernel compiled already."""
        return (key, num_warps, self._constexprs(args)) in self.compiled

    def kernel(self, key, args: tuple, num_warps: int) -> CompiledKernel | None:
        """The compiled kernel a launch with ``key``, ``args`` and ``num_warps`` runs, once it has one."""
        return self.compiled.get((key, num_warps, self._constexprs(args)))

    def direct_launch(self, key, args: tuple, num_warps: int) -> DirectLaunch | None:
        """The :class:`DirectLaunch` a launch with ``key``, ``args`` and ``num_warps`` uses, if it has one."""
        return self.direct.get((key, num_warps, self._constexprs(args)))

    def launch(self, key, grid: tuple[int, int, int], args: tuple, num_warps: int, device: int, **options) -> None:
        """Launch ``fn`` on ``grid`` with ``args`` (every parameter in order, constexprs included) on the
        current stream of CUDA device ``device``; ``key`` as the module docstring says (it covers ``options``,
        further launch options such as ``num_stages``, too; the constexpr arguments and ``num_warps`` are added
        here)."""
        key = (key, num_warps, self._constexprs(args))
        direct = self.direct.get(key)
        if direct is not None and not launch_hook_set():
            with direct.lock:
                direct.set(args)
                direct(grid, torch._C._cuda_getCurrentRawStream(device))
            return
        kernel = self.compiled.get(key)
        if kernel is None:
            kernel = self.fn[grid](*args, num_warps=num_warps, enable_fp_fusion=True, **options)
            if isinstance(kernel, CompiledKernel):
                if len(self.compiled) >= self.keep:
                    self.compiled.clear()
                    self.direct.clear()
                self.compiled[key] = kernel
                self.direct[key] = DirectLaunch.of(kernel)
            return
        kernel[grid](*args, stream=torch._C._cuda_getCurrentRawStream(device))


class PreparedLaunch:
    """One kind of call of Triton kernel ``fn`` made ready: its grid, launch options and every argument but the
    tensors that change between calls (``per_call``, parameter names), in the kernel's order. ``regrid``
    (a persistent kernel: its grid depends on how many of its blocks a multiprocessor holds) maps the compiled
    kernel to the grid of every launch after the first, which runs on ``grid`` and compiles it. A call passes
    those tensors; they and the device make the launch key of :class:`CompiledLaunches` (each one's dtype and
    16-byte alignment: what Triton specializes a pointer on), so ``values`` must hold everything else a
    compiled kernel depends on, and the prepared launch is kept per such kind of call by its caller."""

    def __init__(
        self, fn, grid, values: dict, per_call: tuple[str, ...], num_warps: int, regrid=None, **options
    ) -> None:
        names = list(fn.arg_names)
        missing = [name for name in names if name not in values and name not in per_call]
        if missing:
            raise ValueError(f"{fn.__name__}: no value for {missing}")
        self.template = [values.get(name) for name in names]
        self.slots = tuple(names.index(name) for name in per_call)
        self.grid = (*grid, 1, 1)[:3]
        self.num_warps, self.options = num_warps, options
        self.regrid = regrid
        self.launches = CompiledLaunches(fn)
        self.direct: dict = {}  # launch key -> (its DirectLaunch, the fields of the per-call tensors)

    def __call__(self, device: int | None, *tensors: torch.Tensor) -> None:
        """Launch on the current stream of CUDA device ``device`` with ``tensors`` (in ``per_call``'s order)."""
        addresses = [tensor.data_ptr() for tensor in tensors]
        key = [device]
        for tensor, address in zip(tensors, addresses):
            key += (tensor.dtype, address & 15)
        key = tuple(key)
        direct = self.direct.get(key)
        if direct is not None and not launch_hook_set():  # the template's parameters are in: only addresses
            launch, fields = direct
            with launch.lock:
                values = launch.values
                for field, address in zip(fields, addresses):
                    setattr(values, field, address)
                launch(self.grid, torch._C._cuda_getCurrentRawStream(device))
            return
        args = self.template.copy()
        for slot, tensor in zip(self.slots, tensors):
            args[slot] = tensor
        launches, args = self.launches, tuple(args)
        launches.launch(key, self.grid, args, self.num_warps, device, **self.options)
        if self.regrid is not None:
            kernel = launches.kernel(key, args, self.num_warps)
            if kernel is not None:
                self.grid = (*self.regrid(kernel), 1, 1)[:3]
                self.regrid = None
        launch = launches.direct_launch(key, args, self.num_warps)
        if launch is not None:
            launch.set(args)
            self.direct[key] = (launch, tuple(launch.field(slot) for slot in self.slots))
