"""``cuda.grouped``: the MoE grouped GEMM of ``humming.moe.grouped_linear`` on the CUDA kernels' grouped
variants: the sm_90a WnA16 GEMM (:mod:`.wna16_sm90`) for 16-bit activations (int4 / uint4 / int8 / uint8
experts, and MXFP4 ones with bf16 activations; token tiles of 16 to 256 rows dividing ``block_m``, each
reading its segment's expert id, skipping -1 segments, offsetting its weight tiles; token rows read in place
through ``rows``; fused_moe's gated activation of w13 in its epilogue); the FP8 GEMM (:mod:`.fp8_gemm`) for
e4m3 activations (e4m3 and int4 experts), which reads grouped rows (the caller copies a gather into grouped
order for it)."""

from __future__ import annotations

import weakref

import torch

from ..device import device_index, device_info, device_limits
from ..kernel import Kernel, LaunchesByWeight
from . import _gemm_sm90, _wna16, fp8_gemm
from ._layout import DTYPE_CODE, GATED_ACTS, aligned_rows, tile_group, weight_layout, weight_unsupported
from ._support import runtime_unavailable

__all__ = [
    "COPY_FROM_TOKENS",
    "KERNEL",
    "gated_unsupported",
    "gathers",
    "grouped_linear",
    "grouped_unsupported",
    "launcher",
]

#: The grouped WnA16 GEMM's launches made ready, per weight and kind of call (shape, dtypes, gather, gate).
_launches = LaunchesByWeight()


def grouped_unsupported(qweight, act, x: torch.Tensor, block_m: int) -> str | None:
    """``None`` when a grouped sm_90a GEMM runs ``grouped_linear(x, qweight, ..., block_m, act=act)``, else
    why not: the WnA16 GEMM for ``act=None``, the FP8 GEMM for e4m3 activations. ``x`` is the grouped
    activation ``[M_pad, K]`` (its dtype, device and alignment matter)."""
    if act is not None:
        return fp8_gemm.grouped_unsupported(qweight, act, x, block_m)
    if x.device.type != "cuda":
        return f"x is on {x.device}, not a CUDA device"
    if qweight.num_experts is None:
        return "the grouped CUDA GEMM needs expert-stacked weights [E, N, K]"
    cc = device_info(x.device).capability
    return weight_unsupported(qweight, x) or _gemm_sm90.grouped_unsupported(qweight, x, block_m, cc)


