"""A vLLM quantization method on humming: ``quantization="humming_ir"`` for a checkpoint in any format
:func:`humming.load_checkpoint` reads (GPTQ, AWQ, compressed-tensors, FP8, ModelOpt), dense linears.

Importing this module registers :class:`HummingConfig` under the name ``"humming_ir"`` (vLLM's
``register_quantization_config``; vLLM >= 0.33 has a built-in ``"humming"`` method of its own, on the
humming-kernels package). Known limit: humming-kernels' import name is also ``humming``, and vLLM 0.33's
``get_quantization_config`` imports its built-in humming method (``humming.dtypes``) whatever method is asked
for, so with this package installed that lookup fails (``No module named 'humming.dtypes'``) and the vLLM
engine cannot start; the hooks below are tested against vLLM's base classes directly.

vLLM hands it the checkpoint's ``quantization_config``; for each linear layer
:meth:`HummingConfig.get_quant_method` returns a :class:`HummingLinearMethod`, whose hooks vLLM calls:

- ``create_weights`` registers one empty placeholder parameter per tensor name the formats use
  (``qweight``, ``weight_packed``, ``weight_scale``, ``input_scale``...): vLLM's loader finds them by name,
  and their ``weight_loader`` keeps each checkpoint tensor whole, by shard (``q`` / ``k`` / ``v``, ``0`` /
  ``1`` of fused layers). Empty placeholders are exempt from vLLM's every-parameter-loaded check.
- ``process_weights_after_loading`` decodes each shard with humming's own reader for the format (the same
  code, bit-exact against the producers), takes this rank's part (``shard``: column-parallel along N,
  row-parallel along K), joins fused shards (``concat``, exact), reads the activation scheme the checkpoint
  names, and on CUDA prepares and warms the kernels. A layer the checkpoint leaves unquantized (an
  ``ignore`` entry) is refused.
- ``apply`` is ``humming.linear`` (one ``torch.ops.humming.linear`` node under vLLM's ``torch.compile``).

Not covered: fused shards whose 2-D weight blocks would straddle two shards (``concat`` refuses: FP8 128x128
blocks with 96-row k / v projections), MoE layers (``FusedMoE``: no method is returned for them), bitsandbytes
and gpt-oss checkpoints, per-shard static activation scales that differ within a fused layer.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase, ReplicatedLinear, RowParallelLinear
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from ..ir.concat import concat
from ..ir.dtypes import HALF_DTYPES
from ..linear import linear
from ..loaders.activations import reader_activation
from ..loaders.checkpoint import READERS, open_reader
from ..loaders.errors import UnsupportedFormatError
from ..nn.linear import QuantizedLinear

__all__ = ["HummingConfig", "HummingLinearMethod"]

#: every per-module tensor name of the formats this adapter reads
LEAVES = (
    "weight",
    "weight_packed",
    "weight_scale",
    "weight_shape",
    "weight_zero_point",
    "weight_g_idx",
    "weight_global_scale",
    "weight_scale_2",
    "weight_scale_inv",
    "input_scale",
    "input_global_scale",
    "qweight",
    "qzeros",
    "scales",
    "g_idx",
)
_QKV = {"q": 0, "k": 1, "v": 2}


@register_quantization_config("humming_ir")
class HummingConfig(QuantizationConfig):
    """The checkpoint's own ``quantization_config``, read by humming."""

    def __init__(self, qconfig: dict, backend: str = "auto"):
        super().__init__()
        method = str(qconfig.get("quant_method", "")).lower().replace("_", "-")
        if method not in READERS or method in ("mxfp4", "bitsandbytes"):
            raise UnsupportedFormatError(f"humming's vLLM adapter does not read quant_method {method!r}")
        self.qconfig, self.backend = qconfig, backend

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
    def from_config(cls, config: dict) -> HummingConfig:
        if "quantization" in config and "quant_method" not in config:  # ModelOpt's hf_quant_config.json
            config = {"quant_method": "modelopt", **config["quantization"]}
        return cls(config)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> HummingLinearMethod | None:
        if isinstance(layer, LinearBase):
            return HummingLinearMethod(self, prefix)
        return None


