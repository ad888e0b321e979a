"""A vLLM quantization method on humming's kernels: ``--quantization humming_ir`` serves a GPTQ, AWQ,
compressed-tensors, FP8 or ModelOpt (NVFP4 / FP8) checkpoint's linear layers with ``humming.linear``.

Importing this module registers :class:`HummingConfig` as ``"humming_ir"`` (vLLM loads it in each of its
processes through the ``vllm.general_plugins`` entry point, :mod:`humming.engines.vllm_plugin`).

- Selection: vLLM asks every registered method's ``override_quantization_method`` about the checkpoint's
  ``quantization_config``; this one answers ``"humming_ir"`` only when the user asked for it, so without
  ``--quantization humming_ir`` vLLM picks the method it always picked.
- ``get_quant_method``: a layer the checkpoint leaves unquantized (``ignore``, ``modules_to_not_convert``,
  ``exclude_modules``, GPTQModel ``-:`` rules; for a fused layer, all of its shards) gets vLLM's
  ``UnquantizedLinearMethod``; other linear layers get :class:`HummingLinearMethod`.
- ``create_weights`` registers the format's checkpoint tensors as vLLM parameters of this rank's partition
  sizes (:mod:`._params`), so vLLM's own weight loaders write each shard's slice into place (tensor
  parallel slicing, fused q / k / v and gate / up shards, replicated KV heads): no full tensor is kept.
- ``process_weights_after_loading`` splits those parameters back into the layer's shards, decodes each with
  humming's reader of the format (bit-exact against the producers), joins the shards exactly
  (``humming.concat``; shards that cannot be joined exactly, such as 2-D weight blocks straddling two shards,
  run one ``humming.linear`` each, their outputs concatenated), and on CUDA prepares the weights and compiles
  the kernels of every batch size vLLM captures in CUDA graphs, in the layer's ``params_dtype``.
- ``apply`` is ``humming.linear`` (one ``torch.ops.humming.linear`` node under vLLM's ``torch.compile``).
- MoE: vLLM's routed experts (``RoutedExperts``) get :class:`HummingMoEMethod` (:class:`._moe.MoECore`) for
  every format above: vLLM's expert weight loader fills expert-stacked parameters of this rank's partition,
  each expert is decoded by humming's reader of the format and stacked, ``apply`` is ``humming.moe.fused_moe``
  on vLLM's routing (``topk_weights`` / ``topk_ids``, its ``expert_map``) with the checkpoint's activation
  scheme; experts the checkpoint leaves unquantized get vLLM's ``UnquantizedFusedMoEMethod``.

Not covered: MXFP4 (gpt-oss) and bitsandbytes checkpoints, GPTQ act-order with a row-parallel split (every
rank keeps all groups while ``g_idx`` is split), 3-, 5-, 6- and 7-bit packings.
"""

from __future__ import annotations

from ._vllm_probe import make_probe_truthful

make_probe_truthful()  # vLLM's quantization modules call has_humming() when they are imported

import torch
from vllm.config import get_current_vllm_config
from vllm.model_executor import parameter as vllm_parameter
from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase, RoutedExperts, UnquantizedFusedMoEMethod
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from ._core import ConfigCore, LinearCore, param_classes
from ._moe import MoECore

__all__ = ["HummingConfig", "HummingLinearMethod", "HummingMoEMethod", "capture_sizes"]


@register_quantization_config("humming_ir")
class HummingConfig(ConfigCore, QuantizationConfig):
    """The checkpoint's own ``quantization_config``, read by humming (:class:`._core.ConfigCore`)."""

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, RoutedExperts):
            return self._moe_method(layer, prefix)
        if not isinstance(layer, LinearBase):
            return None
        names = self.linear_shards(prefix)
        return UnquantizedLinearMethod() if names is None else HummingLinearMethod(self, prefix, names)

    def _moe_method(self, layer, prefix: str):
        projections = (layer.ckpt_gate_proj_name, layer.ckpt_up_proj_name, layer.ckpt_down_proj_name)
        names = [f"{prefix}.0.{p}" for p in projections if p]
        if self.skipped(prefix, names):
            return UnquantizedFusedMoEMethod(layer.moe_config)
        return HummingMoEMethod(self, prefix, layer.moe_config, names)


def capture_sizes() -> tuple[int, ...]:
    """The batch sizes vLLM captures in CUDA graphs (its compilation config), largest last; ``(1,)`` when
    it captures none."""
    sizes = get_current_vllm_config().compilation_config.cudagraph_capture_sizes or []
    return tuple(sorted({1, *sizes}))


class HummingLinearMethod(LinearCore, LinearMethodBase):
    """One vLLM linear layer on humming weights (:class:`._core.LinearCore`)."""

    PARAMS = param_classes(vllm_parameter)
    capture_sizes = staticmethod(capture_sizes)


class HummingMoEMethod(MoECore, FusedMoEMethodBase):
    """vLLM's routed experts (``RoutedExperts``) on ``humming.moe.fused_moe`` (:class:`._moe.MoECore`): every
    expert's checkpoint tensors loaded by vLLM's expert weight loader into expert-stacked parameters of this
    rank's partition (w13: gate and up rows side by side, w2: down), decoded by humming's reader and stacked."""

    capture_sizes = staticmethod(capture_sizes)

    def __init__(self, config: HummingConfig, prefix: str, moe, projections: list[str]):
        super().__init__(moe)
        self.init_core(config, prefix, projections, moe.activation)

    def get_fused_moe_quant_config(self, layer: torch.nn.Module):
        return None  # humming's kernels take the weights as QuantizedWeight objects, not vLLM's quant config

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None):
        # shared experts: vLLM's MoE runner runs them itself for a method without an internal modular kernel
        return self.run(layer, x, topk_weights, topk_ids, layer.expert_map)
