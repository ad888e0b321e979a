"""Loading cubins and launching kernels through the CUDA driver API (``cuda.bindings.driver``).

Modules are loaded into the device's primary context (the one torch uses) and kept for the life of the
process, one per (spec, device). A launch passes the kernel's single parameter struct (a ``ctypes``
structure mirroring the C++ one) by value on the given stream (:func:`current_stream`: torch's current
stream as a handle). :func:`tensor_map_2d` encodes the TMA descriptors the Hopper kernels take inside that
struct; :class:`TensorMap2d` does so for one geometry, remembering the descriptors of recent addresses.

Everything here runs on every call of a kernel that may take a few microseconds on the GPU, so the
per-call work is kept to reading pointers and one driver call.
"""

from __future__ import annotations

import ctypes
import functools
import threading

import torch

from .._env import env
from ..device import device_info
from .jit import CompiledKernel, KernelNotReadyError, KernelSpec, compile_kernel, device_arch

__all__ = [
    "LoadedKernel",
    "PackedLaunch",
    "TensorMap2d",
    "check",
    "current_stream",
    "get_kernel",
    "load",
    "loaded",
    "programmatic_launches",
    "tensor_map",
    "tensor_map_2d",
]

_loaded: dict[tuple[KernelSpec, int], LoadedKernel] = {}
_guard = threading.Lock()


def fields(ctype, names: str) -> tuple:
    """``_fields_`` entries of a kernel parameter struct's ctypes mirror: each of the space-separated
    ``names``, in order, of type ``ctype`` (the mirrors list the C++ struct's fields in its order)."""
    return tuple((name, ctype) for name in names.split())


