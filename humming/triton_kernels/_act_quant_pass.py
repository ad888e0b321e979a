"""How a call of :mod:`.act_quant` is quantized: the checks of a scheme and of its activations, the tiling
heuristic (:func:`per_token_tile`, shared with the fused passes) and the passes made ready once per kind of
call (:func:`pass_for`: buffers, tiles, grids and constexprs worked out and checked once; a call allocates
and launches)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton

from ..ir.activation import ActScheme, get_act_scheme
from ..ir.dtypes import FLOAT_DTYPES
from ._act_quant_kernel import _absmax_kernel, _act_quant_kernel
from ._launch import CompiledLaunches

__all__ = [
    "ElementSpec",
    "element_spec",
    "pass_for",
    "per_token_tile",
    "scale_kind",
    "scheme_unsupported",
    "unsupported",
]


def unsupported(x: torch.Tensor, act: str | ActScheme) -> str | None:
    """``None`` if :func:`~.act_quant.quantize_activation` runs ``x`` with ``act``, else the reason."""
    reason = scheme_unsupported(get_act_scheme(act))
    if reason is None and (x.dim() != 2 or x.dtype not in FLOAT_DTYPES or x.stride(-1) != 1):
        return f"x: expected a 2-D float16/bfloat16/float32 tensor with contiguous rows, got {x.dtype} {tuple(x.shape)}"
    return reason


def scheme_unsupported(scheme: ActScheme) -> str | None:
    """``None`` if the kernel quantizes with ``scheme`` (whatever the activations), else the reason."""
    fmt = scheme.element_format
    if fmt.kind not in ("int", "float") or (fmt.is_int and not fmt.signed):
        return f"act {scheme.name}: element format {fmt.name} is not supported (signed int or eXmY only)"
    kind = scale_kind(scheme)
    if kind is None:
        return (
            f"act {scheme.name}: scale dtype {scheme.scale_dtype} with global_scale={scheme.global_scale} is not "
            "supported (float32; e8m0; e4m3 with a global scale)"
        )
    bn, bk = scheme.group_shape
    if bn == -1 and kind != "fp32":
        return f"act {scheme.name}: per-tensor scales must be float32"
    if bk != -1 and (bn != 1 or bk & (bk - 1) or bk < 16):
        return f"act {scheme.name}: groups along K must be a power of two >= 16, got {scheme.group_shape}"
    return None


class ElementSpec(NamedTuple):
    """What the quantizing kernels are specialised for of an element format: an integer grid or eXmY, its bits,
    mantissa bits and exponent bias, its largest value and that value's binade (an MX scale's exponent is the
    absmax's minus it). Numbers and bools only: a kernel takes the whole tuple as one constexpr, ``ELEMENT``."""

    INT: bool
    BITS: int
    MBITS: int
    BIAS: int
    MAXV: float
    EMAX_ELEM: int


def element_spec(fmt) -> ElementSpec:
    """The :class:`ElementSpec` of number format ``fmt``."""
    return ElementSpec(
        INT=fmt.is_int,
        BITS=fmt.bits,
        MBITS=fmt.mantissa_bits,
        BIAS=fmt.bias,
        MAXV=fmt.max_value,
        EMAX_ELEM=math.floor(math.log2(fmt.max_value)),
    )


def scale_kind(scheme: ActScheme) -> str | None:
    """How the kernel computes ``scheme``'s scales: ``"fp32"``, ``"e8m0"``, ``"e4m3g"`` (e4m3 under a float32
    global scale), or ``None`` (not supported)."""
    if scheme.scale_dtype == torch.float32 and not scheme.global_scale:
        return "fp32"
    if scheme.scale_dtype == torch.float8_e8m0fnu and not scheme.global_scale:
        return "e8m0"
    if scheme.scale_dtype == torch.float8_e4m3fn and scheme.global_scale:
        return "e4m3g"
    return None


