"""The checkpoint tensors of one engine linear layer (vLLM's, or SGLang's, which forked them), as the engine's
parameters: which leaves a format stores, their shapes on this rank, and how each splits back into the layer's
shards.

Each leaf is created as the engine's parameter class whose loader does that leaf's tensor-parallel slicing and
fused-shard placement (``ModelWeightParameter`` along N and K, ``PackedvLLMParameter`` for codes packed along
N, ``ChannelQuantScaleParameter`` for scales every rank keeps whole along K, ``BlockQuantScaleParameter`` for
2-D block scales, ``PerTensorScaleParameter`` for one scale per shard, ``RowvLLMParameter`` for ``g_idx``), so
the engine's own ``weight_loader_v2`` (``QKVParallelLinear``, ``MergedColumnParallelLinear``, ``RowParallelLinear``)
writes each checkpoint tensor's slice for this rank into place, replicated KV heads included.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

import torch

from ..ir.weight import cdiv
from ..loaders._common import match_any
from ..loaders.compressed_tensors import config_group
from ..loaders.errors import UnsupportedFormatError

__all__ = ["Leaf", "block_size", "is_skipped", "leaves", "method_of"]

#: ``quant_method`` values this adapter reads (compressed-tensors spelled either way)
METHODS = ("gptq", "awq", "compressed-tensors", "fp8", "modelopt")


@dataclass(frozen=True)
class Leaf:
    """One checkpoint tensor of the layer: ``shape`` on this rank; ``out_dim`` / ``in_dim`` the dims along N
    and K (None: not split along it); ``unit`` how many output rows one entry along ``out_dim`` covers (a pack
    factor or a block height; 1 for plain rows); ``per_shard``: one scalar per fused shard."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype | None  # None: a float scale in the checkpoint's own dtype, taken from its first tensor
    out_dim: int | None = None
    in_dim: int | None = None
    unit: int = 1
    packed: bool = False  # packed along out_dim (PackedvLLMParameter)
    block: bool = False  # a 2-D block scale (BlockQuantScaleParameter)
    per_shard: bool = False
    decoded: bool = True  # False: loaded (the checkpoint has it) but not read: GPTQ's g_idx without act-order

    def rows(self, n: int) -> int:
        """Entries along ``out_dim`` for a shard of ``n`` output rows."""
        return cdiv(n, self.unit)


def method_of(qconfig: dict) -> str:
    method = str(qconfig.get("quant_method", "")).lower().replace("_", "-")
    if method not in METHODS:
        raise UnsupportedFormatError(
            f"humming's vLLM adapter reads quant_method {', '.join(METHODS)}; got {qconfig.get('quant_method')!r}"
        )
    return method


def block_size(qconfig: dict) -> list[int] | None:
    """``[block_n, block_k]`` of a checkpoint's 2-D weight-scale blocks (FP8 ``weight_block_size``,
    compressed-tensors ``block_structure``), None without blocks: the engines' loaders read it from the
    layer's quantization config to place each shard's block rows."""
    if method_of(qconfig) == "fp8":
        block = qconfig.get("weight_block_size")
        return [int(b) for b in block] if block else None
    for group in (qconfig.get("config_groups") or {}).values():
        w = group.get("weights") or {}
        if w.get("strategy") == "block":
            return [int(b) for b in w["block_structure"]]
    return None


def is_skipped(qconfig: dict, module: str) -> bool:
    """Whether the checkpoint leaves ``module`` (a checkpoint module name) unquantized."""
    method = method_of(qconfig)
    if method == "gptq":
        return any(key.startswith("-:") and re.match(key[2:], module) for key in qconfig.get("dynamic") or {})
    if method == "compressed-tensors":
        return match_any(module, qconfig.get("ignore"))
    if method == "modelopt":
        quant = qconfig.get("quantization", qconfig)
        patterns = quant.get("exclude_modules") or quant.get("ignore") or []
        return any(fnmatch.fnmatch(module, p) for p in patterns)
    skip = list(qconfig.get("modules_to_not_convert") or []) + list(qconfig.get("ignored_layers") or [])
    return any(s in module for s in skip)


