"""Read a Hugging Face-style checkpoint folder lazily: configs, and safetensors tensor by tensor."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from .errors import CheckpointError, MissingTensorError

__all__ = ["CheckpointFiles"]


class CheckpointFiles:
    """The configs and tensors of one checkpoint folder.

    Tensors are read one at a time through ``safetensors.safe_open`` (memory-mapped), so a large
    checkpoint is never loaded whole. The tensor files are the ones named by
    ``*.safetensors.index.json`` if present, else ``model.safetensors``, else every ``*.safetensors``.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise CheckpointError(f"{self.path}: not a checkpoint folder (expected a directory)")
        self.config = self._json("config.json") or {}
        self.hf_quant_config = self._json("hf_quant_config.json")
        self._file_of: dict[str, Path] = {}
        for file in self._tensor_files():
            with safe_open(file, "pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    if key in self._file_of:
                        raise CheckpointError(f"{self.path}: tensor {key!r} is in two files")
                    self._file_of[key] = file
        self._handles: dict[Path, object] = {}

    def _json(self, name: str) -> dict | None:
        file = self.path / name
        if not file.exists():
            return None
        try:
            return json.loads(file.read_text())
        except json.JSONDecodeError as err:
            raise CheckpointError(f"{file}: invalid JSON ({err})") from None

    def _tensor_files(self) -> list[Path]:
        indexes = sorted(self.path.glob("*.safetensors.index.json"))
        if indexes:
            weight_map = (self._json(indexes[0].name) or {}).get("weight_map", {})
            return [self.path / f for f in sorted(set(weight_map.values()))]
        single = self.path / "model.safetensors"
        if single.exists():
            return [single]
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{self.path}: no *.safetensors files")
        return files

    def names(self) -> list[str]:
        return list(self._file_of)

    def __contains__(self, key: str) -> bool:
        return key in self._file_of

    def _handle(self, key: str):
        file = self._file_of[key]
        if file not in self._handles:
            self._handles[file] = safe_open(file, "pt")
        return self._handles[file]

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handle(key).get_slice(key).get_shape())

    def get(self, key: str, module: str | None = None) -> torch.Tensor:
        """The tensor ``key`` on the CPU; ``MissingTensorError`` naming ``module`` if absent."""
        if key not in self._file_of:
            where = f"{module}: " if module else ""
            raise MissingTensorError(f"{where}tensor {key!r} is missing from the checkpoint")
        return self._handle(key).get_tensor(key)

    def get_optional(self, key: str) -> torch.Tensor | None:
        return self.get(key) if key in self._file_of else None

    def modules_with(self, *suffixes: str) -> list[str]:
        """Sorted module names ``m`` that have a tensor ``m.<suffix>`` for one of ``suffixes``."""
        found = set()
        for key in self._file_of:
            module, _, leaf = key.rpartition(".")
            if leaf in suffixes:
                found.add(module)
        return sorted(found)


class TensorFiles(CheckpointFiles):
    """:class:`CheckpointFiles` over tensors already in memory (``{name: tensor}``), for engines whose own
    loader hands the checkpoint's tensors over one by one."""

    def __init__(self, tensors: dict[str, torch.Tensor], config: dict | None = None):
        self.path = Path("<memory>")
        self.config = config or {}
        self.hf_quant_config = None
        self._tensors = dict(tensors)
        self._file_of = dict.fromkeys(self._tensors, self.path)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._tensors[key].shape)

    def _handle(self, key: str):
        return self

    def get_tensor(self, key: str) -> torch.Tensor:
        return self._tensors[key]
