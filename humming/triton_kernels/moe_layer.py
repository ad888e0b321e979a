"""The steps of :func:`humming.moe.fused_moe` around its two grouped GEMMs, in Triton: the Triton twins of
:mod:`humming.reference.moe_layer` (the definitions, in torch).

- :func:`activate`: the ``w13`` output ``h [M_pad, 2I]`` -> the ``w2`` input ``[M_pad, I]``, one pass. Each
  element is activated in float32 and rounded to ``h``'s dtype, as the reference does; with ``act`` (a
  per-token or per-group scheme: fp8, fp8_g128, int8, int4, mxfp4...) the pass also quantizes that rounded
  value for ``w2`` and writes codes and scales instead (:class:`~humming.QuantizedActivation`), with
  :mod:`.act_quant`'s arithmetic: bit-exact with :func:`humming.quantize_activation` of the rounded
  activations, so the down projection needs no quantization pass of its own. Per-token scales read the
  row twice (absmax, then codes), recomputing the activation rather than storing it; groups along K hold
  their span in one tile. Rows from ``num_rows`` on (the routing blocks of expert -1, which the grouped
  GEMMs skip) are neither read nor written.
- :func:`combine`: ``out[t] = sum_j w[t, j] * y[slot_rows[t * topk + j]]``, one program per token and
  column tile, accumulating in float32 over ``j`` in order (deterministic, no atomics), rounded once; slots
  without a row are skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ir.activation import ActScheme, QuantizedActivation, get_act_scheme
from ..ir.dtypes import FLOAT_DTYPES
from ..ir.formats import get_format
from ..reference.moe_layer import ACTIVATIONS, Activation
from . import registry
from ._act_quant_kernel import finite_absmax, quantize_chunk, span_scale
from ._launch import CompiledLaunches
from .act_quant import element_spec, per_token_tile, scale_kind, scheme_unsupported
from .interpreter import cast

__all__ = ["PreparedActivate", "PreparedCombine", "act_unsupported", "activate", "combine"]


@triton.jit
def _load_gate_up(h_ptr, rows64, cols, mask, stride_hm, inter, INTERLEAVED: tl.constexpr):
    """float32 ``(gate, up)`` [BM, BK] of columns ``cols`` of the activation (masked elements 0)."""
    base = h_ptr + rows64[:, None] * stride_hm
    if INTERLEAVED:  # gate rows even, up rows odd
        gate_cols = 2 * cols
        up_cols = 2 * cols + 1
    else:  # gate rows [0, I), up rows [I, 2I)
        gate_cols = cols
        up_cols = cols + inter
    gate = tl.load(base + gate_cols[None, :], mask=mask, other=0.0).to(tl.float32)
    up = tl.load(base + up_cols[None, :], mask=mask, other=0.0).to(tl.float32)
    return gate, up


@triton.jit
def _act(gate, up, ACTIVATION: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr):
    """The activation of float32 ``gate`` and ``up`` (humming.reference.moe_layer.activate's formulas)."""
    if ACTIVATION == "silu":
        out = gate / (1.0 + tl.exp(-gate)) * up
    elif ACTIVATION == "gelu":
        out = 0.5 * gate * (1.0 + tl.math.erf(gate * 0.7071067811865476)) * up
    elif ACTIVATION == "gelu_tanh":
        # 0.5 * x * (1 + tanh(y)) = x * sigmoid(2y), y = sqrt(2 / pi) * (x + 0.044715 x^3)
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        out = gate / (1.0 + tl.exp(-2.0 * inner)) * up
    else:  # swiglu_oai; NaN kept (a plain min / max on the GPU would return the bound)
        g = tl.minimum(gate, LIMIT, propagate_nan=tl.PropagateNan.ALL)
        u = tl.minimum(
            tl.maximum(up, -LIMIT, propagate_nan=tl.PropagateNan.ALL), LIMIT, propagate_nan=tl.PropagateNan.ALL
        )
        out = g * tl.sigmoid(ALPHA * g) * (u + 1.0)
    return out


@triton.jit
def _rounded_act(h_ptr, rows64, cols, mask, stride_hm, inter, ACTIVATION, ALPHA, LIMIT, INTERLEAVED):
    """The activation rounded to ``h``'s dtype, as float32 (masked elements 0)."""
    gate, up = _load_gate_up(h_ptr, rows64, cols, mask, stride_hm, inter, INTERLEAVED)
    v = cast(_act(gate, up, ACTIVATION, ALPHA, LIMIT), h_ptr.dtype.element_ty).to(tl.float32)
    return tl.where(mask, v, 0.0)


@triton.jit
def _moe_act_kernel(
    h_ptr,
    out_ptr,
    scales_ptr,
    num_rows_ptr,
    M,
    inter,
    stride_hm,
    stride_om,
    stride_sm,
    ACTIVATION: tl.constexpr,
    ALPHA: tl.constexpr,
    LIMIT: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    QUANT: tl.constexpr,  # False: out_ptr gets the activations; True: codes, and scales_ptr their scales
    ELEMENT: tl.constexpr,  # the element format's ElementSpec (_act_quant_pass)
    SCALE: tl.constexpr,  # "fp32" or "e8m0"
    GROUP_K: tl.constexpr,  # span of one scale along I; 0 = the whole row
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """h [M, 2I] -> out [M, I] (activations in h's dtype, or uint8 codes with scales [M, spans] at
    ``r * stride_sm + span``). Grid: (cdiv(M, BLOCK_M), column tiles, or spans when quantizing)."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_rows = tl.minimum(tl.load(num_rows_ptr), M)
    if pid_m * BLOCK_M >= num_rows:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows64 = rows.to(tl.int64)  # M * 2I may exceed 2^31 elements
    row_mask = rows < num_rows
    if not QUANT:
        cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = row_mask[:, None] & (cols[None, :] < inter)
        v = _rounded_act(h_ptr, rows64, cols, mask, stride_hm, inter, ACTIVATION, ALPHA, LIMIT, INTERLEAVED)
        tl.store(out_ptr + rows64[:, None] * stride_om + cols[None, :], v.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        if GROUP_K == 0:
            k_lo = 0
            k_hi = inter
        else:
            k_lo = pid_k * GROUP_K
            k_hi = tl.minimum(k_lo + GROUP_K, inter)
        # The absmax of each span ignores NaN / Inf, which give the span a NaN scale instead (act_quant's rule:
        # every GEMM epilogue then makes the output row NaN).
        amax = tl.zeros([BLOCK_M], dtype=tl.float32)
        non_finite = tl.zeros([BLOCK_M], dtype=tl.int1)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            mask = row_mask[:, None] & (cols[None, :] < k_hi)
            v = _rounded_act(h_ptr, rows64, cols, mask, stride_hm, inter, ACTIVATION, ALPHA, LIMIT, INTERLEAVED)
            chunk_amax, chunk_non_finite = finite_absmax(v, 1)
            non_finite = non_finite | chunk_non_finite
            amax = tl.maximum(amax, chunk_amax)
        s, e8m0_exp = span_scale(amax, ELEMENT, SCALE)
        scale_at = scales_ptr + rows64 * stride_sm + pid_k
        if SCALE == "e8m0":  # 255: the e8m0 NaN
            tl.store(scale_at, tl.where(non_finite, 255, e8m0_exp + 127).to(tl.uint8), mask=row_mask)
        else:
            tl.store(scale_at, tl.where(non_finite, float("nan"), s), mask=row_mask)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            mask = row_mask[:, None] & (cols[None, :] < k_hi)
            v = _rounded_act(h_ptr, rows64, cols, mask, stride_hm, inter, ACTIVATION, ALPHA, LIMIT, INTERLEAVED)
            code = quantize_chunk(v, s[:, None], e8m0_exp[:, None], ELEMENT, SCALE)
            tl.store(out_ptr + rows64[:, None] * stride_om + cols[None, :], code.to(tl.uint8), mask=mask)


@triton.jit
def _combine_kernel(
    y_ptr,
    slot_rows_ptr,
    weights_ptr,
    out_ptr,
    H,
    stride_ym,
    stride_wt,
    stride_wj,
    stride_ot,
    num_experts,
    TOPK: tl.constexpr,
    BLOCK_H: tl.constexpr,
    SLOT_BLOCK: tl.constexpr,
):
    """out [T, H] = sum_j weights[t, j] * y[slot_rows[t * TOPK + j]] over slots with a row (>= 0).
    ``SLOT_BLOCK`` > 0 (slot-major rows, :func:`humming.moe.fused` at one token): ``slot_rows_ptr`` holds
    the slots' expert ids instead, and slot ``s`` has row ``s * SLOT_BLOCK`` where its id is in
    ``[0, num_experts)``. Grid: (T, cdiv(H, BLOCK_H))."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_mask = cols < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        row = tl.load(slot_rows_ptr + t * TOPK + j)
        if SLOT_BLOCK > 0:
            row = tl.where((row >= 0) & (row < num_experts), (t * TOPK + j) * SLOT_BLOCK, -1)
        if row >= 0:
            w = tl.load(weights_ptr + t * stride_wt + j * stride_wj).to(tl.float32)
            y = tl.load(y_ptr + row.to(tl.int64) * stride_ym + cols, mask=col_mask, other=0.0).to(tl.float32)
            acc += w * y
    tl.store(out_ptr + t * stride_ot + cols, cast(acc, out_ptr.dtype.element_ty), mask=col_mask)


def act_unsupported(act: str | ActScheme) -> str | None:
    """``None`` when :func:`activate` quantizes for scheme ``act``, else why not: it computes each span's
    scale from that span alone (per-token or per-group float32 or e8m0 scales), not a tensor-wide one."""
    scheme = get_act_scheme(act)
    if scheme.group_shape[0] != 1 or scale_kind(scheme) not in ("fp32", "e8m0"):
        return f"act {scheme.name}: the MoE activation pass quantizes with per-token or per-group scales only"
    return scheme_unsupported(scheme)


#: The quantization constexprs of a pass that does not quantize (the format's are then not read).
_NO_QUANT = {"QUANT": False, "ELEMENT": element_spec(get_format("e4m3")), "SCALE": "fp32", "GROUP_K": 0}


def _quant_constexprs(scheme: ActScheme) -> dict[str, object]:
    """The quantization constexprs of ``scheme`` by name, in the kernel's order (the launch passes them
    positionally)."""
    group_k = 0 if scheme.group_shape[1] == -1 else scheme.group_shape[1]
    return {
        "QUANT": True,
        "ELEMENT": element_spec(scheme.element_format),
        "SCALE": scale_kind(scheme),
        "GROUP_K": group_k,
    }


def _check(name: str, t, dtypes) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.dtype not in dtypes or (t.shape[1] and t.stride(1) != 1):
        got = f"{t.dtype} {tuple(t.shape)} strides {t.stride()}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: expected a 2-D float16 / bfloat16 / float32 tensor with contiguous rows, got {got}")


_ACT_LAUNCHES = CompiledLaunches(_moe_act_kernel)
_COMBINE_LAUNCHES = CompiledLaunches(_combine_kernel)


def _launch(launches: CompiledLaunches, grid, args: tuple, num_warps: int, device: torch.device, key=None) -> None:
    """Launch with every argument and the 16-byte alignment of every pointer as the key (``key``: that key,
    made by the caller); refused during a CUDA graph capture when that key was never launched (Triton would
    compile inside the capture)."""
    if key is None:
        key = (device, *(a.dtype if isinstance(a, torch.Tensor) else a for a in args))
        key += tuple(a.data_ptr() % 16 for a in args if isinstance(a, torch.Tensor))
    if device.type == "cuda" and not launches.kept(key, args, num_warps) and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "humming.moe.fused_moe: a CUDA graph is being captured, but this call's activation or combine "
            "kernel never ran at these shapes; run the call once before capturing"
        )
    launches.launch(key, grid, args, num_warps, device.index or 0)


