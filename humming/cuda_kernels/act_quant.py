"""The activation quantization the CUDA GEMMs run before their kernel (``include/humming/act_quant.cuh``):
e4m3 codes (or their values in 16-bit floats) with float32 scales per token or per group along K, bit-exact
with :func:`humming.quantize_activation` and with the Triton pass (:mod:`humming.triton_kernels.act_quant`).

It exists for the host: a Triton launch binds its arguments and goes through Triton's launcher on every
call, where this kernel's launch writes three addresses into a packed parameter struct and calls the driver
(:class:`~._driver.PackedLaunch`), so a quantized-activation call of the CUDA GEMMs costs the host about as
much as a 16-bit one. :func:`quantize_pass` hands out this pass where it covers the call (16-bit ``x`` with
16-byte rows, ``K % 8 == 0``, per-token or power-of-two groups of 16 ... 256 columns dividing K) and the
Triton pass everywhere else (per-tensor scales, float32 ``x``, other formats, act-order gathers).
"""

from __future__ import annotations

import ctypes

import torch

from ..device import device_index, device_info
from ..ir.activation import ActScheme, get_act_scheme
from ..ir.dtypes import HALF_DTYPES
from ._decode_launch import DECODE_CCS
from ._driver import PackedLaunch, current_stream, fields, get_kernel
from ._layout import CPP_DTYPE, DTYPE_CODE
from .jit import KernelSpec, compiler_unavailable_reason, device_arch, per_call_cache

__all__ = [
    "ACT_QUANT_CCS",
    "CudaQuantizePass",
    "act_quant_spec",
    "cuda_unsupported",
    "pass_spec",
    "quantize_pass",
    "warmup_jobs",
]

#: Compute capabilities the pass is built for: those of the kernels that take its output.
ACT_QUANT_CCS = DECODE_CCS
_GROUP_THREADS = 256  # threads per block of the grouped pass: 2048 columns of one row


@per_call_cache
def act_quant_spec(x_dtype: str, group: int, values: str, threads: int) -> KernelSpec:
    """The pass for 16-bit ``x`` (dtype code), ``group`` columns per scale (0: per token), ``values``: the
    16-bit dtype code of stored values, or ``"u8"`` for codes; ``threads`` per block."""
    out = "f32" if values == "u8" else values
    return KernelSpec(
        family="act_quant",
        name=f"humming_act_quant_e4m3_x{x_dtype}_g{group}_{values}_t{threads}",
        header="humming/act_quant.cuh",
        entry=f"humming::act_quant::run<{CPP_DTYPE[x_dtype]}, {group}, {CPP_DTYPE[out]}, {threads}>",
        params="humming::act_quant::Params",
        threads=threads,
        ccs=ACT_QUANT_CCS,
    )


