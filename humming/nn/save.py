"""``save_pretrained``: a transformers model quantized by humming as a checkpoint folder that
:func:`humming.nn.from_pretrained` loads back bit for bit, in compressed-tensors format where every module's
scheme exists there (vLLM, SGLang and transformers then load it without humming), else in humming's own
(``quant_method: humming-ir``; :mod:`humming.loaders.export` lists which schemes go where)."""

from __future__ import annotations

import copy
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ..ir.shard import deinterleave_rows
from ..ir.weight import QuantizedWeight, expert_weight
from ..loaders.export import (
    CT_VERSION,
    HUMMING_METHOD,
    compressed_tensors_scheme,
    compressed_tensors_tensors,
    humming_tensors,
)
from ..loaders.humming_ir import VERSIONS
from .linear import QuantizedLinear
from .moe import FusedMoE, QuantizedExperts

__all__ = ["FORMATS", "save_pretrained"]

#: ``save_pretrained(format=...)``: ``"auto"`` is compressed-tensors when every module has a form there.
FORMATS = ("auto", "compressed-tensors", "humming-ir")
_SHARD_BYTES = 5 << 30


@dataclass(frozen=True)
class _Unit:
    """One weight as the checkpoint stores it: its module name, the weight, its activation scheme and
    static activation scale."""

    name: str
    weight: QuantizedWeight
    act: str | None
    scale: torch.Tensor | None


def save_pretrained(
    model: nn.Module, path: str | Path, *, format: str = "auto", max_shard_bytes: int = _SHARD_BYTES
) -> str:
    """Write ``model`` (a transformers model whose linears and experts :func:`quantize_model` or
    :func:`from_pretrained` made humming modules) to the folder ``path``: ``config.json`` with its
    ``quantization_config``, ``model*.safetensors`` (shards of at most ``max_shard_bytes``, with an index past
    one), ``generation_config.json`` when the model has one.

    ``format``: ``"compressed-tensors"`` (``ValueError`` naming a module that has no form there),
    ``"humming-ir"``, or ``"auto"``: compressed-tensors if every module has a form there, else humming's own
    with a warning naming the first module that has none. Tensor names are the model's own; experts are
    written per expert (``experts.{e}.gate_proj / up_proj / down_proj``) in compressed-tensors, stacked
    (``experts.gate_up_proj`` / ``down_proj``) in humming's own. Returns the format written.
    """
    if format not in FORMATS:
        raise ValueError(f"format: expected one of {FORMATS}, got {format!r}")
    config = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or not hasattr(config, "save_pretrained"):
        raise ValueError(f"model: expected a transformers model (with a .config), got {type(model).__name__}")
    modules = {n: m for n, m in model.named_modules() if isinstance(m, (QuantizedLinear, QuantizedExperts, FusedMoE))}
    fused = [n for n, m in modules.items() if isinstance(m, FusedMoE)]
    if fused:
        raise ValueError(f"model: {fused[0]} is a FusedMoE (routing included), which no checkpoint format holds")
    if not modules:
        raise ValueError("model: no humming module to save (quantize it with humming.nn.quantize_model first)")
    chosen, tensors, qconfig = format, {}, None
    if format != "humming-ir":
        found = _compressed_tensors(model, modules)
        if isinstance(found, str):
            if format == "compressed-tensors":
                raise ValueError(f"format='compressed-tensors': {found}")
            warnings.warn(
                f"save_pretrained: {found}; saving in humming's own format (quant_method {HUMMING_METHOD!r}), "
                "which only humming reads",
                UserWarning,
                stacklevel=2,
            )
        else:
            chosen, (tensors, qconfig) = "compressed-tensors", found
    if qconfig is None:
        chosen, (tensors, qconfig) = "humming-ir", _humming(modules)
    tensors.update(_unquantized(model, modules))
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(config)
    config.quantization_config = qconfig
    config.save_pretrained(path)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(path)
    _write_shards(path, tensors, max_shard_bytes)
    return chosen


def _act(module) -> str | None:
    return None if module.act is None else module.act.name


def _units_per_expert(name: str, module: QuantizedExperts) -> list[_Unit]:
    """Experts as per-expert ``gate_proj`` / ``up_proj`` / ``down_proj`` weights (the checkpoints' names of
    Qwen2/3-MoE, DeepSeek-V2/V3, OLMoE); ``ValueError`` where gate and up rows do not split exactly."""
    units, act = [], _act(module)
    for e in range(module.num_experts):
        w13 = expert_weight(module.w13, e)
        if module.gate_up_layout == "interleaved":
            gate, up = deinterleave_rows(w13)
        else:
            gate, up = w13.shard(0, 0, 2), w13.shard(0, 1, 2)
        down = expert_weight(module.w2, e)
        units += [
            _Unit(f"{name}.{e}.gate_proj", gate, act, module.w13_act_scale),
            _Unit(f"{name}.{e}.up_proj", up, act, module.w13_act_scale),
            _Unit(f"{name}.{e}.down_proj", down, act, module.w2_act_scale),
        ]
    return units


