"""Split a ``QuantizedWeight`` for tensor parallelism (N or K) and expert parallelism (E), exactly.

``shard(qw, dim, rank, world_size)`` returns rank ``rank``'s equal part along ``dim`` of ``qw.shape``:
the N dimension (column-parallel: each rank computes its slice of the outputs), the K dimension
(row-parallel: each rank computes a partial sum over its inputs, then an all-reduce), or the expert
dimension of a ``[E, N, K]`` weight. Splits respect group and block boundaries and raise ``ValueError``
saying why when a part would not be exact; a K split that is not word-aligned repacks the codes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ._checks import as_index
from .packing import cdiv, pack_codes, packed_words, unpack_codes

if TYPE_CHECKING:  # annotations only: weight.py imports this module for QuantizedWeight.shard
    from .weight import QuantizedWeight

__all__ = ["deinterleave_rows", "permute_rows", "shard"]


def shard(qw: QuantizedWeight, dim: int, rank: int, world_size: int) -> QuantizedWeight:
    """Rank ``rank``'s part of ``qw`` split into ``world_size`` equal parts along ``dim``.

    ``dim`` indexes ``qw.shape``: for ``[N, K]`` 0 (or -2) is N and 1 (or -1) is K; for ``[E, N, K]``, 0 is
    the expert dimension. Scales, zeros, bias and ``g_idx`` follow. Row-parallel (K) parts keep the bias
    on rank 0 only, so that summing the partial outputs adds it once; act-order parts keep every group's
    scales and their slice of ``g_idx``.
    """
    if not hasattr(qw, "format") or not hasattr(qw, "qweight"):  # the class is imported for annotations only
        raise ValueError(f"qw: expected a humming.QuantizedWeight, got {type(qw).__name__}")
    dim, rank, world_size = (as_index(n, v) for n, v in (("dim", dim), ("rank", rank), ("world_size", world_size)))
    ndim = len(qw.shape)
    if not -ndim <= dim < ndim:
        raise ValueError(f"dim: {dim} is out of range for a {ndim}-D weight {qw.shape}")
    if world_size < 1 or not 0 <= rank < world_size:
        name = "world_size" if world_size < 1 else "rank"
        raise ValueError(f"{name}: need 0 <= rank < world_size, got rank {rank}, world_size {world_size}")
    dim %= ndim
    size = qw.shape[dim]
    if size % world_size:
        raise ValueError(f"world_size: dimension {dim} of size {size} does not split into {world_size} equal parts")
    part = size // world_size
    start = rank * part
    if dim == ndim - 2:
        out = _rows(qw, start, part, world_size > 1)
    elif dim == ndim - 1:
        out = _columns(qw, start, part, rank, world_size > 1)
    else:
        out = _experts(qw, start, part)
    # Own copies, so that the full weight's memory can be freed once every rank has its part.
    return out.replace(**{name: t.clone() for name, t in out.tensors().items()})


def _check_aligned(what: str, part: int, block: int, split: bool) -> None:
    if split and block > 1 and part % block:
        raise ValueError(
            f"shard: a part of {part} along {what} is not a multiple of the {what} group/block size {block}: "
            "a group would straddle two ranks"
        )


def _rows(qw: QuantizedWeight, start: int, part: int, split: bool) -> QuantizedWeight:
    bn = qw.group_shape[0]
    _check_aligned("N", part, bn, split)
    stop = start + part

    def grid(t):
        if t is None or bn == -1:
            return t
        return t[..., start // bn : cdiv(stop, bn), :]

    return qw.replace(
        shape=(*qw.lead, part, qw.K),
        qweight=qw.qweight[..., start:stop, :],
        scales=grid(qw.scales),
        zeros=grid(qw.zeros),
        bias=qw.bias[..., start:stop] if qw.bias is not None else None,
    )


def _codes_columns(qw: QuantizedWeight, start: int, part: int) -> torch.Tensor:
    bits = qw.bits
    if start * bits % 32 == 0:
        first = start * bits // 32
        words = qw.qweight[..., first : first + packed_words(part, bits)]
        if (start + part) * bits % 32 == 0 or start + part == qw.K:
            return words  # whole words; a trailing partial word is already zero-padded
    codes = unpack_codes(qw.qweight, bits, qw.K)[..., start : start + part]
    return pack_codes(codes, bits)


def _columns(qw: QuantizedWeight, start: int, part: int, rank: int, split: bool) -> QuantizedWeight:
    bk = qw.group_shape[1]
    stop = start + part
    g_idx = qw.g_idx
    if g_idx is not None:
        g_idx = g_idx[..., start:stop].contiguous()
    else:
        _check_aligned("K", part, bk, split)

    def grid(t):
        if t is None or bk == -1 or g_idx is not None:
            return t
        return t[..., start // bk : cdiv(stop, bk)]

    return qw.replace(
        shape=(*qw.lead, qw.N, part),
        qweight=_codes_columns(qw, start, part),
        scales=grid(qw.scales),
        zeros=grid(qw.zeros),
        g_idx=g_idx,
        bias=qw.bias if rank == 0 else None,
    )


def _experts(qw: QuantizedWeight, start: int, part: int) -> QuantizedWeight:
    stop = start + part

    def take(t, per_expert_ndim):
        return t[start:stop] if t is not None and t.dim() == per_expert_ndim + 1 else t

    return qw.replace(
        shape=(part, qw.N, qw.K),
        qweight=qw.qweight[start:stop],
        scales=take(qw.scales, 2),
        zeros=take(qw.zeros, 2),
        global_scale=take(qw.global_scale, 0),
        g_idx=take(qw.g_idx, 1),
        bias=take(qw.bias, 1),
    )


def deinterleave_rows(qw: QuantizedWeight) -> tuple[QuantizedWeight, QuantizedWeight]:
    """Rows ``0::2`` and ``1::2`` (gpt-oss stores gate row i at 2i and up row i at 2i+1) as two weights.

    Needs per-row scales (``group_shape[0]`` 1) or one scale row for the whole N (``-1``).
    """
    bn = qw.group_shape[0]
    if bn not in (1, -1) or qw.N % 2:
        raise ValueError(f"deinterleave_rows: needs an even N and per-row scales, got {qw.shape} / {qw.group_shape}")

    def half(offset: int) -> QuantizedWeight:
        rows = lambda t: t if t is None or bn == -1 else t[..., offset::2, :]
        return qw.replace(
            shape=(*qw.lead, qw.N // 2, qw.K),
            qweight=qw.qweight[..., offset::2, :].contiguous(),
            scales=rows(qw.scales),
            zeros=rows(qw.zeros),
            bias=qw.bias[..., offset::2].contiguous() if qw.bias is not None else None,
        )

    return half(0), half(1)


def permute_rows(qw: QuantizedWeight, rows: torch.Tensor) -> QuantizedWeight:
    """The weight whose row ``j`` is row ``rows[j]`` of ``qw`` (``rows``: a permutation of ``range(N)``),
    for every expert; exact. Needs per-row scales (``group_shape[0]`` 1) or one scale row for the whole N."""
    bn = qw.group_shape[0]
    if bn not in (1, -1):
        raise ValueError(f"permute_rows: needs per-row scales or one for all N, got group shape {qw.group_shape}")
    if tuple(rows.shape) != (qw.N,):
        raise ValueError(f"rows: expected a permutation of the {qw.N} rows, got shape {tuple(rows.shape)}")
    rows = rows.to(device=qw.device, dtype=torch.long)
    take = lambda t: t if t is None or bn == -1 else t[..., rows, :]
    return qw.replace(
        qweight=qw.qweight[..., rows, :],
        scales=take(qw.scales),
        zeros=take(qw.zeros),
        bias=qw.bias[..., rows] if qw.bias is not None else None,
    )
