"""``humming.save`` / ``humming.load``: the standard representation in safetensors, bit-exact.

Tensors are stored as ``<name>.<field>``. The metadata holds the format version and a manifest: per weight,
its non-tensor fields (shape, format, group shape) and, per tensor field, its shape, dtype and SHA-256; the
manifest carries the SHA-256 of its own JSON text. :func:`load` checks all of it, so a file that lost a
tensor (``zeros``, ``g_idx``, ``global_scale``...) or whose header was damaged is refused rather than read
as a different, valid weight.

Format version 1 (no manifest) is still read, with a warning that it cannot be verified.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings

import safetensors
import safetensors.torch
import torch

from .weight import QuantizedWeight

__all__ = ["FORMAT_VERSION", "load", "save"]

FORMAT_VERSION = "2"
_VERSION_KEY = "humming_format_version"
_MANIFEST_KEY = "humming_manifest"
_MANIFEST_DIGEST_KEY = "humming_manifest_sha256"
_SINGLE = "__single__"
_FIELDS = ("qweight", "scales", "zeros", "global_scale", "g_idx", "bias")


def _digest(t: torch.Tensor) -> str:
    """SHA-256 of a CPU tensor's bytes (row-major)."""
    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def save(weights: QuantizedWeight | dict[str, QuantizedWeight], path: str | os.PathLike) -> None:
    """Write one weight or a ``{name: weight}`` dict to a safetensors file, with a manifest that
    :func:`load` verifies (fields present, shapes, dtypes, a SHA-256 per tensor)."""
    single = isinstance(weights, QuantizedWeight)
    if not single and not isinstance(weights, dict):
        raise TypeError(f"weights: expected a QuantizedWeight or a dict of them, got {type(weights).__name__}")
    path = _writable_path(path)
    items = {_SINGLE: weights} if single else dict(weights)
    tensors, manifest, storages = {}, {}, set()
    for name, qw in items.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"weights: names must be non-empty strings, got {name!r}")
        if not single and name == _SINGLE:
            raise ValueError(f"weights: the name {_SINGLE!r} is reserved (it marks a file holding one weight)")
        if not isinstance(qw, QuantizedWeight):
            raise ValueError(f"weights[{name!r}]: expected a QuantizedWeight, got {type(qw).__name__}")
        fields = {}
        for field, t in qw.tensors().items():
            t = t.detach().contiguous().cpu()
            if t.untyped_storage().data_ptr() in storages:  # shared with another weight (or a view of one)
                t = t.clone()
            storages.add(t.untyped_storage().data_ptr())
            tensors[f"{name}.{field}"] = t
            fields[field] = {"shape": list(t.shape), "dtype": _dtype_name(t.dtype), "sha256": _digest(t)}
        manifest[name] = {
            "shape": list(qw.shape),
            "format": qw.format.name,
            "group_shape": list(qw.group_shape),
            "tensors": fields,
        }
    text = json.dumps(manifest, sort_keys=True)
    meta = {
        _VERSION_KEY: FORMAT_VERSION,
        _MANIFEST_KEY: text,
        _MANIFEST_DIGEST_KEY: hashlib.sha256(text.encode()).hexdigest(),
    }
    safetensors.torch.save_file(tensors, path, metadata=meta)


def load(path: str | os.PathLike, device="cpu") -> QuantizedWeight | dict[str, QuantizedWeight]:
    """Read what :func:`save` wrote: a single weight, or the ``{name: weight}`` dict, on ``device``.

    Raises ``ValueError`` when the file is not a humming file or does not match its manifest (a missing or
    extra tensor, a shape, dtype or checksum that differs).
    """
    path = _readable_path(path)
    if isinstance(device, torch.dtype):
        raise TypeError(f"device: expected a device such as 'cpu' or 'cuda:0', got the dtype {device}")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device: expected a torch device such as 'cpu' or 'cuda:0', got {device!r} ({err})") from None
    try:
        with safetensors.safe_open(path, framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            keys = set(f.keys())
            version = meta.get(_VERSION_KEY)
            if version is None:
                raise ValueError(f"path: {path} is not a humming file (no {_VERSION_KEY} in its metadata)")
            if version == "1":
                out = _load_v1(path, f, meta, keys)
            elif version == FORMAT_VERSION:
                out = _load_v2(path, f, meta, keys)
            else:
                raise ValueError(f"path: {path} has humming format version {version}, this humming reads 1 and 2")
    except safetensors.SafetensorError as err:
        raise ValueError(f"path: {path} is not a readable safetensors file ({err})") from None
    out = {name: qw.to(device) for name, qw in out.items()} if device.type != "cpu" else out
    return out[_SINGLE] if set(out) == {_SINGLE} else out


def _as_path(path) -> str:
    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}") from None
    if not isinstance(path, str):
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}")
    return path


