"""``load_checkpoint``: a Hugging Face-style quantized checkpoint folder -> ``{module: QuantizedWeight}``;
``activation_schemes``: the activation scheme each of those modules' producer configured."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from humming.ir.weight import QuantizedWeight

from ..ir.concat import stack
from ._config import Config
from ._files import CheckpointFiles, TensorFiles
from .activations import expert_activation, static_scale
from .awq import AWQReader
from .bnb import BitsAndBytesReader
from .compressed_tensors import CompressedTensorsReader
from .errors import CheckpointError, MissingTensorError, UnsupportedFormatError
from .fp8 import FP8Reader
from .gpt_oss import GptOssReader
from .gptq import GPTQReader
from .humming_ir import HummingReader
from .modelopt import ModelOptReader

__all__ = [
    "READERS",
    "activation_schemes",
    "iter_modules",
    "load_checkpoint",
    "load_module",
    "open_checkpoint",
    "open_reader",
]

#: ``quant_method`` -> reader class.
READERS = {
    "gptq": GPTQReader,
    "awq": AWQReader,
    "compressed-tensors": CompressedTensorsReader,
    "fp8": FP8Reader,
    "modelopt": ModelOptReader,
    "mxfp4": GptOssReader,
    "bitsandbytes": BitsAndBytesReader,
    "humming-ir": HummingReader,
}
_KERNEL_METHODS = ("gptq_marlin", "awq_marlin", "marlin", "gptq_marlin_24", "gptq_bitblas", "exl2", "exllamav2")
_EXPERT = re.compile(r"^(?P<head>.*\.experts)\.(?P<index>\d+)\.(?P<tail>.+)$")
# Tensors of kernel-repacked layouts: Marlin ("B" with "s", "B_meta" for 2:4), exllama ("q_perm", "q_invperm").
_KERNEL_LEAVES = {"B_meta", "q_perm", "q_invperm"}


def open_checkpoint(path: str | Path):
    """``(files, reader)`` for a checkpoint folder; raises ``CheckpointError`` naming the problem."""
    files = CheckpointFiles(path)
    config = Config(files.config, f"{files.path / 'config.json'}")
    key = "quantization_config" if "quantization_config" in config else "compression_config"
    qconfig = config.object(key).value
    if files.hf_quant_config is not None and not qconfig:
        qconfig = {"quant_method": "modelopt"}
    if not qconfig:
        raise CheckpointError(
            f"{files.path}: no quantization_config in config.json and no hf_quant_config.json: "
            "not a quantized checkpoint"
        )
    method = _method(qconfig)
    if method in _KERNEL_METHODS:
        raise UnsupportedFormatError(
            f"quant_method {method!r} is a kernel-specific repacked layout; humming reads the portable "
            "export formats (re-export as 'gptq', 'awq' or compressed-tensors)"
        )
    if method not in READERS:
        raise UnsupportedFormatError(
            f"unknown quant_method {qconfig.get('quant_method')!r}; supported: {', '.join(READERS)}"
        )
    kernel = _kernel_tensors(files)
    if kernel:
        raise UnsupportedFormatError(
            f"{files.path}: tensors named {kernel} belong to a kernel-specific repacked layout "
            "(Marlin / exllama), not to the portable format the config names"
        )
    return files, READERS[method](qconfig, files)


def _method(qconfig: dict) -> str:
    method = Config(qconfig, "quantization_config").str("quant_method", "", lower=True)
    return "compressed-tensors" if method == "compressed_tensors" else method


def open_reader(qconfig: dict, tensors: dict):
    """The format reader of ``qconfig`` (a ``quantization_config``) over tensors in memory
    (``{"<module>.<leaf>": tensor}``), for engines that load the checkpoint themselves."""
    method = _method(qconfig)
    if method not in READERS:
        raise UnsupportedFormatError(
            f"unknown quant_method {qconfig.get('quant_method')!r}; supported: {', '.join(READERS)}"
        )
    return READERS[method](qconfig, TensorFiles(tensors))


def _kernel_tensors(files: CheckpointFiles) -> list[str]:
    """Leaf names only kernel-repacked layouts write (Marlin ``B`` with ``s``, ``B_meta``; exllama perms)."""
    found = set()
    for key in files.names():
        module, _, leaf = key.rpartition(".")
        if leaf in _KERNEL_LEAVES:
            found.add(leaf)
        elif leaf == "B" and f"{module}.s" in files:
            found |= {"B", "s"}
    return sorted(found)


def _group_key(module: str) -> tuple[str, int | None]:
    """``(output name, expert index)``: per-expert modules map to their stacked name."""
    m = _EXPERT.match(module)
    if m is None:
        return module, None
    return f"{m['head']}.{m['tail']}", int(m["index"])


def iter_modules(reader, modules: Iterable[str] | None = None) -> Iterator[tuple[str, list[str | None]]]:
    """``(output name, [checkpoint modules])``: one module, or the experts ``0..E-1`` of a stacked one. Where
    experts are missing (indices ``0..max`` not all present) the list is the experts found, in order, then
    ``None``: :func:`load_module` raises on it, naming them (a list of ``max + 1`` entries could be huge)."""
    if isinstance(modules, (str, bytes)):  # a lone name would be iterated character by character
        raise TypeError(f"modules: expected a list of module names or patterns, got the string {modules!r}")
    wanted = list(modules) if modules is not None else None
    if wanted is not None and not all(isinstance(p, str) for p in wanted):
        raise TypeError(f"modules: expected module names or patterns (str), got {wanted!r}")
    if wanted is not None and not wanted:
        raise ValueError("modules: expected module names or patterns, got an empty list (None loads every module)")
    grouped: dict[str, dict[int | None, str]] = {}
    all_names = set()
    for module in reader.modules():
        name, index = _group_key(module)
        all_names.add(name)
        if wanted is not None and not any(fnmatch.fnmatchcase(name, p) for p in wanted):
            continue
        if name in grouped and (index is None) != (None in grouped[name]):
            raise CheckpointError(f"{name}: is both a module and a stack of experts ({module}) in the checkpoint")
        grouped.setdefault(name, {})[index] = module
    if wanted is not None:
        unmatched = [p for p in wanted if not any(fnmatch.fnmatchcase(n, p) for n in all_names)]
        if unmatched:
            shown = ", ".join(sorted(all_names)[:8]) + (" ..." if len(all_names) > 8 else "")
            raise ValueError(f"modules: {unmatched} match no quantized module of the checkpoint (it has {shown})")
    for name, parts in grouped.items():
        if None in parts:
            yield name, [parts[None]]
        elif max(parts) + 1 == len(parts):
            yield name, [parts[i] for i in range(len(parts))]
        else:
            yield name, [parts[i] for i in sorted(parts)] + [None]


def load_module(reader, name: str, parts: list[str | None]) -> QuantizedWeight:
    """One output module: a single checkpoint module, or per-expert modules stacked into ``[E, N, K]``.

    Raises ``CheckpointError`` naming ``name``; a ``ValueError`` from the IR (a malformed checkpoint that
    the reader did not catch) is re-raised as one.
    """
    if None in parts:
        found = sorted(_group_key(p)[1] for p in parts if p is not None)
        missing, expected = [], 0
        for index in found:  # the first few gaps, without a list of max + 1 entries
            missing += range(expected, min(index, expected + 8 - len(missing)))
            expected = index + 1
        raise MissingTensorError(
            f"{name}: experts {missing}{' ...' if found[-1] + 1 - len(found) > len(missing) else ''} are missing "
            f"(found {len(found)} of {found[-1] + 1}, the largest index found plus one)"
        )
    try:
        if len(parts) == 1 and _group_key(parts[0])[1] is None:
            return reader.load(parts[0])
        return stack([reader.load(p) for p in parts])
    except CheckpointError:
        raise
    except ValueError as err:
        raise CheckpointError(f"{name}: {err}") from err


def load_checkpoint(
    path: str | Path, *, device="cpu", modules: Iterable[str] | None = None
) -> dict[str, QuantizedWeight]:
    """Every quantized linear of a checkpoint folder as a ``QuantizedWeight``, by module name.

    Reads ``config.json`` (``quantization_config``) or ModelOpt's ``hf_quant_config.json``, and the
    safetensors file(s) tensor by tensor. Unquantized and ignored modules are left out. Per-expert MoE
    modules ``...experts.{e}.<proj>`` are stacked into one ``[E, N, K]`` weight named ``...experts.<proj>``.
    ``modules`` limits loading to names matching one of its entries (exact names or shell wildcards).
    Raises a ``CheckpointError`` subclass (see ``humming.loaders.errors``) naming the module and reason.
    """
    _, reader = open_checkpoint(path)
    out = {}
    for name, parts in iter_modules(reader, modules):
        out[name] = load_module(reader, name, parts).to(device)
    return out


def activation_schemes(
    path: str | Path, *, device="cpu", modules: Iterable[str] | None = None
) -> dict[str, tuple[str | None, torch.Tensor | None]]:
    """``{module: (act, static_scale)}`` for the modules :func:`humming.load_checkpoint` returns (same names,
    experts stacked): ``act`` for ``humming.linear(act=...)``, ``static_scale`` a one-element float32 tensor
    on ``device`` (quantize ``x / static_scale``; for stacked experts the max of theirs, see
    :func:`~.activations.static_scale`) or ``None``. Raises ``UnsupportedFormatError`` for activation settings
    humming cannot run."""
    files, reader = open_checkpoint(path)
    out = {}
    for name, parts in iter_modules(reader, modules):
        spec = expert_activation(reader, name, parts)
        out[name] = (spec.act, static_scale(files, spec, device))
    return out
