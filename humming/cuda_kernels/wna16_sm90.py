"""``cuda.wna16_sm90``: the Hopper weight-only GEMM for M > 32 (``include/humming/gemm_sm90.cuh``, sm_90a):
TMA + mbarrier pipeline, producer / consumer warpgroups with setmaxnreg, wgmma with the dequantized weights
as the register A operand; int4 / uint4 / int8 / uint8 weights and MXFP4 with bf16 activations (the decode
kernel's layout, any N % 16 == 0), and those weights with per-token / per-tensor e4m3 activations (their
values in x's 16-bit dtype, the scales in the epilogue). Its grouped variant (the same kernel with a
compile-time flag) runs in :mod:`.grouped`.

This module holds the support checks and the kernel object the dispatcher lists (:data:`KERNEL`); tuning,
specs and launch live in ``_gemm_sm90``, what it shares with :mod:`.wna16_decode` in ``_wna16``.
"""

from __future__ import annotations

import torch

from ..device import device_index, device_info
from . import _wna16
from ._gemm_sm90 import (
    GEMM_CCS,
    GEMM_MIN_M,
    GROUPED_BMS,
    GemmLaunch,
    GemmTuning,
    default_gemm_tuning,
    default_grouped_tuning,
    gemm_call_spec,
    gemm_spec,
    gemm_unsupported,
    grouped_unsupported,
    reserve_gemm_workspace,
    run_gemm,
    run_grouped_gemm,
)
from ._layout import weight_unsupported

__all__ = [
    "GEMM_CCS",
    "GEMM_MIN_M",
    "GROUPED_BMS",
    "KERNEL",
    "GemmLaunch",
    "GemmTuning",
    "default_gemm_tuning",
    "default_grouped_tuning",
    "gemm_call_spec",
    "gemm_spec",
    "gemm_unsupported",
    "grouped_unsupported",
    "run_gemm",
    "run_grouped_gemm",
    "unsupported",
]


def _gemm_unsupported(qweight, x: torch.Tensor, cc: tuple[int, int]) -> str | None:
    """The GEMM's own checks, after those the WnA16 kernels share."""
    reason = weight_unsupported(qweight, x)
    if reason is None and x.shape[0] <= GEMM_MIN_M:
        reason = f"the sm_90a GEMM takes M > {GEMM_MIN_M} (smaller M: the decode kernel)"
    return reason or gemm_unsupported(qweight, x, cc)


def unsupported(qweight, act, x) -> str | None:
    """``None`` when the sm_90a GEMM runs ``linear(x, qweight, act=act)`` (the backend running here), else
    why not. ``x``: the 2-D activation, or a ``QuantizedActivation``'s codes."""
    return _wna16.unsupported(qweight, act, x, _gemm_unsupported)


def _tuning(qweight, act, x) -> GemmTuning:
    """:func:`default_gemm_tuning` of ``x [M, K]`` (the activation, or a QuantizedActivation's codes)."""
    prep, x = _wna16.prepare(qweight), getattr(x, "codes", x)
    return default_gemm_tuning(x.shape[0], prep.n, prep.k, prep.layout, device_info(device_index(x.device)).limits)


def _warmup_jobs(qweight, act, m, *, act_dtype, out_dtype, bias_dtype, device, block_m=None) -> list:
    from . import act_quant
    from .jit import device_arch

    x = torch.empty(m, qweight.K, dtype=act_dtype, device=f"cuda:{device}")
    bias = None if bias_dtype is None else torch.empty(0, dtype=bias_dtype)
    prep, tuning = _wna16.prepare(qweight), _tuning(qweight, act, x)
    spec = gemm_call_spec(prep, x, bias, out_dtype, tuning)
    reserve_gemm_workspace(m, prep.n, prep.k, tuning, prep.layout, device)
    jobs = [(spec, device_arch(spec, device_info(device).capability))]
    return jobs if act is None else jobs + act_quant.warmup_jobs(x, act, values=True)  # the fp8-values route


#: ``cuda.wna16_sm90``: weight-only GEMM for M > 32 on Hopper (and the fp8-values route of integer weights).
KERNEL = _wna16.kernel("cuda.wna16_sm90", unsupported, GemmLaunch, _tuning, _warmup_jobs)