def per_token_tile(m: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_K, BLOCK_M, num_warps) of per-token scales: a program per row that holds up to 8192 columns at
    once, so the absmax pass and the quantize pass each read the row in one go (the row is then in L1 for
    the second), with 8 warps: on the plain pass, 16 warps measured the same and 4-row programs of
    1024-column steps slower from 1024 rows (bench/results/h200/act_quant.json); the fused passes
    (:mod:`.norm_quant`, :mod:`.moe_layer`) read their rows the same way."""
    block_k = min(triton.next_power_of_2(k), 8192)
    return block_k, 1, max(4, min(8, block_k // 512))


#: The passes made ready, by what decides them (bounded: serving sees many M).
_passes: dict = {}
_MAX_PASSES = 4096


def pass_for(x, scheme: ActScheme, static: bool, values_dtype, scales_rows: int, perm: bool = False) -> _Pass:
    key = (x.dtype, x.shape, x.stride(), scheme, static, values_dtype, scales_rows, perm)
    quant = _passes.get(key)
    if quant is None:
        quant = _Pass(x, scheme, static, values_dtype, scales_rows, perm)
        if len(_passes) >= _MAX_PASSES:
            _passes.clear()
        _passes[key] = quant
    return quant


class _Pass:
    """How one kind of call is quantized: x's dtype, shape and strides, the scheme, a static scale or not, the
    codes' dtype (uint8, or 16-bit e4m3 values), the scales' layout and a column permutation or not decide
    the buffers, the tiles, the
    grids and the constexprs, worked out (and checked) once; a call allocates and launches (the absmax pass
    first for tensor-wide scales), through :class:`~._launch.CompiledLaunches`."""

    def __init__(
        self, x: torch.Tensor, scheme: ActScheme, static: bool, values_dtype, scales_rows: int, perm: bool
    ) -> None:
        reason = unsupported(x, scheme)
        if reason:
            raise ValueError(reason)
        fmt = scheme.element_format
        m, k = x.shape
        bn, bk = scheme.group_shape
        kind = scale_kind(scheme)
        if m == 0 or k == 0:
            raise ValueError(f"x: expected a non-empty [M, K], got {tuple(x.shape)}")
        if static and kind != "fp32":
            raise ValueError(f"scale: a static scale needs a float32-scale scheme, got {scheme.name}")
        if static:
            source, group_k, n_spans = "static", 0, 1
        elif bn == -1:
            source, group_k, n_spans = "tensor", 0, 1
        else:
            source, group_k, n_spans = "local", 0 if bk == -1 else bk, 1 if bk == -1 else triton.cdiv(k, bk)
        self.m, self.k = m, k
        self.codes_dtype = values_dtype or torch.uint8
        self.static = static
        self.scales_shape, self.scale_strides = (1, 1), (1, 1)
        self.scales_dtype = torch.float32 if kind == "fp32" else torch.uint8
        if source == "local" and scales_rows:
            if kind != "fp32" or scales_rows < m:
                raise ValueError(f"scales_rows: expected >= M={m} rows of float32 scales, got {scales_rows} ({kind})")
            self.scales_shape, self.scale_strides = (n_spans, scales_rows), (1, scales_rows)
        elif source == "local":
            self.scales_shape, self.scale_strides = (m, n_spans), (n_spans, 1)
        self.global_scale = kind == "e4m3g"
        self.absmax = source == "tensor" or kind == "e4m3g"  # the tensor-wide absmax pass first
        self.absmax_grid = (triton.cdiv(m, 32), triton.cdiv(k, 128), 1)

        num_warps = 4
        if group_k:
            block_k = group_k
            block_m = max(1, min(triton.next_power_of_2(m), 4096 // block_k, 64))
        elif source == "local":  # per-token: one row per program
            block_k, block_m, num_warps = per_token_tile(m, k)
        else:
            block_k = min(triton.next_power_of_2(k), 256)
            block_m = max(1, min(triton.next_power_of_2(m), 16))
        self.num_warps = num_warps
        self.grid = (triton.cdiv(m, block_m), n_spans if source == "local" else triton.cdiv(k, block_k), 1)
        self.constexprs = dict(  # in the kernel's order: the launch passes them positionally
            ELEMENT=element_spec(fmt),
            SCALE="fp32" if source == "static" else kind,
            SOURCE=source,
            GROUP_K=group_k,
            BLOCK_M=block_m,
            BLOCK_K=block_k,
            VALUES=values_dtype is not None,
            PERM=perm,
        )
        self.kernel = CompiledLaunches(_act_quant_kernel)
        self.absmax_kernel = CompiledLaunches(_absmax_kernel)

    def __call__(self, x: torch.Tensor, scale: torch.Tensor | None = None, perm: torch.Tensor | None = None):
        m, k, dev = self.m, self.k, x.device
        codes = torch.empty((m, k), dtype=self.codes_dtype, device=dev)
        if self.static:
            scales = scale.to(device=dev, dtype=torch.float32).reshape(1, 1).contiguous()
        else:
            scales = torch.empty(self.scales_shape, dtype=self.scales_dtype, device=dev)
        gscale = torch.empty((), dtype=torch.float32, device=dev) if self.global_scale else None
        # Launch keys: the device and the alignment of the pointers that are not fresh allocations (those are
        # 16-byte aligned); every other argument is decided by the pass.
        index, x_align = dev.index, x.data_ptr() % 16
        amax = codes  # read only by the tensor-wide schemes, which zero it first (no memset per call otherwise)
        if self.absmax:
            amax = torch.zeros(1, dtype=torch.int32, device=dev)
            args = (x, amax, m, k, x.stride(0), 32, 128)
            self.absmax_kernel.launch((index, x_align), self.absmax_grid, args, 4, index)
        args = (
            x,
            codes,
            scales,
            amax,
            gscale if gscale is not None else amax,
            perm if perm is not None else amax,
            m,
            k,
            x.stride(0),
            k,
            *self.scale_strides,
            *self.constexprs.values(),
        )
        perm_align = 0 if perm is None else perm.data_ptr() % 16
        key = (index, x_align, scales.data_ptr() % 16, perm_align)
        self.kernel.launch(key, self.grid, args, self.num_warps, index)
        return codes, scales, gscale
