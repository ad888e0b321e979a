"""The body of humming's engine MoE methods, the same for vLLM and SGLang (SGLang forked vLLM's ``FusedMoE``
expert weight loader): the checkpoint's per-expert tensors of any format :func:`._params.leaves` describes,
registered as expert-stacked parameters of this rank's partition, decoded by humming's reader of the format
and stacked, run on ``humming.moe.fused_moe``.

The engines' expert loader places a tensor by its name and two attributes: ``is_transposed`` (the tensor is
``[K, N]``: GPTQ's and AWQ's, so gate / up split along dim 1 and down along dim 0) and ``quant_method``
(``"tensor"``: one value per expert and shard; ``"channel"``: every rank keeps the tensor whole along K;
``"group"`` / ``"block"``: split along K with the weight). ``input_scale`` tensors are one value per expert
(the engines keep the last of gate's and up's, as their own FP8 MoE methods do), ``weight_shape`` one pair.
"""

from __future__ import annotations

import torch

from ..ir.concat import concat, stack
from ..loaders.activations import merged_activation, reader_activation
from ..loaders.checkpoint import open_reader
from ..loaders.errors import UnsupportedFormatError
from ..moe import fused_moe
from ._core import ConfigCore, keeping_checkpoint_dtype
from ._params import Leaf, leaves

__all__ = ["MOE_ACTIVATIONS", "MoECore"]

#: the engines' MoE activations -> humming.moe.fused_moe's (gate and up rows concatenated, as both load them)
MOE_ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_tanh", "swigluoai_uninterleave": "swiglu_oai"}
#: attributes of the engines' expert parameters their loaders read (the rest of extra_weight_attrs)
_LOADER_ATTRS = ("weight_loader", "global_num_experts", "unpadded_hidden_size")


def scale_kind(leaf: Leaf) -> str:
    """How the engines' expert loader places ``leaf`` (its ``FusedMoeWeightScaleSupported`` value)."""
    if leaf.per_shard:
        return "tensor"
    if leaf.block:
        return "block"
    if leaf.in_dim is None or leaf.shape[leaf.in_dim] == 1:  # one scale along K: each rank keeps it whole
        return "channel"
    return "group"


