"""The reference backend: the torch definitions every fast kernel is tested against, on any device.

- :mod:`.gemm`: the dense GEMM of ``humming.linear`` (dequantize, then one float32 matmul);
- :mod:`.grouped`: the grouped GEMM of ``humming.moe.grouped_linear`` (one expert at a time);
- :mod:`.moe_layer`: the steps of ``humming.moe.fused_moe`` around its GEMMs (the gather of token rows, the
  gated activation, the weighted combine);
- :mod:`.routing`: the top-k expert routing of ``humming.moe.topk_routing``;
- :mod:`.align`: the grouping of routed slots by expert of ``humming.moe.moe_align``;
- :mod:`.norm`: the RMSNorm of ``humming.rmsnorm``.

The number formats define themselves in the IR (``humming.dequantize``, ``humming.quantize_activation``).
This wing imports only the IR (and the deterministic-mode flag); the kernels import from it the definitions
they are the twins of.
"""

from __future__ import annotations

from .gemm import linear
from .grouped import grouped_linear
from .norm import rmsnorm
from .routing import topk_routing

__all__ = ["grouped_linear", "linear", "rmsnorm", "topk_routing", "unavailable"]


def unavailable() -> None:
    """The reference runs wherever torch does: never a reason it cannot."""
    return None
