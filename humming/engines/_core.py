"""The body of humming's engine quantization methods, the same for vLLM and SGLang (SGLang forked vLLM's linear
layers, parameter classes and weight loaders): the config's answers, the linear method's three hooks, and the
parameters they register (:mod:`._params`). Each engine's module mixes these into its own base classes and
names its parameter classes (``PARAMS``) and the batch sizes it captures in CUDA graphs (``capture_sizes``)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ..ir.concat import concat
from ..ir.dtypes import HALF_DTYPES
from ..linear import linear
from ..loaders.activations import reader_activation
from ..loaders.checkpoint import open_reader
from ..loaders.errors import UnsupportedFormatError
from ..nn.linear import QuantizedLinear
from ._params import Leaf, block_size, is_skipped, leaves, method_of

__all__ = ["ConfigCore", "LinearCore", "keeping_checkpoint_dtype", "param_classes", "shard_names"]

#: the parameter classes an engine's module provides (vLLM's and SGLang's have these names)
PARAM_CLASSES = (
    "BasevLLMParameter",
    "BlockQuantScaleParameter",
    "ChannelQuantScaleParameter",
    "ModelWeightParameter",
    "PackedColumnParameter",
    "PackedvLLMParameter",
    "PerTensorScaleParameter",
    "RowvLLMParameter",
)


def param_classes(module) -> SimpleNamespace:
    """The engine's parameter classes, from its parameter module."""
    return SimpleNamespace(**{name: getattr(module, name) for name in PARAM_CLASSES})


class ConfigCore:
    """The checkpoint's own ``quantization_config``, read by humming; registered as ``"humming_ir"``."""

    def __init__(self, qconfig: dict, backend: str = "auto"):
        super().__init__()
        if "quantization" in qconfig and "quant_method" not in qconfig:  # ModelOpt's hf_quant_config.json
            qconfig = {"quant_method": "modelopt", **qconfig}
        method_of(qconfig)
        self.qconfig, self.backend = qconfig, backend
        self.weight_block_size = block_size(qconfig)

    def get_name(self) -> str:
        return "humming_ir"

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return list(HALF_DTYPES)

    @classmethod
    def get_min_capability(cls) -> int:
        return 75  # Triton kernels from Turing on

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["hf_quant_config.json"]

    @classmethod
    def from_config(cls, config: dict):
        return cls(config)

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None) -> str | None:
        """``"humming_ir"`` for a checkpoint humming reads when the user asked for it; None otherwise, so
        the engine keeps choosing its own method."""
        if user_quant != "humming_ir":
            return None
        method_of(hf_quant_cfg)  # an unsupported format is an error naming it, not a silent fallback
        return "humming_ir"

    def linear_shards(self, prefix: str) -> list[str] | None:
        """The checkpoint modules of linear layer ``prefix``; None when the checkpoint leaves them all
        unquantized (the engine's own unquantized method serves the layer then)."""
        names = shard_names(prefix, self.packed_modules_mapping)
        return None if self.skipped(prefix, names) else names

    def skipped(self, prefix: str, names: list[str]) -> bool:
        """Whether the checkpoint leaves all of layer ``prefix``'s modules ``names`` unquantized (an error
        when it quantizes some of them only)."""
        skipped = [is_skipped(self.qconfig, name) for name in names]
        if any(skipped) and not all(skipped):
            raise UnsupportedFormatError(
                f"{prefix}: the checkpoint quantizes some of its modules {names} and not others ({skipped})"
            )
        return all(skipped)


def shard_names(prefix: str, packed_modules_mapping: dict) -> list[str]:
    """Checkpoint module names of a layer's shards: the engine's ``packed_modules_mapping`` (``qkv_proj`` ->
    ``q_proj``, ``k_proj``, ``v_proj``) for fused layers, the layer's own name otherwise."""
    head, _, tail = prefix.rpartition(".")
    packed = packed_modules_mapping.get(tail)
    if not packed:
        return [prefix]
    return [f"{head}.{p}" if head else p for p in packed]


