"""``triton.grouped``: the MoE grouped GEMM of ``humming.moe.grouped_linear`` on the Triton kernels, the dense
GEMMs with an expert-id path: :func:`.wna16.grouped_linear` for 16-bit activations,
:func:`.scaled_mm.grouped_linear` (imported on first use) for every activation scheme of the dense scaled
GEMM. Both read token rows through a row index (``rows``), so the routed activations are never copied into
grouped order."""

from __future__ import annotations

import importlib

import torch

from ..ir.weight import QuantizedWeight
from ..kernel import Kernel, always_gathers
from . import wna16
from ._support import device_unsupported, unavailable

__all__ = ["KERNEL", "grouped_linear", "grouped_unsupported"]


def _scaled_mm():
    """The quantized-activation GEMM module, imported on first use: weight-only callers never import it."""
    return importlib.import_module("humming.triton_kernels.scaled_mm")


def grouped_unsupported(qweight: QuantizedWeight, act, x: torch.Tensor, block_m: int) -> str | None:
    """``None`` if :func:`grouped_linear` runs this MoE call, else the reason."""
    reason = device_unsupported(x)
    if reason is not None:
        return reason
    if act is None:
        return wna16.grouped_unsupported(qweight, x, block_m)
    return _scaled_mm().grouped_unsupported(qweight, act, x, block_m)


def grouped_linear(
    x, qweight: QuantizedWeight, expert_ids, block_m: int, bias, act, out_dtype, rows=None
) -> torch.Tensor:
    """MoE grouped GEMM ``[M_pad, K] -> [M_pad, N]`` (``humming.moe.grouped_linear``); ``x`` may be a
    QuantizedActivation (the scaled GEMM then skips its quantization pass); with ``rows`` (int32 ``[M_pad]``)
    ``x`` is ``[T, K]`` and row ``r`` reads ``x[rows[r]]``."""
    reason = grouped_unsupported(qweight, act, getattr(x, "codes", x), block_m)
    if reason:
        raise ValueError(f"triton: {reason}")
    if act is not None:
        return _scaled_mm().grouped_linear(x, qweight, expert_ids, block_m, bias, act, out_dtype, rows=rows)
    return wna16.grouped_linear(x, qweight, expert_ids, block_m, bias, out_dtype, rows=rows)


def _run(x, qweight, expert_ids, block_m, bias, act, out_dtype, tuning, rows=None):
    return grouped_linear(x, qweight, expert_ids, block_m, bias, act, out_dtype, rows=rows)


def _launcher(x, qweight, act, block_m, m_pad, bias_dtype, out_dtype, tuning, gather, gated=None, programmatic=True):
    """:attr:`humming.kernel.Kernel.launcher`: the prepared grouped call of the WnA16 GEMM for 16-bit activations
    (:func:`.wna16.grouped_launcher`), of the scaled GEMM for quantized ones (:func:`.scaled_mm.grouped_launcher`);
    ``None`` with a gated epilogue, which these kernels do not have."""
    if gated is not None:
        return None
    if act is None:
        return wna16.grouped_launcher(x, qweight, block_m, m_pad, out_dtype)
    return _scaled_mm().grouped_launcher(x, qweight, act, block_m, m_pad, out_dtype)


#: ``triton.grouped``: every weight format (WnA16) and every activation scheme of the scaled GEMM, gathering
#: token rows in the kernel.
KERNEL = Kernel(
    "triton.grouped",
    "triton",
    "ir",
    lambda qweight, act, x, block_m: unavailable() or grouped_unsupported(qweight, act, x, block_m),
    _run,
    gathers=always_gathers,
    launcher=_launcher,
)