class MoECore:
    """An engine's routed experts on humming weights; ``projections`` are the checkpoint's gate, up and down
    module names of expert 0 (``{prefix}.0.gate_proj``...)."""

    @staticmethod
    def capture_sizes() -> tuple[int, ...]:
        """The batch sizes the engine captures in CUDA graphs (the warmup compiles their kernels)."""
        raise NotImplementedError

    def init_core(self, config: ConfigCore, prefix: str, projections: list[str], activation) -> None:
        activation = str(getattr(activation, "value", activation))
        if activation not in MOE_ACTIVATIONS:
            raise UnsupportedFormatError(f"{prefix}: MoE activation {activation!r} ({sorted(MOE_ACTIVATIONS)})")
        if len(projections) != 3:
            raise UnsupportedFormatError(f"{prefix}: gated experts (gate, up, down) expected, got {projections}")
        self.config, self.prefix, self.projections = config, prefix, projections
        self.activation = MOE_ACTIVATIONS[activation]

    def create_weights(
        self,
        layer: torch.nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ):
        inter, qconfig = intermediate_size_per_partition, self.config.qconfig
        loader = keeping_checkpoint_dtype(extra_weight_attrs["weight_loader"])
        extra = {k: v for k, v in extra_weight_attrs.items() if k not in _LOADER_ATTRS}
        gate, _, down = self.projections
        layer.humming_leaves = {
            "w13": (leaves(qconfig, gate, 2 * inter, hidden_size, hidden_size, 2, False), [inter, inter]),
            "w2": (leaves(qconfig, down, hidden_size, inter, inter, 1, False), [hidden_size]),
        }
        for stem, (found, sizes) in layer.humming_leaves.items():
            for leaf in found:
                if not leaf.decoded:
                    continue
                shape = list(leaf.shape)
                if leaf.out_dim is not None:
                    shape[leaf.out_dim] = sum(leaf.rows(n) for n in sizes)
                data = torch.empty(num_experts, *shape, dtype=leaf.dtype or params_dtype)
                attrs = dict(quant_method=scale_kind(leaf), is_transposed=leaf.out_dim == 1)
                attrs["humming_adopt"] = leaf.dtype is None  # keeping_checkpoint_dtype: the checkpoint's dtype
                _register(layer, f"{stem}_{leaf.name}", data, {**extra, **attrs, "weight_loader": loader})
            if found[0].name == "weight_packed" and found[0].dtype == torch.int32:  # compressed-tensors' [N, K]
                data = torch.empty(num_experts, 2, dtype=torch.int64)
                _register(layer, f"{stem}_weight_shape", data, {**extra, "weight_loader": loader})
        layer.humming_k, layer.humming_params_dtype = {"w13": hidden_size, "w2": inter}, params_dtype

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        weights, specs = {}, {}
        for stem, (found, sizes) in layer.humming_leaves.items():
            kept = [leaf for leaf in found if leaf.decoded]
            stacked = {leaf.name: getattr(layer, f"{stem}_{leaf.name}").data for leaf in kept}
            names = self.projections[:2] if stem == "w13" else self.projections[2:]
            experts, shard_specs = [], []
            for e in range(next(iter(stacked.values())).shape[0]):
                parts = []
                for i, (proj, n) in enumerate(zip(names, sizes)):
                    name = _expert_module(proj, e)
                    tensors = {f"{name}.{leaf.name}": _shard(stacked[leaf.name][e], leaf, sizes, i) for leaf in kept}
                    if hasattr(layer, f"{stem}_weight_shape"):  # each shard's own [N, K]
                        tensors[f"{name}.weight_shape"] = torch.tensor([n, layer.humming_k[stem]], dtype=torch.int64)
                    reader = open_reader(self.config.qconfig, tensors)
                    parts.append(reader.load(name))
                    shard_specs.append((reader_activation(reader, name), tensors))
                experts.append(concat(parts) if len(parts) > 1 else parts[0])
            weights[stem], specs[stem] = stack(experts), shard_specs
            for leaf in kept:
                delattr(layer, f"{stem}_{leaf.name}")
            if hasattr(layer, f"{stem}_weight_shape"):
                delattr(layer, f"{stem}_weight_shape")
        layer.humming_w13, layer.humming_w2 = weights["w13"], weights["w2"]
        layer.humming_act, layer.humming_act_scales = _activation(self.prefix, specs)
        if layer.humming_w13.device.type == "cuda":  # the planned kernels prepare what they read (_core.py)
            self.warm_experts(layer)

    def warm_experts(self, layer) -> None:
        """Make the layer's kernels ready at the engine's capture sizes and free the IR codes that a prepared
        CUDA layout holds (``keep_codes=False``: served experts take their memory once). Where the layer says
        its ``top_k`` (vLLM's and SGLang's ``FusedMoE`` do), its fused_moe call as an :class:`~humming.moe.MoeCall`:
        the routing blocks, w13 in the gated epilogue's layout, the activation and combine passes, at the token
        counts it serves. Else its two expert weights as grouped GEMMs (w13's gated layout is then made on the
        first call)."""
        from .. import warmup
        from ..moe import MoeCall
        from ..moe.call import top_k_unsupported

        w13, w2 = layer.humming_w13, layer.humming_w2
        top_k, expert_map = getattr(layer, "top_k", None), getattr(layer, "expert_map", None)
        layers = [w13, w2]
        if top_k_unsupported(top_k, w13, expert_map) is None:
            w13_scale, w2_scale = layer.humming_act_scales
            options = dict(activation=self.activation, expert_map=expert_map, act=layer.humming_act)
            options.update(w13_act_scale=w13_scale, w2_act_scale=w2_scale, backend=self.config.backend)
            layers = [MoeCall(w13, w2, top_k, **options)]
        warmup(
            layers,
            m_values=self.capture_sizes(),
            act=layer.humming_act,
            act_dtype=layer.humming_params_dtype,
            progress=False,
            keep_codes=False,
        )

    def run(self, layer, x, topk_weights, topk_ids, expert_map=None) -> torch.Tensor:
        """``humming.moe.fused_moe`` on the engine's routing (``expert_map``: its expert parallelism)."""
        w13_scale, w2_scale = layer.humming_act_scales
        return fused_moe(
            x,
            layer.humming_w13,
            layer.humming_w2,
            topk_weights,
            topk_ids,
            activation=self.activation,
            expert_map=expert_map,
            act=layer.humming_act,
            w13_act_scale=w13_scale,
            w2_act_scale=w2_scale,
            backend=self.config.backend,
        )


def _register(layer: torch.nn.Module, name: str, data: torch.Tensor, attrs: dict) -> None:
    param = torch.nn.Parameter(data, requires_grad=False)
    for key, value in attrs.items():
        setattr(param, key, value)
    layer.register_parameter(name, param)


def _expert_module(proj: str, e: int) -> str:
    """Expert ``e``'s checkpoint module of ``proj``, expert 0's (``...experts.0.gate_proj``)."""
    head, _, tail = proj.rpartition(".0.")
    return f"{head}.{e}.{tail}"


def _shard(data: torch.Tensor, leaf: Leaf, sizes: list[int], index: int) -> torch.Tensor:
    """Shard ``index``'s part of one expert's loaded leaf: its rows along N, or its scalar."""
    if leaf.per_shard:
        return data[index]
    if leaf.out_dim is None:
        return data
    rows = [leaf.rows(n) for n in sizes]
    return data.narrow(leaf.out_dim, sum(rows[:index]), rows[index])


def _activation(prefix: str, specs: dict) -> tuple[str | None, tuple]:
    """The experts' activation scheme (one for both GEMMs) and the static scales of w13's and w2's inputs:
    the max over their experts' (and gate's and up's) ``input_scale``, or None for scales computed per call."""
    merged = {stem: merged_activation(f"{prefix} {stem}", [spec for spec, _ in found]) for stem, found in specs.items()}
    if merged["w13"].act != merged["w2"].act:
        raise UnsupportedFormatError(f"{prefix}: gate / up and down with activation schemes {merged}")
    scales = []
    for stem, found in specs.items():
        if merged[stem].scale_tensor is None:
            scales.append(None)
            continue
        values = [tensors[spec.scale_tensor].to(torch.float32).reshape(()) for spec, tensors in found]
        scales.append(torch.stack(values).amax().reshape(1))
    return merged["w13"].act, tuple(scales)
