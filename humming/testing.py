"""Random FP8 GEMM operands built directly in humming's IR, and the float64 product they define: the inputs
of the FP8 GEMM checks (tests/test_cuda_fp8*.py, bench/tools/cuda_fp8_sanitize.py), for anyone who checks a
kernel against humming's definition.

Codes are drawn uniformly from every e4m3 code except NaN (0x7F, 0xFF), scales uniformly from [s, 2s):
no quantizer runs, so a check depends on nothing but the kernel and torch's exact fp8 -> float
conversion.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .ir.activation import QuantizedActivation, get_act_scheme
from .ir.layout import parse_group_size
from .ir.quantize import dequantize
from .ir.weight import QuantizedWeight

__all__ = ["random_activation", "random_codes", "random_weight", "reference", "reference_weight"]


def random_codes(rows: int, k: int, device) -> torch.Tensor:
    """uint8 ``[rows, k]`` e4m3 codes, uniform over the 254 non-NaN codes."""
    codes = torch.randint(0, 254, (rows, k), dtype=torch.int32, device=device)
    return (codes + (codes >= 0x7F).to(torch.int32)).to(torch.uint8)  # skip 0x7F; 0xFF is never reached


def random_weight(
    n: int, k: int, group, device, bias_dtype: torch.dtype | None = None, fmt: str = "e4m3", mx_row_span: int = 12
) -> QuantizedWeight:
    """An e4m3, int4 or MXFP4 ``QuantizedWeight [n, k]`` with ``group`` scales (``"tensor"``, ``-1``, ``g``,
    ``(bn, bk)``; MXFP4: e8m0 scales per 32, ``group`` ignored, exponents uniform over 12 binades in each 128-K
    block, odd blocks ``mx_row_span - 12`` binades up: rows of ``mx_row_span`` binades where K spans two blocks)."""
    if fmt in ("int4", "mxfp4"):  # nibbles: element k in bits 4k..4k+3 of the row's little-endian stream
        nibbles = F.pad(torch.randint(0, 16, (n, k), device=device), (0, -k % 8))
        qweight = (nibbles[:, 0::2] | nibbles[:, 1::2] << 4).to(torch.uint8).view(torch.int32)
    else:  # canonical packing of 8-bit codes: bytes little-endian along K
        qweight = F.pad(random_codes(n, k, device), (0, -k % 4)).view(torch.int32)
    bias = None if bias_dtype is None else torch.randn(n, device=device, dtype=bias_dtype)
    if fmt == "mxfp4":
        groups = -(-k // 32)
        exps = torch.randint(127 - 14, 127 - 2, (n, groups), dtype=torch.uint8, device=device)
        exps += ((torch.arange(groups, device=device) // 4) % 2 * (mx_row_span - 12)).to(torch.uint8)
        return QuantizedWeight((n, k), "e2m1", qweight, exps.view(torch.float8_e8m0fnu), (1, 32), bias=bias)
    probe = QuantizedWeight((n, k), fmt, qweight, None, parse_group_size(group), bias=bias)
    return probe.replace(scales=(1 + torch.rand(probe.scale_grid, device=device)) * 2e-3)


def random_activation(m: int, k: int, act: str, device) -> QuantizedActivation:
    """e4m3 activations ``[m, k]`` of scheme ``act`` (per-token, per-tensor or 1x128 groups)."""
    scheme = get_act_scheme(act)
    grid = {"token": (m, 1), "tensor": (1, 1)}.get(scheme.group) or (m, -(-k // scheme.group))
    return QuantizedActivation(scheme, random_codes(m, k, device), (1 + torch.rand(grid, device=device)) * 1e-2)


def _expand(scales: torch.Tensor, block: tuple[int, int], rows: int, k: int) -> torch.Tensor:
    s = scales.to(torch.float64).repeat_interleave(block[0], 0)[:rows]
    return s.repeat_interleave(block[1], 1)[:, :k]


def reference_weight(qw: QuantizedWeight) -> torch.Tensor:
    """float64 ``dequant(W)`` ``[N, K]``: torch's exact e4m3 decoding, int4 as two's complement, MXFP4
    through ``humming.dequantize``."""
    n, k = qw.N, qw.K
    if qw.format.name == "int4":
        packed = qw.qweight.view(torch.uint8).to(torch.int64)
        nibbles = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)[:, :k]
        values = (nibbles - 16 * (nibbles >= 8)).to(torch.float64)
    elif qw.format.name == "e2m1":  # the IR's definition: the format's decoding times the e8m0 scales
        return dequantize(qw, torch.float64)
    else:
        values = qw.qweight.view(torch.uint8)[:, :k].view(torch.float8_e4m3fn).to(torch.float64)
    return values * _expand(qw.scales, qw.block_shape, n, k)


def reference(qa: QuantizedActivation, qw: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """float64 ``dequant(x) @ dequant(W)^T + bias``, with torch's exact e4m3 decoding (int4: two's complement)."""
    m, k = qa.codes.shape
    x_block = {"token": (1, k), "tensor": (m, k)}.get(qa.scheme.group) or (1, qa.scheme.group)
    xd = qa.codes.view(torch.float8_e4m3fn).to(torch.float64) * _expand(qa.scales, x_block, m, k)
    out = xd @ reference_weight(qw).T
    return out if bias is None else out + bias.to(torch.float64)
