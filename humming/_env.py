"""The environment variables humming reads, each parsed by one reader that refuses what it does not understand.

| variable | value | default |
|---|---|---|
| ``HUMMING_BACKEND`` | ``auto``, ``reference``, ``triton`` or ``cuda``: what ``backend="auto"`` means | ``auto`` |
| ``HUMMING_DETERMINISTIC`` | a flag: batch invariance (:mod:`humming.deterministic`) | off |
| ``HUMMING_LOG_DISPATCH`` | a flag: log each new dispatch decision | off |
| ``HUMMING_TABLES_DIR`` | a folder of dispatch tables (``python -m humming tune``'s output) | the shipped ones |
| ``HUMMING_CACHE_DIR`` | the folder of the on-disk CUDA kernel cache | the user cache folder's ``humming`` |
| ``HUMMING_CACHE_LOCK_TIMEOUT`` | finite non-negative seconds to wait for a cache entry's lock | 600 |
| ``HUMMING_KERNELS_SITE`` | a folder: the peer library the benchmarks import | none |
| ``HUMMING_PDL`` | a flag: programmatic launches of the CUDA kernels behind the kernel before them (sm_90+) | on |
| ``HUMMING_TRITON_PACKED_DECODE`` | a flag: the Triton kernels' packed 4-bit decodes where exact | on |
| ``TRITON_INTERPRET`` | a flag: Triton's CPU interpreter (Triton too reads 1 / true / yes / on as on) | off |

A flag is ``1`` / ``true`` / ``yes`` / ``on`` or ``0`` / ``false`` / ``no`` / ``off`` (any case). An empty or
unset variable takes the default; any other value raises ``ValueError`` naming the variable, what it takes and
what it holds. Values are read through ``os.environ`` on every call, so a change applies at once; a value's
parse is kept per string, so that a hot path pays one dictionary read per variable.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["BACKEND_NAMES", "env", "pass_backend"]

#: The values of ``HUMMING_BACKEND`` (and of every ``backend=`` argument).
BACKEND_NAMES = ("auto", "reference", "triton", "cuda")

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"expected a flag ({' / '.join(_TRUE)} or {' / '.join(_FALSE)})")


def _backend(raw: str) -> str:
    if raw not in BACKEND_NAMES:
        raise ValueError(f"expected one of {', '.join(BACKEND_NAMES)} (the backend that backend='auto' means)")
    return raw


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError("expected a finite, non-negative number of seconds")
    return value


def _folder(raw: str) -> Path:
    path = Path(raw).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError("expected a folder (or a path where one can be made), but it is a file")
    return path


#: name -> (parser of a non-empty value, default)
_VARIABLES: dict[str, tuple[Callable[[str], object], object]] = {
    "HUMMING_BACKEND": (_backend, "auto"),
    "HUMMING_DETERMINISTIC": (_flag, False),
    "HUMMING_LOG_DISPATCH": (_flag, False),
    "HUMMING_TABLES_DIR": (_folder, None),
    "HUMMING_CACHE_DIR": (_folder, None),
    "HUMMING_CACHE_LOCK_TIMEOUT": (_seconds, 600.0),
    "HUMMING_KERNELS_SITE": (_folder, None),
    "HUMMING_PDL": (_flag, True),
    "HUMMING_TRITON_PACKED_DECODE": (_flag, True),
    "TRITON_INTERPRET": (_flag, False),
}
_parsed: dict[tuple[str, object], object] = {}  # (name, raw value) -> parsed value (values of path readers vary)
_ENVIRON = os.environ
_ENCODED = {name: _ENVIRON.encodekey(name) for name in _VARIABLES} if hasattr(_ENVIRON, "encodekey") else {}


def _raw(name: str):
    """``name``'s value as ``os.environ`` holds it: ``os.environ.get`` without its key encoding and value
    decoding (a microsecond on every call of a hot path), the encoded value as it is stored. ``os.environ``
    replaced by another mapping is read through ``get``."""
    environ = os.environ
    if environ is _ENVIRON and _ENCODED:
        return environ._data.get(_ENCODED[name])
    return environ.get(name)


def env(name: str):
    """The parsed value of environment variable ``name`` (one of the table in the module docstring), or its
    default when unset or empty; ``ValueError`` naming ``name`` for a value it does not take."""
    parse, default = _VARIABLES[name]
    raw = _raw(name)
    if not raw:
        return default
    key = (name, raw)
    if key in _parsed:
        return _parsed[key]
    if not isinstance(raw, str):
        raw = _ENVIRON.decodevalue(raw)
    try:
        value = parse(raw)
    except ValueError as err:
        raise ValueError(f"{name}: {err}, got {raw!r}") from None
    if parse is not _folder:  # a folder's test reads the file system, which may change
        _parsed[key] = value
    return value


def pass_backend(backend) -> str:
    """The backend of an op that has a reference and a Triton kernel only (activation quantization, the fused
    norm, routing): ``backend`` checked, ``"auto"`` replaced by ``HUMMING_BACKEND``, whose ``"cuda"`` (the GEMMs
    these ops feed) leaves ``"auto"``."""
    if backend not in ("auto", "reference", "triton"):
        raise ValueError(f"backend: expected 'auto', 'reference' or 'triton', got {backend!r}")
    if backend == "auto":
        backend = env("HUMMING_BACKEND")
    return "auto" if backend == "cuda" else backend
