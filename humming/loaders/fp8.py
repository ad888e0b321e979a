"""FP8 checkpoints with ``quant_method: fp8`` (DeepSeek-V3 / transformers FineGrainedFP8, vLLM / AutoFP8).

Per module: ``weight`` float8_e4m3fn ``[N, K]`` and either ``weight_scale_inv`` float32
``[ceil(N/bn), ceil(K/bk)]`` for ``weight_block_size: [bn, bk]`` (DeepSeek-V3: 128x128; despite its name a
MULTIPLIER: ``w = fp8 * weight_scale_inv``), or ``weight_scale`` float32 (per tensor ``[]``/``[1]``, or per
channel ``[N]``/``[N, 1]``). The codes are the fp8 bytes themselves (``e4m3``).
"""

from __future__ import annotations

import torch

from humming.ir.weight import QuantizedWeight, cdiv

from ._common import bytes_to_words, check_shape
from ._config import Config
from ._files import CheckpointFiles
from .activations import ActivationSpec
from .errors import MissingTensorError, ShapeMismatchError, UnsupportedFormatError

__all__ = ["FP8Reader", "decode_fp8"]


class FP8Reader:
    method = "fp8"

    def __init__(self, qconfig: dict, files: CheckpointFiles):
        self.files = files
        config = Config(qconfig, "quantization_config")
        fmt = config.str("fmt", "e4m3", lower=True)
        if fmt != "e4m3":
            raise UnsupportedFormatError(f"fp8 checkpoint with fmt {fmt!r}: only e4m3 weights are defined")
        self.block = config.int_pair("weight_block_size")
        self.skip = config.strings("modules_to_not_convert") + config.strings("ignored_layers")
        self.activation_scheme = config.str("activation_scheme", "dynamic", lower=True)

    def describe(self) -> str:
        return f"FP8 e4m3 block {self.block[0]}x{self.block[1]}" if self.block else "FP8 e4m3 per-tensor/channel"

    def modules(self) -> list[str]:
        found = self.files.modules_with("weight_scale_inv", "weight_scale")
        return [m for m in found if not any(s in m for s in self.skip)]

    def activation(self, module: str) -> ActivationSpec:
        """Block weights: fp8 per 1x``bk`` group (dynamic, as DeepSeek-V3); others: fp8 per token when
        dynamic, per tensor with the static ``input_scale`` when static."""
        if self.activation_scheme not in ("dynamic", "static"):
            raise UnsupportedFormatError(f"{module}: fp8 activation_scheme {self.activation_scheme!r} is not known")
        if self.block is not None:
            if self.activation_scheme != "dynamic" or self.block[1] != 128:
                raise UnsupportedFormatError(
                    f"{module}: fp8 block weights with {self.activation_scheme} activations in 1x{self.block[1]} "
                    "groups; humming runs dynamic 1x128 groups (fp8_g128)"
                )
            return ActivationSpec("fp8_g128")
        if self.activation_scheme == "dynamic":
            return ActivationSpec("fp8")
        key = f"{module}.input_scale"
        if key not in self.files:
            raise MissingTensorError(f"{module}: activation_scheme 'static' needs tensor {key!r}")
        return ActivationSpec("fp8_tensor", key)

    def load(self, module: str) -> QuantizedWeight:
        weight = self.files.get(f"{module}.weight", module)
        bias = self.files.get_optional(f"{module}.bias")
        if self.block is not None:
            scale = self.files.get(f"{module}.weight_scale_inv", module)
            return decode_fp8(module, weight, scale, bias, block=self.block)
        return decode_fp8(module, weight, self.files.get(f"{module}.weight_scale", module), bias)


def decode_fp8(module, weight, scale, bias, *, block=None) -> QuantizedWeight:
    """fp8 ``weight`` ``[N, K]`` and its scale -> ``e4m3`` ``QuantizedWeight``.

    ``block=(bn, bk)``: ``scale`` is the block grid ``[ceil(N/bn), ceil(K/bk)]``; otherwise its size
    decides: one value (per tensor) or ``N`` values (per channel).
    """
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        raise ShapeMismatchError(
            f"{module}: weight must be 2-D float8_e4m3fn, got {weight.dtype} {tuple(weight.shape)}"
        )
    n, k = weight.shape
    if block is not None:
        group_shape = block
        check_shape(module, "weight_scale_inv", scale, (cdiv(n, block[0]), cdiv(k, block[1])))
    elif scale.numel() == 1:
        group_shape, scale = (-1, -1), scale.reshape(1, 1)
    elif scale.numel() == n:
        group_shape, scale = (1, -1), scale.reshape(n, 1)
    else:
        raise ShapeMismatchError(
            f"{module}: weight_scale has shape {tuple(scale.shape)}; expected one value (per tensor) "
            f"or {n} (per channel)"
        )
    return QuantizedWeight(
        shape=(n, k),
        format="e4m3",
        qweight=bytes_to_words(weight.view(torch.uint8)),
        scales=scale,
        group_shape=group_shape,
        bias=bias,
    )
