"""``humming.moe.grouped_linear``: the grouped GEMM on the contiguous grouped layout (the module doc of
:mod:`humming.moe`), checked, planned by the dispatcher and launched, gathering token rows through ``rows``."""

from __future__ import annotations

import weakref

import torch

from .. import ops
from ..cuda_kernels.jit import KernelNotReadyError
from ..dispatch.kernels import GROUPED_KERNELS, backend_unavailable
from ..dispatch.plan import plan_grouped, requested_backend, unwarmed_error
from ..dispatch.support import combination_error
from ..ir.activation import ActScheme, QuantizedActivation, get_act_scheme
from ..ir.weight import QuantizedWeight
from ..reference.moe_layer import gather_rows as reference_gather_rows
from ._checks import check_block_m, check_experts, check_out_dtype, check_range, check_rows, check_x, expert_bias
from .align import default_block_m

__all__ = ["copies_on_triton", "gather_rows", "grouped_linear", "grouped_step", "run_gated", "run_grouped"]


def copies_on_triton(device: torch.device) -> bool:
    """Whether :func:`gather_rows` copies tensors of ``device`` in its Triton pass (else in torch)."""
    return device.type == "cuda" and backend_unavailable("triton") is None


def gather_rows(x, rows: torch.Tensor):
    """Token rows copied into grouped order for a kernel that reads grouped rows
    (:func:`humming.reference.moe_layer.gather_rows`): in one Triton pass on CUDA tensors, else in torch."""
    data = x.codes if isinstance(x, QuantizedActivation) else x
    if copies_on_triton(data.device):
        from ..triton_kernels import gather_rows as triton_gather

        return triton_gather.gather_rows(x, rows)
    return reference_gather_rows(x, rows)


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
        block_m: rows per routing block, a positive multiple of 8 (:func:`humming.moe.moe_align`'s).
        bias: ``[E, N]``; defaults to ``qweight.bias``.
        rows: the gather, int32 ``[M_pad]`` on ``x``'s device (:meth:`humming.moe.MoeRouting.token_rows`): output row
            ``r`` is token ``rows[r]``, or a padding row (unspecified) where it is -1; values in ``[-1, T)``,
            checked on CPU only. The Triton kernels, the reference and the CUDA WnA16 GEMM read the tokens
            through it; the CUDA FP8 GEMM gets ``x[rows]`` copied first.
        act, out_dtype, backend: as :func:`humming.linear` (``act`` may be omitted for a quantized ``x``;
            ``out_dtype`` then defaults to bfloat16). Dynamic tensor-wide activation scales span the rows of
            blocks in use (expert id >= 0), or with ``rows`` the ``T`` tokens.
    Returns:
        ``[M_pad, N]`` in ``out_dtype`` (default ``x``'s dtype).
    """
    qweight = check_experts("qweight", qweight)
    bias = qweight.bias if bias is None else bias
    act, bias, out_dtype, block_m = _checked(x, qweight, expert_ids, block_m, bias, rows, act, out_dtype)
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


def _checked(x, qweight: QuantizedWeight, expert_ids, block_m, bias, rows, act, out_dtype):
    """``(act, bias, out_dtype, block_m)`` of a grouped_linear call, every argument checked (the entry point's
    and the custom op's, which may be called directly)."""
    k = qweight.K
    prequantized = isinstance(x, QuantizedActivation)
    if prequantized:
        act = x.checked_scheme(act)
        x_data = x.codes
        if x_data.shape[1] != k:
            raise ValueError(f"x: expected shape [M, {k}] (K of the weight), got {tuple(x_data.shape)}")
        if x_data.device != qweight.device:
            raise ValueError(f"x is on {x_data.device} but the weight is on {qweight.device}; move one with .to()")
    else:
        check_x("x", x, k, qweight.device)
        x_data = x
    block_m = check_block_m(block_m)
    if rows is not None:
        check_rows(rows, x_data.device)
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
    bias = expert_bias(bias, qweight)
    out_dtype = check_out_dtype(out_dtype, torch.bfloat16 if prequantized else x.dtype)
    act = None if act is None else get_act_scheme(act)
    reason = combination_error(qweight.format, act)
    if reason:
        raise ValueError(reason)
    return act, bias, out_dtype, block_m


def takes_blocks_of_8(w13, w2, x: torch.Tensor, act, backend: str) -> bool:
    """Whether both grouped GEMMs of a fused_moe layer run on the CUDA grouped decode kernel (the first the
    dispatcher tries for 16-bit activations on the ``"auto"`` and ``"cuda"`` backends) at routing blocks of 8
    for tokens like ``x`` (its dtype and device): the only grouped kernel that takes them."""
    return _both_run_on("cuda.grouped_decode", 8, w13, w2, x, act, backend)


def takes_fitted_blocks(w13, w2, x: torch.Tensor, act, backend: str) -> bool:
    """Whether both grouped GEMMs of a fused_moe layer run on the grouped sm_90a GEMM (the CUDA kernel the
    dispatcher tries first for 16-bit activations above blocks of 16) for tokens like ``x``: the kernel whose
    token tile is any multiple of 16, so that the routing block can follow the tokens per expert."""
    return _both_run_on("cuda.grouped", 16, w13, w2, x, act, backend)


def _both_run_on(kernel: str, block_m: int, w13, w2, x: torch.Tensor, act, backend: str) -> bool:
    """Whether grouped kernel ``kernel`` takes both GEMMs of a fused_moe layer with 16-bit activations of
    ``x``'s dtype and device (each weight's own K) at routing blocks of ``block_m``."""
    if act is not None or requested_backend(backend) not in ("auto", "cuda"):
        return False
    unsupported = GROUPED_KERNELS[kernel].unsupported
    return all(unsupported(w, None, x.new_empty(0, w.K), block_m) is None for w in (w13, w2))


def layer_block_m(num_slots: int, w13, w2, x: torch.Tensor, act, backend: str) -> int:
    """The routing block a fused_moe layer takes for ``num_slots`` routed slots of tokens like ``x``:
    :func:`humming.moe.default_block_m` for the blocks its grouped GEMMs take."""
    blocks_of_8 = takes_blocks_of_8(w13, w2, x, act, backend)
    return default_block_m(num_slots, w13.num_experts, blocks_of_8, takes_fitted_blocks(w13, w2, x, act, backend))


def run_grouped(
    x, qweight, expert_ids, block_m: int, bias, act: ActScheme | None, out_dtype, backend: str, rows=None
) -> torch.Tensor:
    """What :func:`grouped_linear` runs once its arguments are checked (``torch.ops.humming.grouped_linear``
    too): plan, launch (copying the gathered rows into grouped order for a kernel that does not gather),
    non-finite rows. Checks the expert ids and rows of CPU tensors here, where they are data (not while
    ``torch.compile`` traces). ``x`` may also be a :class:`QuantizedActivation` of scheme ``act``
    (:func:`humming.moe.fused_moe` quantizes the input of ``w2`` in its activation pass)."""
    check_range("expert_ids", expert_ids, -1, qweight.num_experts)
    prequantized = isinstance(x, QuantizedActivation)
    x_data = x.codes if prequantized else x
    if rows is not None:
        check_range("rows", rows, -1, x_data.shape[0])
    m_pad = None if rows is None else rows.shape[0]
    plan = plan_grouped(qweight, act, x_data, block_m, backend, m_pad)
    kernel = GROUPED_KERNELS[plan.kernel]
    gather = {}
    if rows is not None and kernel.gathers(qweight, act, x_data.shape[0], m_pad):
        gather = {"rows": rows}
    elif rows is not None:
        # Copied into grouped order. Exact for the kernels that do not gather (CUDA's FP8 GEMM): they take
        # row-wise activation scales only, for which quantizing the gathered rows equals gathering the
        # quantized tokens.
        x = gather_rows(x, rows)
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


def run_gated(x, w13, expert_ids, block_m: int, bias, activation, out_dtype, backend: str, rows) -> torch.Tensor | None:
    """fused_moe's first GEMM with its gated ``activation`` in the kernel's epilogue: the 16-bit tokens ``x``
    through ``rows`` -> the activated ``[M_pad, I]``, where the grouped kernel the dispatcher plans for w13
    has that epilogue (:attr:`humming.kernel.Kernel.gates`); ``None`` where it has not (the caller then runs
    :func:`run_grouped` and the activation pass)."""
    m_pad = rows.shape[0]
    plan = plan_grouped(w13, None, x, block_m, backend, m_pad)
    kernel = GROUPED_KERNELS[plan.kernel]
    if not kernel.gates(w13, x, activation):
        return None
    check_range("expert_ids", expert_ids, -1, w13.num_experts)
    check_range("rows", rows, -1, x.shape[0])
    if not kernel.gathers(w13, None, x.shape[0], m_pad):  # copied into grouped order (see run_grouped)
        x, rows = gather_rows(x, rows), None
    try:
        return kernel.run(x, w13, expert_ids, block_m, bias, None, out_dtype, plan.tuning, rows=rows, gated=activation)
    except KernelNotReadyError as err:  # during a capture: name the warmup call this one needed
        raise unwarmed_error(err, w13, None, x, backend, block_m, m_pad) from None


def grouped_step(
    qweight,
    x,
    m_pad: int | None,
    block_m: int,
    bias_dtype,
    out_dtype,
    backend: str,
    gated=None,
    programmatic=True,
    act: ActScheme | None = None,
):
    """:func:`run_grouped` (``gated``: :func:`run_gated`) made ready, for every call shaped as ``x`` (dtype,
    shape, strides, alignment, device) with ``m_pad`` grouped rows gathered through ``rows`` (``None``: ``x``'s
    grouped rows) and a bias of ``bias_dtype``: ``(x, expert_ids, bias, rows) -> out`` (the expert ids and rows
    are the alignment's, in range; ``rows`` ``None`` without a gather). With ``gated``: ``None`` where the
    planned kernel has no such epilogue. ``act``: activations of that scheme (``x`` 16-bit, quantized by the
    step, or a :class:`QuantizedActivation` of it, as every call passes them), prepared where the planned
    kernel's launcher takes them, else ``None`` (the caller runs :func:`run_grouped`). ``programmatic``: a CUDA
    kernel's programmatic launch (it waits for the kernel before it first), else a plain one. Holds the weight
    weakly."""
    x_data = x.codes if isinstance(x, QuantizedActivation) else x
    plan = plan_grouped(qweight, act, x_data, block_m, backend, m_pad)
    kernel = GROUPED_KERNELS[plan.kernel]
    if gated is not None and not kernel.gates(qweight, x, gated):
        return None
    weight = weakref.ref(qweight)
    gather = m_pad is not None
    gathers = gather and kernel.gathers(qweight, act, x_data.shape[0], m_pad)
    if act is not None and gather and not gathers:
        return None
    grouped_x = x if gathers or not gather else x.new_empty(m_pad, x.shape[1])  # what the kernel reads
    launch = None
    if kernel.launcher is not None:
        rows = grouped_x.shape[0] if m_pad is None else m_pad
        launch = kernel.launcher(
            grouped_x, qweight, act, block_m, rows, bias_dtype, out_dtype, plan.tuning, gathers, gated, programmatic
        )
    if launch is None and act is not None:
        return None
    if launch is None:
        options = {} if gated is None else {"gated": gated}

        def launch(x, expert_ids, bias, rows):
            row_index = {"rows": rows} if gathers else {}
            return kernel.run(
                x, weight(), expert_ids, block_m, bias, None, out_dtype, plan.tuning, **row_index, **options
            )

    def run(x, expert_ids, bias, rows):
        try:
            if gather and not gathers:  # copied into grouped order (see run_grouped)
                return launch(gather_rows(x, rows), expert_ids, bias, None)
            return launch(x, expert_ids, bias, rows)
        except KernelNotReadyError as err:  # during a capture: name the warmup call this one needed
            raise unwarmed_error(err, weight(), act, getattr(x, "codes", x), backend, block_m, m_pad) from None

    return run


def _grouped_op(x, x_scales, x_global_scale, expert_ids, block_m, rows, *args):
    *weight, bias, act, out_dtype, backend = args
    qweight = check_experts("qweight", ops.weight_from_args(*weight))
    if x_scales is not None:
        if act is None:
            raise ValueError("act: quantized activations (x_scales given) need the scheme's name")
        x = QuantizedActivation(act, x, x_scales, x_global_scale)
    act, bias, out_dtype, block_m = _checked(x, qweight, expert_ids, block_m, bias, rows, act, out_dtype)
    return run_grouped(x, qweight, expert_ids, block_m, bias, act, out_dtype, backend, rows)


def _grouped_fake(x, x_scales, x_global_scale, expert_ids, block_m, rows, qweight, *args):
    m_pad = x.shape[0] if rows is None else rows.shape[0]
    return x.new_empty((m_pad, qweight.shape[-2]), dtype=args[-2])


ops.register("grouped_linear", _grouped_op, _grouped_fake)
