"""What every CUDA kernel object shares (:mod:`humming.kernel`): whether the backend runs here at all, the
device-side half of each kernel's ``unsupported``, and the launchers made ready per weight and call shape."""

from __future__ import annotations

import functools
import weakref

import torch

from ..device import device_info
from ._layout import DTYPE_CODE
from .jit import compiler_unavailable_reason

__all__ = ["cached_launch", "device_unsupported", "runtime_unavailable"]


@functools.cache
def runtime_unavailable() -> str | None:
    """``None`` when the CUDA backend can run here, else why not (NVRTC or cuda-core missing, no GPU...)."""
    reason = compiler_unavailable_reason()
    if reason is not None:
        return reason
    try:
        from cuda.bindings import driver  # noqa: F401
    except Exception as exc:
        return f"cuda.bindings.driver cannot be imported ({type(exc).__name__}: {exc})"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


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


#: Call shapes made ready per weight (a launcher each, :func:`cached_launch`), at most this many: then they
#: start over.
_MAX_LAUNCHERS = 64
_launchers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # weight -> {call key: launcher}


def cached_launch(kernel: str, make_launcher, x: torch.Tensor, qweight, bias, act, out_dtype, tuning) -> torch.Tensor:
    """``kernel``'s launcher for this call shape (``make_launcher(x, qweight, act, bias_dtype, out_dtype,
    tuning)``, a callable ``(x, bias) -> out``), made once per weight and call shape, then called.

    Everything a call does not need its tensors' addresses for (checks, tuning, kernel, grid, parameter
    struct, descriptor encoders) is made once per weight and call shape: kernel, ``act``, x's dtype, shape,
    strides, alignment and device, the bias dtype, ``out_dtype`` and ``tuning``."""
    bias_dtype = None if bias is None else bias.dtype
    key = (kernel, act, x.dtype, x.shape, x.stride(), x.data_ptr() % 16 == 0, x.device, bias_dtype, out_dtype, tuning)
    launchers = _launchers.get(qweight)
    if launchers is None:
        launchers = _launchers[qweight] = {}
    launch = launchers.get(key)
    if launch is None:
        launch = make_launcher(x, qweight, act, bias_dtype, out_dtype, tuning)
        if len(launchers) >= _MAX_LAUNCHERS:
            launchers.clear()
        launchers[key] = launch
    return launch(x, bias)
