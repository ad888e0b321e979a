"""The torch dtypes humming takes, named once: every entry point and kernel checks against these."""

from __future__ import annotations

import torch

__all__ = ["DEQUANTIZED_DTYPES", "FLOAT_DTYPES", "HALF_DTYPES"]

#: The activations and outputs of the entry points (float32 on the reference backend and in the passes that
#: compute in float32).
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: The 16-bit activations the tensor-core kernels read.
HALF_DTYPES = (torch.float16, torch.bfloat16)
#: The dtypes :func:`humming.dequantize` (and :func:`humming.dequantize_activation`) round their values to.
DEQUANTIZED_DTYPES = (*FLOAT_DTYPES, torch.float64)
