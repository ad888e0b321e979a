"""The steps of :func:`humming.moe.fused_moe` around its two grouped GEMMs, in torch: the gather of token
rows into grouped order before them, the activation between them and the weighted combine after. These are
the definitions; :mod:`humming.triton_kernels.moe_layer` holds Triton twins of the last two, tested against
them, and the Triton grouped GEMMs do the gather as they load their activations.

Activations take the ``w13`` output ``h [M, 2I]``, split into ``gate`` and ``up`` by the weights' row layout
(``"concat"``: gate rows ``[0, I)`` then up rows, vLLM's and transformers' convention; ``"interleaved"``:
gate rows even, up rows odd, as gpt-oss checkpoints store them), compute in float32 and round once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .ir.activation import QuantizedActivation

__all__ = [
    "ACTIVATIONS",
    "GATE_UP_LAYOUTS",
    "SWIGLU_OAI_ALPHA",
    "SWIGLU_OAI_LIMIT",
    "Activation",
    "activate",
    "check_activation",
    "combine",
    "gather_rows",
    "split_gate_up",
]

#: ``"silu"``: SwiGLU, ``silu(gate) * up`` (Mixtral, Qwen-MoE, DeepSeek). ``"gelu"``: GeGLU with the exact
#: erf GELU, ``gelu(gate) * up`` (what vLLM's fused MoE runs for ``"gelu"``: its ``gelu_and_mul``).
#: ``"gelu_tanh"``: GeGLU with the tanh approximation (transformers' ``gelu_pytorch_tanh``).
#: ``"swiglu_oai"``: gpt-oss's clamped SwiGLU (vLLM's ``swigluoai``), see :func:`activate`.
ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "swiglu_oai")
GATE_UP_LAYOUTS = ("concat", "interleaved")
#: gpt-oss's defaults (its ``swiglu(x, alpha=1.702, limit=7.0)``; ``swiglu_limit`` in its config).
SWIGLU_OAI_ALPHA = 1.702
SWIGLU_OAI_LIMIT = 7.0


def _number(name: str, value) -> float:
    # a tuple and comparisons: torch 2.9's dynamo traces neither ``int | float`` nor math.isfinite
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -math.inf < value < math.inf:
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Activation:
    """fused_moe's activation, checked (:func:`check_activation`): its name, swiglu_oai's ``alpha`` and
    ``limit`` (``None`` for the others) and the row layout of gate and up."""

    name: str
    alpha: float | None
    limit: float | None
    gate_up_layout: str


def check_activation(activation, alpha, limit, gate_up_layout) -> Activation:
    """Check ``fused_moe``'s activation arguments; ``alpha`` and ``limit`` default to swiglu_oai's and are
    refused with any other activation."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")
    if gate_up_layout not in GATE_UP_LAYOUTS:
        raise ValueError(f"gate_up_layout: expected one of {GATE_UP_LAYOUTS}, got {gate_up_layout!r}")
    if activation != "swiglu_oai":
        given = [name for name, value in (("alpha", alpha), ("limit", limit)) if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: parameters of activation='swiglu_oai', not {activation!r}")
        return Activation(activation, None, None, gate_up_layout)
    alpha = SWIGLU_OAI_ALPHA if alpha is None else _number("alpha", alpha)
    limit = SWIGLU_OAI_LIMIT if limit is None else _number("limit", limit)
    if limit <= 0:
        raise ValueError(f"limit: expected a positive clamp bound, got {limit!r}")
    return Activation(activation, alpha, limit, gate_up_layout)


def split_gate_up(h: torch.Tensor, gate_up_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gate, up)`` views of ``h [M, 2I]``, each ``[M, I]``."""
    if gate_up_layout == "interleaved":
        return h[:, 0::2], h[:, 1::2]
    inter = h.shape[1] // 2
    return h[:, :inter], h[:, inter:]


def activate(h: torch.Tensor, activation: Activation, dtype: torch.dtype) -> torch.Tensor:
    """The input of ``w2``: ``h [M, 2I]`` (any float dtype) activated in float32 -> ``[M, I]`` in ``dtype``."""
    gate, up = split_gate_up(h.float(), activation.gate_up_layout)
    if activation.name == "silu":
        out = F.silu(gate) * up
    elif activation.name == "gelu":
        out = F.gelu(gate) * up
    elif activation.name == "gelu_tanh":
        out = F.gelu(gate, approximate="tanh") * up
    else:
        # gpt-oss's reference, `swiglu` in gpt_oss/torch/model.py (github.com/openai/gpt-oss), on its interleaved
        # rows x[..., ::2] (glu) and x[..., 1::2] (linear); vLLM's swigluoai_and_mul (csrc/activation_kernels.cu)
        # is the same: the gate is clamped from above only, and clamped before its sigmoid; up gets a bias of 1.
        gate = gate.clamp(max=activation.limit)
        up = up.clamp(min=-activation.limit, max=activation.limit)
        out = gate * torch.sigmoid(activation.alpha * gate) * (up + 1)
    return out.to(dtype)


def combine(y: torch.Tensor, slot_rows: torch.Tensor, topk_weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``out[t] = sum_j topk_weights[t, j] * y[slot_rows[t * topk + j]]`` accumulated in float32 over ``j`` in
    order, rounded once to ``dtype``: ``y [M_pad, H]`` the ``w2`` output by grouped row, ``slot_rows`` int32
    ``[T * topk]`` (:class:`humming.moe.MoeRouting`'s), ``topk_weights [T, topk]``. A slot without a row (-1:
    an expert that is not on this rank, or an id out of range) adds nothing: it is masked, not multiplied by
    zero, so that whatever row it would read cannot turn the sum into NaN. One ``[T, H]`` term per slot
    index: the ``[T, topk, H]`` products are never held at once."""
    t, topk = topk_weights.shape
    rows = slot_rows.long().view(t, topk)
    out = torch.zeros(t, y.shape[1], dtype=torch.float32, device=y.device)
    for j in range(topk):
        term = y[rows[:, j].clamp_min(0)].float() * topk_weights[:, j : j + 1].float()
        out += torch.where(rows[:, j : j + 1] >= 0, term, 0.0)
    return out.to(dtype)


def gather_rows(x, rows: torch.Tensor):
    """Token rows in grouped order: row ``r`` of the result is ``x[rows[r]]``, and zeros where ``rows[r]`` is
    -1 (a padding row). ``x``: float ``[T, K]``, or a :class:`QuantizedActivation` of ``T`` rows, whose codes
    and per-row scales are gathered alike (zero bytes for padding rows: codes and scales that decode to 0 and
    finite numbers) and whose per-tensor or static scale and global scale stay as they are.
    ``rows``: int32 ``[M_pad]`` with values in ``[-1, T)``."""
    used = rows[:, None] >= 0
    src = torch.where(rows >= 0, rows, 0).long()
    if not isinstance(x, QuantizedActivation):
        if x.shape[0] == 0:  # every row is padding
            return x.new_zeros(rows.shape[0], x.shape[1])
        return torch.where(used, x[src], 0)
    pick = lambda t: torch.where(used, t.view(torch.uint8)[src], 0).view(t.dtype)  # bytes: float8 scales too
    scales = x.scales
    if x.scheme.group_shape[0] == 1 and scales.shape[0] == x.codes.shape[0]:  # a scale row per token
        scales = pick(scales.contiguous())
    return QuantizedActivation(x.scheme, pick(x.codes), scales, x.global_scale)
