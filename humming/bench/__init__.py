"""``python -m humming bench``: humming's kernels timed against torch, gemlite and humming-kernels on the same
inputs (``bench/report.py`` turns the JSON into tables and plots).

- :mod:`.sweeps`: the sweeps and their command line (:func:`sweep`, :func:`main`);
- :mod:`.systems`: the dense systems compared and the :class:`Group` of one case, shape and dtype;
- :mod:`.moe`: the MoE model presets, the parts of their layers and their systems;
- :mod:`.peer`: humming-kernels, run in a worker process (its package is also named ``humming``);
- :mod:`.inputs`: the seeded inputs every system starts from, and the float32 products they are checked
  against.
"""

from __future__ import annotations

from .inputs import ROUTINGS, rel_err
from .moe import MODELS, PARTS, MoeModel
from .sweeps import CHECK_TOLERANCE, COPY_BYTES_PER_S, DEFAULTS, copy_roof, main, parse_shapes, registry, sweep
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
    "copy_roof",
    "main",
    "parse_shapes",
    "registry",
    "rel_err",
    "sweep",
]
