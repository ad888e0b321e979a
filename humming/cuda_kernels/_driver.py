"""Loading cubins and launching kernels through the CUDA driver API (``cuda.bindings.driver``).

Modules are loaded into the device's primary context (the one torch uses) and kept for the life of the
process, one per (spec, device). A launch passes the kernel's single parameter struct (a ``ctypes``
structure mirroring the C++ one) by value on the given stream. :func:`tensor_map_2d` encodes the TMA
descriptors the Hopper kernels take inside that struct.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from ..device import device_info
from .jit import CompiledKernel, KernelNotReadyError, KernelSpec, compile_kernel, device_arch

__all__ = ["LoadedKernel", "check", "get_kernel", "load", "loaded", "tensor_map_2d"]

_loaded: dict[tuple[KernelSpec, int], LoadedKernel] = {}
_guard = threading.Lock()


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


_TMAP_DTYPES = {torch.uint8: "UINT8", torch.bfloat16: "BFLOAT16", torch.float16: "FLOAT16"}


def tensor_map_2d(t: torch.Tensor, box_inner: int, box_rows: int) -> bytes:
    """The 128-byte TMA descriptor (``CUtensorMap``) of a row-major 2-D tensor (uint8, bf16 or fp16), boxes
    of ``box_rows x box_inner`` elements (``box_inner`` x element size = 128 bytes), 128-byte swizzle, zero
    fill outside the tensor."""
    from cuda.bindings import driver

    if t.dim() != 2 or t.stride(1) != 1 or t.dtype not in _TMAP_DTYPES:
        raise ValueError(f"t: expected a 2-D uint8 / bf16 / fp16 tensor, unit column stride; got {t.dtype} {t.shape}")
    if box_inner * t.element_size() != 128:
        raise ValueError(f"box_inner: expected {128 // t.element_size()} (128 bytes of {t.dtype}), got {box_inner}")
    rows, cols = t.shape
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    dtype = getattr(driver.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{_TMAP_DTYPES[t.dtype]}")
    tmap = check(
        driver.cuTensorMapEncodeTiled(
            dtype,
            2,
            t.data_ptr(),
            [u64(cols), u64(rows)],
            [u64(t.stride(0) * t.element_size())],
            [u32(box_inner), u32(box_rows)],
            [u32(1), u32(1)],
            driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    )
    return ctypes.string_at(tmap.getPtr(), 128)


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

    def launch(self, grid: tuple[int, int, int], smem: int, params: ctypes.Structure, stream: int) -> None:
        """Launch on ``stream`` (a ``cudaStream_t`` as int) with ``params`` passed by value."""
        from cuda.bindings import driver

        if smem > self._max_dynamic_smem:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(driver.cuFuncSetAttribute(self._function, attr, smem))
            self._max_dynamic_smem = smem
        pointers = (ctypes.c_void_p * 1)(ctypes.addressof(params))
        threads = self.compiled.spec.threads
        check(
            driver.cuLaunchKernel(
                self._function, *grid, threads, 1, 1, smem, driver.CUstream(stream), ctypes.addressof(pointers), 0
            )
        )


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
