"""The one place that knows about Triton's CPU interpreter (``TRITON_INTERPRET=1``) and its gaps.

CI has no GPU, so every Triton kernel of humming also runs under the interpreter (tests/conftest.py sets
``TRITON_INTERPRET=1`` before any kernel is decorated). Triton 3.6's interpreter has six gaps that the
kernels work around here, and only here:

- ``tl.dot`` on bfloat16 operands returns garbage: the interpreter stores bf16 as uint16 and multiplies
  the raw bit patterns. :func:`dot` therefore upcasts both operands to float32 when interpreting. The
  products of bf16/fp16 values are exact in fp32, so the only difference from the GPU is the order of
  the fp32 accumulation: results agree with the GPU's to a relative error of ~1e-6 of the dot's size,
  far inside the tests' tolerances (stated in each test module). The interpreter's ``tl.dot`` is numpy's
  matmul, whose summation order for a row depends on where the row sits in the tile, so :func:`dot` and
  :func:`fp8_dot` multiply in float64 (:func:`_row_dot`): the products are exact, and fp64 sums in any
  order round to the same fp32 unless they straddle an fp32 rounding boundary (far rarer than the tests'
  inputs can hit), so a row's result does not depend on the rows around it, as on the GPU (batch
  invariance).
- fp32 -> bf16 casts truncate instead of rounding to nearest even (and mishandle fp32 subnormals).
  :func:`cast` rounds the fp32 bit pattern to nearest even itself when interpreting.
- fp8 (``float8e4nv``) operands of ``tl.dot`` are decoded without NaN: code 0x7F reads as 480.
  :func:`fp8_dot` decodes them to float32 with their NaN codes when interpreting (exact: every e4m3 product
  and the fp32 sums are as before).
- ``tl.fma`` rounds the product before the addition (triton 3.6; later interpreters round once), so a
  residual ``c - a * b`` of an exact product comes out zero. :func:`fma` computes in float64 when
  interpreting: the fp32 product is exact there and the sum rounds once in fp64 before fp32, so its sign
  is always the exact one, and its value differs from the GPU's only where those two roundings meet a tie.
- ``tl.sort`` runs its bitonic network's combine functions element by element: seconds per thousand keys.
  :func:`sort_distinct` ranks up to 1024 keys instead when interpreting (each key's place: the keys below
  it; a ``[keys, keys]`` comparison, within Triton's largest tensor).
- ``tl.dot_scaled`` does not run at all. Kernels that use it on GPUs that have it keep an upcasting path
  (``dot`` on dequantized operands) that the interpreter runs instead; :data:`INTERPRET` selects it.

Under the interpreter ``triton.jit`` returns interpreted functions that cannot be compiled ahead of time;
the compile check (tests/test_compile_triton.py) runs in a subprocess with ``TRITON_INTERPRET`` unset.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._env import env

__all__ = ["INTERPRET", "INTERPRETED", "and_or", "cast", "dot", "fma", "fp8_dot", "sort_distinct"]

#: True when kernels run under Triton's CPU interpreter (read once, at import, as Triton itself does).
INTERPRET = env("TRITON_INTERPRET")
#: :data:`INTERPRET` for kernels: a helper whose inline assembly the interpreter cannot run branches on it to
#: plain operators computing the same bits (:func:`and_or`, ``_weight_tile.e2m1_fields``).
INTERPRETED = tl.constexpr(INTERPRET)


@triton.jit
def _row_dot(a, b, acc):
    """``acc + a @ b`` for fp32 ``a`` [M, K] and ``b`` [K, N] under the interpreter: the products (exact in
    fp64) summed in fp64 and rounded to fp32 once, so a row's result does not depend on the order numpy's
    matmul picks for it by its place in the tile."""
    return acc + tl.dot(a.to(tl.float64), b.to(tl.float64)).to(tl.float32)


@triton.jit
def and_or(x, mask, bits: tl.constexpr):
    """``(x & mask) | bits`` on int32 tensors, one ``lop3`` per element on the GPU: written as an AND and an
    OR, ptxas keeps both constants as immediates and so emits two instructions (a ``LOP3`` encodes one
    immediate); passed to inline PTX, the mask rides in a register. Plain operators under the interpreter,
    which runs no inline assembly."""
    if INTERPRETED:
        out = (x & mask) | bits
    else:
        out = tl.inline_asm_elementwise(
            f"lop3.b32 $0, $1, $2, {bits}, 0xEA;", "=r,r,r", [x, mask], dtype=tl.int32, is_pure=True, pack=1
        )
    return out


@triton.jit
def dot(a, b, acc):
    """``acc + a @ b`` with fp32 accumulation; operands upcast to fp32 under the interpreter only."""
    if INTERPRETED:
        return _row_dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def fp8_dot(a, b, acc, max_num_imprecise_acc: tl.constexpr):
    """``acc + a @ b`` of float8e4nv operands, fp32 accumulation (promoted every ``max_num_imprecise_acc``
    along K); NaN codes (0x7F / 0xFF) make their outputs NaN also under the interpreter (module doc)."""
    if INTERPRETED:
        a_bits = a.to(tl.uint8, bitcast=True)
        b_bits = b.to(tl.uint8, bitcast=True)
        a32 = tl.where((a_bits & 0x7F) == 0x7F, float("nan"), a.to(tl.float32))
        b32 = tl.where((b_bits & 0x7F) == 0x7F, float("nan"), b.to(tl.float32))
        return _row_dot(a32, b32, acc)
    return tl.dot(a, b, acc, max_num_imprecise_acc=max_num_imprecise_acc)


@triton.jit
def fma(a, b, c):
    """``a * b + c`` of fp32 values, rounded once on the GPU; under the interpreter exact in sign (module doc)."""
    if INTERPRETED:
        return (a.to(tl.float64) * b.to(tl.float64) + c.to(tl.float64)).to(tl.float32)
    return tl.fma(a, b, c)


@triton.jit
def cast(x, dtype: tl.constexpr):
    """fp32 ``x`` -> ``dtype``, rounded to nearest even (also under the interpreter, see the module doc)."""
    if INTERPRETED and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(x != x, 0x7FC0, rounded)  # NaN: the canonical quiet NaN, as torch
        return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return x.to(dtype)


@triton.jit
def sort_distinct(x, BLOCK: tl.constexpr):
    """``tl.sort`` of ``BLOCK`` distinct keys; under the interpreter by ranking (see the module doc), which
    gives the same order as the keys are distinct."""
    if INTERPRETED and BLOCK <= 1024:
        place = tl.sum((x[None, :] < x[:, None]).to(tl.int32), axis=1)
        return tl.sum(tl.where(place[None, :] == tl.arange(0, BLOCK)[:, None], x[None, :], 0), axis=1)
    return tl.sort(x)
