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
  sizes (:mod:`._vllm_params`), so vLLM's own weight loaders write each shard's slice into place (tensor
  parallel slicing, fused q / k / v and gate / up shards, replicated KV heads): no full tensor is kept.
- ``process_weights_after_loading`` splits those parameters back into the layer's shards, decodes each with
  humming's reader of the format (bit-exact against the producers), joins the shards exactly
  (``humming.concat``; shards that cannot be joined exactly, such as 2-D weight blocks straddling two shards,
  run one ``humming.linear`` each, their outputs concatenated), and on CUDA prepares the weights and compiles
  the kernels of every batch size vLLM captures in CUDA graphs, in the layer's ``params_dtype``.
- ``apply`` is ``humming.linear`` (one ``torch.ops.humming.linear`` node under vLLM's ``torch.compile``).

Not covered: MoE layers (vLLM's ``RoutedExperts``: no method is returned, so vLLM refuses the model rather
than serving it unquantized), MXFP4 (gpt-oss) and bitsandbytes checkpoints, GPTQ act-order with a
row-parallel split (every rank keeps all groups while ``g_idx`` is split), 3-, 5-, 6- and 7-bit packings.
"""

from __future__ import annotations

from ._vllm_probe import make_probe_truthful

make_probe_truthful()  # vLLM's quantization modules call has_humming() when they are imported

import torch
from vllm.config import get_current_vllm_config
from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase, FusedMoeWeightScaleSupported, RoutedExperts
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.parameter import (
    BasevLLMParameter,
    BlockQuantScaleParameter,
    ChannelQuantScaleParameter,
    ModelWeightParameter,
    PackedColumnParameter,
    PackedvLLMParameter,
    PerTensorScaleParameter,
    RowvLLMParameter,
)

from ..ir.concat import concat, stack
from ..linear import linear
from ..loaders.activations import reader_activation
from ..loaders.checkpoint import open_reader
from ..loaders.errors import UnsupportedFormatError
from ..moe import fused_moe
from ..nn.linear import QuantizedLinear
from ._vllm_params import Leaf, is_skipped, leaves, method_of

__all__ = ["HummingConfig", "HummingLinearMethod", "HummingMoEMethod", "capture_sizes"]

#: vLLM's MoE activations -> humming.moe.fused_moe's (gate and up rows concatenated, as vLLM loads them)
MOE_ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_tanh", "swigluoai_uninterleave": "swiglu_oai"}
#: formats whose experts this adapter serves (weight-only GPTQ: the MoE fixture the tests run)
MOE_METHODS = ("gptq",)


@register_quantization_config("humming_ir")
class HummingConfig(QuantizationConfig):
    """The checkpoint's own ``quantization_config``, read by humming."""

    def __init__(self, qconfig: dict, backend: str = "auto"):
        super().__init__()
        if "quantization" in qconfig and "quant_method" not in qconfig:  # ModelOpt's hf_quant_config.json
            qconfig = {"quant_method": "modelopt", **qconfig}
        method_of(qconfig)
        self.qconfig, self.backend = qconfig, backend

    def get_name(self) -> str:
        return "humming_ir"

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 75  # Triton kernels from Turing on

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["hf_quant_config.json"]

    @classmethod
    def from_config(cls, config: dict) -> HummingConfig:
        return cls(config)

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None) -> str | None:
        """``"humming_ir"`` for a checkpoint humming reads when the user asked for it; None otherwise, so
        vLLM keeps choosing its own method."""
        if user_quant != "humming_ir":
            return None
        method_of(hf_quant_cfg)  # an unsupported format is an error naming it, not a silent fallback
        return "humming_ir"

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, RoutedExperts):
            return self._moe_method(layer, prefix)
        if not isinstance(layer, LinearBase):
            return None
        names = shard_names(prefix, self.packed_modules_mapping)
        skipped = [is_skipped(self.qconfig, name) for name in names]
        if all(skipped):
            return UnquantizedLinearMethod()
        if any(skipped):
            raise UnsupportedFormatError(
                f"{prefix}: the checkpoint quantizes some of its shards {names} and not others ({skipped})"
            )
        return HummingLinearMethod(self, prefix, names)

    def _moe_method(self, layer, prefix: str):
        projections = (layer.ckpt_gate_proj_name, layer.ckpt_up_proj_name, layer.ckpt_down_proj_name)
        names = [f"{prefix}.0.{p}" for p in projections if p]
        if all(is_skipped(self.qconfig, name) for name in names):
            from vllm.model_executor.layers.fused_moe import UnquantizedFusedMoEMethod

            return UnquantizedFusedMoEMethod(layer.moe_config)
        method = method_of(self.qconfig)
        if method not in MOE_METHODS:
            raise UnsupportedFormatError(
                f"{prefix}: humming's vLLM adapter serves {', '.join(MOE_METHODS)} experts, not {method!r} ones"
            )
        return HummingMoEMethod(self, prefix, layer.moe_config)


