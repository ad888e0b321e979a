"""``from_pretrained``: a quantized Hugging Face checkpoint folder as a transformers model running on humming.

Needs the ``hf`` extra (``pip install 'humming[hf]'``: transformers). The model is built from its config by
transformers (``AutoModelForCausalLM.from_config``, the quantization config removed so that none of
transformers' own quantizers runs), its parameters on the meta device; then every module
:func:`humming.load_checkpoint` reads becomes a humming module on ``device`` and every other tensor of the
checkpoint (embeddings, norms, routers, ``lm_head``...) is loaded into the parameter of the same name.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from pathlib import Path

import torch
from torch import nn

from ..ir.concat import concat
from ..ir.weight import QuantizedWeight
from ..loaders.activations import ActivationSpec, expert_activation, merged_activation, static_scale
from ..loaders.checkpoint import iter_modules, load_module, open_checkpoint
from ..loaders.errors import (
    CheckpointError,
    MissingTensorError,
    ShapeMismatchError,
    UnexpectedTensorError,
    UnsupportedFormatError,
)
from ..reference.moe_layer import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT
from .linear import QuantizedLinear
from .moe import QuantizedExperts

__all__ = ["from_pretrained"]

# checkpoint names of the experts' projections: per expert (gate, up, down), or fused (gpt-oss: gate_up, down)
_EXPERT_PROJS = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"), ("gate_up_proj", "down_proj"))
#: fused_moe's activation of each act_fn of transformers' default expert gate ``act_fn(gate) * up``
_ACT_FNS = {
    "SiLU": "silu",
    "SiLUActivation": "silu",
    "GELUActivation": "gelu",
    "GELUTanh": "gelu_tanh",
    "NewGELUActivation": "gelu_tanh",
}
#: experts modules whose gate is gpt-oss's clamped SwiGLU (alpha and limit from the config)
_CLAMPED_SWIGLU = ("GptOssExperts",)


def _transformers():
    try:
        import transformers
    except ImportError as err:
        raise ImportError(
            "humming.nn.from_pretrained needs transformers: install the hf extra, pip install 'humming[hf]'"
        ) from err
    return transformers


def from_pretrained(
    path: str | Path,
    *,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device = "cpu",
    device_map: str | int | torch.device | dict | None = None,
    backend: str = "auto",
    strict: bool = True,
    trust_remote_code: bool = False,
    revision: str | None = None,
    local_files_only: bool = True,
) -> nn.Module:
    """A transformers causal LM from a quantized checkpoint folder, its quantized linears run by humming.

    Every format :func:`humming.load_checkpoint` reads (GPTQ, AWQ, compressed-tensors, FP8, ModelOpt,
    bitsandbytes NF4...). Quantized linears become :class:`QuantizedLinear` with the activation scheme the
    checkpoint names (:func:`humming.loaders.activation_schemes`; static ``input_scale`` included);
    quantized experts (per-expert ``experts.{e}.gate_proj / up_proj / down_proj`` or ``w1 / w3 / w2``, or
    gpt-oss's fused ``gate_up_proj`` / ``down_proj``) become :class:`QuantizedExperts` where the model's
    module of that name is a transformers experts module with fused 3-D ``gate_up_proj`` / ``down_proj``,
    running the module's activation (SiLU, GELU, gpt-oss's clamped SwiGLU from its config) in its gate / up
    layout, with the checkpoint's biases and static input scales (one per GEMM input: the max over the
    experts, as vLLM) (Qwen2/3-MoE, OLMoE, DeepSeek-V3, gpt-oss...).

    Args:
        path: the checkpoint folder (``config.json``, ``*.safetensors``), or a Hugging Face hub id
            (``"org/name"``) found in the local ``huggingface_hub`` cache (``HF_HUB_CACHE``).
        dtype: the dtype of the unquantized parameters and of the activations (a ``torch.dtype`` or its name);
            ``None`` or ``"auto"``: the config's (``dtype`` / ``torch_dtype``), else float32.
        device: where every tensor goes.
        device_map: as transformers' for one device, in place of ``device``: a device (``"cuda:0"``, ``0``,
            ``"cpu"``), ``"auto"`` (the current CUDA device, else the CPU) or ``{module prefix: device}``
            naming one device (``{"": 0}``). A model spread over several devices is refused (transformers
            needs accelerate's hooks for that).
        backend: as :func:`humming.linear` (``"auto"``: the reference on CPU).
        strict: raise on checkpoint tensors the model has no place for; ``False`` warns instead.
        trust_remote_code: passed to transformers for models defined in the checkpoint folder.
        revision: of a hub id: a branch, tag or commit (``None``: ``main``).
        local_files_only: a hub id is looked up in the local cache only (offline, the default); ``False``
            downloads what is missing (configs and safetensors).
    Returns:
        the model, in eval mode.
    Raises:
        ImportError: transformers is not installed (the ``hf`` extra).
        humming.loaders.CheckpointError: an unknown or unsupported format (``UnsupportedFormatError``), a
            tensor the model needs that the checkpoint lacks (``MissingTensorError``), one the model has no
            place for (``UnexpectedTensorError``), a shape that disagrees (``ShapeMismatchError``).
    """
    for name, flag in (("strict", strict), ("trust_remote_code", trust_remote_code)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected True or False, got {flag!r}")
    transformers = _transformers()
    files, reader = open_checkpoint(_local_folder(path, revision, local_files_only))
    device = _device(device if device_map is None else device_map)
    config = transformers.AutoConfig.from_pretrained(files.path, trust_remote_code=trust_remote_code)
    for attr in ("quantization_config", "compression_config"):
        if hasattr(config, attr):
            delattr(config, attr)
    dtype = _resolve_dtype(dtype, config)
    with _parameters_on_meta():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    model.eval()

    quantized: dict[str, tuple[QuantizedWeight, ActivationSpec]] = {}
    for name, parts in iter_modules(reader):
        spec = expert_activation(reader, name, parts)
        quantized[name] = (load_module(reader, name, parts).to(device), spec)
    replaced = _replace_modules(model, quantized, files, dtype, device, backend)

    owners = set(reader.modules()) | set(quantized)
    rest = [k for k in files.names() if not _owned(k, owners)]
    _load_unquantized(model, files, rest, replaced, device, strict)
    model.to(device)  # buffers made at construction (rotary frequencies...)
    gen = files.path / "generation_config.json"
    if gen.exists() and getattr(model, "generation_config", None) is not None:
        model.generation_config = transformers.GenerationConfig.from_pretrained(files.path)
    return model


def _local_folder(path: str | Path, revision: str | None, local_files_only: bool) -> Path:
    """``path`` when it is a folder, else the snapshot folder of hub id ``path`` (``huggingface_hub``'s cache;
    downloaded only when ``local_files_only`` is ``False``)."""
    if Path(path).is_dir() or not isinstance(path, str) or path.count("/") != 1 or path.startswith((".", "/")):
        return Path(path)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    patterns = ["*.json", "*.safetensors", "*.py", "tokenizer*", "*.model"]
    try:
        folder = snapshot_download(path, revision=revision, local_files_only=local_files_only, allow_patterns=patterns)
    except LocalEntryNotFoundError:
        raise CheckpointError(
            f"{path}: not a folder, and no snapshot of hub id {path!r} (revision {revision or 'main'}) is in the "
            "local huggingface_hub cache; download it (huggingface-cli download) or pass local_files_only=False"
        ) from None
    return Path(folder)


def _device(where) -> torch.device:
    """A transformers-style ``device`` / ``device_map`` for one device as a ``torch.device``."""
    if isinstance(where, dict):
        devices = {str(_device(v)) for v in where.values()}
        if len(devices) != 1:
            raise ValueError(
                f"device_map: expected one device for the whole model, got {sorted(devices)} (spreading a model "
                "over devices needs accelerate's hooks, which humming does not install)"
            )
        return torch.device(devices.pop())
    if where == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if isinstance(where, int) and not isinstance(where, bool):
        return torch.device("cuda", where)
    try:
        return torch.device(where)
    except (RuntimeError, TypeError):
        raise ValueError(f"device_map: expected a device, 'auto' or {{prefix: device}}, got {where!r}") from None


def _resolve_dtype(dtype, config) -> torch.dtype:
    if dtype is None or dtype == "auto":
        dtype = getattr(config, "dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype: expected a floating-point torch.dtype, got {dtype!r}")
    return dtype


@contextlib.contextmanager
def _parameters_on_meta():
    """Parameters registered inside go to the meta device (no memory, no initialisation); buffers stay where
    they are made, so that those computed at construction and absent from checkpoints (rotary frequencies)
    are real. Patches ``nn.Module.register_parameter`` for the duration (not thread-safe)."""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def _owned(key: str, owners: set[str]) -> bool:
    """Whether checkpoint tensor ``key`` belongs to a quantized module: ``<module>.<anything>`` (scales,
    zero points, bias, input_scale, bitsandbytes' quant state) or ``<module>_<suffix>`` (gpt-oss blocks)."""
    head = key
    while "." in head:
        head = head.rpartition(".")[0]
        if head in owners:
            return True
    return key.rpartition("_")[0] in owners


def _replace_modules(model, quantized, files, dtype, device, backend) -> list[str]:
    """Put humming modules in place of the quantized linears and experts; returns the replaced names."""
    replaced = []
    experts: dict[str, dict[str, tuple[QuantizedWeight, ActivationSpec]]] = {}
    for name, (qw, spec) in quantized.items():
        parent_name, _, child = name.rpartition(".")
        module = _submodule(model, name)
        if module is None and parent_name.endswith("experts") and qw.num_experts is not None:
            experts.setdefault(parent_name, {})[child] = (qw, spec)
            continue
        if module is None:
            raise UnexpectedTensorError(
                f"{name}: the checkpoint quantizes it, but {type(model).__name__} has no module of that name"
            )
        if not isinstance(module, nn.Linear):
            raise UnsupportedFormatError(
                f"{name}: the checkpoint quantizes it, but the model's module is a {type(module).__name__}, "
                "not an nn.Linear"
            )
        if (module.out_features, module.in_features) != tuple(qw.shape):
            raise ShapeMismatchError(
                f"{name}: the checkpoint's weight is {tuple(qw.shape)}, the model's Linear is "
                f"{(module.out_features, module.in_features)} [out, in]"
            )
        if module.bias is not None and qw.bias is None:
            raise MissingTensorError(f"{name}: the model's Linear has a bias, the checkpoint has no {name}.bias")
        if qw.bias is not None:
            qw = qw.replace(bias=qw.bias.to(device, dtype))
        layer = QuantizedLinear(qw, act=spec.act, act_scale=static_scale(files, spec), backend=backend)
        setattr(model.get_submodule(parent_name), child, layer)
        replaced.append(name)
    for name, projs in experts.items():
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, _experts(model, name, projs, files, dtype, device, backend))
        replaced.append(name)
    return replaced


def _submodule(model: nn.Module, name: str) -> nn.Module | None:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _experts(model, name, projs, files, dtype, device, backend) -> QuantizedExperts:
    """A :class:`QuantizedExperts` for the transformers experts module ``name`` from its quantized
    projections: per expert (``gate_proj`` / ``up_proj`` / ``down_proj``, concatenated here: gate rows, then
    up) or fused (``gate_up_proj`` / ``down_proj``, gpt-oss: rows in the module's own gate / up layout).
    Static input scales (compressed-tensors / ModelOpt / FP8 checkpoints' per-expert ``input_scale``) become
    one per-tensor scale per GEMM input, as vLLM takes them: the max over the experts (and over gate and up,
    which read the same input) for w13, over the experts for w2."""
    module = _submodule(model, name)
    names = next((p for p in _EXPERT_PROJS if set(p) == set(projs)), None)
    if module is None or names is None:
        raise UnexpectedTensorError(
            f"{name}: the checkpoint quantizes experts {sorted(projs)}, but the model has no experts module "
            f"{name} with {' / '.join(p[0] for p in _EXPERT_PROJS)}-style projections"
        )
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    fused = isinstance(gate_up, nn.Parameter) and isinstance(down, nn.Parameter) and gate_up.dim() == down.dim() == 3
    activation = _expert_activation(module)
    if not fused or isinstance(activation, str):
        why = activation if isinstance(activation, str) else "no fused 3-D gate_up_proj / down_proj parameters"
        raise UnsupportedFormatError(
            f"{name}: {type(module).__name__} is not an experts module humming can replace (it needs fused 3-D "
            f"gate_up_proj and down_proj and a gated activation humming runs): {why}"
        )
    if len(names) == 3:
        (gate, spec), (up, up_spec), (w2, down_spec) = (projs[p] for p in names)
        w13 = concat([gate, up], dim=1)  # [E, 2I, K]: gate rows, then up rows
        activation["gate_up_layout"] = "concat"
        specs = (spec, up_spec, down_spec)
    else:
        (w13, spec), (w2, down_spec) = (projs[p] for p in names)
        specs = (spec, down_spec)
    if {s.act for s in specs} != {spec.act}:
        raise UnsupportedFormatError(f"{name}: the expert projections have different activation schemes")
    w13_spec = merged_activation(f"{name} gate / up", specs[:-1])
    transposed = getattr(module, "is_transposed", False)  # parameters [E, in, out]
    want = [tuple(w.shape[i] for i in ((0, 2, 1) if transposed else (0, 1, 2))) for w in (w13, w2)]
    if want != [tuple(gate_up.shape), tuple(down.shape)]:
        raise ShapeMismatchError(
            f"{name}: the checkpoint's experts are gate_up {tuple(w13.shape)}, down {tuple(w2.shape)} [E, out, in]; "
            f"the model's are {tuple(gate_up.shape)}, {tuple(down.shape)}{' [E, in, out]' if transposed else ''}"
        )
    for proj, w in (("gate_up_proj", w13), ("down_proj", w2)):
        if getattr(module, f"{proj}_bias", None) is not None and w.bias is None:
            raise MissingTensorError(f"{name}: the model's experts have a {proj}_bias, the checkpoint has none")
    w13, w2 = (w if w.bias is None else w.replace(bias=w.bias.to(device, dtype)) for w in (w13, w2))
    scales = dict(w13_act_scale=static_scale(files, w13_spec), w2_act_scale=static_scale(files, down_spec))
    return QuantizedExperts(w13, w2, **activation, act=spec.act, **scales, backend=backend)


def _expert_activation(module) -> dict | str:
    """The ``QuantizedExperts`` activation arguments of a transformers experts module, or why it has none
    humming runs: the default gate (``act_fn(gate) * up``: SiLU, exact or tanh GELU) in the module's gate /
    up layout, or gpt-oss's clamped SwiGLU with the module's ``alpha`` / ``limit`` (else its config's
    ``swiglu_alpha`` / ``swiglu_limit``)."""
    if not getattr(module, "has_gate", True):
        return "experts without a gate (up_proj only)"
    layout = "concat" if getattr(module, "is_concatenated", True) else "interleaved"
    gate = getattr(type(module), "_apply_gate", None)
    if type(module).__name__ in _CLAMPED_SWIGLU:
        # gpt-oss's gate reads interleaved rows (gate_up[..., ::2]); transformers < 5.17 does not say so
        layout = "concat" if getattr(module, "is_concatenated", False) else "interleaved"
        # What the module computes with: transformers keeps alpha and limit on the experts module, read from
        # the config by some versions and fixed at gpt-oss's 1.702 / 7.0 by others (5.17 ignores the config).
        config = getattr(module, "config", None)
        alpha = getattr(module, "alpha", getattr(config, "swiglu_alpha", SWIGLU_OAI_ALPHA))
        limit = getattr(module, "limit", getattr(config, "swiglu_limit", SWIGLU_OAI_LIMIT))
        return dict(activation="swiglu_oai", alpha=alpha, limit=limit, gate_up_layout=layout)
    if gate is not None and gate.__name__ != "_default_apply_gate":
        return f"its own gate {type(module).__name__}._apply_gate"
    act_fn = getattr(module, "act_fn", None)
    name = type(act_fn).__name__
    if name == "GELU":  # torch.nn.GELU
        name = "GELUTanh" if getattr(act_fn, "approximate", "none") == "tanh" else "GELUActivation"
    if name not in _ACT_FNS:
        return f"act_fn {name}"
    return dict(activation=_ACT_FNS[name], gate_up_layout=layout)


def _load_unquantized(model, files, keys, replaced, device, strict) -> None:
    """Load the checkpoint tensors ``keys`` into the model's parameters and persistent buffers of the same
    names (floating tensors cast to the parameter's dtype), tie the output embeddings to the input ones where
    the config ties them and the checkpoint leaves them out, and raise on anything left missing."""
    prefixes = tuple(f"{name}." for name in replaced)
    targets = {k: v for k, v in model.state_dict(keep_vars=True).items() if not k.startswith(prefixes)}
    ignore = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []]
    unexpected = [k for k in keys if k not in targets and not any(p.search(k) for p in ignore)]
    if unexpected:
        message = (
            f"{len(unexpected)} checkpoint tensors have no place in {type(model).__name__}: {_listing(unexpected)}"
        )
        if strict:
            raise UnexpectedTensorError(message)
        warnings.warn(message, stacklevel=3)
    state = {}
    for key in keys:
        if key not in targets:
            continue
        tensor, target = files.get(key), targets[key]
        if tuple(tensor.shape) != tuple(target.shape):
            raise ShapeMismatchError(
                f"{key}: the checkpoint's tensor is {tuple(tensor.shape)}, the model's is {tuple(target.shape)}"
            )
        if tensor.is_floating_point() and target.is_floating_point():
            tensor = tensor.to(target.dtype)  # dtype, or float32 for a model's _keep_in_fp32_modules
        state[key] = tensor.to(device)
    model.load_state_dict(state, strict=False, assign=True)
    _tie_embeddings(model)
    state = model.state_dict(keep_vars=True)  # humming modules' _extra_state entries are dicts
    missing = [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.device.type == "meta"]
    if missing:
        raise MissingTensorError(f"{len(missing)} tensors of the model are not in the checkpoint: {_listing(missing)}")


def _tie_embeddings(model) -> None:
    """As transformers: an output embedding the checkpoint leaves out shares the input embedding's weight when
    the config ties word embeddings."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if not getattr(config, "tie_word_embeddings", False):
        return
    out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    if isinstance(out, nn.Linear) and out.weight.device.type == "meta" and inp.weight.device.type != "meta":
        out.weight = inp.weight


def _listing(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")