def grouped_linear(
    x: torch.Tensor,
    qweight,
    expert_ids: torch.Tensor,
    block_m: int,
    bias: torch.Tensor | None,
    act,
    out_dtype: torch.dtype,
    rows: torch.Tensor | None = None,
    gated=None,
    tuning=None,
) -> torch.Tensor:
    """``x [M_pad, K]`` grouped by expert -> ``[M_pad, N]`` of ``out_dtype``: row ``r`` is ``x[r] @
    dequantize(qweight)[e]^T + bias[e]`` with ``e = expert_ids[r // block_m]`` (int32, ``M_pad // block_m``
    entries); segments whose id is -1 are skipped (their rows unspecified). Ids outside [-1, E) are not
    checked (that would need a host sync) and fault. ``bias`` is ``[E, N]`` or ``None``. With ``act``, ``x``
    may be a ``QuantizedActivation`` of that scheme (the FP8 GEMM then skips its quantization pass).
    ``rows`` (16-bit activations only): int32 ``[M_pad]``, grouped row ``r`` is token ``rows[r]`` of ``x
    [T, K]`` (-1: padding), read in place; values are not checked on the GPU. ``gated``: fused_moe's
    activation (a ``humming.reference.moe_layer.Activation``; ``qweight`` is then its w13, see
    :func:`gated_unsupported`): the result is the activation of each row's gate and up, ``[M_pad, N / 2]``.
    ``tuning``: the kernel's (a ``GemmTuning``, with ``act`` an ``Fp8Tuning``), or ``None`` for its heuristic's."""
    codes = getattr(x, "codes", x)
    reason = grouped_unsupported(qweight, act, codes, block_m)
    if reason is not None:
        raise ValueError(f"humming CUDA backend: {reason}")
    if rows is not None and act is not None:
        raise ValueError("rows: the grouped FP8 GEMM reads grouped rows (copy the tokens into grouped order first)")
    m = codes.shape[0] if rows is None else rows.shape[0]
    e, n, device = qweight.num_experts, qweight.N, codes.device
    if rows is not None and (rows.dtype != torch.int32 or rows.dim() != 1 or rows.device != device):
        raise ValueError(
            f"rows: expected int32 [M_pad] on {device}, got {rows.dtype} {tuple(rows.shape)} on {rows.device}"
        )
    if m % block_m or expert_ids.shape != (m // block_m,):
        raise ValueError(f"expert_ids: expected shape ({m // block_m},) for M_pad={m}, block_m={block_m}")
    if expert_ids.dtype != torch.int32 or expert_ids.device != device:
        raise ValueError(f"expert_ids: expected int32 on {device}, got {expert_ids.dtype} on {expert_ids.device}")
    if bias is not None and (tuple(bias.shape) != (e, n) or bias.device != device):
        raise ValueError(f"bias: expected shape ({e}, {n}) on {device}, got {tuple(bias.shape)} on {bias.device}")
    bias = bias.contiguous() if bias is not None else None
    if act is not None:
        return fp8_gemm.run_grouped(fp8_gemm.prepare(qweight), x, act, expert_ids, block_m, bias, out_dtype, tuning)
    if gated is not None and (reason := gated_unsupported(qweight, gated)) is not None:
        raise ValueError(f"humming CUDA backend: {reason}")
    prep = _wna16.prepare(qweight) if gated is None else _wna16.prepare_gate_up(qweight, gated.gate_up_layout)
    rows = None if rows is None else rows.contiguous()
    ids = expert_ids.contiguous()
    kept = lambda key, make: _launches.get(qweight, key, make)
    return _gemm_sm90.run_grouped_gemm(
        prep, x, ids, block_m, bias, out_dtype, tuning, rows=rows, gated=gated, kept=kept
    )


def launcher(
    x,
    qweight,
    act,
    block_m: int,
    m_pad: int,
    bias_dtype,
    out_dtype,
    tuning,
    gather: bool,
    gated=None,
    programmatic=True,
):
    """The grouped WnA16 GEMM's :attr:`humming.kernel.Kernel.launcher`: ``(x, expert_ids, bias, rows) -> out``
    for every call of :func:`grouped_linear` shaped as this one (``x``'s dtype, shape, strides and alignment,
    ``m_pad`` grouped rows, gathering or not, gated or not, a bias of ``bias_dtype``), checked once, its launch
    made ready; ``None`` for activation schemes (the FP8 GEMM: ``run`` is called). ``expert_ids`` and ``rows``
    contiguous, ``bias`` contiguous or ``None``."""
    if act is not None:
        return None
    reason = grouped_unsupported(qweight, None, x, block_m)
    if reason is None and gated is not None:
        reason = gated_unsupported(qweight, gated)
    if reason is not None:
        raise ValueError(f"humming CUDA backend: {reason}")
    if gather and x.shape[0] == 0:  # no token to read: the general path (the weight held weakly, as launches are)
        weight = weakref.ref(qweight)
        return lambda x, ids, bias, rows: grouped_linear(x, weight(), ids, block_m, bias, None, out_dtype, rows, gated)
    prep = _wna16.prepare(qweight) if gated is None else _wna16.prepare_gate_up(qweight, gated.gate_up_layout)
    if tuning is not None and block_m % tuning.bm:
        raise ValueError(f"tuning: the token tile bm={tuning.bm} must divide block_m={block_m}")
    aligned = aligned_rows(x)  # the rows the kernel reads (a copy of unaligned ones)
    copy, stride, device = aligned is not x, aligned.stride(0), device_index(x.device)
    kind = (bias_dtype, out_dtype, tuning, device, block_m, gather, gated)
    make = lambda: _gemm_sm90.grouped_launch(prep, m_pad, x.dtype, stride, *kind, programmatic)
    # run_grouped_gemm's key (the calls of both paths share a launch), plain launches apart
    key = (m_pad, x.dtype, stride, *kind) + (() if programmatic else ("plain",))
    launch = _launches.get(qweight, key, make)

    def run(x, expert_ids, bias, rows):
        bias = None if bias is None else bias.contiguous()
        return launch(aligned_rows(x) if copy else x, bias, None, expert_ids, rows=rows)

    return run


#: Tokens from which the WnA16 GEMM reads fused_moe's w13 input copied into grouped order (the copy one
#: Triton pass, the kernel then reading rows by TMA) instead of gathering it in its producer: the gathering
#: producer's per-row copies cost more than the copy from there (bench/results/h200/grouped_w13_feed.json,
#: the ``copied`` rows against ``gather``).
COPY_FROM_TOKENS = 1024


def gathers(qweight, act, tokens: int, m_pad: int) -> bool:
    """:attr:`humming.kernel.Kernel.gathers`: the WnA16 GEMM gathers token rows below
    :data:`COPY_FROM_TOKENS` tokens; the FP8 GEMM reads grouped rows only."""
    return act is None and tokens < COPY_FROM_TOKENS


def gated_unsupported(qweight, activation) -> str | None:
    """``None`` when the grouped WnA16 GEMM, given that it runs the call, applies ``activation`` to w13 =
    ``qweight`` in its epilogue: a gated activation it has, and scales per row or per tensor along N (w13's
    rows are reordered, :func:`~._layout.gate_up_rows`)."""
    if activation.name not in GATED_ACTS:
        return f"the grouped GEMM's epilogue has no {activation.name!r} activation"
    if qweight.N % 128:
        return f"the gated epilogue reorders w13's rows in blocks of 128: it needs 2I % 128 == 0, got {qweight.N}"
    if qweight.group_shape[0] not in (1, -1):
        return f"w13's rows are reordered for the gated epilogue: its scales must be per row, not {qweight.group_shape}"
    return None


def grouped_jobs(
    qw, m_values, block_ms, act_dtype, out_dtype, bias_dtype, device: int, cc, gather=None, gated=None
) -> list:
    """The ``(spec, arch)`` of the grouped WnA16 GEMM for each ``block_m`` and grouped row count ``m``, reading
    grouped rows (``gather`` False), gathering token rows (True: fused_moe's first GEMM below
    :data:`COPY_FROM_TOKENS` tokens) or both (``None``); ``gated``: the variant with fused_moe's activation of
    w13 = ``qw`` in the epilogue."""
    from .jit import device_arch

    jobs, gate = [], None if gated is None else gated.name
    for block_m in block_ms:
        x = torch.empty(block_m, qw.K, dtype=act_dtype, device=f"cuda:{device}")
        if grouped_unsupported(qw, None, x, block_m) is not None:
            continue
        layout = weight_layout(qw)  # not prepare: fused_moe's w13 is prepared in another row order
        smem = device_limits(device).smem_per_block
        codes = DTYPE_CODE[act_dtype], DTYPE_CODE[out_dtype], DTYPE_CODE[bias_dtype or act_dtype]
        for m in m_values:
            tuning = _gemm_sm90.default_grouped_tuning(block_m, m, qw.num_experts, layout, smem)
            for gathering in (False, True) if gather is None else (gather,):
                spec = _gemm_sm90.gemm_spec(
                    layout, *codes, tuning, grouped=True, gather=gathering, gated=gate, tile_group=tile_group(qw.N)
                )
                jobs.append((spec, device_arch(spec, cc)))
    return jobs


def _warmup_jobs(
    qweight, act, m, *, act_dtype, out_dtype, bias_dtype, device, block_m, gather=None, gated=None
) -> list:
    """The compile jobs of ``m`` grouped rows in routing blocks of ``block_m`` (``gather``, ``gated``: as
    :func:`grouped_jobs`; the FP8 GEMM reads grouped rows and has no gated epilogue)."""
    info = device_info(device)
    if act is not None:
        return fp8_gemm.grouped_warmup_jobs(qweight, act, (m,), (block_m,), out_dtype, bias_dtype, info.limits)
    args = act_dtype, out_dtype, bias_dtype, device, info.capability, gather, gated
    return grouped_jobs(qweight, (m,), (block_m,), *args)


def _run(x, qweight, expert_ids, block_m, bias, act, out_dtype, tuning, rows=None, gated=None):
    return grouped_linear(x, qweight, expert_ids, block_m, bias, act, out_dtype, rows, gated, tuning)


#: ``cuda.grouped``: the grouped sm_90a GEMMs (WnA16, gathering token rows; FP8 with e4m3 activations).
KERNEL = Kernel(
    "cuda.grouped",
    "cuda",
    "fragment",
    lambda qweight, act, x, block_m: runtime_unavailable() or grouped_unsupported(qweight, act, x, block_m),
    _run,
    warmup_jobs=_warmup_jobs,
    prepare=lambda qweight, act=None: _wna16.prepare(qweight) if act is None else fp8_gemm.prepare(qweight),
    gathers=gathers,
    gates=lambda qweight, x, activation: gated_unsupported(qweight, activation) is None,
    launcher=launcher,
)