def pass_spec(x_dtype: torch.dtype, k: int, scheme: ActScheme, values_dtype: torch.dtype | None) -> KernelSpec:
    """The pass's kernel for 16-bit x of ``x_dtype`` with ``k`` columns, e4m3 codes (``values_dtype`` None)
    or their values: per token, a block of up to 256 threads per row (8 columns each); per group, blocks of
    ``_GROUP_THREADS`` threads along the row."""
    bk = scheme.group_shape[1]
    group = 0 if bk == -1 else bk
    threads = max(32, min(256, 1 << max(0, (k // 8 - 1).bit_length()))) if group == 0 else _GROUP_THREADS
    values = "u8" if values_dtype is None else DTYPE_CODE[values_dtype]
    return act_quant_spec(DTYPE_CODE[x_dtype], group, values, threads)


def warmup_jobs(x: torch.Tensor, act: str | ActScheme, *, values: bool = False) -> list[tuple[KernelSpec, str]]:
    """The ``(spec, arch)`` job of the pass :func:`quantize_pass` makes for calls shaped as ``x`` (for
    ``humming.warmup``, which compiles every job in parallel before the calls); none where Triton's pass runs."""
    scheme = get_act_scheme(act)
    if cuda_unsupported(x, scheme) is not None:
        return []
    spec = pass_spec(x.dtype, x.shape[1], scheme, x.dtype if values else None)
    arch = device_arch(spec, device_info(x.device).capability)
    return [] if arch is None else [(spec, arch)]


class _Params(ctypes.Structure):
    """Mirror of ``humming::act_quant::Params``."""

    _fields_ = (
        *fields(ctypes.c_void_p, "x codes scales"),
        *fields(ctypes.c_int, "M K x_stride codes_stride scale_row scale_span"),
    )


def cuda_unsupported(x: torch.Tensor, scheme: ActScheme) -> str | None:
    """``None`` when the CUDA pass quantizes calls shaped as ``x`` with ``scheme``, else why not (the Triton
    pass takes those)."""
    bn, bk = scheme.group_shape
    if scheme.element_format.name != "e4m3" or scheme.scale_dtype != torch.float32 or scheme.global_scale:
        return f"the CUDA pass writes e4m3 codes with float32 scales, not act={scheme.name}"
    if bn != 1 or not (bk == -1 or (16 <= bk <= 256 and bk & (bk - 1) == 0)):
        return f"the CUDA pass takes per-token scales or groups of 16 ... 256 columns, not act={scheme.name}"
    if x.dim() != 2 or x.dtype not in HALF_DTYPES or x.stride(-1) != 1 or x.shape[0] == 0:
        return "the CUDA pass takes non-empty 2-D float16 / bfloat16 x with contiguous rows"
    m, k = x.shape
    if k % 8 or (bk != -1 and k % bk) or (m > 1 and x.stride(0) % 8):
        return f"the CUDA pass takes K % 8 == 0 (and a multiple of the group), 16-byte rows, got x {tuple(x.shape)}"
    if x.device.type != "cuda" or device_info(x.device).capability not in ACT_QUANT_CCS:
        return f"the CUDA pass is built for compute capabilities {ACT_QUANT_CCS}"
    return compiler_unavailable_reason()


class CudaQuantizePass:
    """One kind of call made ready (x's dtype, shape and row stride, the scheme, values or codes, the scales'
    layout): buffers, grid and the packed launch; a call allocates the codes and scales, writes their
    addresses and x's, and launches. ``x`` whose address is not 16-byte aligned goes through the Triton pass
    (made on first need)."""

    def __init__(self, x: torch.Tensor, scheme: ActScheme, values_dtype, scales_rows: int) -> None:
        m, k = x.shape
        bk = scheme.group_shape[1]
        group = 0 if bk == -1 else bk
        spans = 1 if group == 0 else k // group
        if scales_rows and scales_rows < m:
            raise ValueError(f"scales_rows: expected >= M={m} rows of float32 scales, got {scales_rows}")
        self.scheme, self.values_dtype, self.scales_rows, self.m, self.k = scheme, values_dtype, scales_rows, m, k
        self.codes_dtype = values_dtype or torch.uint8
        self.device = device_index(x.device)
        self.torch_device = torch.device("cuda", self.device)
        params = _Params()
        params.M, params.K, params.x_stride, params.codes_stride = m, k, x.stride(0) if m > 1 else k, k
        if scales_rows:  # [spans, scales_rows]: span j of row r at j * scales_rows + r
            self.scales_shape = (spans, scales_rows)
            params.scale_row, params.scale_span = 1, scales_rows
        else:
            self.scales_shape = (m, spans)
            params.scale_row, params.scale_span = spans, 1
        spec = pass_spec(x.dtype, k, scheme, values_dtype)
        grid = (m, 1 if group == 0 else -(-(k // 8) // spec.threads), 1)
        self.packed = PackedLaunch(get_kernel(spec, self.device), grid, 0, params)
        codes_bytes = m * k * self.codes_dtype.itemsize
        self.scales_offset = -(-codes_bytes // 16) * 16
        self.buffer_bytes = self.scales_offset + 4 * self.scales_shape[0] * self.scales_shape[1]
        self.fallback = None

    def __call__(self, x: torch.Tensor, scale: torch.Tensor | None = None, perm: torch.Tensor | None = None):
        """``(codes, scales, None)`` of ``x`` (the Triton pass's return, for the same call)."""
        if x.data_ptr() % 16:
            if self.fallback is None:
                from ..triton_kernels.act_quant import pass_for

                self.fallback = pass_for(x, self.scheme, False, self.values_dtype, self.scales_rows)
            return self.fallback(x)
        codes = torch.empty((self.m, self.k), dtype=self.codes_dtype, device=self.torch_device)
        scales = torch.empty(self.scales_shape, dtype=torch.float32, device=self.torch_device)
        self._launch(x.data_ptr(), codes.data_ptr(), scales.data_ptr())
        return codes, scales, None

    def addresses(self, x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        """``(buffer, codes address, scales address)``: the call's codes and scales in one allocation, for a
        kernel that takes addresses (one allocation fewer than :meth:`__call__`). ``buffer`` holds both; a
        kernel launched on the same stream may read them after it is freed (the caching allocator reuses
        memory in stream order)."""
        if x.data_ptr() % 16:
            codes, scales, _ = self(x)
            return codes, codes.data_ptr(), scales.data_ptr()
        buffer = torch.empty(self.buffer_bytes, dtype=torch.uint8, device=self.torch_device)
        codes = buffer.data_ptr()
        self._launch(x.data_ptr(), codes, codes + self.scales_offset)
        return buffer, codes, codes + self.scales_offset

    def _launch(self, x: int, codes: int, scales: int) -> None:
        packed = self.packed
        with packed.lock:
            params = packed.params
            params.x, params.codes, params.scales = x, codes, scales
            packed(current_stream(self.device))


#: The CUDA passes made ready, by what decides them (bounded: serving sees many M).
_passes: dict = {}
_MAX_PASSES = 4096


def quantize_pass(x: torch.Tensor, act: str | ActScheme, *, values: bool = False, scales_rows: int = 0):
    """A callable ``x -> (codes, scales, global_scale)`` for calls shaped as ``x``, as
    :func:`humming.triton_kernels.act_quant.quantize_pass` (same arguments, same buffers and bits): the CUDA
    pass where :func:`cuda_unsupported` allows, the Triton pass otherwise."""
    from ..triton_kernels.act_quant import quantize_pass as triton_pass

    scheme = get_act_scheme(act)
    if cuda_unsupported(x, scheme) is not None:
        return triton_pass(x, scheme, values=values, scales_rows=scales_rows)
    values_dtype = x.dtype if values else None
    key = (x.dtype, x.shape, x.stride(0), x.device, scheme, values_dtype, scales_rows)
    quant = _passes.get(key)
    if quant is None:
        quant = CudaQuantizePass(x, scheme, values_dtype, scales_rows)
        if len(_passes) >= _MAX_PASSES:
            _passes.clear()
        _passes[key] = quant
    return quant
