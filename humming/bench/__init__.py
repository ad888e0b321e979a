"""``python -m humming bench``: time humming's kernels against torch, gemlite and humming-kernels on the same
inputs; ``bench/report.py`` turns the JSON into tables and plots.

    python -m humming bench linear --out bench/results/h200/linear.json   # the standard dense sweep
    python -m humming bench moe --models deepseek-v3 --m 1,16,256 --budget-s 120 --out moe.json
    python -m humming bench linear --shapes 64x64 --m 1,5 --check-only  # CPU: every system's result

Modules: :mod:`.sweeps` (the sweeps and their command line), :mod:`.systems` (the dense systems and the
:class:`Group` of one case, shape and dtype), :mod:`.moe` (the MoE model presets, the parts of their layers,
their systems), :mod:`.peer` (humming-kernels in a worker process: its package is also named ``humming``),
:mod:`.inputs` (the seeded inputs every system starts from and the float32 products they are checked
against).
"""

from __future__ import annotations

from .inputs import ROUTINGS, rel_err
from .moe import MODELS, PARTS, MoeModel
from .sweeps import (
    CHECK_TOLERANCE,
    COPY_BYTES_PER_S,
    DEFAULTS,
    add_arguments,
    copy_roof,
    main,
    parse_shapes,
    registry,
    run,
    sweep,
)
from .systems import OPS, Group, Shape

__all__ = [
    "CHECK_TOLERANCE",
    "COPY_BYTES_PER_S",
    "DEFAULTS",
    "MODELS",
    "OPS",
    "PARTS",
    "ROUTINGS",
    "Group",
    "MoeModel",
    "Shape",
    "add_arguments",
    "copy_roof",
    "main",
    "parse_shapes",
    "registry",
    "rel_err",
    "run",
    "sweep",
]
