"""Token rows copied into grouped order in one pass: :func:`humming.reference.moe_layer.gather_rows` (row ``r``
is ``x[rows[r]]``, zeros for a padding row, ``rows[r] == -1``) bit for bit, for the grouped GEMMs that read
grouped rows (a TMA-fed kernel, the FP8 GEMM). The torch definition indexes, then selects zeros for the
padding: two passes over ``[M_pad, K]`` and a temporary; this kernel reads each used row once and writes
every row once.

Any 2-D tensor with unit column stride is copied as it is (bf16 / fp16 / fp32 tokens, uint8 codes, float32
or 8-bit scales), so a :class:`~humming.ir.activation.QuantizedActivation` gathers its codes and per-row
scales through it too."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ir.activation import QuantizedActivation
from . import registry
from ._launch import CompiledLaunches

__all__ = ["gather_rows", "tile"]


@triton.jit
def _gather_rows_kernel(
    x_ptr,
    rows_ptr,
    out_ptr,
    M_PAD,
    K,
    stride_xm,
    stride_om,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[r, :] = x[rows[r], :] (zeros where rows[r] < 0) for BLOCK_R grouped rows and BLOCK_K columns.
    Grid: (cdiv(M_PAD, BLOCK_R), cdiv(K, BLOCK_K))."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    src = tl.load(rows_ptr + r, mask=r < M_PAD, other=-1)
    col_ok = cols[None, :] < K
    # int64 offsets: M_PAD * K may exceed 2^31 elements
    values = tl.load(
        x_ptr + src.to(tl.int64)[:, None] * stride_xm + cols[None, :], mask=(src >= 0)[:, None] & col_ok, other=0
    )
    tl.store(out_ptr + r.to(tl.int64)[:, None] * stride_om + cols[None, :], values, mask=(r < M_PAD)[:, None] & col_ok)


def tile(k: int, element_size: int) -> tuple[int, int, int]:
    """(rows per program, columns per program, warps): up to 4 KiB of a row per program, 8 rows."""
    block_k = min(triton.next_power_of_2(k), max(16, 4096 // element_size))
    return 8, block_k, 4 if block_k * element_size >= 2048 else 2


_launches = CompiledLaunches(_gather_rows_kernel)


def _gather_2d(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    m_pad, (t, k) = rows.shape[0], x.shape
    out = torch.empty((m_pad, k), dtype=x.dtype, device=x.device)
    if m_pad == 0 or k == 0:
        return out
    if t == 0:
        return out.zero_()
    if x.stride(-1) != 1:
        x = x.contiguous()
    block_r, block_k, warps = tile(k, x.element_size())
    grid = (triton.cdiv(m_pad, block_r), triton.cdiv(k, block_k), 1)
    index = x.device.index
    # what Triton specializes on: dtypes, pointer alignment, integers equal to 1 or multiples of 16
    ints = tuple((v == 1, v % 16 == 0) for v in (m_pad, k, x.stride(0)))
    key = (index, x.dtype, rows.dtype, x.data_ptr() % 16, rows.data_ptr() % 16, ints)
    args = (x, rows, out, m_pad, k, x.stride(0), k, block_r, block_k)
    _launches.launch(key, grid, args, warps, index)
    return out


def gather_rows(x, rows: torch.Tensor):
    """:func:`humming.reference.moe_layer.gather_rows` in one kernel per tensor: ``x`` float ``[T, K]`` or a
    :class:`QuantizedActivation` of ``T`` rows (codes and per-row scales gathered, zero bytes for padding;
    per-tensor and global scales kept), ``rows`` int32 ``[M_pad]`` in ``[-1, T)`` (checked by the caller),
    on ``x``'s CUDA device (or the interpreter)."""
    if not isinstance(x, QuantizedActivation):
        return _gather_2d(x, rows)
    byte_view = lambda t: _gather_2d(t.view(torch.uint8), rows).view(t.dtype)  # 8-bit float scales too
    scales = x.scales
    if x.scheme.group_shape[0] == 1 and scales.shape[0] == x.codes.shape[0]:  # a scale row per token
        scales = byte_view(scales.contiguous()) if scales.element_size() == 1 else _gather_2d(scales, rows)
    return QuantizedActivation(x.scheme, byte_view(x.codes), scales, x.global_scale)


def _compile_specs() -> list[registry.CompileSpec]:
    """bf16 tokens (K = 7168) and uint8 codes."""
    specs = []
    for dtype, size in (("bf16", 2), ("u8", 1)):
        block_r, block_k, warps = tile(7168, size)
        specs.append(
            registry.CompileSpec(
                name=f"gather_rows-{dtype}",
                kernel=_gather_rows_kernel,
                pointers={"x_ptr": f"*{dtype}", "rows_ptr": "*i32", "out_ptr": f"*{dtype}"},
                constexprs={"BLOCK_R": block_r, "BLOCK_K": block_k},
                num_warps=warps,
                aligned=("K", "stride_xm", "stride_om"),
            )
        )
    return specs


registry.register("gather_rows", _compile_specs)
