"""gpt-oss MXFP4 expert checkpoints (``quant_method: mxfp4``).

Per fused expert projection ``<p>`` (``mlp.experts.gate_up_proj`` and ``mlp.experts.down_proj``):
``<p>_blocks`` uint8 ``[E, N, K/32, 16]`` (32 e2m1 codes per 16 bytes, element 2i in the low nibble),
``<p>_scales`` uint8 ``[E, N, K/32]`` (e8m0 exponents, bias 127), ``<p>_bias`` bf16 ``[E, N]``.
``w = ldexp(e2m1, scale - 127)``, exactly the IR's e2m1 codes with e8m0 scales in groups of 32.
The gate_up rows stay interleaved as stored (row 2i = gate i, row 2i+1 = up i): gpt-oss's SwiGLU reads them
that way; ``humming.loaders.deinterleave_rows`` splits them if a kernel wants separate halves.
"""

from __future__ import annotations

import fnmatch

import torch

from humming.ir.weight import QuantizedWeight

from ._common import bytes_to_words, check_shape
from ._config import Config
from ._files import CheckpointFiles
from .errors import ShapeMismatchError

__all__ = ["GptOssReader", "pack_gpt_oss"]


class GptOssReader:
    method = "mxfp4"

    def __init__(self, qconfig: dict, files: CheckpointFiles):
        self.files = files
        self.skip = Config(qconfig, "quantization_config").strings("modules_to_not_convert")

    def describe(self) -> str:
        return "gpt-oss MXFP4 experts (e2m1, e8m0 scales, group 32)"

    def modules(self) -> list[str]:
        found = sorted({k[: -len("_blocks")] for k in self.files.names() if k.endswith("_blocks")})
        return [m for m in found if not any(fnmatch.fnmatchcase(m, p) or p in m for p in self.skip)]

    def load(self, module: str) -> QuantizedWeight:
        blocks = self.files.get(f"{module}_blocks", module)
        scales = self.files.get(f"{module}_scales", module)
        bias = self.files.get_optional(f"{module}_bias")
        return decode_gpt_oss(module, blocks, scales, bias)


def decode_gpt_oss(module, blocks, scales, bias) -> QuantizedWeight:
    """``*_blocks`` ``[E, N, K/32, 16]`` + ``*_scales`` ``[E, N, K/32]`` -> ``e2m1`` ``[E, N, K]``."""
    if blocks.dtype != torch.uint8 or blocks.dim() != 4 or blocks.shape[-1] != 16:
        raise ShapeMismatchError(
            f"{module}: *_blocks must be uint8 [E, N, K/32, 16], got {blocks.dtype} {tuple(blocks.shape)}"
        )
    e, n, kb, _ = blocks.shape
    check_shape(module, "scales", scales, (e, n, kb))
    if scales.dtype == torch.uint8:
        scales = scales.view(torch.float8_e8m0fnu)
    if bias is not None:
        check_shape(module, "bias", bias, (e, n))
    return QuantizedWeight(
        shape=(e, n, kb * 32),
        format="e2m1",
        qweight=bytes_to_words(blocks.reshape(e, n, kb * 16)),
        scales=scales,
        group_shape=(1, 32),
        bias=bias,
    )


def pack_gpt_oss(codes: torch.Tensor, exponents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e2m1 codes uint8 ``[E, N, K]`` and e8m0 exponents uint8 ``[E, N, K/32]`` -> (``_blocks``, ``_scales``)."""
    e, n, k = codes.shape
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.reshape(e, n, k // 32, 16), exponents
