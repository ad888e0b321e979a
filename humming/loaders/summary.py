"""What a checkpoint folder holds and what would not load, with the reason (``python -m humming inspect``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .checkpoint import iter_modules, load_module, open_checkpoint
from .errors import CheckpointError

__all__ = ["checkpoint_summary"]


def checkpoint_summary(path: str | Path, modules: Iterable[str] | None = None) -> dict:
    """``{"path", "format", "modules": [{"name", "shape", "layout", "bytes"}], "bytes", "unquantized",
    "failed": [{"name", "reason"}]}`` for the quantized modules of a checkpoint folder (``modules``: names or
    shell wildcards); ``unquantized`` counts the tensors of no quantized module. Raises ``CheckpointError``
    when the folder cannot be read at all."""
    files, reader = open_checkpoint(path)
    loaded, failed = [], []
    for name, parts in iter_modules(reader, modules):
        try:
            qw = load_module(reader, name, parts)
        except CheckpointError as err:
            failed.append(dict(name=name, reason=str(err)))
            continue
        loaded.append(dict(name=name, shape=list(qw.shape), layout=qw.describe(), bytes=qw.nbytes))
    quantized = set(reader.modules())
    others = [k for k in files.names() if not {k.rpartition(".")[0], k.rpartition("_")[0]} & quantized]
    return dict(
        path=str(files.path),
        format=reader.describe(),
        modules=loaded,
        bytes=sum(m["bytes"] for m in loaded),
        unquantized=len(others),
        failed=failed,
    )
