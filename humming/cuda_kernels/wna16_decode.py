"""``cuda.wna16_decode``: the small-M weight-only GEMM (``include/humming/decode.cuh``), M <= 64 on compute
capability 8.0 and newer: int4 / uint4 (+ zero points) / int8 / uint8 weights with per-tensor / per-channel /
group scales, MXFP4, and those weights with per-token / per-tensor e4m3 activations (their values in x's
16-bit dtype, the scales in the epilogue).

Configs come in the three kinds of the house style:

- layout (:class:`~humming.cuda_kernels._layout.WeightLayout`): what the prepared weights are (code
  bits, zero points, scale dtype); fixed by ``prepare_weight``.
- compute: fp32 accumulation of exact integer-times-activation products, scaled per row and 64-column
  chunk in fp32; the same for every tuning.
- tuning (:class:`DecodeTuning`): token tiles, row tiles per warp, warps, loads in flight, split-K or
  stream-K. A tuning change never changes results beyond fp32 summation order.

Stream-K tunings sum shared tiles in an fp32 workspace with atomics (``_decode_launch``); :func:`choose_decode_tuning`
picks stream-K where it balances the last wave.

This module holds the support checks and the kernel object the dispatcher lists (:data:`KERNEL`); the tuning
heuristics live in ``_decode_tuning``, the kernel specs, the stream-K workspaces and the launch in
``_decode_launch``, what it shares with :mod:`.wna16_sm90` in ``_wna16``.
"""

from __future__ import annotations

import torch

from ..device import device_index, device_info
from . import _wna16
from ._decode_launch import (
    DECODE_CCS,
    DECODE_MAX_M,
    DecodeLaunch,
    decode_call_spec,
    decode_spec,
    reserve_workspace,
    run_decode,
    stream_k_grid,
)
from ._decode_tuning import (
    DecodeTuning,
    candidate_tunings,
    choose_decode_tuning,
    default_tuning,
    stream_k_blocks_per_sm,
)
from ._layout import weight_unsupported

__all__ = [
    "DECODE_CCS",
    "DECODE_MAX_M",
    "KERNEL",
    "DecodeLaunch",
    "DecodeTuning",
    "candidate_tunings",
    "choose_decode_tuning",
    "decode_call_spec",
    "decode_spec",
    "decode_unsupported",
    "default_tuning",
    "reserve_workspace",
    "run_decode",
    "stream_k_blocks_per_sm",
    "stream_k_grid",
    "unsupported",
]


def decode_unsupported(qw, x: torch.Tensor) -> str | None:
    """``None`` when the decode kernel runs this call, else why not."""
    reason = weight_unsupported(qw, x)
    if reason is None and x.shape[0] > DECODE_MAX_M:
        reason = f"the decode kernel takes M <= {DECODE_MAX_M}, got M={x.shape[0]}"
    return reason


def unsupported(qweight, act, x) -> str | None:
    """``None`` when the decode kernel runs ``linear(x, qweight, act=act)`` (the backend running here), else
    why not. ``x``: the 2-D activation, or a ``QuantizedActivation``'s codes."""
    return _wna16.unsupported(qweight, act, x, lambda qw, x, cc: decode_unsupported(qw, x))


def _tuning(qweight, act, x) -> DecodeTuning:
    """:func:`default_tuning` of ``x [M, K]`` (the activation, or a QuantizedActivation's codes)."""
    prep, x = _wna16.prepare(qweight), getattr(x, "codes", x)
    return default_tuning(x.shape[0], prep.n, prep.k, prep.layout.bits, device_index(x.device))


def _warmup_jobs(qweight, act, m, *, act_dtype, out_dtype, bias_dtype, device, block_m=None) -> list:
    """The kernel of a call of ``m`` tokens; also sets aside the stream-K workspace it uses, since a CUDA
    graph capture cannot allocate it."""
    from . import act_quant
    from .jit import device_arch

    x = torch.empty(m, qweight.K, dtype=act_dtype, device=f"cuda:{device}")
    tuning = _tuning(qweight, act, x)
    bias = None if bias_dtype is None else torch.empty(0, dtype=bias_dtype)
    spec = decode_call_spec(_wna16.prepare(qweight), x, bias, out_dtype, tuning)
    reserve_workspace(m, qweight.N, tuning, device)
    jobs = [(spec, device_arch(spec, device_info(device).capability))]
    return jobs if act is None else jobs + act_quant.warmup_jobs(x, act, values=True)  # the fp8-values route


#: ``cuda.wna16_decode``: weight-only GEMM for M <= 64 (and the fp8-values route of integer weights).
KERNEL = _wna16.kernel("cuda.wna16_decode", unsupported, DecodeLaunch, _tuning, _warmup_jobs)
