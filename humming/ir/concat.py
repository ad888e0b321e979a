"""Join quantized weights: ``concat`` along N (fused q/k/v, gate/up), ``stack`` experts into ``[E, N, K]``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._checks import as_index
from .packing import msb_mask
from .weight import QuantizedWeight, cdiv

__all__ = ["concat", "stack"]


def _unify_format(parts: Sequence[QuantizedWeight]) -> list[QuantizedWeight]:
    """Same format for all parts: ``intN`` parts become ``uintN`` + zeros when others are ``uintN`` (zero points
    need scales: without them an ``intN`` part cannot join a ``uintN`` one)."""
    names = {p.format.name for p in parts}
    devices = {str(p.device) for p in parts}
    if len(devices) > 1:
        raise ValueError(f"cannot join weights on different devices {sorted(devices)}")
    if len(names) == 1:
        return list(parts)
    bits = {p.format.bits for p in parts}
    if len(bits) == 1 and all(p.format.is_int for p in parts):
        unified = [to_unsigned(p) for p in parts]
        if len({p.format.name for p in unified}) == 1:
            return unified
        raise ValueError(
            f"cannot join weights of formats {sorted(names)} without scales: an int part joins uint ones as uint "
            "codes with zero points, which need scales"
        )
    raise ValueError(f"cannot join weights of formats {sorted(names)}")


def _same(values, what: str) -> None:
    if len({v is None for v in values}) > 1:
        raise ValueError(f"cannot join weights where only some have {what}")


def _common_dtype(tensors: list[torch.Tensor]) -> torch.dtype:
    """One dtype holding every part's values exactly: float32 when any is floating (every scale dtype, and the
    integer zero points of uintN formats, convert to it exactly), else the narrowest integer type that holds
    them all."""
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) == 1:
        return dtypes.pop()
    if any(t.is_floating_point() for t in tensors):
        return torch.float32
    return torch.int16 if all(d in (torch.uint8, torch.int8, torch.int16) for d in dtypes) else torch.int32


def _bias(parts: Sequence[QuantizedWeight]) -> list[torch.Tensor] | None:
    """Each part's bias, zeros where a part has none; ``None`` if no part has one."""
    if all(p.bias is None for p in parts):
        return None
    dtype = next(p.bias.dtype for p in parts if p.bias is not None)
    return [p.bias if p.bias is not None else torch.zeros(*p.lead, p.N, dtype=dtype, device=p.device) for p in parts]


