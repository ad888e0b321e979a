"""The pieces every ``python -m humming`` command shares: one table printer, JSON output, an argparse
formatter that shows defaults, and errors on stderr with an exit status."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

__all__ = ["Formatter", "print_json", "print_table", "size", "table"]


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Help with each option's default (those that have one: not a flag's False nor an unset None) and the
    description's line breaks kept."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def table(header: Sequence[str], rows: Sequence[Sequence], right: Sequence[str] = ()) -> str:
    """``rows`` under ``header`` in aligned columns (two spaces apart); the columns named in ``right`` are
    right-aligned (numbers)."""
    cells = [[str(c) for c in header]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        parts = [c.rjust(w) if h in right else c.ljust(w) for c, w, h in zip(row, widths, header)]
        lines.append("  ".join(parts).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_table(header: Sequence[str], rows: Sequence[Sequence], right: Sequence[str] = ()) -> None:
    print(table(header, rows, right))


def print_json(obj) -> None:
    """``obj`` as indented JSON on stdout (what ``--json`` prints: the same facts as the table)."""
    json.dump(obj, sys.stdout, indent=1, default=str)
    print()


def size(nbytes: float) -> str:
    """``1.5 MiB``-style byte counts."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")