def _writable_path(path) -> str:
    """Where :func:`save` writes: ``path`` with its symlinks resolved (the file they point to is written, the
    symlinks stay), checked to be a regular file, or none, in a folder that exists."""
    path = _as_path(path)
    real = os.path.realpath(path)
    if os.path.lexists(real) and not os.path.exists(real):
        raise ValueError(f"path: {path} is a symlink that leads nowhere (a loop)")
    if os.path.isdir(real):
        raise ValueError(
            f"path: {path} is a folder; expected a file name such as {os.path.join(path, 'w.safetensors')}"
        )
    if os.path.exists(real) and not os.path.isfile(real):
        raise ValueError(f"path: {path} is not a regular file (a device, socket or pipe); expected a file name")
    folder = os.path.dirname(real)
    if not os.path.isdir(folder):
        raise ValueError(f"path: the folder {folder} of {path} does not exist")
    return real


def _readable_path(path) -> str:
    """``path`` checked to be a regular file (``FileNotFoundError`` when there is none)."""
    path = _as_path(path)
    if os.path.lexists(path) and not os.path.exists(path):
        raise ValueError(f"path: {path} is a symlink that leads nowhere (a loop, or a missing file)")
    if not os.path.exists(path):
        raise FileNotFoundError(f"path: no such file: {path}")
    if not os.path.isfile(path):
        raise ValueError(f"path: {path} is not a file (a folder, device or pipe); expected a safetensors file")
    return path


def _load_v2(path, f, meta, keys) -> dict[str, QuantizedWeight]:
    text = meta.get(_MANIFEST_KEY)
    if text is None or hashlib.sha256(text.encode()).hexdigest() != meta.get(_MANIFEST_DIGEST_KEY):
        raise ValueError(f"path: {path}: the manifest is missing or does not match its checksum (damaged file)")
    manifest = _manifest(path, text)
    expected_keys = {f"{name}.{field}" for name, record in manifest.items() for field in record["tensors"]}
    if keys != expected_keys:
        missing, extra = sorted(expected_keys - keys), sorted(keys - expected_keys)
        raise ValueError(f"path: {path}: tensors missing {missing} / not in the manifest {extra} (damaged file)")
    out = {}
    for name, record in manifest.items():
        fields = {}
        for field, entry in record["tensors"].items():
            t = f.get_tensor(f"{name}.{field}")
            got = {"shape": list(t.shape), "dtype": _dtype_name(t.dtype)}
            if got != {"shape": entry["shape"], "dtype": entry["dtype"]} or _digest(t) != entry["sha256"]:
                raise ValueError(
                    f"path: {path}: tensor {name}.{field} ({got['dtype']} {got['shape']}) does not match the "
                    f"manifest ({entry['dtype']} {entry['shape']}, sha256 {entry['sha256'][:12]}...) (damaged file)"
                )
            fields[field] = t
        out[name] = _weight(path, name, record, fields)
    return out


def _manifest(path, text: str) -> dict:
    """The manifest's JSON, checked to have the form :func:`save` writes: ``{name: {"shape", "format",
    "group_shape", "tensors": {field: {"shape": [ints], "dtype": str, "sha256": str}}}}``."""
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"path: {path}: the manifest is not JSON ({err})") from None
    bad = lambda what: ValueError(f"path: {path}: malformed manifest: {what}")
    if not isinstance(manifest, dict) or not manifest:
        raise bad(f"expected an object of weights, got {type(manifest).__name__}")
    for name, record in manifest.items():
        if not isinstance(record, dict) or not isinstance(record.get("tensors"), dict):
            raise bad(f"weight {name!r} has no 'tensors' object")
        for field, entry in record["tensors"].items():
            if field not in _FIELDS:
                raise bad(f"weight {name!r} has an unknown tensor field {field!r} (expected one of {_FIELDS})")
            shape = entry.get("shape") if isinstance(entry, dict) else None
            if (
                not isinstance(shape, list)
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
                or not isinstance(entry.get("dtype"), str)
                or not isinstance(entry.get("sha256"), str)
            ):
                raise bad(f"tensor {name}.{field}: expected shape (non-negative ints), dtype and sha256, got {entry!r}")
    return manifest


def _load_v1(path, f, meta, keys) -> dict[str, QuantizedWeight]:
    warnings.warn(
        f"{path}: humming format version 1 has no manifest; its tensors cannot be verified (a missing "
        "optional tensor would go unnoticed). Save it again to write format version 2.",
        UserWarning,
        stacklevel=3,
    )
    out = {}
    for key, value in meta.items():
        if not key.endswith(".__meta__"):
            continue
        name = key[: -len(".__meta__")]
        fields = {field: f.get_tensor(f"{name}.{field}") for field in _FIELDS if f"{name}.{field}" in keys}
        try:
            record = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"path: {path}: the record of weight {name!r} is not JSON ({err})") from None
        out[name] = _weight(path, name, record, fields)
    return out


def _weight(path, name, record, fields) -> QuantizedWeight:
    if not isinstance(record, dict):
        raise ValueError(f"path: {path}: the record of weight {name!r} is a {type(record).__name__}, not an object")
    for field in ("shape", "format", "group_shape"):
        if field not in record:
            raise ValueError(f"path: {path}: the record of weight {name!r} lacks its {field!r} field")
    try:
        return QuantizedWeight(
            shape=record["shape"],
            format=record["format"],
            group_shape=record["group_shape"],
            **fields,
        )
    except (ValueError, TypeError) as err:
        raise ValueError(f"path: {path}: weight {name!r} is not valid ({err})") from None