def leaves(qconfig: dict, module: str, n: int, k: int, k_full: int, shards: int, row_parallel: bool) -> list[Leaf]:
    """The leaves of a layer of ``n`` output rows (all shards, this rank) and ``k`` input columns (this rank;
    ``k_full`` in all) whose first checkpoint module is ``module``."""
    method = method_of(qconfig)
    if method == "gptq":
        return _gptq(qconfig, n, k, k_full, row_parallel)
    if method == "awq":
        bits = int(qconfig.get("bits", qconfig.get("w_bit", 4)))
        group = int(qconfig.get("group_size", qconfig.get("q_group_size", 128)))
        pf, groups = _pack_factor(bits), k // (group if group > 0 else k)
        return [
            Leaf("qweight", (k, n // pf), torch.int32, out_dim=1, in_dim=0, unit=pf, packed=True),
            Leaf("qzeros", (groups, n // pf), torch.int32, out_dim=1, in_dim=0, unit=pf, packed=True),
            Leaf("scales", (groups, n), None, out_dim=1, in_dim=0),
        ]
    if method == "fp8":
        return _fp8(qconfig, n, k, shards)
    if method == "modelopt":
        return _modelopt(qconfig, module, n, k, shards)
    return _compressed_tensors(qconfig, module, n, k, shards)


def _pack_factor(bits: int) -> int:
    if 32 % bits:
        raise UnsupportedFormatError(f"{bits}-bit codes do not pack a whole number per int32 word (2, 4, 8 do)")
    return 32 // bits


def _gptq(qconfig: dict, n: int, k: int, k_full: int, row_parallel: bool) -> list[Leaf]:
    bits, group = int(qconfig.get("bits", 4)), int(qconfig.get("group_size", -1))
    pf = _pack_factor(bits)
    act_order = bool(qconfig.get("desc_act")) and group > 0
    # act-order or per-channel scales of a row-parallel layer: every rank keeps all the groups (as vLLM)
    whole = row_parallel and (act_order or group <= 0)
    groups = (k_full if whole else k) // group if group > 0 else 1
    scale_in_dim = None if whole else 0
    found = [
        Leaf("qweight", (k // pf, n), torch.int32, out_dim=1, in_dim=0),
        Leaf("qzeros", (groups, n // pf), torch.int32, out_dim=1, in_dim=scale_in_dim, unit=pf, packed=True),
        Leaf("scales", (groups, n), None, out_dim=1, in_dim=scale_in_dim),
        # without act-order g_idx is arange(K) // group: a rank's slice holds global group numbers
        Leaf("g_idx", (k,), torch.int32, in_dim=0, decoded=act_order),
    ]
    return found


def _weight_8bit(n: int, k: int, dtype: torch.dtype) -> Leaf:
    return Leaf("weight", (n, k), dtype, out_dim=0, in_dim=1)


def _fp8(qconfig: dict, n: int, k: int, shards: int) -> list[Leaf]:
    block = qconfig.get("weight_block_size")
    found = [_weight_8bit(n, k, torch.float8_e4m3fn)]
    if block:
        bn, bk = (int(b) for b in block)
        found.append(Leaf("weight_scale_inv", (0, cdiv(k, bk)), None, 0, 1, unit=bn, block=True))
    else:
        found.append(Leaf("weight_scale", (shards,), None, per_shard=True))
    if str(qconfig.get("activation_scheme", "dynamic")).lower() == "static":
        found.append(Leaf("input_scale", (shards,), None, per_shard=True))
    return found


def _modelopt(qconfig: dict, module: str, n: int, k: int, shards: int) -> list[Leaf]:
    quant = qconfig.get("quantization", qconfig)
    algo = str(quant.get("quant_algo") or "").upper()
    if algo == "NVFP4":
        group = int(quant.get("group_size") or 16)
        return [
            Leaf("weight", (n, k // 2), torch.uint8, out_dim=0, in_dim=1),
            Leaf("weight_scale", (n, k // group), torch.float8_e4m3fn, out_dim=0, in_dim=1),
            Leaf("weight_scale_2", (shards,), None, per_shard=True),
            Leaf("input_scale", (shards,), None, per_shard=True),
        ]
    if algo == "FP8":
        return [
            _weight_8bit(n, k, torch.float8_e4m3fn),
            Leaf("weight_scale", (shards,), None, per_shard=True),
            Leaf("input_scale", (shards,), None, per_shard=True),
        ]
    raise UnsupportedFormatError(f"{module}: ModelOpt quant_algo {algo!r} (the vLLM adapter reads NVFP4 and FP8)")


def _ct_scale(w: dict, n: int, k: int, shards: int, name: str, dtype) -> Leaf:
    strategy = w.get("strategy")
    if strategy == "tensor":
        return Leaf(name, (shards,), None, per_shard=True)
    if strategy == "channel":
        return Leaf(name, (n, 1), dtype, out_dim=0)
    if strategy == "group":
        return Leaf(name, (n, k // int(w["group_size"])), dtype, out_dim=0, in_dim=1)
    if strategy == "block":
        bn, bk = (int(b) for b in w["block_structure"])
        return Leaf(name, (0, cdiv(k, bk)), dtype, out_dim=0, in_dim=1, unit=bn, block=True)
    raise UnsupportedFormatError(f"compressed-tensors weight strategy {strategy!r}")


def _compressed_tensors(qconfig: dict, module: str, n: int, k: int, shards: int) -> list[Leaf]:
    group = config_group(qconfig.get("config_groups") or {}, module)
    w, a = group.get("weights") or {}, group.get("input_activations")
    fmt = group.get("format") or qconfig.get("format")
    bits = int(w.get("num_bits", 8))
    if fmt == "pack-quantized":
        pf = _pack_factor(bits)
        scale = _ct_scale(w, n, k, shards, "weight_scale", None)
        found = [Leaf("weight_packed", (n, k // pf), torch.int32, out_dim=0, in_dim=1), scale]
        if not w.get("symmetric", True):
            zp_cols = scale.shape[1] if scale.in_dim is not None else 1
            found.append(
                Leaf("weight_zero_point", (n // pf, zp_cols), torch.int32, 0, scale.in_dim, unit=pf, packed=True)
            )
        if w.get("actorder") == "group":
            found.append(Leaf("weight_g_idx", (k,), torch.int32, in_dim=0))
        return found
    if fmt in ("float-quantized", "int-quantized", "naive-quantized"):
        dtype = torch.float8_e4m3fn if w.get("type") == "float" else torch.int8
        found = [_weight_8bit(n, k, dtype), _ct_scale(w, n, k, shards, "weight_scale", None)]
        if a is not None and not a.get("dynamic", True):
            found.append(Leaf("input_scale", (shards,), None, per_shard=True))
            if not a.get("symmetric", True):
                found.append(Leaf("input_zero_point", (shards,), torch.int32, per_shard=True))
        return found
    if fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized"):
        nv = fmt.startswith("nv")
        found = [
            Leaf("weight_packed", (n, k // 2), torch.uint8, out_dim=0, in_dim=1),
            Leaf("weight_scale", (n, k // (16 if nv else 32)), torch.float8_e4m3fn if nv else torch.uint8, 0, 1),
        ]
        if nv:
            found.append(Leaf("weight_global_scale", (shards,), None, per_shard=True))
            if a is not None:
                found.append(Leaf("input_global_scale", (shards,), None, per_shard=True))
        return found
    raise UnsupportedFormatError(f"{module}: compressed-tensors format {fmt!r} (the vLLM adapter does not read it)")
