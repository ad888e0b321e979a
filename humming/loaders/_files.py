"""Read a Hugging Face-style checkpoint folder lazily: configs, and safetensors tensor by tensor."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .errors import CheckpointError, MissingTensorError

__all__ = ["CheckpointFiles"]


class CheckpointFiles:
    """The configs and tensors of one checkpoint folder.

    Tensors are read one at a time through ``safetensors.safe_open`` (memory-mapped), so a large
    checkpoint is never loaded whole. The tensor files are the ones named by
    ``*.safetensors.index.json`` if present, else ``model.safetensors``, else every ``*.safetensors``.
    """

    def __init__(self, path: str | Path):
        try:
            self.path = Path(path)
        except TypeError:
            raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}") from None
        if not self.path.is_dir():
            raise CheckpointError(f"{self.path}: not a checkpoint folder (expected a directory)")
        self.config = self._json("config.json") or {}
        self.hf_quant_config = self._json("hf_quant_config.json")
        self._file_of: dict[str, Path] = {}
        for file in self._tensor_files():
            with self._open(file) as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    if key in self._file_of:
                        raise CheckpointError(f"{self.path}: tensor {key!r} is in two files")
                    self._file_of[key] = file
        self._handles: dict[Path, object] = {}

    @staticmethod
    def _open(file: Path):
        """``safe_open(file)``; ``CheckpointError`` naming the file when it is not a readable safetensors file."""
        try:
            return safe_open(file, "pt")
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{file}: not a readable safetensors file ({err})") from None

    def _json(self, name: str) -> dict | None:
        """The JSON object in file ``name`` of the folder, or ``None`` without that file."""
        file = self.path / name
        if not file.exists():
            return None
        try:
            value = json.loads(file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, OSError) as err:
            raise CheckpointError(f"{file}: invalid JSON ({err})") from None
        if not isinstance(value, dict):
            raise CheckpointError(f"{file}: expected a JSON object, got a {type(value).__name__}")
        return value

    def _inside(self, source: Path, name) -> Path:
        """The folder's file ``name`` (as ``source`` names it), refused unless it is a relative path that stays
        in the folder and exists: checked once, lexically (symlinks inside the folder, as a Hugging Face cache
        snapshot holds, are followed by the file system)."""
        if not isinstance(name, str) or not name:
            raise CheckpointError(f"{source}: expected a file name, got {name!r}")
        relative = os.path.normpath(name)
        if os.path.isabs(relative) or relative == ".." or relative.startswith(".." + os.sep):
            raise CheckpointError(f"{source}: names the file {name!r}, outside the checkpoint folder {self.path}")
        file = self.path / relative
        if not file.is_file():
            raise CheckpointError(f"{source}: names the file {name!r}, which is not in the folder {self.path}")
        return file

    def _tensor_files(self) -> list[Path]:
        indexes = sorted(self.path.glob("*.safetensors.index.json"))
        if indexes:
            weight_map = self._json(indexes[0].name).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(
                    f"{indexes[0]}: expected a non-empty 'weight_map' object (tensor -> file), got {weight_map!r}"
                )
            names = set()
            for key, name in weight_map.items():
                if not isinstance(name, str):
                    raise CheckpointError(f"{indexes[0]}: weight_map[{key!r}] is {name!r}, not a file name")
                names.add(name)
            return [self._inside(indexes[0], name) for name in sorted(names)]
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
            self._handles[file] = self._open(file)
        return self._handles[file]

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handle(key).get_slice(key).get_shape())

    def get(self, key: str, module: str | None = None) -> torch.Tensor:
        """The tensor ``key`` on the CPU; ``MissingTensorError`` naming ``module`` if absent, ``CheckpointError``
        naming the file where it cannot be read (a truncated file)."""
        where = f"{module}: " if module else ""
        if key not in self._file_of:
            raise MissingTensorError(f"{where}tensor {key!r} is missing from the checkpoint")
        try:
            return self._handle(key).get_tensor(key)
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{where}tensor {key!r} cannot be read from {self._file_of[key]} ({err})") from None

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
