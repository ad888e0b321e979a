"""``python -m humming inspect PATH``: what a checkpoint holds and what would not load, with the reason."""

from __future__ import annotations

import argparse
import sys

from .checkpoint import iter_modules, load_module, open_checkpoint
from .errors import CheckpointError

__all__ = ["inspect_main"]


def _size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def inspect_main(argv: list[str] | None = None) -> int:
    """List the quantized modules of a checkpoint folder: name, shape, format and group layout, bytes in the
    IR, and the count of unquantized tensors on stdout; the modules that would not load, with the reason, on
    stderr. Returns the exit status: 0 when every quantized module loads, 1 otherwise."""
    parser = argparse.ArgumentParser(prog="humming inspect", description=inspect_main.__doc__.split("\n")[0])
    parser.add_argument("path", help="checkpoint folder (config.json + *.safetensors)")
    parser.add_argument("--modules", nargs="*", help="only these module names / shell wildcards")
    args = parser.parse_args(argv)
    try:
        files, reader = open_checkpoint(args.path)
    except CheckpointError as err:
        print(f"cannot load: {err}", file=sys.stderr)
        return 1
    print(f"{files.path}: {reader.describe()}")
    loaded, failed = [], []
    try:
        for name, parts in iter_modules(reader, args.modules):
            try:
                loaded.append((name, load_module(reader, name, parts)))
            except CheckpointError as err:
                failed.append((name, str(err)))
    except (CheckpointError, ValueError) as err:  # the module listing itself (a pattern that matches nothing)
        print(f"cannot load: {err}", file=sys.stderr)
        return 1
    width = max((len(n) for n, _ in loaded), default=6)
    print(f"{'module':<{width}}  {'shape':<16}  {'format / layout':<40}  bytes")
    for name, qw in loaded:
        print(f"{name:<{width}}  {'x'.join(map(str, qw.shape)):<16}  {qw.describe():<40}  {_size(qw.nbytes)}")
    print(f"{len(loaded)} quantized modules, {_size(sum(qw.nbytes for _, qw in loaded))}")
    quantized = set(reader.modules())
    others = [
        k for k in files.names() if k.rpartition(".")[0] not in quantized and k.rpartition("_")[0] not in quantized
    ]
    print(f"{len(others)} unquantized tensors (left out)")
    for name, reason in failed:
        print(f"NOT LOADED {name}: {reason}", file=sys.stderr)
    if failed:
        print(f"{len(failed)} quantized modules would not load", file=sys.stderr)
    return 1 if failed else 0