def _compressed_tensors(model, modules) -> tuple[dict, dict] | str:
    """``(tensors, quantization_config)`` in compressed-tensors format, or why a module has no form there."""
    groups: dict[str, tuple[dict, list[str]]] = {}
    tensors: dict[str, torch.Tensor] = {}
    schemes: list[tuple[_Unit, dict]] = []
    for name, module in modules.items():
        if isinstance(module, QuantizedLinear):
            units = [_Unit(name, module.weight, _act(module), module.act_scale)]
        else:
            try:
                units = _units_per_expert(name, module)
            except ValueError as err:
                return f"{name}: its gate and up rows do not split exactly ({err})"
        for unit in units:
            scheme = compressed_tensors_scheme(unit.weight, unit.act, unit.scale is not None)
            if isinstance(scheme, str):
                return f"{unit.name}: {scheme}"
            schemes.append((unit, scheme))
    for unit, scheme in _common_blocks(schemes):
        groups.setdefault(json.dumps(scheme, sort_keys=True), (scheme, []))[1].append(unit.name)
        for leaf, t in compressed_tensors_tensors(unit.weight, scheme["format"]).items():
            tensors[f"{unit.name}.{leaf}"] = t
        if unit.scale is not None:
            tensors[f"{unit.name}.input_scale"] = unit.scale.detach().cpu().reshape(1)
    formats = {scheme["format"] for scheme, _ in groups.values()}
    config_groups = {
        f"group_{i}": dict(
            targets=["Linear"] if len(groups) == 1 else names,
            weights=scheme["weights"],
            input_activations=scheme["input_activations"],
            output_activations=None,
            format=scheme["format"],
        )
        for i, (scheme, names) in enumerate(groups.values())
    }
    qconfig = dict(
        quant_method="compressed-tensors",
        format=formats.pop() if len(formats) == 1 else "mixed-precision",
        config_groups=config_groups,
        ignore=_float_weight_modules(model),
        quantization_status="compressed",
        kv_cache_scheme=None,
        sparsity_config={},
        transform_config={},
        version=CT_VERSION,
    )
    return tensors, qconfig


def _common_blocks(schemes: list[tuple[_Unit, dict]]) -> list[tuple[_Unit, dict]]:
    """Block schemes of weights smaller than one block along N or K (a 96-row projection in 128x128 blocks:
    the IR's ``-1``) take the block structure of the model's whole-block weights that covers them, so that
    they share one config group (as producers write them)."""
    blocks = {
        tuple(scheme["weights"]["block_structure"])
        for unit, scheme in schemes
        if scheme["weights"]["strategy"] == "block" and -1 not in unit.weight.group_shape
    }
    out = []
    for unit, scheme in schemes:
        bn, bk = unit.weight.group_shape
        if scheme["weights"]["strategy"] == "block" and -1 in (bn, bk):
            fits = [
                (n, k)
                for n, k in sorted(blocks)
                if (n == bn or (bn == -1 and n >= unit.weight.N)) and (k == bk or (bk == -1 and k >= unit.weight.K))
            ]
            if fits:
                scheme = copy.deepcopy(scheme)
                scheme["weights"]["block_structure"] = list(fits[0])
        out.append((unit, scheme))
    return out


def _humming(modules) -> tuple[dict, dict]:
    """``(tensors, quantization_config)`` in humming's own format."""
    units = []
    for name, module in modules.items():
        if isinstance(module, QuantizedLinear):
            units.append(_Unit(name, module.weight, _act(module), module.act_scale))
        else:
            units.append(_Unit(f"{name}.gate_up_proj", module.w13, _act(module), module.w13_act_scale))
            units.append(_Unit(f"{name}.down_proj", module.w2, _act(module), module.w2_act_scale))
    tensors, records = {}, {}
    for unit in units:
        qw = unit.weight
        tensors.update({f"{unit.name}.{leaf}": t for leaf, t in humming_tensors(qw).items()})
        if unit.scale is not None:
            tensors[f"{unit.name}.input_scale"] = unit.scale.detach().cpu().reshape(1)
        records[unit.name] = dict(
            shape=list(qw.shape),
            format=qw.format.name,
            group_shape=list(qw.group_shape),
            act=unit.act,
            static=unit.scale is not None,
        )
    return tensors, dict(quant_method=HUMMING_METHOD, version=VERSIONS[-1], modules=records)


def _float_weight_modules(model: nn.Module) -> list[str]:
    """Modules holding a float 2-D ``weight`` that are neither embeddings nor humming's: the linears and
    routers left unquantized, which a compressed-tensors config lists in ``ignore``."""
    out = []
    for name, module in model.named_modules():
        w = module._parameters.get("weight")
        if name and isinstance(w, torch.Tensor) and w.dim() == 2 and not isinstance(module, nn.Embedding):
            out.append(name)
    return out


def _unquantized(model: nn.Module, modules) -> dict[str, torch.Tensor]:
    """The model's other persistent tensors by state_dict name, on the CPU; an output embedding tied to the
    input one is left out (from_pretrained and transformers tie it again), other shared tensors copied."""
    prefixes = tuple(f"{name}." for name in modules)
    out, seen = {}, set()
    tied = _tied_output_key(model)
    for key, t in model.state_dict().items():
        if key.startswith(prefixes) or not isinstance(t, torch.Tensor):
            continue
        if key == tied:
            continue
        ptr = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        t = t.detach().cpu()
        out[key] = t.clone() if ptr in seen else t.contiguous()
        seen.add(ptr)
    return out


def _tied_output_key(model: nn.Module) -> str | None:
    """The state_dict key of the output embedding's weight when it is the input embedding's, else ``None``."""
    get_out, get_in = getattr(model, "get_output_embeddings", None), getattr(model, "get_input_embeddings", None)
    if get_out is None or get_in is None:
        return None
    out, inp = get_out(), get_in()
    if out is None or inp is None or getattr(out, "weight", None) is not getattr(inp, "weight", None):
        return None
    return next((f"{name}.weight" for name, m in model.named_modules() if m is out), None)


def _write_shards(path: Path, tensors: dict[str, torch.Tensor], max_shard_bytes: int) -> None:
    """``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` shards with their index; stale files of
    either naming are removed first."""
    for stale in [*path.glob("model*.safetensors"), path / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)
    shards, size = [{}], 0
    for key, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = t
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(path / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = dict(metadata=dict(total_size=total), weight_map=weight_map)
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