def activate(
    h: torch.Tensor,
    activation: Activation,
    act: str | ActScheme | None = None,
    num_rows: torch.Tensor | None = None,
) -> torch.Tensor | QuantizedActivation:
    """``h [M, 2I]`` (fp16 / bf16 / fp32, rows contiguous) activated -> ``[M, I]`` in ``h``'s dtype, or with
    ``act`` a :class:`QuantizedActivation` of those values (:func:`act_unsupported` says which schemes).
    ``num_rows``: an int32 0-d tensor on ``h``'s device; rows from it on are left unwritten."""
    prepared = PreparedActivate(h, activation, act)  # checks h
    if num_rows is None:
        num_rows = torch.full((), h.shape[0], dtype=torch.int32, device=h.device)
    return prepared(h, num_rows)


class PreparedActivate:
    """:func:`activate` made ready (checked, its tiles, grid and launch arguments but the tensors worked out)
    for every call whose ``h`` has this one's dtype, shape and strides, on its device."""

    def __init__(self, h: torch.Tensor, activation: Activation, act: str | ActScheme | None = None) -> None:
        _check("h", h, FLOAT_DTYPES)
        if not isinstance(activation, Activation):
            raise ValueError(f"activation: expected a checked Activation, got {activation!r}")
        m, two_i = h.shape
        if two_i % 2:
            raise ValueError(f"h: expected [M, 2I] (gate and up columns), got an odd width {two_i}")
        inter = two_i // 2
        scheme = None if act is None else get_act_scheme(act)
        if scheme is None:
            quant, spans, fp32 = _NO_QUANT, 0, True
            block_k = min(triton.next_power_of_2(inter), 1024)
            block_m, num_warps = max(1, min(triton.next_power_of_2(m), 4096 // block_k)), 4
            grid = (triton.cdiv(m, block_m), triton.cdiv(inter, block_k), 1)
        else:
            reason = act_unsupported(scheme)
            if reason:
                raise ValueError(reason)
            quant = _quant_constexprs(scheme)
            group_k = quant["GROUP_K"]
            spans = 1 if group_k == 0 else triton.cdiv(inter, group_k)
            if group_k:
                block_k, block_m, num_warps = group_k, max(1, min(triton.next_power_of_2(m), 4096 // group_k, 64)), 4
            else:
                block_k, block_m, num_warps = per_token_tile(m, inter)
            fp32 = scale_kind(scheme) == "fp32"
            grid = (triton.cdiv(m, block_m), spans, 1)
        a = activation
        self.scheme, self.fp32, self.spans = scheme, fp32, spans
        self.shape, self.dtype, self.device = (m, inter), h.dtype, h.device
        self.grid, self.num_warps = grid, num_warps
        # the arguments after the four tensors (the output strides are those of fresh contiguous buffers; the
        # scales' is not read without quantization)
        self.values = (
            m,
            inter,
            h.stride(0),
            inter,
            spans if scheme else inter,
            *(a.name, a.alpha or 0.0, a.limit or 0.0, a.gate_up_layout == "interleaved"),
            *quant.values(),
            block_m,
            block_k,
        )
        out_dtype = h.dtype if scheme is None else torch.uint8
        scales_dtype = torch.float32 if fp32 else torch.uint8
        self.key = (h.device, h.dtype, out_dtype, scales_dtype if scheme else out_dtype, torch.int32, *self.values)
        self.launches = bool(m and inter)

    def _buffers(self) -> tuple:
        """``(result, out, scales)``: a new output of these calls (unwritten), and the two buffers the kernel
        writes (the scales as it writes them: float32, or the bytes of 8-bit scales; ``out`` itself, not read,
        without quantization)."""
        if self.scheme is None:
            out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            return out, out, out
        out = torch.empty(self.shape, dtype=torch.uint8, device=self.device)
        scales_dtype = torch.float32 if self.fp32 else torch.uint8
        scales = torch.empty(self.shape[0], self.spans, dtype=scales_dtype, device=self.device)
        typed = scales if self.fp32 else scales.view(self.scheme.scale_dtype)
        return QuantizedActivation.from_kernel(self.scheme, out, typed), out, scales

    def empty(self) -> torch.Tensor | QuantizedActivation:
        """A new output buffer of these calls (unwritten)."""
        return self._buffers()[0]

    def __call__(self, h: torch.Tensor, num_rows: torch.Tensor) -> torch.Tensor | QuantizedActivation:
        result, out, scales = self._buffers()
        if self.launches:
            tensors = (h, out, scales, num_rows)
            key = self.key + tuple(t.data_ptr() % 16 for t in tensors)
            _launch(_ACT_LAUNCHES, self.grid, (*tensors, *self.values), self.num_warps, self.device, key)
        return result


def combine(y: torch.Tensor, slot_rows: torch.Tensor, topk_weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """:func:`humming.reference.moe_layer.combine` in one kernel: ``y [M_pad, H]`` (rows contiguous), ``slot_rows``
    int32 ``[T * topk]``, float ``topk_weights [T, topk]`` -> ``[T, H]`` in ``dtype``."""
    return PreparedCombine(y, slot_rows, topk_weights, dtype)(y, slot_rows, topk_weights)


class PreparedCombine:
    """:func:`combine` made ready (checked, its launch arguments but the tensors packed) for every call whose
    ``y``, ``slot_rows`` and ``topk_weights`` have these ones' dtypes, shapes and strides, on their device.
    ``slot_block`` > 0: slot-major rows, ``slot_rows`` the slots' int32 expert ids (``_combine_kernel``'s
    ``SLOT_BLOCK``; ids outside ``[0, num_experts)`` add nothing)."""

    def __init__(
        self,
        y: torch.Tensor,
        slot_rows: torch.Tensor,
        topk_weights: torch.Tensor,
        dtype,
        slot_block: int = 0,
        num_experts: int = 0,
    ) -> None:
        _check("y", y, FLOAT_DTYPES)
        t, topk = topk_weights.shape
        h = y.shape[1]
        if slot_rows.dtype != torch.int32 or tuple(slot_rows.shape) != (t * topk,):
            raise ValueError(f"slot_rows: expected int32 [{t * topk}], got {slot_rows.dtype} {tuple(slot_rows.shape)}")
        self.shape, self.dtype, self.device = (t, h), dtype, y.device
        self.contiguous = slot_rows.is_contiguous()
        block_h = min(triton.next_power_of_2(h), 1024)
        self.grid = (t, triton.cdiv(h, block_h), 1)
        # the arguments after the four tensors, and their part of _launch's key
        self.values = (h, y.stride(0), *topk_weights.stride(), h, num_experts, topk, block_h, slot_block)
        self.key = (y.device, y.dtype, torch.int32, topk_weights.dtype, dtype, *self.values)
        self.launches = bool(t and h)

    def __call__(self, y: torch.Tensor, slot_rows: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        if self.launches:
            if not self.contiguous:
                slot_rows = slot_rows.contiguous()
            tensors = (y, slot_rows, topk_weights, out)
            key = self.key + tuple(a.data_ptr() % 16 for a in tensors)
            _launch(_COMBINE_LAUNCHES, self.grid, (*tensors, *self.values), 4, self.device, key)
        return out


def _compile_specs() -> list[registry.CompileSpec]:
    """Each activation from bf16 (concat, and gpt-oss's interleaved swiglu_oai), quantized per token (fp8,
    int8) and per group (fp8_g128, mxfp4) with the launch's tiles, and the combine."""
    cases = [(a, False, None) for a in ACTIVATIONS] + [
        ("swiglu_oai", True, None),
        ("silu", False, "fp8"),
        ("swiglu_oai", True, "int8"),
        ("silu", False, "fp8_g128"),
        ("swiglu_oai", True, "mxfp4"),
    ]
    specs = []
    for activation, interleaved, act in cases:
        quant = _NO_QUANT if act is None else _quant_constexprs(get_act_scheme(act))
        group_k = quant["GROUP_K"]
        block_m, block_k = (4096 // group_k, group_k) if group_k else (4, 1024)
        swiglu = activation == "swiglu_oai"
        specs.append(
            registry.CompileSpec(
                name=f"moe_act-{activation}-{'interleaved' if interleaved else 'concat'}-bf16-{act or 'bf16'}",
                kernel=_moe_act_kernel,
                pointers={
                    "h_ptr": "*bf16",
                    "out_ptr": "*bf16" if act is None else "*u8",
                    "scales_ptr": "*fp32" if act is not None and quant["SCALE"] == "fp32" else "*u8",
                    "num_rows_ptr": "*i32",
                },
                constexprs={
                    "ACTIVATION": activation,
                    "ALPHA": 1.702 if swiglu else 0.0,
                    "LIMIT": 7.0 if swiglu else 0.0,
                    "INTERLEAVED": interleaved,
                    **quant,
                    "BLOCK_M": block_m,
                    "BLOCK_K": block_k,
                },
                aligned=("stride_hm", "stride_om"),
            )
        )
    for slot_block in (0, 8):  # rows by slot_rows, and slot-major rows (one token)
        specs.append(
            registry.CompileSpec(
                name=f"moe_combine-bf16-slots{slot_block}",
                kernel=_combine_kernel,
                pointers={"y_ptr": "*bf16", "slot_rows_ptr": "*i32", "weights_ptr": "*fp32", "out_ptr": "*bf16"},
                constexprs={"TOPK": 8, "BLOCK_H": 1024, "SLOT_BLOCK": slot_block},
                aligned=("stride_ym", "stride_ot"),
            )
        )
    return specs


registry.register("moe_layer", _compile_specs)
