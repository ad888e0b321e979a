"""Helpers shared by the format readers: shape checks and exact code-space conversions."""

from __future__ import annotations

import re

import torch

from humming.ir.packing import msb_mask, pack_codes

from .errors import ShapeMismatchError

__all__ = [
    "bytes_to_words",
    "check_shape",
    "drop_trivial_g_idx",
    "match_any",
    "signed_if_symmetric",
]


def check_shape(module: str, name: str, tensor: torch.Tensor, expected: tuple[int, ...]) -> None:
    """Raise ``ShapeMismatchError`` unless ``tensor.shape == expected``."""
    if tuple(tensor.shape) != tuple(expected):
        raise ShapeMismatchError(
            f"{module}: tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(expected)}"
        )


def bytes_to_words(data: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., B]`` holding a little-endian bit stream -> int32 ``[..., ceil(B/4)]`` (zero-padded)."""
    return pack_codes(data, 8)


def drop_trivial_g_idx(g_idx: torch.Tensor | None, k: int, group: int) -> torch.Tensor | None:
    """``None`` when ``g_idx`` is just ``arange(k) // group`` (no act-order), else ``g_idx`` as int32."""
    if g_idx is None:
        return None
    g_idx = g_idx.to(torch.int32)
    trivial = torch.arange(k, dtype=torch.int32, device=g_idx.device) // group
    return None if torch.equal(g_idx, trivial) else g_idx


def signed_if_symmetric(
    qweight: torch.Tensor, zeros: torch.Tensor, bits: int, k: int
) -> tuple[str, torch.Tensor, torch.Tensor | None]:
    """Unsigned codes with integer zeros -> ``("int<b>", codes, None)`` when every zero is ``2^(b-1)``.

    ``(u - 2^(b-1))`` is exactly the two's-complement value of ``u ^ 2^(b-1)``, so the conversion is
    exact and drops the zeros tensor. Otherwise returns ``("uint<b>", qweight, zeros)`` unchanged.
    """
    if bool((zeros == 1 << (bits - 1)).all()):
        return f"int{bits}", qweight ^ msb_mask(k, bits, qweight.device), None
    return f"uint{bits}", qweight, zeros


def match_any(name: str, patterns) -> bool:
    """compressed-tensors / GPTQModel matching: ``re:<regex>`` (``re.match``) or an exact module name."""
    for pattern in patterns or ():
        if pattern.startswith("re:"):
            if re.match(pattern[3:], name):
                return True
        elif pattern == name:
            return True
    return False