def stack(parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
    """2-D weights ``[N, K]`` of the same shape and layout -> one ``[E, N, K]`` weight (expert ``e`` = ``parts[e]``).

    Formats are unified exactly (``intN`` + ``uintN`` -> ``uintN`` with zeros), scale dtypes widened to fp32
    when they differ (exact), per-expert global scales become ``[E]``, a missing bias is zero, and a
    missing ``g_idx`` becomes ``arange(K) // group`` when other experts use act-order.
    """
    _check_parts("stack", parts)
    try:
        return _stack(list(parts))
    except ValueError as err:
        raise ValueError(f"parts: {err}") from None


def _check_parts(fn: str, parts) -> None:
    if isinstance(parts, QuantizedWeight) or not isinstance(parts, (list, tuple)):
        raise TypeError(f"parts: {fn} takes a list of QuantizedWeight, got {type(parts).__name__}")
    if not parts:
        raise ValueError(f"parts: {fn} needs at least one weight, got an empty list")
    for i, p in enumerate(parts):
        if not isinstance(p, QuantizedWeight):
            raise TypeError(f"parts[{i}]: expected a QuantizedWeight, got {type(p).__name__}")


def _stack(parts: list[QuantizedWeight]) -> QuantizedWeight:
    parts = _unify_format(parts)
    first = parts[0]
    for i, p in enumerate(parts):
        if len(p.shape) != 2 or p.shape != first.shape or p.group_shape != first.group_shape:
            raise ValueError(
                f"stack: expert {i} has shape {p.shape} / group {p.group_shape}, expert 0 has "
                f"{first.shape} / {first.group_shape}; experts must match and be 2-D"
            )
    for field in ("scales", "zeros", "global_scale"):
        _same([getattr(p, field) for p in parts], field)

    def stacked(field: str) -> torch.Tensor | None:
        tensors = [getattr(p, field) for p in parts]
        if tensors[0] is None:
            return None
        dtype = _common_dtype(tensors)
        return torch.stack([t.to(dtype) for t in tensors])

    g_idx = None
    if any(p.g_idx is not None for p in parts):
        group = first.group_size
        trivial = torch.arange(first.K, dtype=torch.int32, device=first.device) // group
        g_idx = torch.stack([p.g_idx if p.g_idx is not None else trivial for p in parts])
    bias = _bias(parts)
    return QuantizedWeight(
        shape=(len(parts), *first.shape),
        format=first.format,
        qweight=torch.stack([p.qweight for p in parts]),
        scales=stacked("scales"),
        group_shape=first.group_shape,
        zeros=stacked("zeros"),
        global_scale=stacked("global_scale"),
        g_idx=g_idx,
        bias=torch.stack(bias) if bias is not None else None,
    )


def _target_groups(parts: Sequence[QuantizedWeight]) -> tuple[int, int]:
    """The finest common ``(bn, bk)``; ``-1`` along N only when every part shares one scale row."""

    def explicit(values, what):
        found = set(values) - {-1}
        if len(found) > 1:
            raise ValueError(f"concat: parts have different {what} {sorted(found)}")
        return found.pop() if found else -1

    bk = explicit([p.group_shape[1] for p in parts], "group sizes along K")
    bn = explicit([p.group_shape[0] for p in parts], "block heights along N")
    if bn == -1:
        first = parts[0]
        same = (
            all(
                torch.equal(p.scales, first.scales) and (p.zeros is None or torch.equal(p.zeros, first.zeros))
                for p in parts
            )
            if first.scales is not None and all(p.scales.shape == first.scales.shape for p in parts)
            else False
        )
        bn = -1 if same or first.scales is None else 1
    return bn, bk


def _regrid(t: torch.Tensor, p: QuantizedWeight, bn: int, bk: int) -> torch.Tensor:
    """A part's scales/zeros ``[*E, rows, cols]`` repeated onto the target grid (exact: values repeat)."""
    if p.group_shape[0] == -1 and bn != -1:
        t = t.repeat_interleave(cdiv(p.N, bn), dim=-2)
    if p.group_shape[1] == -1 and bk != -1 and p.g_idx is None:
        t = t.repeat_interleave(cdiv(p.K, bk), dim=-1)
    return t


def _fold_global(parts: list[QuantizedWeight]) -> list[QuantizedWeight]:
    """Keep one global scale when all parts share it; otherwise fold each into fp32 scales.

    ``fp32(scale) * global`` is the one fp32 rounding ``humming.dequantize`` performs, so folding is exact
    (the fused weight then carries fp32 scales).
    """
    gs = [p.global_scale for p in parts]
    _same(gs, "global_scale")
    if gs[0] is None or all(torch.equal(g, gs[0]) for g in gs):
        return parts
    out = []
    for p in parts:
        g = p.global_scale.reshape(*p.global_scale.shape, 1, 1)
        out.append(p.replace(scales=p.scales.to(torch.float32) * g, global_scale=None))
    return out


def concat(parts: Sequence[QuantizedWeight], dim: int = 0) -> QuantizedWeight:
    """Join weights along N (``dim`` = the N dimension: 0 for ``[N, K]``, 1 or -2 for ``[E, N, K]``).

    For fused projections (q/k/v, gate/up). Exact in every case it accepts: formats unify as in
    :func:`stack`; scale dtypes widen to fp32 when they differ; per-tensor or per-channel parts whose scales
    differ are re-expressed per channel / per group by repeating their scales; equal global scales are kept
    (ModelOpt exports fused projections with one shared ``weight_scale_2``) and different ones are folded
    into fp32 scales. Nothing is requantized. Raises ``ValueError`` when the parts cannot be joined exactly:
    different K, act-order ``g_idx`` that differ, or a 2-D block that would straddle two parts.
    """
    _check_parts("concat", parts)
    dim = as_index("dim", dim)
    try:
        return _concat(list(parts), dim)
    except ValueError as err:
        raise ValueError(f"parts: {err}") from None


def _concat(parts: list[QuantizedWeight], dim: int) -> QuantizedWeight:
    rank = len(parts[0].shape)
    if dim not in (rank - 2, -2):
        raise ValueError(
            f"concat: only the N dimension ({rank - 2} or -2) can be joined for {rank}-D weights, got {dim}"
        )
    parts = _fold_global(_unify_format(parts))
    first = parts[0]
    for i, p in enumerate(parts):
        if p.lead != first.lead or p.K != first.K:
            raise ValueError(f"concat: part {i} has shape {p.shape}, incompatible with part 0 {first.shape}")
    for field in ("scales", "zeros", "global_scale", "g_idx"):
        _same([getattr(p, field) for p in parts], field)
    if first.g_idx is not None and not all(torch.equal(p.g_idx, first.g_idx) for p in parts):
        raise ValueError("concat: act-order parts have different g_idx (g_idx is per input column, shared by all rows)")
    bn, bk = _target_groups(parts)
    if bn > 1:
        for i, p in enumerate(parts[:-1]):
            if p.N % bn:
                raise ValueError(
                    f"concat: part {i} has N={p.N}, not a multiple of the block height {bn}: the joined "
                    "weight's blocks would straddle two parts with different scales"
                )

    def joined(field: str) -> torch.Tensor | None:
        tensors = [getattr(p, field) for p in parts]
        if tensors[0] is None:
            return None
        if bn == -1:
            return tensors[0]
        dtype = _common_dtype(tensors)
        return torch.cat([_regrid(t.to(dtype), p, bn, bk) for t, p in zip(tensors, parts)], dim=-2)

    bias = _bias(parts)
    return QuantizedWeight(
        shape=(*first.lead, sum(p.N for p in parts), first.K),
        format=first.format,
        qweight=torch.cat([p.qweight for p in parts], dim=-2),
        scales=joined("scales"),
        group_shape=(bn, bk),
        zeros=joined("zeros"),
        global_scale=first.global_scale,
        g_idx=first.g_idx,
        bias=torch.cat(bias, dim=-1) if bias is not None else None,
    )


def to_unsigned(qw: QuantizedWeight) -> QuantizedWeight:
    """An ``intN`` weight as the equal ``uintN`` weight with zeros ``2^(N-1)`` (for joining with asym parts)."""
    fmt = qw.format
    if not (fmt.is_int and fmt.signed) or qw.scales is None:
        return qw
    zeros = torch.full(qw.scales.shape, 1 << (fmt.bits - 1), dtype=torch.int16, device=qw.device)
    return qw.replace(format=f"uint{fmt.bits}", qweight=qw.qweight ^ msb_mask(qw.K, fmt.bits, qw.device), zeros=zeros)
