"""An SGLang quantization method on humming's kernels: ``--quantization humming_ir`` serves a GPTQ, AWQ,
compressed-tensors, FP8 or ModelOpt (NVFP4 / FP8) checkpoint's linear layers with ``humming.linear``.

SGLang (0.5.23 read and run) forked vLLM's linear layers, parameter classes and weight loaders, so the method
is the vLLM one's (:mod:`._core`): ``create_weights`` registers the format's checkpoint tensors as SGLang
parameters of this rank's partition sizes, SGLang's own loaders slice and place each shard,
``process_weights_after_loading`` decodes them with humming's readers, ``apply`` is ``humming.linear``; layers
the checkpoint leaves unquantized get SGLang's ``UnquantizedLinearMethod``.

:func:`register` (SGLang's ``sglang.srt.plugins`` entry point, which SGLang runs in each of its processes)
adds ``"humming_ir"`` to SGLang's quantization registry and to ``--quantization``'s choices. SGLang imports
humming-kernels only for ``--quantization humming``, so this package does not disturb its other methods.

Not covered: MoE layers (no method is returned for SGLang's ``FusedMoE``), and what the vLLM adapter does not
cover either (see :mod:`humming.engines.vllm`).
"""

from __future__ import annotations

import torch
from sglang.srt.layers import parameter as sglang_parameter
from sglang.srt.layers.linear import LinearBase
from sglang.srt.layers.quantization.base_config import LinearMethodBase, QuantizationConfig
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

from ._core import ConfigCore, LinearCore, param_classes

__all__ = ["HummingConfig", "HummingLinearMethod", "capture_sizes", "register"]


class HummingConfig(ConfigCore, QuantizationConfig):
    """The checkpoint's own ``quantization_config``, read by humming (:class:`._core.ConfigCore`)."""

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if not isinstance(layer, LinearBase):
            return None
        names = self.linear_shards(prefix)
        return UnquantizedLinearMethod() if names is None else HummingLinearMethod(self, prefix, names)

    def get_scaled_act_names(self) -> list[str]:
        return []


def capture_sizes() -> tuple[int, ...]:
    """The decode batch sizes SGLang captures in CUDA graphs (its published config), largest last."""
    from sglang.srt.runtime_context import get_exec

    return tuple(sorted({1, *get_exec().graph.cuda_graph_config.decode.bs}))


class HummingLinearMethod(LinearCore, LinearMethodBase):
    """One SGLang linear layer on humming weights (:class:`._core.LinearCore`)."""

    PARAMS = param_classes(sglang_parameter)
    capture_sizes = staticmethod(capture_sizes)


def register() -> None:
    """SGLang's plugin hook: ``--quantization humming_ir``."""
    from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES
    from sglang.srt.layers import quantization

    quantization.QUANTIZATION_METHODS["humming_ir"] = HummingConfig
    quantization.BASE_QUANTIZATION_METHODS["humming_ir"] = HummingConfig
    if "humming_ir" not in QUANTIZATION_CHOICES:
        QUANTIZATION_CHOICES.append("humming_ir")
