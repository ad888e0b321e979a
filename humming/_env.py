"""Environment variables read on every call (``HUMMING_BACKEND``, ``HUMMING_DETERMINISTIC``).

``os.environ.get`` of an unset variable costs about a microsecond (``os.environ`` raises and catches a
``KeyError`` inside), as much as the rest of a cached dispatch decision; on POSIX :func:`getenv` reads the
bytes dictionary that ``os.environ`` keeps and its setters update, so that changes still apply at once.
"""

from __future__ import annotations

import os

__all__ = ["getenv"]

_BYTES = getattr(os.environ, "_data", None) if os.name == "posix" else None


def getenv(name: str, default: str | None = None) -> str | None:
    """``os.environ.get(name, default)`` for an ASCII ``name``."""
    if _BYTES is None:
        return os.environ.get(name, default)
    value = _BYTES.get(name.encode())
    return default if value is None else os.fsdecode(value)
