"""What rules out every Triton kernel before its own checks: the backend (a GPU of sm_75 or newer, or the
interpreter) and the device of the call's tensors."""

from __future__ import annotations

import torch

from ..device import device_info
from .interpreter import INTERPRET

__all__ = ["device_unsupported", "unavailable"]

_MIN_CAPABILITY = (7, 5)


def unavailable() -> str | None:
    """``None`` when Triton kernels can run here (a CUDA GPU of sm_75 or newer, or the interpreter), else why
    not."""
    if INTERPRET:
        return None
    if not torch.cuda.is_available():
        return "no CUDA GPU (set TRITON_INTERPRET=1 to run the Triton kernels on the CPU interpreter)"
    cap = device_info().capability
    if cap < _MIN_CAPABILITY:
        return f"GPU compute capability {cap} is below the {_MIN_CAPABILITY} the Triton kernels need"
    return None


def device_unsupported(x: torch.Tensor) -> str | None:
    """``None`` when the Triton kernels run on ``x``'s device, else why not."""
    if x.device.type != "cuda" and not INTERPRET:
        return f"x is on {x.device}; the Triton kernels run on CUDA tensors (or CPU ones under TRITON_INTERPRET=1)"
    return None
