"""NVIDIA ModelOpt checkpoints (``hf_quant_config.json`` or ``quant_method: modelopt``): NVFP4 and FP8.

NVFP4 per module: ``weight`` uint8 ``[N, K/2]`` (element 2i in the low nibble, e2m1 codes),
``weight_scale`` float8_e4m3fn ``[N, K/16]`` and ``weight_scale_2`` float32 ``[]`` that MULTIPLIES every
block scale: ``w = e2m1 * (fp32(weight_scale) * weight_scale_2)`` in fp32, which is exactly the IR's
``global_scale``. ModelOpt decodes e2m1 code 8 as +0.0, so the loader rewrites code 8 to code 0: the IR then
reproduces ModelOpt's values bit for bit, signed zeros included.

FP8 per module: ``weight`` float8_e4m3fn ``[N, K]``, ``weight_scale`` float32 (per tensor, or per channel).
``exclude_modules`` / ``ignore`` entries are shell-style wildcards (``model.layers.*.mlp.gate``).
"""

from __future__ import annotations

import fnmatch

import torch

from humming.ir.weight import QuantizedWeight, cdiv

from ._common import bytes_to_words, check_shape
from ._config import Config
from ._files import CheckpointFiles
from .activations import ActivationSpec
from .errors import MissingTensorError, ShapeMismatchError, UnsupportedFormatError
from .fp8 import decode_fp8

__all__ = ["ModelOptReader", "modelopt_positive_zero"]

_SUPPORTED = ("NVFP4", "FP8", "FP8_PER_CHANNEL_PER_TOKEN")
_WHY = {
    "NVFP4_AWQ": "it needs a pre_quant_scale applied to the activations, which the weight IR does not carry",
    "INT4_AWQ": "it needs a pre_quant_scale applied to the activations, which the weight IR does not carry",
    "W4A8_AWQ": "it needs a pre_quant_scale applied to the activations, which the weight IR does not carry",
    "FP8_PB_WO": "its per-block FP8 export is not documented well enough to decode exactly",
}


class ModelOptReader:
    method = "modelopt"

    def __init__(self, qconfig: dict, files: CheckpointFiles):
        self.files = files
        quant = Config(files.hf_quant_config or {}, "hf_quant_config.json").object("quantization")
        if not quant.value:  # the config.json form
            quant = Config(qconfig, "quantization_config")
        self.algo = quant.str("quant_algo", "").upper()
        # module -> (its quant_algo, its group size or None)
        self.layers: dict[str, tuple[str, int | None]] = {}
        if self.algo == "MIXED_PRECISION":
            layers = quant.object("quantized_layers")
            for name in layers.value:
                layer = layers.object(name)
                self.layers[name] = (
                    layer.str("quant_algo", "").upper(),
                    layer.int("group_size", None, minimum=1, null=True),
                )
            bad = sorted({algo for algo, _ in self.layers.values() if algo not in _SUPPORTED})
            if bad:
                raise UnsupportedFormatError(f"ModelOpt MIXED_PRECISION with quant_algo {bad}: {_why(bad[0])}")
        elif self.algo not in _SUPPORTED:
            raise UnsupportedFormatError(f"ModelOpt quant_algo {self.algo or None!r}: {_why(self.algo)}")
        self.group_size = quant.int("group_size", 16, minimum=1, null=True)
        self.exclude = quant.strings("exclude_modules") or quant.strings("ignore")

    def describe(self) -> str:
        return f"ModelOpt {self.algo}" + (f" group {self.group_size}" if self.algo == "NVFP4" else "")

    def _algo(self, module: str) -> str | None:
        if self.layers:
            entry = self.layers.get(module)
            return entry[0] if entry else None
        return self.algo

    def modules(self) -> list[str]:
        found = self.files.modules_with("weight_scale")
        return [
            m for m in found if self._algo(m) is not None and not any(fnmatch.fnmatchcase(m, p) for p in self.exclude)
        ]

    def activation(self, module: str) -> ActivationSpec:
        """NVFP4: ``nvfp4`` (its static ``input_scale`` replaced by a per-call global scale); FP8: per-tensor
        with the static ``input_scale``; FP8_PER_CHANNEL_PER_TOKEN: per-token dynamic."""
        algo = self._algo(module)
        if algo == "NVFP4":
            return ActivationSpec("nvfp4")
        if algo == "FP8_PER_CHANNEL_PER_TOKEN":
            return ActivationSpec("fp8")
        key = f"{module}.input_scale"
        if key not in self.files:
            raise MissingTensorError(f"{module}: ModelOpt FP8 needs the static activation scale {key!r}")
        return ActivationSpec("fp8_tensor", key)

    def load(self, module: str) -> QuantizedWeight:
        algo = self._algo(module)
        weight = self.files.get(f"{module}.weight", module)
        scale = self.files.get(f"{module}.weight_scale", module)
        bias = self.files.get_optional(f"{module}.bias")
        if algo == "NVFP4":
            group = (self.layers.get(module) or (None, None))[1] or self.group_size
            scale_2 = self.files.get(f"{module}.weight_scale_2", module)
            return decode_nvfp4(module, weight, scale, scale_2, bias, group_size=group)
        return decode_fp8(module, weight, scale, bias)


def _why(algo: str) -> str:
    return _WHY.get(algo, f"not a format humming reads (supported: {', '.join(_SUPPORTED)}, MIXED_PRECISION of them)")


def modelopt_positive_zero(packed: torch.Tensor) -> torch.Tensor:
    """uint8 bytes of two e2m1 codes each: rewrite code 8 (-0.0) to code 0 (+0.0), as ModelOpt decodes it."""
    lo, hi = packed & 0x0F, packed & 0xF0
    return torch.where(lo == 8, 0, lo) | torch.where(hi == 0x80, 0, hi)


def decode_nvfp4(module, weight, scale, scale_2, bias, *, group_size: int = 16) -> QuantizedWeight:
    """ModelOpt NVFP4 tensors of one module -> ``e2m1`` weight with e4m3 scales and a global scale."""
    if weight.dtype != torch.uint8 or weight.dim() != 2:
        raise ShapeMismatchError(
            f"{module}: NVFP4 weight must be 2-D uint8 [N, K/2], got {weight.dtype} {tuple(weight.shape)}"
        )
    n, k = weight.shape[0], weight.shape[1] * 2
    check_shape(module, "weight_scale", scale, (n, cdiv(k, group_size)))
    if scale.dtype != torch.float8_e4m3fn:
        raise ShapeMismatchError(f"{module}: NVFP4 weight_scale must be float8_e4m3fn, got {scale.dtype}")
    if scale_2.numel() != 1:
        raise ShapeMismatchError(f"{module}: weight_scale_2 must hold one value, got shape {tuple(scale_2.shape)}")
    return QuantizedWeight(
        shape=(n, k),
        format="e2m1",
        qweight=bytes_to_words(modelopt_positive_zero(weight)),
        scales=scale,
        group_shape=(1, group_size),
        global_scale=scale_2.to(torch.float32).reshape(()),
        bias=bias,
    )
