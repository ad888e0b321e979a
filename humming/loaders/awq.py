"""AutoAWQ GEMM checkpoints (``quant_method: awq``, ``version: gemm``), 4 bits with zero points.

Layout (per module), transposed with respect to ``nn.Linear``: ``qweight`` int32 ``[K, N/8]`` packed along
N with the nibble order ``[0, 2, 4, 6, 1, 3, 5, 7]`` (nibble i of word c holds column ``8c + order[i]``);
``qzeros`` int32 ``[groups, N/8]`` packed the same way, stored as is (no offset); ``scales`` ``[groups, N]``.
The loader un-interleaves and transposes into canonical ``uint4`` codes ``[N, K]`` with uint8 zeros.
"""

from __future__ import annotations

import torch

from humming.ir.packing import pack_codes
from humming.ir.weight import QuantizedWeight, cdiv

from ._common import check_shape
from ._config import Config
from ._files import CheckpointFiles
from .errors import ShapeMismatchError, UnsupportedFormatError

__all__ = ["AWQReader", "pack_awq"]

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i holds column 8c + AWQ_ORDER[i]


def _columns(n: int, order: tuple[int, ...]) -> torch.Tensor:
    return torch.arange(n).view(-1, 8)[:, list(order)].reshape(-1)


class AWQReader:
    method = "awq"

    def __init__(self, qconfig: dict, files: CheckpointFiles):
        self.files = files
        config = Config(qconfig, "quantization_config")
        version = config.str("version", "gemm", lower=True)
        if version != "gemm":
            kind = "a kernel-specific repacked layout" if version in ("marlin", "exllama", "ipex") else "unknown"
            raise UnsupportedFormatError(
                f"AWQ version {version!r} is {kind}; humming reads AutoAWQ's GEMM layout (version 'gemm'), "
                "whose packing is documented and shared by vLLM and transformers. GEMV variants pack along K "
                "in a different order."
            )
        self.bits = config.int("bits", config.int("w_bit", 4))
        if self.bits != 4:
            raise UnsupportedFormatError(
                f"AWQ GEMM with {self.bits} bits: AutoAWQ's GEMM layout is defined for 4 bits only"
            )
        if not config.bool("zero_point", True):
            raise UnsupportedFormatError(
                "AWQ with zero_point=false: AutoAWQ's GEMM kernels and packers always use zero points; "
                "this variant has no defined GEMM checkpoint layout"
            )
        group = config.int("q_group_size", 128, minimum=1, allowed=(-1,))
        self.group_size = config.int("group_size", group, minimum=1, allowed=(-1,))
        self.skip = config.strings("modules_to_not_convert")

    def describe(self) -> str:
        return f"AWQ GEMM {self.bits}-bit group {self.group_size}"

    def modules(self) -> list[str]:
        # transformers' convention: a module is skipped when any entry is a substring of its name.
        return [m for m in self.files.modules_with("qweight") if not any(s in m for s in self.skip)]

    def load(self, module: str) -> QuantizedWeight:
        t = {name: self.files.get(f"{module}.{name}", module) for name in ("qweight", "qzeros", "scales")}
        return decode_awq(module, **t, bias=self.files.get_optional(f"{module}.bias"), group_size=self.group_size)


def _unpack_awq(words: torch.Tensor) -> torch.Tensor:
    """int32 ``[R, N/8]`` in AWQ nibble order -> uint8 codes ``[R, N]`` in column order.

    Byte b of a word holds nibbles 2b (low) and 2b+1 (high), i.e. columns ``order[2b]`` and ``order[2b+1]``;
    working on bytes keeps the memory traffic at one byte per code.
    """
    data = words.contiguous().view(torch.uint8).reshape(*words.shape, 4)
    lo, hi = data & 0x0F, data >> 4
    # columns 0..7 sit in (lo|hi, byte): 0 lo0, 1 lo2, 2 hi0, 3 hi2, 4 lo1, 5 lo3, 6 hi1, 7 hi3
    by_column = (lo[..., 0], lo[..., 2], hi[..., 0], hi[..., 2], lo[..., 1], lo[..., 3], hi[..., 1], hi[..., 3])
    return torch.stack(by_column, dim=-1).reshape(words.shape[0], -1)


def decode_awq(module, *, qweight, qzeros, scales, bias, group_size) -> QuantizedWeight:
    """AWQ GEMM tensors of one module -> ``uint4`` ``QuantizedWeight`` with uint8 zeros."""
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise ShapeMismatchError(f"{module}: AWQ qweight/qzeros must be int32, got {qweight.dtype}/{qzeros.dtype}")
    if scales.dim() != 2 or qweight.dim() != 2:
        raise ShapeMismatchError(f"{module}: AWQ qweight and scales must be 2-D ([K, N/8], [groups, N])")
    k, n = qweight.shape[0], scales.shape[1]
    if n % 8:
        raise ShapeMismatchError(f"{module}: AWQ needs N divisible by 8, got scales with N = {n}")
    group = k if group_size == -1 else group_size
    # K comes from qweight's rows; AWQ's kernels need whole groups, which also catches a truncated qweight.
    if k % group:
        raise ShapeMismatchError(
            f"{module}: AWQ qweight has K={k} rows, which is not a multiple of group_size {group_size}"
        )
    check_shape(module, "qweight", qweight, (k, n // 8))
    check_shape(module, "scales", scales, (cdiv(k, group), n))
    check_shape(module, "qzeros", qzeros, (cdiv(k, group), n // 8))
    codes = _unpack_awq(qweight).T
    zeros = _unpack_awq(qzeros).T.contiguous()
    return QuantizedWeight(
        shape=(n, k),
        format="uint4",
        qweight=pack_codes(codes, 4),
        scales=scales.T.contiguous(),
        group_shape=(1, group_size),
        zeros=zeros,
        bias=bias,
    )


def pack_awq(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> dict[str, torch.Tensor]:
    """Write one module in AutoAWQ GEMM layout.

    ``codes`` uint8 ``[N, K]`` (0..15); ``scales`` fp16 ``[N, groups]``; ``zeros`` uint8 ``[N, groups]``.
    Returns ``qweight`` ``[K, N/8]``, ``qzeros`` ``[groups, N/8]``, ``scales`` ``[groups, N]``.
    """
    order = _columns(codes.shape[0], AWQ_ORDER)
    return {
        "qweight": pack_codes(codes.T[:, order], 4),
        "qzeros": pack_codes(zeros.T[:, order], 4),
        "scales": scales.T.contiguous(),
    }
