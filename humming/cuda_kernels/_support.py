"""The device-side half of the kernels' ``supports()``: what every CUDA kernel checks the same way."""

from __future__ import annotations

import torch

from ..device import device_info
from ._layout import DTYPE_CODE

__all__ = ["device_unsupported"]


def device_unsupported(
    kernel: str, x: torch.Tensor, ccs: tuple, arch: str, out_dtype: torch.dtype | None
) -> str | None:
    """``None`` when ``x`` is on a CUDA device of a compute capability in ``ccs`` and ``out_dtype`` (if given)
    is one the kernel writes, else the reason (naming ``kernel`` and its ``arch``)."""
    if x.device.type != "cuda":
        return f"x is on {x.device}, not a CUDA device"
    cc = device_info(x.device).capability
    if cc not in ccs:
        return f"the {kernel} is built for compute capabilities {ccs} ({arch}), not {cc}"
    if out_dtype is not None and out_dtype not in DTYPE_CODE:
        return f"the {kernel} writes bfloat16, float16 or float32, not {out_dtype}"
    return None