class HummingLinearMethod(LinearMethodBase):
    """One vLLM linear layer (plain, fused QKV or gate/up) on a humming weight."""

    def __init__(self, config: HummingConfig, prefix: str):
        self.config, self.prefix = config, prefix

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
        layer.humming_tensors = {}  # (shard, leaf) -> checkpoint tensor
        layer.humming_params_dtype = params_dtype
        layer.humming_sizes = (input_size_per_partition, list(output_partition_sizes))
        for leaf in LEAVES:

            def keep(param, loaded_weight, shard_id=None, leaf=leaf):
                shard = shard_id if shard_id is not None else getattr(loaded_weight, "shard_id", None)
                layer.humming_tensors[(shard, leaf)] = loaded_weight.detach().clone()

            placeholder = torch.nn.Parameter(torch.empty(0), requires_grad=False)
            placeholder.weight_loader = keep
            layer.register_parameter(leaf, placeholder)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        shards = sorted({s for s, _ in layer.humming_tensors}, key=lambda s: _QKV.get(s, s) if s is not None else -1)
        names = self._shard_names(len(shards))
        rank, world = getattr(layer, "tp_rank", 0), getattr(layer, "tp_size", 1)
        dim = None if isinstance(layer, ReplicatedLinear) or world == 1 else int(isinstance(layer, RowParallelLinear))
        parts, specs = [], set()
        for shard, name in zip(shards, names):
            tensors = {f"{name}.{leaf}": t for (s, leaf), t in layer.humming_tensors.items() if s == shard}
            reader = open_reader(self.config.qconfig, tensors)
            if name not in reader.modules():  # left unquantized by the checkpoint
                raise UnsupportedFormatError(
                    f"{name}: not quantized in this checkpoint; serve it without the humming method"
                )
            qw = reader.load(name)
            parts.append(qw if dim is None else qw.shard(dim, rank, world))
            spec = reader_activation(reader, name)
            scale = None if spec.scale_tensor is None else tensors[spec.scale_tensor]
            specs.add((spec.act, None if scale is None else float(scale)))
        if len(specs) != 1:
            raise UnsupportedFormatError(f"{self.prefix}: shards with different activation settings {sorted(specs)}")
        act, scale = specs.pop()
        for leaf in LEAVES:
            delattr(layer, leaf)
        del layer.humming_tensors
        device = layer.bias.device if getattr(layer, "bias", None) is not None else _default_device()
        qw = (concat(parts) if len(parts) > 1 else parts[0]).to(device)
        layer.humming = QuantizedLinear(
            qw, act=act, act_scale=None if scale is None else torch.tensor(scale), backend=self.config.backend
        )
        if device.type == "cuda":
            from .. import prepare, warmup

            prepare(qw, backend="cuda", act=act)
            warmup([qw], m_values=(1, 16, 64, 256), act=act, progress=False)

    def _shard_names(self, count: int) -> list[str]:
        """Checkpoint module names of the layer's shards: vLLM's ``packed_modules_mapping`` (``qkv_proj`` ->
        ``q_proj``, ``k_proj``, ``v_proj``) for fused layers, the layer's own name otherwise."""
        head, _, tail = self.prefix.rpartition(".")
        packed = self.config.packed_modules_mapping.get(tail)
        if count == 1 and not packed:
            return [self.prefix]
        if not packed or len(packed) != count:
            raise UnsupportedFormatError(f"{self.prefix}: {count} shards, packed_modules_mapping gives {packed}")
        return [f"{head}.{p}" if head else p for p in packed]

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        module: QuantizedLinear = layer.humming
        if module.act_scale is None:
            return linear(x, module.weight, bias, act=module.act, backend=module.backend)
        y = module(x)
        return y if bias is None else y + bias


def _default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
