"""``humming.warmup``: compile ahead of time every kernel the dispatcher would pick for a set of layers.

For each layer and token count it asks the one decision (:mod:`.plan`) which kernel runs, then makes that
kernel ready: CUDA kernels compile through NVRTC in parallel (and load); Triton kernels compile by running
the call once on random inputs. Serving, and CUDA graph capture, then never compile.
"""

from __future__ import annotations

import torch

from ..ir.activation import get_act_scheme
from ..ir.weight import QuantizedWeight
from .kernels import DENSE_KERNELS, GROUPED_KERNELS
from .plan import plan_grouped, plan_linear

__all__ = ["warmup"]


def warmup(
    layers,
    m_values=(1, 16, 64),
    act=None,
    *,
    act_dtype: torch.dtype = torch.bfloat16,
    out_dtype: torch.dtype | None = None,
    bias_dtype: torch.dtype | None = None,
    block_ms: tuple[int, ...] = (16, 32, 64, 128),
    backend: str = "auto",
    progress: bool = True,
    max_workers: int | None = None,
):
    """Make ready every kernel ``humming.linear`` (dense layers) or ``humming.moe.grouped_linear``
    (expert-stacked layers, once per routing ``block_m`` of ``block_ms``, ``m_values`` read as grouped row
    counts) would run for these layers at the token counts ``m_values``.

    Args:
        layers: ``QuantizedWeight`` objects on one CUDA device.
        act: the activation scheme they run with (``None``: 16-bit activations).
        act_dtype, out_dtype, bias_dtype: what the calls will pass (kernels are specialised on them).
    Returns:
        The CUDA kernels' :class:`~humming.cuda_kernels.WarmupReport` (origin and seconds of each), or
        ``None`` when no CUDA kernel is involved.
    """
    if isinstance(layers, QuantizedWeight) or not hasattr(layers, "__iter__"):
        raise TypeError(f"layers: expected an iterable of QuantizedWeight, got {type(layers).__name__}")
    layers = list(layers)
    for i, qw in enumerate(layers):
        if not isinstance(qw, QuantizedWeight):
            raise TypeError(f"layers[{i}]: expected a QuantizedWeight, got {type(qw).__name__}")
        if qw.device.type != "cuda":
            raise ValueError(f"layers[{i}]: is on {qw.device}; warmup compiles kernels for weights on a GPU")
    devices = {qw.device for qw in layers}
    if len(devices) > 1:
        raise ValueError(f"layers: expected weights on one CUDA device, got {sorted(map(str, devices))}")
    try:
        if isinstance(m_values, str):
            raise TypeError
        m_values = tuple(int(m) for m in m_values)
    except (TypeError, ValueError):
        raise TypeError(f"m_values: expected an iterable of token counts, got {m_values!r}") from None
    if not m_values or any(m < 1 for m in m_values):
        raise ValueError(f"m_values: expected positive token counts, got {m_values}")
    if act_dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"act_dtype: expected float16 or bfloat16, got {act_dtype}")
    act = None if act is None else get_act_scheme(act)
    out_dtype = out_dtype or act_dtype
    if not layers:
        return None
    device = next(iter(devices))
    cuda_jobs = []
    for qw in layers:
        for m in m_values:
            for block_m in block_ms if qw.num_experts is not None else (None,):
                cuda_jobs += _ready(qw, act, m, block_m, act_dtype, out_dtype, bias_dtype, backend, device)
    if not cuda_jobs:
        return None
    from .. import cuda_kernels
    from ..device import device_index

    return cuda_kernels.compile_and_load(cuda_jobs, device_index(device), progress, max_workers)


def _ready(qw, act, m, block_m, act_dtype, out_dtype, bias_dtype, backend, device) -> list:
    """The CUDA compile jobs of the kernel planned for this call; a Triton or reference kernel runs once."""
    rows = m if block_m is None else -(-m // block_m) * block_m
    x = torch.randn(rows, qw.K, dtype=act_dtype, device=device)
    if block_m is None:
        plan = plan_linear(qw, act, x, backend)
    else:
        plan = plan_grouped(qw, act, x, block_m, backend)
    if plan.backend == "cuda":
        from .. import cuda_kernels
        from ..device import device_index

        kernel = "grouped" if block_m is not None else plan.kernel.split(".", 1)[1]
        return cuda_kernels.warmup_jobs(
            kernel,
            qw,
            act,
            rows,
            act_dtype=act_dtype,
            out_dtype=out_dtype,
            bias_dtype=bias_dtype,
            device=device_index(device),
            block_m=block_m,
        )
    if plan.backend == "triton":
        if block_m is None:
            bias = None if bias_dtype is None else torch.randn(qw.N, dtype=bias_dtype, device=device)
            DENSE_KERNELS[plan.kernel].run(x, qw, bias, act, out_dtype, plan.tuning)
        else:
            bias = None if bias_dtype is None else torch.randn(qw.num_experts, qw.N, dtype=bias_dtype, device=device)
            ids = torch.zeros(rows // block_m, dtype=torch.int32, device=device)
            GROUPED_KERNELS[plan.kernel].run(x, qw, ids, block_m, bias, act, out_dtype, plan.tuning)
    return []
