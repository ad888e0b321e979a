"""``humming.moe``: mixture-of-experts entry points on expert-stacked weights ``[E, N, K]``.

Layout: the "contiguous grouped" layout of DeepGEMM and vLLM's fused_moe. The ``T * topk`` routed slots
(slot ``t * topk + j`` = token ``t``'s ``j``-th expert) are sorted by expert into one ``[M_pad, K]`` matrix;
each expert's segment is padded to a multiple of ``block_m`` rows, so every ``block_m`` block of rows has
one expert (``expert_ids``) and a kernel tile reads one expert's weights and contiguous activations (what
TMA needs). ``M_pad`` is the worst case (:func:`padded_rows`), fixed by ``(T, topk, E, block_m)``, so that
routing never reads anything back to the host and the whole layer can be captured in a CUDA graph; blocks
past the last used one have expert id -1 and kernels skip them.

- :func:`moe_align`: routing ``topk_ids [T, topk]`` -> :class:`MoeRouting` (Triton kernels on CUDA tensors, no
  host sync).
- :func:`grouped_linear`: ``[M_pad, K]`` rows times their block's expert -> ``[M_pad, N]``; with ``rows``
  (:meth:`MoeRouting.token_rows`) the ``[T, K]`` tokens are read through that index instead, so that the
  routed rows are never copied into grouped order.
- :func:`grouped_linear_masked`: the masked layout of DeepEP's low-latency dispatch, ``[E, max_m, K]`` with
  ``masked_m[e]`` valid rows per expert -> ``[E, max_m, N]``, on the same grouped GEMMs.
- :func:`fused_moe`: align, ``w13`` on the gathered tokens, the gated activation (SiLU, GELU, gpt-oss's
  clamped SwiGLU;
  gate and up rows concatenated or interleaved), ``w2``, weighted sum back to tokens; an ``expert_map`` runs
  the experts of one expert-parallel rank.
- :func:`topk_routing`: router logits -> ``(topk_weights, topk_ids)``: softmax or sigmoid scores, DeepSeek-V3's
  grouped top-k and correction bias, gpt-oss's softmax over the top k (a Triton kernel on CUDA tensors).
- :class:`MoeCall`: a fused_moe layer described once, for :func:`humming.warmup` (the kernels a call
  launches, and the call on random inputs).

One module each (:mod:`.align`, :mod:`.grouped`, :mod:`.masked`, :mod:`.fused`, :mod:`.routing`,
:mod:`.call`; argument checks in ``_checks``); the torch definitions of the layer's steps around its GEMMs
and of the routing are in :mod:`humming.reference`.

Each is also a custom op (``torch.ops.humming.*``, :mod:`humming.ops`), which ``torch.compile`` sees as
one node.

Backends: ``"auto"`` tries CUDA, Triton, then the reference (``humming/dispatch/plan.py``). The
reference runs every weight format and ``act`` scheme that :func:`humming.linear` does. The Triton grouped
kernels (the dense WnA16 and scaled GEMMs with an expert-id path) need ``block_m`` a multiple of 16 and run
every WnA16 format (``act=None``) and every weight x activation combination of the dense scaled GEMM:
per-token, per-group, per-tensor (dynamic or static) scales, NVFP4 and MXFP4; both gather token rows in the
kernel. The CUDA backend's grouped sm_90a GEMMs run int4/uint4/int8/uint8 WnA16 (``block_m`` a multiple of
16) and, with ``act="fp8"`` or ``"fp8_g128"``, e4m3 experts (per-channel or 128x128 block scales: the
DeepSeek-V3 recipe), int4 and MXFP4 experts (W4A8); N % 128 == 0. The WnA16 GEMM reads token rows in place
and, in fused_moe, applies the gated activation to w13 in its epilogue; the FP8 GEMM reads grouped rows, so
a gather is copied into grouped order for it first.

A dynamic tensor-wide activation scale (``fp8_tensor``, ``int8_tensor``, NVFP4's global scale) spans the
rows of the blocks in use (expert id >= 0) of a grouped ``x``, and every token of a gathered one (``rows``:
the ``T`` tokens are quantized once, routed or not).
"""

from __future__ import annotations

from ..ir.weight import expert_weight
from ._checks import MAX_BLOCK_M, MAX_EXPERTS
from .align import MoeRouting, default_block_m, moe_align, padded_rows
from .call import MoeCall, MoeLaunch
from .fused import fused_moe
from .grouped import grouped_linear
from .masked import grouped_linear_masked, masked_block_m, masked_expert_ids
from .routing import topk_routing

__all__ = [
    "MAX_BLOCK_M",
    "MAX_EXPERTS",
    "MoeCall",
    "MoeLaunch",
    "MoeRouting",
    "default_block_m",
    "expert_weight",
    "fused_moe",
    "grouped_linear",
    "grouped_linear_masked",
    "masked_block_m",
    "masked_expert_ids",
    "moe_align",
    "padded_rows",
    "topk_routing",
]