class LinearCore:
    """One linear layer (plain, fused QKV or gate / up, column- or row-parallel) on humming weights."""

    PARAMS: SimpleNamespace  # the engine's parameter classes (param_classes)

    @staticmethod
    def capture_sizes() -> tuple[int, ...]:
        """The batch sizes the engine captures in CUDA graphs (the warmup compiles their kernels)."""
        raise NotImplementedError

    def __init__(self, config: ConfigCore, prefix: str, names: list[str]):
        self.config, self.prefix, self.names = config, prefix, names
        self.quant_config = config  # where the engines' loaders look up weight_block_size

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
        loader = keeping_checkpoint_dtype(extra_weight_attrs["weight_loader"])
        for leaf in found:
            if leaf.block:
                layer.weight_block_size = self.config.weight_block_size  # vLLM's loaders read it here
            shape = list(leaf.shape)
            if leaf.out_dim is not None:
                shape[leaf.out_dim] = sum(leaf.rows(n) for n in sizes)
            param = _parameter(self.PARAMS, leaf, torch.empty(shape, dtype=leaf.dtype or params_dtype), loader)
            param.humming_adopt = leaf.dtype is None
            layer.register_parameter(leaf.name, param)
        if found[0].name == "weight_packed" and found[0].dtype == torch.int32:  # compressed-tensors' [N, K]
            layer.register_parameter(
                "weight_shape",
                self.PARAMS.BasevLLMParameter(data=torch.empty(2, dtype=torch.int64), weight_loader=loader),
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
            # warmup runs each capture size once: the planned kernel prepares the weights it reads (a repack
            # for a backend that does not run them, such as the CUDA kernels for NVFP4 x bf16, would fail),
            # and frees the IR codes a prepared CUDA layout holds, so that a served weight takes its memory once
            from .. import warmup

            for module in layer.humming:
                warmup(
                    [module.weight],
                    m_values=self.capture_sizes(),
                    act=module.act,
                    act_dtype=layer.humming_params_dtype,
                    progress=False,
                    keep_codes=False,
                )

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        outs = [
            linear(x, m.weight, act=m.act, backend=m.backend) if m.act_scale is None else m(x) for m in layer.humming
        ]
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return y if bias is None else y + bias


def _parameter(p: SimpleNamespace, leaf: Leaf, data: torch.Tensor, loader) -> torch.nn.Parameter:
    """The engine's parameter class (of ``p``) whose loader slices ``leaf`` as its dims say."""
    if leaf.per_shard:
        return p.PerTensorScaleParameter(data=data, weight_loader=loader)
    if leaf.block:
        return p.BlockQuantScaleParameter(
            data=data, input_dim=leaf.in_dim, output_dim=leaf.out_dim, weight_loader=loader
        )
    if leaf.packed:
        kw = dict(data=data, output_dim=leaf.out_dim, packed_dim=leaf.out_dim, packed_factor=leaf.unit)
        if leaf.in_dim is None:
            return p.PackedColumnParameter(**kw, weight_loader=loader)
        return p.PackedvLLMParameter(**kw, input_dim=leaf.in_dim, weight_loader=loader)
    if leaf.out_dim is not None and leaf.in_dim is not None:
        return p.ModelWeightParameter(data=data, input_dim=leaf.in_dim, output_dim=leaf.out_dim, weight_loader=loader)
    if leaf.out_dim is not None:
        return p.ChannelQuantScaleParameter(data=data, output_dim=leaf.out_dim, weight_loader=loader)
    if leaf.in_dim is not None:
        return p.RowvLLMParameter(data=data, input_dim=leaf.in_dim, weight_loader=loader)
    return p.BasevLLMParameter(data=data, weight_loader=loader)


def keeping_checkpoint_dtype(loader):
    """The engine's loader, after giving a float scale parameter whose leaf names no dtype
    (``param.humming_adopt``) the dtype of its first checkpoint tensor, so the scales keep the producer's bits
    (the engines' own methods convert them to ``params_dtype``); a later tensor of another dtype is an error."""

    def load(param, loaded_weight, *args, **kwargs):
        if getattr(param, "humming_adopt", False) and param.dtype != loaded_weight.dtype:
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