def check(result) -> object:
    """Unwrap a ``cuda.bindings.driver`` return tuple, raising on any error code."""
    from cuda.bindings import driver

    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise RuntimeError(f"CUDA driver error {name.decode() if name else err}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def current_stream(device_index: int) -> int:
    """The handle (``cudaStream_t``) of torch's current stream on CUDA device ``device_index``: what
    ``torch.cuda.current_stream(device_index).cuda_stream`` is, without building a ``Stream`` object (the
    capture stream while a CUDA graph is captured)."""
    return torch._C._cuda_getCurrentRawStream(device_index)


_TMAP_DTYPES = {torch.uint8: "UINT8", torch.bfloat16: "BFLOAT16", torch.float16: "FLOAT16", torch.int32: "INT32"}


class TensorMap2d:
    """The TMA descriptors (``CUtensorMap``, 128 bytes) of row-major 2-D tensors of one dtype (uint8, bf16
    or fp16), shape and row stride (elements), in boxes of ``box_rows x box_inner`` elements (``box_inner``
    x element size = 128 bytes), 128-byte swizzle (or int32 words without swizzle, boxes of up to 256 words),
    zero fill outside the tensor: everything of the
    descriptor but the address, which :meth:`encode` takes. A descriptor depends on nothing else, so those of
    the last addresses are kept (activations often come back at the addresses of earlier calls)."""

    _KEEP = 64

    def __init__(
        self,
        dtype: torch.dtype,
        rows: int,
        cols: int,
        row_stride: int,
        box_inner: int,
        box_rows: int,
        swizzle: bool = True,
    ):
        from cuda.bindings import driver

        if dtype not in _TMAP_DTYPES or (swizzle and dtype == torch.int32):
            raise ValueError(f"dtype: expected uint8 / bf16 / fp16 (int32: without swizzle), got {dtype}")
        size = dtype.itemsize
        if swizzle and box_inner * size != 128:
            raise ValueError(f"box_inner: expected {128 // size} (128 bytes of {dtype}), got {box_inner}")
        if not swizzle and ((box_inner * size) % 16 or not 0 < box_inner <= 256 or (row_stride * size) % 16):
            raise ValueError(
                f"box_inner, row_stride: a box of 16-byte multiples, at most 256 elements, rows 16-byte aligned; got"
                f" box_inner={box_inner}, row_stride={row_stride} of {dtype}"
            )
        no_swizzle = driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE
        u64, u32 = driver.cuuint64_t, driver.cuuint32_t
        self._encode = driver.cuTensorMapEncodeTiled
        self._dtype = getattr(driver.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{_TMAP_DTYPES[dtype]}")
        self._layout = (
            [u64(cols), u64(rows)],
            [u64(row_stride * size)],
            [u32(box_inner), u32(box_rows)],
            [u32(1), u32(1)],
            driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B if swizzle else no_swizzle,
            driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        self._recent: dict[int, bytes] = {}

    def encode(self, address: int) -> bytes:
        """The descriptor of the tensor at device address ``address``."""
        tmap = self._recent.get(address)
        if tmap is None:
            encoded = check(self._encode(self._dtype, 2, address, *self._layout))
            tmap = ctypes.string_at(encoded.getPtr(), 128)
            if len(self._recent) >= self._KEEP:
                self._recent.clear()
            self._recent[address] = tmap
        return tmap


@functools.lru_cache(maxsize=1024)
def tensor_map(
    dtype: torch.dtype, rows: int, cols: int, row_stride: int, box_inner: int, box_rows: int, swizzle: bool = True
) -> TensorMap2d:
    """The :class:`TensorMap2d` of this geometry (one per process)."""
    return TensorMap2d(dtype, rows, cols, row_stride, box_inner, box_rows, swizzle)


def rows_tensor_map(t: torch.Tensor, box_words: int, box_rows: int) -> bytes:
    """The TMA descriptor of ``t`` (contiguous, first dimension the rows) read as rows of 32-bit words: boxes
    of ``box_rows`` rows x ``box_words`` words, no swizzle, zero fill past the last row (the sm_90a GEMM's
    16-row tiles of a layout whose tiles are not grouped, :mod:`._gemm_sm90`)."""
    if not t.is_contiguous():
        raise ValueError(
            f"t: expected a contiguous tensor (the descriptor holds its address), got strides {t.stride()}"
        )
    words = t.reshape(t.shape[0], -1).view(torch.int32)
    rows, cols = words.shape
    return tensor_map(torch.int32, rows, cols, cols, box_words, box_rows, False).encode(words.data_ptr())


def tensor_map_2d(t: torch.Tensor, box_inner: int, box_rows: int) -> bytes:
    """The 128-byte TMA descriptor (``CUtensorMap``) of a row-major 2-D tensor (uint8, bf16 or fp16), boxes
    of ``box_rows x box_inner`` elements (``box_inner`` x element size = 128 bytes), 128-byte swizzle, zero
    fill outside the tensor."""
    if t.dim() != 2 or t.stride(1) != 1 or t.dtype not in _TMAP_DTYPES:
        raise ValueError(f"t: expected a 2-D uint8 / bf16 / fp16 tensor, unit column stride; got {t.dtype} {t.shape}")
    rows, cols = t.shape
    return tensor_map(t.dtype, rows, cols, t.stride(0), box_inner, box_rows).encode(t.data_ptr())


def _make_current(device_index: int) -> None:
    from cuda.bindings import driver

    check(driver.cuInit(0))
    dev = check(driver.cuDeviceGet(device_index))
    ctx = check(driver.cuDevicePrimaryCtxRetain(dev))
    check(driver.cuCtxSetCurrent(ctx))


class LoadedKernel:
    """A kernel loaded on one device, ready to launch."""

    def __init__(self, compiled: CompiledKernel, device_index: int) -> None:
        from cuda.bindings import driver

        self.compiled = compiled
        self.device_index = device_index
        _make_current(device_index)
        self._module = check(driver.cuModuleLoadData(compiled.cubin))
        self._function = check(driver.cuModuleGetFunction(self._module, compiled.spec.name.encode()))
        self._max_dynamic_smem = 0
        self._threads = compiled.spec.threads
        self._launch = driver.cuLaunchKernel
        self._stream = driver.CUstream
        self._success = driver.CUresult.CUDA_SUCCESS

    def allow_smem(self, smem: int) -> None:
        """Let launches ask for ``smem`` bytes of dynamic shared memory (the driver's opt-in past 48 KiB)."""
        if smem > self._max_dynamic_smem:
            from cuda.bindings import driver

            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(driver.cuFuncSetAttribute(self._function, attr, smem))
            self._max_dynamic_smem = smem

    def launch(self, grid: tuple[int, int, int], smem: int, params: ctypes.Structure, stream: int) -> None:
        """Launch on ``stream`` (a ``cudaStream_t`` as int) with ``params`` passed by value."""
        self.allow_smem(smem)
        pointers = (ctypes.c_void_p * 1)(ctypes.addressof(params))
        result = self._launch(
            self._function, *grid, self._threads, 1, 1, smem, self._stream(stream), ctypes.addressof(pointers), 0
        )
        if result[0] != self._success:
            check(result)


class PackedLaunch:
    """One launch of a loaded kernel made ready: grid, shared memory and one parameter struct (``params``, a
    ctypes structure instance) kept with the pointer array the driver reads it through, so that a call writes
    its tensors' addresses into ``params`` and launches, building nothing. The driver copies the parameters
    during the launch call, so the struct may be rewritten as soon as it returns; callers hold ``lock`` from
    their first write to the launch (threads sharing a launcher).

    ``programmatic``: a programmatic dependent launch (``cuLaunchKernelEx``) where :func:`programmatic_launches`
    allows it: the kernel may start before the kernel before it ends, and waits for it with
    ``grid_dependency_wait`` (common.cuh). Before that wait it may read only what that kernel cannot be
    writing: the dense GEMMs, which load weights early, launch so only behind the call's own activation pass;
    the grouped GEMMs and the combine wait before reading anything, so any kernel may precede them. Where the
    driver refuses it, the launch is made plainly, then every later one (the kernel's waits are then no-ops)."""

    _STREAMS_KEPT = 64

    def __init__(
        self,
        kernel: LoadedKernel,
        grid: tuple[int, int, int],
        smem: int,
        params: ctypes.Structure,
        programmatic: bool = False,
    ):
        kernel.allow_smem(smem)
        self.params = params
        self.lock = threading.Lock()
        self._argv = (ctypes.c_void_p * 1)(ctypes.addressof(params))
        self._head = (kernel._function, *grid, kernel._threads, 1, 1, smem)
        self._tail = (ctypes.addressof(self._argv), 0)
        self._launch, self._stream, self._success = kernel._launch, kernel._stream, kernel._success
        self._streams: dict[int, object] = {}
        programmatic = programmatic and programmatic_launches(kernel.device_index)
        self._config = _programmatic_config(grid, kernel._threads, smem) if programmatic else None
        if self._config is not None:
            from cuda.bindings import driver

            self._launch_ex, self._function = driver.cuLaunchKernelEx, kernel._function

    def __call__(self, stream: int) -> None:
        """Launch on ``stream`` (a ``cudaStream_t`` as int) with ``params`` as they are."""
        handle = self._streams.get(stream)
        if handle is None:
            if len(self._streams) >= self._STREAMS_KEPT:
                self._streams.clear()
            handle = self._streams[stream] = self._stream(stream)
        if self._config is None:
            result = self._launch(*self._head, handle, *self._tail)
        else:
            self._config.hStream = handle
            result = self._launch_ex(self._config, self._function, *self._tail)
            if result[0] != self._success:  # a driver without programmatic launches: plain ones from now on
                self._config = None
                result = self._launch(*self._head, handle, *self._tail)
        if result[0] != self._success:
            check(result)


def programmatic_launches(device_index: int) -> bool:
    """Whether launches asked to be programmatic (:class:`PackedLaunch`) are on ``device_index``: sm_90 and
    newer, unless ``HUMMING_PDL`` is off (A/B timings)."""
    return env("HUMMING_PDL") and device_info(device_index).capability >= (9, 0)


def _programmatic_config(grid: tuple[int, int, int], threads: int, smem: int):
    """A ``CUlaunchConfig`` of one block shape with programmatic stream serialization allowed."""
    from cuda.bindings import driver

    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
    config.sharedMemBytes = smem
    config.attrs = [attr]
    config.numAttrs = 1
    return config


def loaded(spec: KernelSpec, device_index: int) -> LoadedKernel | None:
    return _loaded.get((spec, device_index))


def load(compiled: CompiledKernel, device_index: int) -> LoadedKernel:
    """Load ``compiled`` on ``device_index`` once per process."""
    key = (compiled.spec, device_index)
    with _guard:
        kernel = _loaded.get(key)
        if kernel is None:
            kernel = _loaded[key] = LoadedKernel(compiled, device_index)
        return kernel


def get_kernel(spec: KernelSpec, device_index: int):
    """``spec`` loaded on CUDA device ``device_index``, compiling and loading it on first use.

    Raises :class:`KernelNotReadyError` when that first use happens during CUDA graph capture.
    """
    ready = loaded(spec, device_index)
    if ready is not None:
        return ready
    if torch.cuda.is_current_stream_capturing():
        raise KernelNotReadyError(
            f"CUDA kernel {spec.name} is not compiled and loaded on cuda:{device_index}, and the current "
            "stream is capturing a CUDA graph, during which humming never compiles; call "
            "humming.warmup(...) for this layer and M before capturing"
        )
    cc = device_info(device_index).capability
    arch = device_arch(spec, cc)
    if arch is None:
        raise ValueError(f"{spec.name} has no build for compute capability {cc}; it targets {spec.ccs}")
    return load(compile_kernel(spec, arch), device_index)
