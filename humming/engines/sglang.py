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

MoE: SGLang's ``FusedMoE`` gets :class:`HummingMoEMethod` (:class:`._moe.MoECore`, the vLLM adapter's): SGLang's
expert weight loader fills expert-stacked parameters of this rank's partition, each expert is decoded and
stacked, ``apply`` is ``humming.moe.fused_moe`` on SGLang's top-k output, times its ``routed_scaling_factor``
as SGLang's runners apply it. SGLang's layer does not name the checkpoint's expert projections: the
checkpoint's ignore rules are matched against ``{prefix}.0.gate_proj`` / ``up_proj`` / ``down_proj``.

Not covered: expert parallelism (the standard dispatcher's local top-k ids of other ranks' experts),
``apply_router_weight_on_input`` and ``no_combine`` (refused), and what the vLLM adapter does not cover
either (see :mod:`humming.engines.vllm`).
"""

from __future__ import annotations

import torch
from sglang.srt.layers import parameter as sglang_parameter
from sglang.srt.layers.linear import LinearBase
from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
from sglang.srt.layers.moe.token_dispatcher.standard import StandardCombineInput
from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase, LinearMethodBase, QuantizationConfig
from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod, UnquantizedLinearMethod

from ..loaders.errors import UnsupportedFormatError
from ._core import ConfigCore, LinearCore, param_classes
from ._moe import MoECore

__all__ = ["HummingConfig", "HummingLinearMethod", "HummingMoEMethod", "capture_sizes", "register"]

#: the checkpoint's expert projections SGLang's models map (Qwen2 / Qwen3-MoE, DeepSeek-V2 / V3, OLMoE)
EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


class HummingConfig(ConfigCore, QuantizationConfig):
    """The checkpoint's own ``quantization_config``, read by humming (:class:`._core.ConfigCore`)."""

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, FusedMoE):
            names = [f"{prefix}.0.{p}" for p in EXPERT_PROJECTIONS]
            if self.skipped(prefix, names):
                return UnquantizedFusedMoEMethod(layer.use_triton_kernels)
            return HummingMoEMethod(self, prefix, names, layer.moe_runner_config.activation)
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


class HummingMoEMethod(MoECore, FusedMoEMethodBase):
    """SGLang's ``FusedMoE`` on ``humming.moe.fused_moe`` (:class:`._moe.MoECore`)."""

    capture_sizes = staticmethod(capture_sizes)

    def __init__(self, config: HummingConfig, prefix: str, projections: list[str], activation: str):
        super().__init__()
        self.init_core(config, prefix, projections, activation)

    def create_moe_runner(self, layer: torch.nn.Module, moe_runner_config) -> None:
        for option in ("apply_router_weight_on_input", "no_combine"):
            if getattr(moe_runner_config, option, False):
                raise UnsupportedFormatError(f"{self.prefix}: humming's MoE method does not run {option}=True")
        self.moe_runner_config = moe_runner_config

    def apply(self, layer: torch.nn.Module, dispatch_output) -> StandardCombineInput:
        topk = dispatch_output.topk_output
        out = self.run(layer, dispatch_output.hidden_states, topk.topk_weights, topk.topk_ids)
        factor = self.moe_runner_config.routed_scaling_factor
        return StandardCombineInput(hidden_states=out if factor is None else out.mul_(factor))


def register() -> None:
    """SGLang's plugin hook: ``--quantization humming_ir``."""
    from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES
    from sglang.srt.layers import quantization

    quantization.QUANTIZATION_METHODS["humming_ir"] = HummingConfig
    quantization.BASE_QUANTIZATION_METHODS["humming_ir"] = HummingConfig
    if "humming_ir" not in QUANTIZATION_CHOICES:
        QUANTIZATION_CHOICES.append("humming_ir")
