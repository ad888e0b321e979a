"""Humming's own checkpoint format (``quant_method: humming-ir``), for schemes compressed-tensors has no form
for (:mod:`.export` lists them): each weight's IR tensors as ``<module>.qweight``, ``.scales``, ``.zeros``,
``.global_scale``, ``.g_idx``, ``.bias`` (those set), a static activation scale as ``<module>.input_scale``,
and per module in ``quantization_config.modules``: ``shape``, ``format``, ``group_shape``, ``act`` (an
activation scheme name or null) and ``static`` (whether ``input_scale`` is stored)."""

from __future__ import annotations

from humming.ir.weight import QuantizedWeight

from ._files import CheckpointFiles
from .activations import ActivationSpec
from .errors import CheckpointError, UnsupportedFormatError

__all__ = ["HummingReader"]

_FIELDS = ("qweight", "scales", "zeros", "global_scale", "g_idx", "bias")
_KEYS = ("shape", "format", "group_shape")
#: versions of this layout the reader knows
VERSIONS = (1,)


class HummingReader:
    method = "humming-ir"

    def __init__(self, qconfig: dict, files: CheckpointFiles):
        self.files = files
        version = qconfig.get("version")
        if version not in VERSIONS:
            raise UnsupportedFormatError(f"humming-ir version {version!r}: this humming reads versions {VERSIONS}")
        self.records = qconfig.get("modules")
        if not isinstance(self.records, dict):
            raise CheckpointError("humming-ir: quantization_config has no 'modules' mapping")
        for name, record in self.records.items():
            missing = [key for key in _KEYS if key not in record]
            if missing:
                raise CheckpointError(f"{name}: its humming-ir record lacks {missing}")

    def describe(self) -> str:
        kinds = sorted({f"{r['format']} {tuple(r['group_shape'])}" for r in self.records.values()})
        return "humming-ir " + ", ".join(kinds)

    def modules(self) -> list[str]:
        return sorted(self.records)

    def load(self, module: str) -> QuantizedWeight:
        record = self.records[module]
        fields = {name: self.files.get_optional(f"{module}.{name}") for name in _FIELDS}
        fields["qweight"] = self.files.get(f"{module}.qweight", module)
        fields = {name: t for name, t in fields.items() if t is not None}
        return QuantizedWeight(
            shape=tuple(record["shape"]), format=record["format"], group_shape=tuple(record["group_shape"]), **fields
        )

    def activation(self, module: str) -> ActivationSpec:
        record = self.records[module]
        static = f"{module}.input_scale" if record.get("static") else None
        return ActivationSpec(record.get("act"), static)
