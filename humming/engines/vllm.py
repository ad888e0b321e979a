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
- MoE: vLLM's routed experts (``RoutedExperts``) of GPTQ checkpoints get :class:`HummingMoEMethod`: vLLM's
  expert weight loader fills expert-stacked parameters of this rank's partition, each expert is decoded and
  stacked, ``apply`` is ``humming.moe.fused_moe`` on vLLM's routing (``topk_weights`` / ``topk_ids``, its
  ``expert_map``); other formats' experts are an error naming the supported ones.

Not covered: MoE experts of formats other than GPTQ, MXFP4 (gpt-oss) and bitsandbytes checkpoints, GPTQ
act-order with a row-parallel split (every rank keeps all groups while ``g_idx`` is split), 3-, 5-, 6- and
7-bit packings.
"""

from __future__ import annotations

from ._vllm_probe import make_probe_truthful

make_probe_truthful()  # vLLM's quantization modules call has_humming() when they are imported

import torch
from vllm.config import get_current_vllm_config
from vllm.model_executor import parameter as vllm_parameter
from vllm.model_executor.layers.fused_moe import (
    FusedMoEMethodBase,
    FusedMoeWeightScaleSupported,
    RoutedExperts,
    UnquantizedFusedMoEMethod,
)
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from ..ir.concat import concat, stack
from ..loaders.checkpoint import open_reader
from ..loaders.errors import UnsupportedFormatError
from ..moe import fused_moe
from ._core import ConfigCore, LinearCore, keeping_checkpoint_dtype, param_classes
from ._params import is_skipped, leaves, method_of

__all__ = ["HummingConfig", "HummingLinearMethod", "HummingMoEMethod", "capture_sizes"]

#: vLLM's MoE activations -> humming.moe.fused_moe's (gate and up rows concatenated, as vLLM loads them)
MOE_ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_tanh", "swigluoai_uninterleave": "swiglu_oai"}
#: formats whose experts this adapter serves (weight-only GPTQ: the MoE fixture the tests run)
MOE_METHODS = ("gptq",)


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
        if all(is_skipped(self.qconfig, name) for name in names):
            return UnquantizedFusedMoEMethod(layer.moe_config)
        method = method_of(self.qconfig)
        if method not in MOE_METHODS:
            raise UnsupportedFormatError(
                f"{prefix}: humming's vLLM adapter serves {', '.join(MOE_METHODS)} experts, not {method!r} ones"
            )
        return HummingMoEMethod(self, prefix, layer.moe_config)


def capture_sizes() -> tuple[int, ...]:
    """The batch sizes vLLM captures in CUDA graphs (its compilation config), largest last; ``(1,)`` when
    it captures none."""
    sizes = get_current_vllm_config().compilation_config.cudagraph_capture_sizes or []
    return tuple(sorted({1, *sizes}))


class HummingLinearMethod(LinearCore, LinearMethodBase):
    """One vLLM linear layer on humming weights (:class:`._core.LinearCore`)."""

    PARAMS = param_classes(vllm_parameter)
    capture_sizes = staticmethod(capture_sizes)


class HummingMoEMethod(FusedMoEMethodBase):
    """vLLM's routed experts (``RoutedExperts``) on ``humming.moe.fused_moe``: every expert's checkpoint
    tensors loaded by vLLM's expert weight loader into expert-stacked parameters of this rank's partition
    (w13: gate and up rows side by side, w2: down), decoded by humming's reader and stacked."""

    def __init__(self, config: HummingConfig, prefix: str, moe):
        super().__init__(moe)
        self.config, self.prefix = config, prefix

    def create_weights(
        self,
        layer: torch.nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ):
        inter = intermediate_size_per_partition
        activation = str(getattr(self.moe.activation, "value", self.moe.activation))
        if activation not in MOE_ACTIVATIONS:
            raise UnsupportedFormatError(f"{self.prefix}: MoE activation {activation!r} ({sorted(MOE_ACTIVATIONS)})")
        loader = keeping_checkpoint_dtype(extra_weight_attrs.pop("weight_loader"))
        extra = {k: v for k, v in extra_weight_attrs.items() if k not in ("global_num_experts", "unpadded_hidden_size")}
        qconfig = self.config.qconfig
        layer.humming_leaves = {
            "w13": (leaves(qconfig, self.prefix, 2 * inter, hidden_size, hidden_size, 2, False), [inter, inter]),
            "w2": (leaves(qconfig, self.prefix, hidden_size, inter, inter, 1, False), [hidden_size]),
        }
        group = int(qconfig.get("group_size", -1))
        scale_kind = FusedMoeWeightScaleSupported.GROUP if group > 0 else FusedMoeWeightScaleSupported.CHANNEL
        for stem, (found, sizes) in layer.humming_leaves.items():
            for leaf in found:
                if not leaf.decoded:
                    continue
                shape = list(leaf.shape)
                shape[leaf.out_dim] = sum(leaf.rows(n) for n in sizes)
                param = torch.nn.Parameter(
                    torch.empty(num_experts, *shape, dtype=leaf.dtype or params_dtype), requires_grad=False
                )
                # GPTQ's tensors are [K, N]: vLLM's loader splits w1 / w3 along dim 1 and w2 along dim 0
                attrs = {**extra, "quant_method": scale_kind.value, "is_transposed": True, "weight_loader": loader}
                for key, value in {**attrs, "humming_adopt": leaf.dtype is None}.items():
                    setattr(param, key, value)
                layer.register_parameter(f"{stem}_{leaf.name}", param)
        layer.humming_activation = MOE_ACTIVATIONS[activation]
        layer.humming_params_dtype = params_dtype

    def get_fused_moe_quant_config(self, layer: torch.nn.Module):
        return None  # humming's kernels take the weights as QuantizedWeight objects, not vLLM's quant config

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        weights = {}
        for stem, (found, sizes) in layer.humming_leaves.items():
            kept = [leaf for leaf in found if leaf.decoded]
            stacked = {leaf.name: getattr(layer, f"{stem}_{leaf.name}").data for leaf in kept}
            experts = []
            for e in range(next(iter(stacked.values())).shape[0]):
                parts = []
                for i in range(len(sizes)):
                    name = f"{self.prefix}.{e}.{stem}.{i}"
                    tensors = {}
                    for leaf in kept:
                        rows = [leaf.rows(m) for m in sizes]
                        part = stacked[leaf.name][e].narrow(leaf.out_dim, sum(rows[:i]), rows[i])
                        tensors[f"{name}.{leaf.name}"] = part
                    parts.append(open_reader(self.config.qconfig, tensors).load(name))
                experts.append(concat(parts) if len(parts) > 1 else parts[0])
            weights[stem] = stack(experts)
            for leaf in kept:
                delattr(layer, f"{stem}_{leaf.name}")
        layer.humming_w13, layer.humming_w2 = weights["w13"], weights["w2"]
        if layer.humming_w13.device.type == "cuda":
            from .. import prepare, warmup

            for qw in (layer.humming_w13, layer.humming_w2):
                prepare(qw, backend="cuda")
            warmup(
                [layer.humming_w13, layer.humming_w2],
                m_values=capture_sizes(),
                act_dtype=layer.humming_params_dtype,
                progress=False,
            )

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None):
        # shared experts: vLLM's MoE runner runs them itself for a method without an internal modular kernel
        return fused_moe(
            x,
            layer.humming_w13,
            layer.humming_w2,
            topk_weights,
            topk_ids,
            activation=layer.humming_activation,
            expert_map=layer.expert_map,
            backend=self.config.backend,
        )
