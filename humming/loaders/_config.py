"""Typed reads of a checkpoint's JSON configs: every value a loader uses is checked, and a wrong one raises
``CheckpointError`` naming the field (``quantization_config.bits: expected an int, got 4.7``)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from .errors import CheckpointError

__all__ = ["Config"]

_REQUIRED = object()


def _kind(value) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"


class Config:
    """One JSON object of a config (``quantization_config``, a config group, a module's quant state), read
    field by field. ``where`` names it in messages (``quantization_config``,
    ``quantization_config.config_groups.group_0.weights``). A field that is absent, or null where ``null`` is
    allowed, reads as its default; ``_REQUIRED`` has none."""

    def __init__(self, value, where: str) -> None:
        if not isinstance(value, dict):
            raise CheckpointError(f"{where}: expected a JSON object, got {_kind(value)}")
        self.value, self.where = value, where

    def __contains__(self, key: str) -> bool:
        return self.value.get(key) is not None

    def _get(self, key: str, default, null: bool) -> tuple[bool, object]:
        """``(True, value)`` when the field is set, else ``(False, default)``."""
        value = self.value.get(key, _REQUIRED)
        if value is not _REQUIRED and not (value is None and null):
            return True, value
        if default is _REQUIRED:
            raise CheckpointError(f"{self.where}.{key}: missing")
        return False, default

    def error(self, key: str, expected: str, value) -> CheckpointError:
        return CheckpointError(f"{self.where}.{key}: expected {expected}, got {_kind(value)}")

    def int(
        self,
        key: str,
        default=_REQUIRED,
        *,
        minimum: int | None = None,
        allowed: Iterable[int] = (),
        null: bool = False,
    ) -> int:
        """An integer (an integral JSON float such as ``4.0`` too, never a bool), at least ``minimum`` or one of
        ``allowed`` (``-1`` for "the whole dimension"); ``null``: a null reads as the default (where the
        producer writes null for "unset"), else it is refused."""
        found, value = self._get(key, default, null=null)
        if not found:
            return value
        allowed = tuple(allowed)
        number = value if isinstance(value, int) and not isinstance(value, bool) else None
        if isinstance(value, float) and value.is_integer():
            number = int(value)
        if number is None or (minimum is not None and number < minimum and number not in allowed):
            bound = "" if minimum is None else f" >= {minimum}" + "".join(f" or {a}" for a in allowed)
            raise self.error(key, f"an int{bound}", value)
        return number

    def number(self, key: str, default=_REQUIRED) -> float:
        """A finite JSON number (not a bool)."""
        found, value = self._get(key, default, null=False)
        if not found:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(key, "a finite number", value)
        return float(value)

    def str(self, key: str, default=_REQUIRED, *, lower: bool = False) -> str:
        found, value = self._get(key, default, null=True)
        if not found:
            return value
        if not isinstance(value, str):
            raise self.error(key, "a string", value)
        return value.lower() if lower else value

    def bool(self, key: str, default=_REQUIRED) -> bool:
        found, value = self._get(key, default, null=True)
        if found and not isinstance(value, bool):
            raise self.error(key, "true or false", value)
        return value

    def strings(self, key: str) -> list[str]:
        """A list of strings (module names or patterns); absent or null: empty."""
        _, value = self._get(key, [], null=True)
        if isinstance(value, str) or not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, "a list of strings", value)
        return list(value)

    def object(self, key: str) -> Config:
        """A nested object; absent or null: an empty one."""
        return Config(self._get(key, {}, null=True)[1], f"{self.where}.{key}")

    def int_pair(self, key: str) -> tuple[int, int] | None:
        """Two positive ints (a block shape ``[bn, bk]``), or ``None`` when absent or null."""
        found, value = self._get(key, None, null=True)
        if not found:
            return None
        pair = value if isinstance(value, list) and len(value) == 2 else None
        if pair is None or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pair):
            raise self.error(key, "a list of two positive ints [bn, bk]", value)
        return pair[0], pair[1]
