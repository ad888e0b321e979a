"""The argument checks of :mod:`humming.moe`'s entry points: each names the argument, what was expected and
what was got. What can be checked without reading tensor data is checked at the call; values (ids, rows,
expert maps) are checked on CPU tensors only, where they are data (on a GPU that would be a host sync)."""

from __future__ import annotations

import torch

from ..ir.activation import ActScheme
from ..ir.dtypes import FLOAT_DTYPES
from ..ir.weight import QuantizedWeight

__all__ = [
    "MAX_BLOCK_M",
    "MAX_EXPERTS",
    "check_act_scale",
    "check_block_m",
    "check_expert_map",
    "check_experts",
    "check_out_dtype",
    "check_range",
    "check_rows",
    "check_topk_ids",
    "check_x",
    "expert_bias",
]


#: The largest routing block: every expert's segment is padded to a multiple of it (E * block_m rows at worst).
MAX_BLOCK_M = 1024
#: The most experts one moe_align call groups (its per-expert counts and padded rows are allocated).
MAX_EXPERTS = 1 << 16


def check_block_m(block_m) -> int:
    if isinstance(block_m, bool) or not isinstance(block_m, int) or not 0 < block_m <= MAX_BLOCK_M or block_m % 8:
        raise ValueError(f"block_m: expected a positive multiple of 8 up to {MAX_BLOCK_M}, got {block_m!r}")
    return block_m


def check_topk_ids(topk_ids) -> None:
    if not isinstance(topk_ids, torch.Tensor):
        raise ValueError(f"topk_ids: expected a torch.Tensor, got {type(topk_ids).__name__}")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype.is_complex or topk_ids.dtype == torch.bool:
        raise ValueError(f"topk_ids: expected an integer dtype, got {topk_ids.dtype}")
    if topk_ids.dtype in (torch.uint16, torch.uint32, torch.uint64):  # torch has few ops for these
        raise ValueError(f"topk_ids: expected int8, int16, int32, int64 or uint8 ids, got {topk_ids.dtype}")
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids: expected shape [T, topk], got {tuple(topk_ids.shape)}")


def check_range(name: str, values: torch.Tensor, low: int, high: int) -> None:
    """``ValueError`` unless every value lies in ``[low, high)``: on CPU tensors only (on a GPU it would read
    them back to the host, a sync; there, values out of range are dropped by whoever reads them)."""
    if values.device.type != "cpu" or not values.numel():
        return
    flat = values.reshape(-1)
    if int(flat.min()) < low or int(flat.max()) >= high:
        bad = flat[(flat < low) | (flat >= high)][0]
        raise ValueError(f"{name}: values must lie in [{low}, {high}), found {int(bad)}")


def check_experts(name: str, qweight) -> QuantizedWeight:
    if not isinstance(qweight, QuantizedWeight):
        raise ValueError(f"{name}: expected a humming.QuantizedWeight, got {type(qweight).__name__}")
    if qweight.num_experts is None:
        raise ValueError(
            f"{name}: expected an expert-stacked weight [E, N, K], got a dense weight {qweight.shape} "
            "(humming.linear takes dense weights; humming.stack builds [E, N, K])"
        )
    return qweight


def check_x(name: str, x, k: int, device: torch.device) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: expected dtype float16, bfloat16 or float32, got {x.dtype}")
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"{name}: expected shape [M, {k}] (K of the weight), got {tuple(x.shape)}")
    if x.shape[1] and x.stride(1) != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1), got strides {tuple(x.stride())}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but the weight is on {device}; move one with .to()")


def check_rows(rows, device: torch.device) -> None:
    """What can be checked of a gather index without reading it (its values: ``run_grouped``)."""
    if not isinstance(rows, torch.Tensor) or rows.dtype != torch.int32:
        raise ValueError(f"rows: expected an int32 tensor, got {getattr(rows, 'dtype', type(rows).__name__)}")
    if rows.dim() != 1:
        raise ValueError(f"rows: expected shape [M_pad], got {tuple(rows.shape)}")
    if rows.device != device:
        raise ValueError(f"rows is on {rows.device} but x is on {device}")


def expert_bias(bias, qweight: QuantizedWeight, name: str = "bias") -> torch.Tensor | None:
    """A grouped GEMM's bias checked: ``[E, N]`` floats on the weight's device, or None."""
    if bias is None:
        return None
    e, n, _ = qweight.shape
    if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (e, n) or not bias.is_floating_point():
        raise ValueError(f"{name}: expected a float tensor of shape ({e}, {n}), got {getattr(bias, 'shape', bias)!r}")
    if bias.device != qweight.device:
        raise ValueError(f"{name} is on {bias.device} but qweight is on {qweight.device}")
    return bias


def check_out_dtype(out_dtype, default: torch.dtype) -> torch.dtype:
    out_dtype = out_dtype or default
    if out_dtype not in FLOAT_DTYPES:
        raise ValueError(f"out_dtype: expected float16, bfloat16 or float32, got {out_dtype}")
    return out_dtype


def check_act_scale(name: str, scale, act: ActScheme | None, device: torch.device) -> torch.Tensor | None:
    """A static activation scale as the op takes it (float32 ``[1, 1]``), or ``None``."""
    if scale is None:
        return None
    if act is None or act.scale_dtype != torch.float32 or act.global_scale:
        raise ValueError(f"{name}: a static scale needs an act with float32 scales (fp8, int8...), got act={act}")
    if not isinstance(scale, torch.Tensor) or scale.numel() != 1 or not scale.is_floating_point():
        raise ValueError(f"{name}: expected a one-element float tensor, got {scale!r}")
    if scale.device != device:
        raise ValueError(f"{name} is on {scale.device} but x is on {device}")
    return scale.to(torch.float32).reshape(1, 1)


def check_expert_map(expert_map, num_local: int, device: torch.device) -> None:
    """What can be checked of an expert map without reading it (its values: ``run_fused_moe``)."""
    if not isinstance(expert_map, torch.Tensor):
        raise ValueError(f"expert_map: expected a torch.Tensor, got {type(expert_map).__name__}")
    if expert_map.dtype.is_floating_point or expert_map.dtype.is_complex or expert_map.dtype == torch.bool:
        raise ValueError(f"expert_map: expected an integer dtype, got {expert_map.dtype}")
    if expert_map.dim() != 1 or expert_map.shape[0] < num_local:
        raise ValueError(
            f"expert_map: expected shape [E_global] with E_global >= {num_local} (the experts of w13), "
            f"got {tuple(expert_map.shape)}"
        )
    if expert_map.device != device:
        raise ValueError(f"expert_map is on {expert_map.device} but x is on {device}")