def shard_names(prefix: str, packed_modules_mapping: dict) -> list[str]:
    """Checkpoint module names of a layer's shards: vLLM's ``packed_modules_mapping`` (``qkv_proj`` ->
    ``q_proj``, ``k_proj``, ``v_proj``) for fused layers, the layer's own name otherwise."""
    head, _, tail = prefix.rpartition(".")
    packed = packed_modules_mapping.get(tail)
    if not packed:
        return [prefix]
    return [f"{head}.{p}" if head else p for p in packed]


def capture_sizes() -> tuple[int, ...]:
    """The batch sizes vLLM captures in CUDA graphs (its compilation config), largest last; ``(1,)`` when
    it captures none."""
    sizes = get_current_vllm_config().compilation_config.cudagraph_capture_sizes or []
    return tuple(sorted({1, *sizes}))


class HummingLinearMethod(LinearMethodBase):
    """One vLLM linear layer (plain, fused QKV or gate / up, column- or row-parallel) on humming weights."""

    def __init__(self, config: HummingConfig, prefix: str, names: list[str]):
        self.config, self.prefix, self.names = config, prefix, names

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ):
        sizes = list(output_partition_sizes)
        if len(sizes) != len(self.names):
            raise UnsupportedFormatError(
                f"{self.prefix}: {len(sizes)} output partitions, packed_modules_mapping gives {self.names}"
            )
        row_parallel = input_size != input_size_per_partition
        found = leaves(
            self.config.qconfig, self.names[0], sum(sizes), input_size_per_partition, input_size, len(sizes),
            row_parallel,
        )  # fmt: skip
        loader = _keeping_checkpoint_dtype(extra_weight_attrs["weight_loader"])
        for leaf in found:
            if leaf.block:
                layer.weight_block_size = [leaf.unit, -(-input_size_per_partition // leaf.shape[1])]
            shape = list(leaf.shape)
            if leaf.out_dim is not None:
                shape[leaf.out_dim] = sum(leaf.rows(n) for n in sizes)
            data = torch.empty(shape, dtype=leaf.dtype or params_dtype)
            layer.register_parameter(leaf.name, _parameter(leaf, data, loader))
        if found[0].name == "weight_packed" and found[0].dtype == torch.int32:  # compressed-tensors' [N, K]
            layer.register_parameter(
                "weight_shape", BasevLLMParameter(data=torch.empty(2, dtype=torch.int64), weight_loader=loader)
            )
        layer.humming_leaves, layer.humming_sizes, layer.humming_k = found, sizes, input_size_per_partition
        layer.humming_params_dtype = params_dtype

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        parts, acts = [], []
        for i, (name, n) in enumerate(zip(self.names, layer.humming_sizes)):
            tensors = {f"{name}.{x.name}": _shard_of(layer, x, i) for x in layer.humming_leaves if x.decoded}
            if hasattr(layer, "weight_shape"):  # each shard's own [N, K], which the fused parameter cannot hold
                tensors[f"{name}.weight_shape"] = torch.tensor([n, layer.humming_k], dtype=torch.int64)
            reader = open_reader(self.config.qconfig, tensors)
            parts.append(reader.load(name))
            spec = reader_activation(reader, name)
            acts.append((spec.act, None if spec.scale_tensor is None else tensors[spec.scale_tensor].reshape(())))
        for leaf in layer.humming_leaves:
            delattr(layer, leaf.name)
        if hasattr(layer, "weight_shape"):
            del layer.weight_shape
        weights = _joined(parts, acts)
        layer.humming = torch.nn.ModuleList(
            QuantizedLinear(qw, act=act, act_scale=scale, backend=self.config.backend) for qw, (act, scale) in weights
        )
        if parts[0].device.type == "cuda":
            from .. import prepare, warmup

            for module in layer.humming:
                prepare(module.weight, backend="cuda", act=module.act)
                warmup(
                    [module.weight],
                    m_values=capture_sizes(),
                    act=module.act,
                    act_dtype=layer.humming_params_dtype,
                    progress=False,
                )

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        outs = [
            linear(x, m.weight, act=m.act, backend=m.backend) if m.act_scale is None else m(x) for m in layer.humming
        ]
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return y if bias is None else y + bias


def _parameter(leaf: Leaf, data: torch.Tensor, loader) -> torch.nn.Parameter:
    """The vLLM parameter class whose loader slices ``leaf`` as its dims say."""
    if leaf.per_shard:
        return PerTensorScaleParameter(data=data, weight_loader=loader)
    if leaf.block:
        return BlockQuantScaleParameter(data=data, input_dim=leaf.in_dim, output_dim=leaf.out_dim, weight_loader=loader)
    if leaf.packed:
        kw = dict(data=data, output_dim=leaf.out_dim, packed_dim=leaf.out_dim, packed_factor=leaf.unit)
        if leaf.in_dim is None:
            return PackedColumnParameter(**kw, weight_loader=loader)
        return PackedvLLMParameter(**kw, input_dim=leaf.in_dim, weight_loader=loader)
    if leaf.out_dim is not None and leaf.in_dim is not None:
        return ModelWeightParameter(data=data, input_dim=leaf.in_dim, output_dim=leaf.out_dim, weight_loader=loader)
    if leaf.out_dim is not None:
        return ChannelQuantScaleParameter(data=data, output_dim=leaf.out_dim, weight_loader=loader)
    if leaf.in_dim is not None:
        return RowvLLMParameter(data=data, input_dim=leaf.in_dim, weight_loader=loader)
    return BasevLLMParameter(data=data, weight_loader=loader)


def _keeping_checkpoint_dtype(loader):
    """vLLM's loader, after giving a 16-bit scale parameter the checkpoint's dtype (float16 or bfloat16) on
    its first tensor, so the scales stay the producer's bits; later tensors of another dtype are an error."""

    def load(param, loaded_weight, *args, **kwargs):
        if param.dtype != loaded_weight.dtype and loaded_weight.dtype in (torch.float16, torch.bfloat16):
            if getattr(param, "humming_dtype_set", False):
                raise UnsupportedFormatError(
                    f"scale tensors of one layer in {param.dtype} and {loaded_weight.dtype}: one dtype expected"
                )
            param.data = torch.empty_like(param.data, dtype=loaded_weight.dtype)
        param.humming_dtype_set = True
        return loader(param, loaded_weight, *args, **kwargs)

    return load


def _shard_of(layer: torch.nn.Module, leaf: Leaf, index: int) -> torch.Tensor:
    """Shard ``index``'s part of a loaded leaf: its rows along N, its scalar, or the whole (shared) tensor."""
    data = getattr(layer, leaf.name).data
    if leaf.per_shard:
        return data[index]
    if leaf.out_dim is None:
        return data
    rows = [leaf.rows(n) for n in layer.humming_sizes]
    return data.narrow(leaf.out_dim, sum(rows[:index]), rows[index])


def _joined(parts: list, acts: list) -> list:
    """``[(weight, (act, static scale))]``: one weight for all shards where they join exactly with one
    activation setting, else one per shard."""
    same_act = all(a == acts[0][0] and (s is None) == (acts[0][1] is None) for a, s in acts)
    same_scale = all(s is None or torch.equal(s, acts[0][1]) for _, s in acts)
    if len(parts) == 1:
        return [(parts[0], acts[0])]
    if same_act and same_scale:
        try:
            return [(concat(parts), acts[0])]
        except ValueError:  # blocks straddling two shards: run them apart
            pass
    return list(zip(parts, acts))


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
        loader = _keeping_checkpoint_dtype(extra_weight_attrs.pop("weight_loader"))
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
                for key, value in attrs.items():
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
