"""``humming.moe``: mixture-of-experts entry points on expert-stacked weights ``[E, N, K]``.

Layout: the "contiguous grouped" layout of DeepGEMM and vLLM's fused_moe. The ``T * topk`` routed slots
(slot ``t * topk + j`` = token ``t``'s ``j``-th expert) are sorted by expert into one ``[M_pad, K]`` matrix;
each expert's segment is padded to a multiple of ``block_m`` rows, so every ``block_m`` block of rows has
one expert (``expert_ids``) and a kernel tile reads one expert's weights and contiguous activations (what
TMA needs). ``M_pad`` is the worst case, fixed by ``(T, topk, E, block_m)``, so that routing never reads
anything back to the host and the whole layer can be captured in a CUDA graph; blocks past the last used
one have expert id -1 and kernels skip them.

- :func:`moe_align`: routing ``topk_ids [T, topk]`` -> :class:`MoeRouting` (torch ops only, no host sync).
- :func:`grouped_linear`: ``[M_pad, K]`` rows times their block's expert -> ``[M_pad, N]``; with ``rows``
  (:meth:`MoeRouting.token_rows`) the ``[T, K]`` tokens are read through that index instead, so that the
  routed rows are never copied into grouped order.
- :func:`grouped_linear_masked`: the masked layout of DeepEP's low-latency dispatch, ``[E, max_m, K]`` with
  ``masked_m[e]`` valid rows per expert -> ``[E, max_m, N]``, on the same grouped GEMMs.
- :func:`fused_moe`: align, ``w13`` on the gathered tokens, the gated activation (SiLU, GELU, gpt-oss's
  clamped SwiGLU;
  gate and up rows concatenated or interleaved), ``w2``, weighted sum back to tokens; an ``expert_map`` runs
  the experts of one expert-parallel rank.
- :func:`topk_routing`: router logits -> ``(topk_weights, topk_ids)``: softmax or sigmoid scores, DeepSeek-V3's
  grouped top-k and correction bias, gpt-oss's softmax over the top k (a Triton kernel on CUDA tensors).
- :class:`MoeCall`: a fused_moe layer described once, for :func:`humming.warmup` (the kernels a call
  launches, and the call on random inputs).

Each is also a custom op (``torch.ops.humming.*``, :mod:`humming.ops`), which ``torch.compile`` sees as
one node.

Backends: ``"auto"`` tries CUDA, Triton, then the reference (``humming/dispatch/plan.py``). The
reference runs every weight format and ``act`` scheme that :func:`humming.linear` does. The Triton grouped
kernels (the dense WnA16 and scaled GEMMs with an expert-id path) need ``block_m`` a multiple of 16 and run
every WnA16 format (``act=None``) and every weight x activation combination of the dense scaled GEMM:
per-token, per-group, per-tensor (dynamic or static) scales, NVFP4 and MXFP4; both gather token rows in the
kernel. The CUDA backend's grouped sm_90a GEMMs run int4/uint4/int8/uint8 WnA16 (``block_m`` a multiple of
16) and, with ``act="fp8"`` or ``"fp8_g128"``, e4m3 experts (per-channel or 128x128 block scales: the
DeepSeek-V3 recipe) and int4 experts (W4A8); N % 128 == 0; they read grouped rows, so a gather is copied
into grouped order for them first.

A dynamic tensor-wide activation scale (``fp8_tensor``, ``int8_tensor``, NVFP4's global scale) spans the
rows of the blocks in use (expert id >= 0) of a grouped ``x``, and every token of a gathered one (``rows``:
the ``T`` tokens are quantized once, routed or not).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from . import _moe_layer, ops
from ._routing import check_routing, route
from .cuda_kernels.jit import KernelNotReadyError
from .dispatch.kernels import GROUPED_KERNELS, backend_unavailable
from .dispatch.plan import plan_grouped, requested_backend, unwarmed_error
from .dispatch.support import combination_error
from .ir.activation import ActScheme, QuantizedActivation, get_act_scheme
from .ir.weight import QuantizedWeight, expert_weight

__all__ = [
    "MoeCall",
    "MoeLaunch",
    "MoeRouting",
    "default_block_m",
    "expert_weight",
    "fused_moe",
    "grouped_linear",
    "grouped_linear_masked",
    "masked_block_m",
    "masked_expert_ids",
    "moe_align",
    "padded_rows",
    "topk_routing",
]

_X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class MoeRouting:
    """Routed slots grouped by expert (see the module doc); every tensor is on ``topk_ids``' device.

    ``src_slots``: int32 ``[M_pad]``, the slot ``t * topk + j`` of each grouped row, -1 for padding rows.
    ``expert_ids``: int32 ``[M_pad // block_m]``, each block's expert, -1 past the last used block.
    ``num_rows``: int32 0-d, the grouped rows in use (padding included).
    ``slot_rows``: int32 ``[T * topk]``, the grouped row of each slot (the inverse of ``src_slots``), -1 for
    dropped slots: combining gathers each token's rows through it, with no atomics and no padding rows.
    """

    src_slots: torch.Tensor
    expert_ids: torch.Tensor
    block_m: int
    num_rows: torch.Tensor
    slot_rows: torch.Tensor

    @property
    def m_pad(self) -> int:
        return self.src_slots.shape[0]

    def token_rows(self, topk: int) -> torch.Tensor:
        """int32 ``[M_pad]``: the token of each grouped row (``src_slots // topk``), -1 for padding rows:
        :func:`grouped_linear`'s ``rows``, which reads the ``[T, K]`` tokens in place."""
        return torch.where(self.src_slots >= 0, self.src_slots // topk, -1)


#: The largest routing block: every expert's segment is padded to a multiple of it (E * block_m rows at worst).
MAX_BLOCK_M = 1024
#: The most experts one moe_align call groups (its per-expert counts and padded rows are allocated).
MAX_EXPERTS = 1 << 16


def _check_block_m(block_m) -> int:
    if isinstance(block_m, bool) or not isinstance(block_m, int) or not 0 < block_m <= MAX_BLOCK_M or block_m % 8:
        raise ValueError(f"block_m: expected a positive multiple of 8 up to {MAX_BLOCK_M}, got {block_m!r}")
    return block_m


def padded_rows(num_slots: int, num_experts: int, block_m: int) -> int:
    """``M_pad``: the grouped rows of the worst case, every expert's segment padded by ``block_m - 1``."""
    worst = num_slots + num_experts * (block_m - 1)
    return (worst + block_m - 1) // block_m * block_m  # not -(-a // b): the size may be symbolic


def _check_topk_ids(topk_ids) -> None:
    if not isinstance(topk_ids, torch.Tensor):
        raise ValueError(f"topk_ids: expected a torch.Tensor, got {type(topk_ids).__name__}")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype.is_complex or topk_ids.dtype == torch.bool:
        raise ValueError(f"topk_ids: expected an integer dtype, got {topk_ids.dtype}")
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids: expected shape [T, topk], got {tuple(topk_ids.shape)}")


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoeRouting:
    """Group the routed slots of ``topk_ids`` (integer ``[T, topk]``) by expert, padded to ``block_m``.

    Within an expert, slots keep their order (stable). Torch ops only and no host sync: CUDA-graph
    capturable. Ids outside ``[0, num_experts)`` raise ``ValueError`` on CPU tensors; on a GPU they are not
    checked (that would read them back to the host): such slots are dropped (no row, so they add nothing).
    """
    _check_topk_ids(topk_ids)
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or not 0 < num_experts <= MAX_EXPERTS:
        raise ValueError(f"num_experts: expected a positive int up to {MAX_EXPERTS}, got {num_experts!r}")
    block_m = _check_block_m(block_m)
    if ops.eager(topk_ids):
        _check_range("topk_ids", topk_ids, 0, num_experts)
        return _align(topk_ids, num_experts, block_m)
    src_slots, expert_ids, num_rows, slot_rows = torch.ops.humming.moe_align(topk_ids, num_experts, block_m)
    return MoeRouting(src_slots, expert_ids, block_m, num_rows, slot_rows)


def _check_range(name: str, values: torch.Tensor, low: int, high: int) -> None:
    """``ValueError`` unless every value lies in ``[low, high)``: on CPU tensors only (on a GPU it would read
    them back to the host, a sync; there, values out of range are dropped by whoever reads them)."""
    if values.device.type != "cpu" or not values.numel():
        return
    flat = values.reshape(-1)
    if int(flat.min()) < low or int(flat.max()) >= high:
        bad = flat[(flat < low) | (flat >= high)][0]
        raise ValueError(f"{name}: values must lie in [{low}, {high}), found {int(bad)}")


def _align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoeRouting:
    """:func:`moe_align` once its arguments are checked; slots with ids out of range get no row."""
    device = topk_ids.device
    ids = topk_ids.reshape(-1).long()
    m_pad = padded_rows(ids.numel(), num_experts, block_m)
    # Expert num_experts is a bucket for dropped (out of range) slots: it gets no rows.
    key = torch.where((ids >= 0) & (ids < num_experts), ids, num_experts)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device).scatter_add_(0, key, torch.ones_like(key))
    padded = (counts + block_m - 1) // block_m * block_m
    padded[num_experts:].zero_()  # an in-place fill: capturable (item assignment copies from the host)
    seg_start = torch.cumsum(padded, 0) - padded  # first grouped row of each expert
    first_sorted = torch.cumsum(counts, 0) - counts  # first position of each expert in sorted order
    order = torch.argsort(key, stable=True)
    sorted_key = key[order]
    rank = torch.arange(ids.numel(), device=device) - first_sorted[sorted_key]
    dest = torch.where(sorted_key < num_experts, seg_start[sorted_key] + rank, m_pad)  # m_pad: dropped
    src_slots = torch.full((m_pad + 1,), -1, dtype=torch.int32, device=device)
    src_slots.scatter_(0, dest, order.to(torch.int32))
    block_ends = torch.cumsum(padded[:num_experts] // block_m, 0)
    blocks = torch.arange(m_pad // block_m, device=device)
    expert_ids = torch.searchsorted(block_ends, blocks, right=True).to(torch.int32)
    expert_ids = torch.where(expert_ids < num_experts, expert_ids, -1)
    num_rows = padded.sum().to(torch.int32)
    slot_rows = torch.empty(ids.numel(), dtype=torch.int32, device=device)
    slot_rows.scatter_(0, order, torch.where(dest < m_pad, dest, -1).to(torch.int32))
    return MoeRouting(src_slots[:m_pad], expert_ids, block_m, num_rows, slot_rows)


def _moe_align_op(topk_ids, num_experts, block_m):
    r = moe_align(topk_ids, num_experts, block_m)  # eager here: every argument checked, then aligned
    return r.src_slots, r.expert_ids, r.num_rows, r.slot_rows


def _moe_align_fake(topk_ids, num_experts, block_m):
    m_pad = padded_rows(topk_ids.numel(), num_experts, block_m)
    new = lambda *shape: topk_ids.new_empty(shape, dtype=torch.int32)
    return new(m_pad), new(m_pad // block_m), new(), new(topk_ids.numel())


ops.register("moe_align", _moe_align_op, _moe_align_fake)


def _check_experts(name: str, qweight) -> QuantizedWeight:
    if not isinstance(qweight, QuantizedWeight):
        raise ValueError(f"{name}: expected a humming.QuantizedWeight, got {type(qweight).__name__}")
    if qweight.num_experts is None:
        raise ValueError(
            f"{name}: expected an expert-stacked weight [E, N, K], got a dense weight {qweight.shape} "
            "(humming.linear takes dense weights; humming.stack builds [E, N, K])"
        )
    return qweight


def _check_x(name: str, x, k: int, device: torch.device) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _X_DTYPES:
        raise ValueError(f"{name}: expected dtype float16, bfloat16 or float32, got {x.dtype}")
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"{name}: expected shape [M, {k}] (K of the weight), got {tuple(x.shape)}")
    if x.shape[1] and x.stride(1) != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1), got strides {tuple(x.stride())}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but the weight is on {device}; move one with .to()")


def _check_rows(rows, device: torch.device) -> None:
    """What can be checked of a gather index without reading it (its values: :func:`run_grouped`)."""
    if not isinstance(rows, torch.Tensor) or rows.dtype != torch.int32:
        raise ValueError(f"rows: expected an int32 tensor, got {getattr(rows, 'dtype', type(rows).__name__)}")
    if rows.dim() != 1:
        raise ValueError(f"rows: expected shape [M_pad], got {tuple(rows.shape)}")
    if rows.device != device:
        raise ValueError(f"rows is on {rows.device} but x is on {device}")


def _expert_bias(bias, qweight: QuantizedWeight, name: str = "bias") -> torch.Tensor | None:
    """A grouped GEMM's bias checked: ``[E, N]`` floats on the weight's device, or None."""
    if bias is None:
        return None
    e, n, _ = qweight.shape
    if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (e, n) or not bias.is_floating_point():
        raise ValueError(f"{name}: expected a float tensor of shape ({e}, {n}), got {getattr(bias, 'shape', bias)!r}")
    if bias.device != qweight.device:
        raise ValueError(f"{name} is on {bias.device} but qweight is on {qweight.device}")
    return bias


def _out_dtype(out_dtype, default: torch.dtype) -> torch.dtype:
    out_dtype = out_dtype or default
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype: expected float16, bfloat16 or float32, got {out_dtype}")
    return out_dtype


def grouped_linear(
    x: torch.Tensor | QuantizedActivation,
    qweight: QuantizedWeight,
    expert_ids: torch.Tensor,
    block_m: int,
    bias: torch.Tensor | None = None,
    *,
    rows: torch.Tensor | None = None,
    act=None,
    out_dtype: torch.dtype | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Grouped GEMM: row ``r`` (of ``x``, or token ``rows[r]``) times expert ``expert_ids[r // block_m]``.

    Args:
        x: ``[M_pad, K]`` float16 / bfloat16 (float32 on the reference backend), ``M_pad % block_m == 0``;
            with ``rows``, the ``[T, K]`` tokens. Or a :class:`~humming.QuantizedActivation` of those rows,
            quantized beforehand (``humming.quantize_activation``, a static ``scale`` included).
        qweight: expert-stacked ``[E, N, K]``.
        expert_ids: int32 ``[M_pad // block_m]`` on ``x``'s device, values in ``[-1, E)`` (checked on CPU
            only; on a GPU that would be a host sync). Rows of blocks with expert -1 are unspecified.
        block_m: rows per routing block, a positive multiple of 8 (:func:`moe_align`'s).
        bias: ``[E, N]``; defaults to ``qweight.bias``.
        rows: the gather, int32 ``[M_pad]`` on ``x``'s device (:meth:`MoeRouting.token_rows`): output row
            ``r`` is token ``rows[r]``, or a padding row (unspecified) where it is -1; values in ``[-1, T)``,
            checked on CPU only. The Triton kernels read the tokens through it; other backends get
            ``x[rows]`` copied first.
        act, out_dtype, backend: as :func:`humming.linear` (``act`` may be omitted for a quantized ``x``;
            ``out_dtype`` then defaults to bfloat16). Dynamic tensor-wide activation scales span the rows of
            blocks in use (expert id >= 0), or with ``rows`` the ``T`` tokens.
    Returns:
        ``[M_pad, N]`` in ``out_dtype`` (default ``x``'s dtype).
    """
    qweight = _check_experts("qweight", qweight)
    bias = qweight.bias if bias is None else bias
    act, bias, out_dtype, block_m = _checked_grouped(x, qweight, expert_ids, block_m, bias, rows, act, out_dtype)
    prequantized = isinstance(x, QuantizedActivation)
    x_data = x.codes if prequantized else x
    if ops.eager(x_data):
        return run_grouped(x, qweight, expert_ids, block_m, bias, act, out_dtype, backend, rows)
    return torch.ops.humming.grouped_linear(
        x_data,
        x.scales if prequantized else None,
        x.global_scale if prequantized else None,
        expert_ids,
        block_m,
        rows,
        *ops.weight_args(qweight),
        bias,
        ops.act_name(act),
        out_dtype,
        backend,
    )


def _checked_grouped(x, qweight: QuantizedWeight, expert_ids, block_m, bias, rows, act, out_dtype):
    """``(act, bias, out_dtype, block_m)`` of a grouped_linear call, every argument checked (the entry point's
    and the custom op's, which may be called directly)."""
    k = qweight.K
    prequantized = isinstance(x, QuantizedActivation)
    if prequantized:
        if act is not None and get_act_scheme(act) != x.scheme:
            raise ValueError(f"act: x is already quantized with {x.scheme.name}, but act={act!r}")
        act = x.scheme
        x.check_codes()
        x_data = x.codes
        if x_data.shape[1] != k:
            raise ValueError(f"x: expected shape [M, {k}] (K of the weight), got {tuple(x_data.shape)}")
        if x_data.device != qweight.device:
            raise ValueError(f"x is on {x_data.device} but the weight is on {qweight.device}; move one with .to()")
    else:
        _check_x("x", x, k, qweight.device)
        x_data = x
    block_m = _check_block_m(block_m)
    if rows is not None:
        _check_rows(rows, x_data.device)
    m_pad = x_data.shape[0] if rows is None else rows.shape[0]
    if m_pad % block_m:
        raise ValueError(f"{'x' if rows is None else 'rows'}: its {m_pad} rows are not a multiple of block_m={block_m}")
    if not isinstance(expert_ids, torch.Tensor) or expert_ids.dtype != torch.int32:
        raise ValueError(f"expert_ids: expected an int32 tensor, got {getattr(expert_ids, 'dtype', type(expert_ids))}")
    if tuple(expert_ids.shape) != (m_pad // block_m,):
        raise ValueError(
            f"expert_ids: expected shape ({m_pad // block_m},) = M_pad // block_m, got {tuple(expert_ids.shape)}"
        )
    if expert_ids.device != x_data.device:
        raise ValueError(f"expert_ids is on {expert_ids.device} but x is on {x_data.device}")
    bias = _expert_bias(bias, qweight)
    out_dtype = _out_dtype(out_dtype, torch.bfloat16 if prequantized else x.dtype)
    act = None if act is None else get_act_scheme(act)
    reason = combination_error(qweight.format, act)
    if reason:
        raise ValueError(reason)
    return act, bias, out_dtype, block_m


def run_grouped(
    x, qweight, expert_ids, block_m: int, bias, act: ActScheme | None, out_dtype, backend: str, rows=None
) -> torch.Tensor:
    """What :func:`grouped_linear` runs once its arguments are checked (``torch.ops.humming.grouped_linear``
    too): plan, launch (copying the gathered rows into grouped order for a kernel that does not gather),
    non-finite rows. Checks the expert ids and rows of CPU tensors here, where they are data (not while
    ``torch.compile`` traces). ``x`` may also be a :class:`QuantizedActivation` of scheme ``act``
    (:func:`fused_moe` quantizes the input of ``w2`` in its activation pass)."""
    _check_range("expert_ids", expert_ids, -1, qweight.num_experts)
    prequantized = isinstance(x, QuantizedActivation)
    x_data = x.codes if prequantized else x
    if rows is not None:
        _check_range("rows", rows, -1, x_data.shape[0])
    m_pad = None if rows is None else rows.shape[0]
    plan = plan_grouped(qweight, act, x_data, block_m, backend, m_pad)
    kernel = GROUPED_KERNELS[plan.kernel]
    gather = {}
    if rows is not None and kernel.gathers:
        gather = {"rows": rows}
    elif rows is not None:
        # Copied into grouped order. Exact for the kernels that do not gather (CUDA's): they take row-wise
        # activation scales only, for which quantizing the gathered rows equals gathering the quantized tokens.
        x = _moe_layer.gather_rows(x, rows)
    try:
        out = kernel.run(x, qweight, expert_ids, block_m, bias, act, out_dtype, plan.tuning, **gather)
    except KernelNotReadyError as err:  # during a capture: name the warmup call this one needed
        raise unwarmed_error(err, qweight, act, x_data, backend, block_m, m_pad) from None
    # NaN / Inf activations: NaN output rows (see humming.linear.poison_non_finite_rows), skipped rows kept;
    # quantized activations carry them in NaN scales
    tensor_wide = act is not None and act.group_shape[0] != 1
    if act is not None and not prequantized and x_data.shape[0] and (plan.backend == "reference" or tensor_wide):
        bad = ~torch.isfinite(x_data).all(dim=-1)
        if rows is not None:
            bad = (rows >= 0) & bad[torch.where(rows >= 0, rows, 0).long()]
        routed = (expert_ids >= 0).repeat_interleave(block_m)
        out = out.masked_fill((bad & routed)[:, None], float("nan"))
    return out


def _grouped_op(x, x_scales, x_global_scale, expert_ids, block_m, rows, *args):
    *weight, bias, act, out_dtype, backend = args
    qweight = _check_experts("qweight", ops.weight_from_args(*weight))
    if x_scales is not None:
        if act is None:
            raise ValueError("act: quantized activations (x_scales given) need the scheme's name")
        x = QuantizedActivation(act, x, x_scales, x_global_scale)
    act, bias, out_dtype, block_m = _checked_grouped(x, qweight, expert_ids, block_m, bias, rows, act, out_dtype)
    return run_grouped(x, qweight, expert_ids, block_m, bias, act, out_dtype, backend, rows)


def _grouped_fake(x, x_scales, x_global_scale, expert_ids, block_m, rows, qweight, *args):
    m_pad = x.shape[0] if rows is None else rows.shape[0]
    return x.new_empty((m_pad, qweight.shape[-2]), dtype=args[-2])


ops.register("grouped_linear", _grouped_op, _grouped_fake)


#: Rows per routing block of :func:`grouped_linear_masked`, largest first: multiples of 16 (the Triton
#: grouped GEMMs' minimum), so that every backend runs the same blocks.
_MASKED_BLOCK_MS = (128, 64, 32, 16)


def grouped_linear_masked(
    x: torch.Tensor,
    qweight: QuantizedWeight,
    masked_m: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    act=None,
    out_dtype: torch.dtype | None = None,
    expected_m: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Grouped GEMM on the masked layout (DeepEP's low-latency dispatch, DeepGEMM's masked GEMM): the first
    ``masked_m[e]`` rows of ``x[e]`` times expert ``e`` of ``qweight``.

    Runs :func:`grouped_linear` on ``x`` viewed as ``[E * max_m, K]`` (no copy) with routing blocks of
    ``block_m`` rows that divide ``max_m`` (so no block spans two experts); the blocks' expert ids are made
    on the device from ``masked_m`` (no host sync: CUDA-graph capturable), blocks past ``masked_m[e]`` get
    id -1 and are skipped.

    Args:
        x: ``[E, max_m, K]`` float16 / bfloat16 (float32 on the reference backend), viewable as
            ``[E * max_m, K]`` (experts ``max_m`` rows apart, last dimension contiguous). When ``max_m`` is
            not a multiple of 16 it is copied into a buffer padded to one (every kernel's routing blocks are
            multiples of 16 rows, and a block may not span two experts).
        qweight: expert-stacked ``[E, N, K]``.
        masked_m: int32 ``[E]`` on ``x``'s device, the valid rows of each expert; values past ``max_m``
            count as ``max_m``, negative ones as 0 (checked to lie in ``[0, max_m]`` on CPU only).
        bias: ``[E, N]``; defaults to ``qweight.bias``.
        act, out_dtype, backend: as :func:`grouped_linear`; ``act`` per token or per group only (a
            per-tensor or global activation scale would be taken over the rows past ``masked_m`` too, which
            hold whatever the dispatch left there).
        expected_m: the rows an expert is expected to hold (DeepGEMM's hint), which picks ``block_m``:
            16 up to 16 rows, 64 up to 96, else 128, each the largest that divides ``max_m``.
            ``None``: ``max_m``.
    Returns:
        ``[E, max_m, N]`` in ``out_dtype`` (default ``x``'s dtype). Rows ``>= masked_m[e]`` of expert ``e``
        are unspecified (the kernels skip their blocks; garbage there never reaches a valid row).
    """
    qweight = _check_experts("qweight", qweight)
    bias = qweight.bias if bias is None else bias
    act, bias, out_dtype = _checked_masked(x, qweight, masked_m, bias, act, out_dtype, expected_m)
    if ops.eager(x):
        return run_grouped_masked(x, qweight, masked_m, bias, act, out_dtype, expected_m or 0, backend)
    return torch.ops.humming.grouped_linear_masked(
        x, masked_m, expected_m or 0, *ops.weight_args(qweight), bias, ops.act_name(act), out_dtype, backend
    )


def _checked_masked(x, qweight: QuantizedWeight, masked_m, bias, act, out_dtype, expected_m):
    """``(act, bias, out_dtype)`` of a grouped_linear_masked call, every argument checked (the entry point's
    and the custom op's)."""
    e, _, k = qweight.shape
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3 or x.shape[0] != e or x.shape[2] != k:
        raise ValueError(f"x: expected shape [E={e}, max_m, K={k}] (E, K of the weight), got {tuple(x.shape)}")
    _check_x("x", x[0], k, qweight.device)  # dtype, contiguous last dimension, device
    if x.shape[1] > 1 and x.stride(0) != x.shape[1] * x.stride(1):
        raise ValueError(
            f"x: experts must be max_m rows apart (x viewed as [E * max_m, K] without a copy), got strides "
            f"{tuple(x.stride())}"
        )
    if not isinstance(masked_m, torch.Tensor) or masked_m.dtype != torch.int32 or tuple(masked_m.shape) != (e,):
        got = f"{masked_m.dtype} {tuple(masked_m.shape)}" if isinstance(masked_m, torch.Tensor) else masked_m
        raise ValueError(f"masked_m: expected an int32 tensor of shape ({e},) (E), got {got!r}")
    if masked_m.device != x.device:
        raise ValueError(f"masked_m is on {masked_m.device} but x is on {x.device}")
    bias = _expert_bias(bias, qweight)
    out_dtype = _out_dtype(out_dtype, x.dtype)
    if expected_m is not None and (isinstance(expected_m, bool) or not isinstance(expected_m, int) or expected_m < 1):
        raise ValueError(f"expected_m: expected None or a positive int, got {expected_m!r}")
    act = None if act is None else get_act_scheme(act)
    if act is not None and (act.group_shape[0] != 1 or act.global_scale):
        raise ValueError(
            f"act: {act.name} takes one activation scale over every row, which in the masked layout would include "
            "the rows past masked_m (whatever the dispatch left there); use a per-token or per-group scheme "
            "(fp8, fp8_g128, int8, mxfp4...)"
        )
    reason = combination_error(qweight.format, act)
    if reason:
        raise ValueError(reason)
    return act, bias, out_dtype


def masked_block_m(max_m: int, expected_m: int) -> int:
    """The routing block of :func:`grouped_linear_masked` for ``max_m`` rows per expert (a multiple of 16)
    and ``expected_m`` expected rows: :func:`default_block_m`'s choice for that many rows, lowered to the
    largest of 128, 64, 32, 16 that divides ``max_m``."""
    target = default_block_m(expected_m, 1)
    return next(bm for bm in _MASKED_BLOCK_MS if bm <= target and max_m % bm == 0)


def masked_expert_ids(masked_m: torch.Tensor, max_m: int, block_m: int) -> torch.Tensor:
    """int32 ``[E * max_m // block_m]``: block ``b`` of expert ``e`` gets ``e`` if ``b * block_m <
    masked_m[e]``, else -1. Torch ops on ``masked_m``'s device, no host sync."""
    e = masked_m.shape[0]
    starts = torch.arange(0, max_m, block_m, dtype=torch.int32, device=masked_m.device)
    experts = torch.arange(e, dtype=torch.int32, device=masked_m.device)[:, None]
    return torch.where(starts[None, :] < masked_m[:, None], experts, -1).reshape(-1)


def run_grouped_masked(x, qweight, masked_m, bias, act: ActScheme | None, out_dtype, expected_m: int, backend: str):
    """What :func:`grouped_linear_masked` runs once its arguments are checked (its op too): the block size,
    the expert ids, the grouped GEMM. ``expected_m`` 0: ``max_m``."""
    e, max_m, k = x.shape
    _check_range("masked_m", masked_m, 0, max_m + 1)
    rows = -(-max_m // 16) * 16
    if rows != max_m:  # no block size divides max_m: pad each expert to a multiple of 16 rows (a copy)
        padded = x.new_zeros(e, rows, k)
        padded[:, :max_m] = x
        x = padded
    block_m = masked_block_m(rows, expected_m or max_m)
    expert_ids = masked_expert_ids(masked_m, rows, block_m)
    out = run_grouped(x.reshape(e * rows, k), qweight, expert_ids, block_m, bias, act, out_dtype, backend)
    out = out.view(e, rows, -1)
    return out if rows == max_m else out[:, :max_m].contiguous()


def _grouped_masked_op(x, masked_m, expected_m, *args):
    *weight, bias, act, out_dtype, backend = args
    qweight = _check_experts("qweight", ops.weight_from_args(*weight))
    act, bias, out_dtype = _checked_masked(x, qweight, masked_m, bias, act, out_dtype, expected_m or None)
    return run_grouped_masked(x, qweight, masked_m, bias, act, out_dtype, expected_m, backend)


def _grouped_masked_fake(x, masked_m, expected_m, qweight, *args):
    return x.new_empty((x.shape[0], x.shape[1], qweight.shape[-2]), dtype=args[-2])


ops.register("grouped_linear_masked", _grouped_masked_op, _grouped_masked_fake)


def default_block_m(num_slots: int, num_experts: int) -> int:
    """``block_m`` for ``num_slots`` routed slots over ``num_experts``: 16 while experts average <= 16 rows
    (decode: little padding), 64 up to 96 rows, else 128 (larger tiles for prefill)."""
    rows = num_slots / num_experts
    return 16 if rows <= 16 else 64 if rows <= 96 else 128


def fused_moe(
    x: torch.Tensor,
    w13: QuantizedWeight,
    w2: QuantizedWeight,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    alpha: float | None = None,
    limit: float | None = None,
    gate_up_layout: str = "concat",
    expert_map: torch.Tensor | None = None,
    act=None,
    w13_act_scale: torch.Tensor | None = None,
    w2_act_scale: torch.Tensor | None = None,
    block_m: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """A mixture-of-experts MLP: ``sum_j topk_weights[t, j] * w2_e(act_fn(gate, up))`` with
    ``[gate, up] = w13_e(x[t])``, ``e = topk_ids[t, j]``.

    Args:
        x: ``[T, K]`` float16 / bfloat16 (float32 on the reference backend).
        w13: ``[E, 2I, K]``, gate and up rows as ``gate_up_layout`` says.
        w2: ``[E, K, I]``. Their ``bias`` fields (``[E, 2I]``, ``[E, K]``), if set, are added.
        topk_weights: float ``[T, topk]``; topk_ids: integer ``[T, topk]`` (see :func:`moe_align`).
        activation: ``"silu"`` (SwiGLU), ``"gelu"`` (exact erf GELU, vLLM's ``"gelu"``), ``"gelu_tanh"``
            (tanh approximation) or ``"swiglu_oai"`` (gpt-oss: ``clamp(gate, max=limit)`` times
            ``sigmoid(alpha * gate)`` times ``clamp(up, -limit, limit) + 1``); computed in float32, rounded
            to ``x``'s dtype. ``alpha``, ``limit``: swiglu_oai's only (``None``: 1.702 and 7.0).
        gate_up_layout: ``"concat"`` (gate rows ``[0, I)``, then up rows: vLLM's and transformers'
            convention) or ``"interleaved"`` (gate rows even, up rows odd: gpt-oss checkpoints).
        expert_map: expert parallelism (vLLM's): an integer ``[E_global]`` tensor on ``x``'s device giving
            each global expert id its index in ``w13`` / ``w2``, or -1 where the expert is not on this rank;
            ``topk_ids`` are then global ids in ``[0, E_global)``, and slots of experts not here add nothing
            (the rank's partial sum, to be reduced across ranks). Mapped on the device, no host sync; values
            are checked on CPU only (on a GPU, ids or map values out of range drop their slots).
        act, backend: as :func:`grouped_linear`, for both GEMMs. ``w13`` gathers the tokens
            (``grouped_linear``'s ``rows``): a dynamic tensor-wide scale of its input spans the ``T`` tokens,
            those of ``w2``'s input the grouped rows in use. With a per-token or per-group ``act``, the
            activation pass of the Triton path writes ``w2``'s quantized input itself.
        w13_act_scale, w2_act_scale: static per-tensor scales of the two GEMMs' inputs (one element each;
            ``x / scale`` is quantized, as a checkpoint's ``input_scale``) for an ``act`` with float32 scales
            and no global scale; ``None``: dynamic scales.
        block_m: the routing block; ``None`` -> :func:`default_block_m`.
    Returns:
        ``[T, K]`` in ``x``'s dtype; the weighted sum accumulates in fp32 and is rounded once.
    """
    w13 = _check_experts("w13", w13)
    w2 = _check_experts("w2", w2)
    activation, act, scales, block_m = _checked_fused(
        x,
        w13,
        w2,
        topk_weights,
        topk_ids,
        (activation, alpha, limit, gate_up_layout),
        expert_map,
        act,
        (w13_act_scale, w2_act_scale),
        block_m,
    )
    if ops.eager(x):
        args = (topk_weights, topk_ids, expert_map, activation, act, *scales, block_m, backend)
        return run_fused_moe(x, w13, w13.bias, w2, w2.bias, *args)
    return torch.ops.humming.fused_moe(
        x,
        topk_weights,
        topk_ids,
        *ops.weight_args(w13),
        w13.bias,
        *ops.weight_args(w2),
        w2.bias,
        expert_map,
        activation.name,
        activation.alpha,
        activation.limit,
        activation.gate_up_layout,
        ops.act_name(act),
        *scales,
        0 if block_m is None else block_m,
        backend,
    )


def _checked_fused(x, w13, w2, topk_weights, topk_ids, activation, expert_map, act, act_scales, block_m):
    """``(activation, act, (w13_act_scale, w2_act_scale), block_m)`` of a fused_moe call, every argument checked
    (the entry point's and the custom op's); ``activation`` is ``(name, alpha, limit, gate_up_layout)``."""
    e, two_i, k = w13.shape
    activation = _moe_layer.check_activation(*activation)
    if two_i % 2:
        raise ValueError(f"w13: expected [E, 2I, K] (gate and up rows), got an odd N={two_i}")
    inter = two_i // 2
    if w2.shape != (e, k, inter):
        raise ValueError(f"w2: expected shape {(e, k, inter)} for w13 {w13.shape}, got {w2.shape}")
    if w2.device != w13.device:
        raise ValueError(f"w2 is on {w2.device} but w13 is on {w13.device}")
    _check_x("x", x, k, w13.device)
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids: expected shape [T={x.shape[0]}, topk], got {getattr(topk_ids, 'shape', topk_ids)}")
    if topk_ids.shape[1] == 0:
        raise ValueError(
            f"topk_ids: expected at least one expert per token (topk >= 1), got shape {tuple(topk_ids.shape)}"
        )
    if topk_ids.device != x.device:
        raise ValueError(f"topk_ids is on {topk_ids.device} but x is on {x.device}")
    _check_topk_ids(topk_ids)
    if not isinstance(topk_weights, torch.Tensor) or not topk_weights.is_floating_point():
        raise ValueError(f"topk_weights: expected a float tensor, got {getattr(topk_weights, 'dtype', topk_weights)}")
    if topk_weights.shape != topk_ids.shape or topk_weights.device != x.device:
        raise ValueError(
            f"topk_weights: expected shape {tuple(topk_ids.shape)} on {x.device} (as topk_ids), "
            f"got {tuple(topk_weights.shape)} on {topk_weights.device}"
        )
    if expert_map is not None:
        _check_expert_map(expert_map, e, x.device)
    block_m = _check_block_m(block_m) if block_m is not None else None
    act = None if act is None else get_act_scheme(act)
    reason = combination_error(w13.format, act) or combination_error(w2.format, act)
    if reason:
        raise ValueError(reason)
    scales = tuple(
        _check_act_scale(name, scale, act, x.device)
        for name, scale in zip(("w13_act_scale", "w2_act_scale"), act_scales)
    )
    return activation, act, scales, block_m


def _check_act_scale(name: str, scale, act: ActScheme | None, device: torch.device) -> torch.Tensor | None:
    """A static activation scale as the op takes it (float32 ``[1, 1]``), or ``None``."""
    if scale is None:
        return None
    if act is None or act.scale_dtype != torch.float32 or act.global_scale:
        raise ValueError(f"{name}: a static scale needs an act with float32 scales (fp8, int8...), got act={act}")
    if not isinstance(scale, torch.Tensor) or scale.numel() != 1 or not scale.is_floating_point():
        raise ValueError(f"{name}: expected a one-element float tensor, got {scale!r}")
    if scale.device != device:
        raise ValueError(f"{name} is on {scale.device} but x is on {device}")
    return scale.to(torch.float32).reshape(1, 1)


def _check_expert_map(expert_map, num_local: int, device: torch.device) -> None:
    """What can be checked of an expert map without reading it (its values: :func:`run_fused_moe`)."""
    if not isinstance(expert_map, torch.Tensor):
        raise ValueError(f"expert_map: expected a torch.Tensor, got {type(expert_map).__name__}")
    if expert_map.dtype.is_floating_point or expert_map.dtype.is_complex or expert_map.dtype == torch.bool:
        raise ValueError(f"expert_map: expected an integer dtype, got {expert_map.dtype}")
    if expert_map.dim() != 1 or expert_map.shape[0] < num_local:
        raise ValueError(
            f"expert_map: expected shape [E_global] with E_global >= {num_local} (the experts of w13), "
            f"got {tuple(expert_map.shape)}"
        )
    if expert_map.device != device:
        raise ValueError(f"expert_map is on {expert_map.device} but x is on {device}")


def _local_ids(topk_ids: torch.Tensor, expert_map: torch.Tensor, num_local: int) -> torch.Tensor:
    """Global ``topk_ids`` -> indices in ``w13`` / ``w2`` through ``expert_map``; -1 for experts not on this
    rank and for ids or map values out of range (unchecked on a GPU), whose slots :func:`_align` drops."""
    ids = topk_ids.long()
    local = expert_map.long()[ids.clamp(0, expert_map.shape[0] - 1)]
    keep = (ids >= 0) & (ids < expert_map.shape[0]) & (local >= 0) & (local < num_local)
    return torch.where(keep, local, -1)


def _on_triton(x: torch.Tensor, backend: str) -> bool:
    """Whether fused_moe's activation and combine run as Triton kernels (else in torch): on CUDA tensors
    unless the reference is asked for, and on any device with ``backend="triton"``."""
    requested = requested_backend(backend)
    if requested == "triton":
        return True
    return requested != "reference" and x.device.type == "cuda" and backend_unavailable("triton") is None


def run_fused_moe(
    x,
    w13,
    w13_bias,
    w2,
    w2_bias,
    topk_weights,
    topk_ids,
    expert_map,
    activation: _moe_layer.Activation,
    act: ActScheme | None,
    w13_act_scale: torch.Tensor | None,
    w2_act_scale: torch.Tensor | None,
    block_m: int | None,
    backend: str,
):
    """What :func:`fused_moe` runs once its arguments are checked (``torch.ops.humming.fused_moe`` too);
    the biases are passed apart from the weights, as the ops take them. Checks the ids and the expert map of
    CPU tensors here, where they are data. A static scale quantizes its GEMM's input beforehand (the
    Triton quantizer on the Triton path, else the reference)."""
    e, _, k = w13.shape
    if expert_map is None:
        _check_range("topk_ids", topk_ids, 0, e)
        ids = topk_ids
    else:
        _check_range("topk_ids", topk_ids, 0, expert_map.shape[0])
        _check_range("expert_map", expert_map, -1, e)
        ids = _local_ids(topk_ids, expert_map, e)
    if x.shape[0] == 0:
        return torch.empty(0, k, dtype=x.dtype, device=x.device)
    block_m = default_block_m(topk_ids.numel(), e) if block_m is None else block_m
    routing = _align(ids, e, block_m)
    on_triton = _on_triton(x, backend)
    quant = "triton" if on_triton else "reference"
    static = lambda v, scale: v if scale is None else ops.quantize_activation(v, act, scale=scale, backend=quant)
    # w13 reads each routed row's token through the index (padding rows read zeros: finite, then dropped)
    rows = routing.token_rows(topk_ids.shape[1])
    h = run_grouped(static(x, w13_act_scale), w13, routing.expert_ids, block_m, w13_bias, act, x.dtype, backend, rows)
    if on_triton:
        kernels = importlib.import_module("humming.triton_kernels.moe_layer")
        # w2's quantization in the activation pass, where its scales are per token or per group
        fuse = act is not None and w2_act_scale is None and kernels.act_unsupported(act) is None
        hidden = kernels.activate(h, activation, act if fuse else None, routing.num_rows)
        hidden = static(hidden, w2_act_scale)
        y = run_grouped(hidden, w2, routing.expert_ids, block_m, w2_bias, act, x.dtype, backend)
        return kernels.combine(y, routing.slot_rows, topk_weights, x.dtype)
    hidden = static(_moe_layer.activate(h, activation, x.dtype), w2_act_scale)
    y = run_grouped(hidden, w2, routing.expert_ids, block_m, w2_bias, act, x.dtype, backend)
    return _moe_layer.combine(y, routing.slot_rows, topk_weights, x.dtype)


def _fused_moe_op(x, topk_weights, topk_ids, *args):
    w13, w13_bias, w2, w2_bias, expert_map = args[:7], args[7], args[8:15], args[15], args[16]
    name, alpha, limit, gate_up_layout, act, w13_act_scale, w2_act_scale, block_m, backend = args[17:]
    w13 = _check_experts("w13", ops.weight_from_args(*w13))
    w2 = _check_experts("w2", ops.weight_from_args(*w2))
    activation, act, scales, block_m = _checked_fused(
        x,
        w13,
        w2,
        topk_weights,
        topk_ids,
        (name, alpha, limit, gate_up_layout),
        expert_map,
        act,
        (w13_act_scale, w2_act_scale),
        block_m or None,
    )
    w13_bias, w2_bias = _expert_bias(w13_bias, w13, "w13_bias"), _expert_bias(w2_bias, w2, "w2_bias")
    args = (topk_weights, topk_ids, expert_map, activation, act, *scales, block_m, backend)
    return run_fused_moe(x, w13, w13_bias, w2, w2_bias, *args)


def _fused_moe_fake(x, topk_weights, topk_ids, *args):
    return torch.empty_like(x)


ops.register("fused_moe", _fused_moe_op, _fused_moe_fake)


def topk_routing(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = False,
    num_groups: int | None = None,
    topk_groups: int | None = None,
    correction_bias: torch.Tensor | None = None,
    routed_scaling: float = 1.0,
    order: str = "score_then_topk",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick each token's ``top_k`` experts from ``router_logits`` and weight them (the routing of Mixtral,
    Qwen-MoE, DeepSeek-V3, Kimi-K2 and gpt-oss; defined step by step in :mod:`humming._routing`).

    Args:
        router_logits: float ``[T, E]``; everything is computed in float32.
        top_k: experts per token.
        scoring: ``"softmax"`` over the experts (Mixtral, Qwen-MoE) or ``"sigmoid"`` of each logit
            (DeepSeek-V3, Kimi-K2).
        renormalize: divide the picked weights by their sum.
        num_groups, topk_groups: grouped top-k (DeepSeek-V3: 8 and 4), both or neither. The experts form
            ``num_groups`` groups of consecutive ids; a group's score is the sum of its two highest ranking
            keys, and only the experts of the ``topk_groups`` best groups can be picked.
        correction_bias: float ``[E]`` added to the scores to rank the experts, not to the weights
            (DeepSeek-V3's ``e_score_correction_bias``).
        routed_scaling: multiplies the weights (after ``renormalize``).
        order: ``"score_then_topk"`` (scores over every expert, then the top k) or ``"topk_then_softmax"``
            (gpt-oss: the k highest logits, then a softmax over those k; softmax scoring, without groups or
            bias).
        backend: ``"auto"`` (the Triton kernel on CUDA tensors, within its limits: E up to 1024 once
            padded to powers of two per group, ``top_k`` up to 32; else the reference), ``"reference"``
            (torch ops, the definition) or ``"triton"``.
    Returns:
        ``(topk_weights float32 [T, top_k], topk_ids int32 [T, top_k])``, best first: what :func:`fused_moe`
        takes. Ties rank the lower expert id first; a NaN ranks below every number. No host sync on any
        backend (CUDA-graph capturable).
    """
    spec = check_routing(
        router_logits,
        top_k,
        scoring,
        renormalize,
        num_groups,
        topk_groups,
        correction_bias,
        routed_scaling,
        order,
        backend,
    )
    if ops.eager(router_logits):
        return route(router_logits, correction_bias, spec, backend)
    return torch.ops.humming.topk_routing(
        router_logits,
        top_k,
        scoring,
        renormalize,
        num_groups,
        topk_groups,
        correction_bias,
        spec.routed_scaling,
        order,
        backend,
    )


def _topk_routing_op(
    router_logits,
    top_k,
    scoring,
    renormalize,
    num_groups=None,
    topk_groups=None,
    correction_bias=None,
    routed_scaling=1.0,
    order="score_then_topk",
    backend="auto",
):  # the schema's defaults too: a Python implementation gets only the arguments a caller passes
    spec = check_routing(
        router_logits,
        top_k,
        scoring,
        renormalize,
        num_groups,
        topk_groups,
        correction_bias,
        routed_scaling,
        order,
        backend,
    )
    return route(router_logits, correction_bias, spec, backend)


def _topk_routing_fake(router_logits, top_k, *args):
    shape = (router_logits.shape[0], top_k)
    return router_logits.new_empty(shape, dtype=torch.float32), router_logits.new_empty(shape, dtype=torch.int32)


ops.register("topk_routing", _topk_routing_op, _topk_routing_fake)

# MoeCall builds on the functions above (it imports them from this module)
from ._moe_call import MoeCall, MoeLaunch  # noqa: E402
