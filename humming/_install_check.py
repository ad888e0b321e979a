"""Checks run first whenever humming is imported (standard library only, nothing of humming imported yet).

humming-kernels (vLLM's GPU kernel package, a hard dependency of vLLM >= 0.33) installs a top-level package
named ``humming`` too. pip installs both into one ``site-packages/humming`` directory without a warning: the
later install overwrites the files both ship (``__init__.py``, ``device.py``) and the other's stay, so
humming-kernels' ``ops/`` package shadows humming's ``ops.py``, and uninstalling either one deletes files of
the other. :func:`check` stops such an import at once with an error that names both packages and the fix.

vLLM's ``has_humming()`` probe (``vllm.utils.import_utils._has_module("humming")``) means "humming-kernels is
installed"; it imports whatever package is named ``humming``. When that import is this package, :func:`check`
fails it, so the probe answers False and vLLM keeps its own kernels (``humming.engines.vllm_plugin`` makes the
probe answer False in processes that imported humming before vLLM's probe ran).
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["FOREIGN_FILES", "check"]

#: files only humming-kernels installs into the ``humming/`` directory
FOREIGN_FILES = ("dtypes.py", "_version.py", "ops/__init__.py", "schema/__init__.py", "forward.py")

_PACKAGE = Path(__file__).resolve().parent


def check() -> None:
    """Raise ``ImportError`` when humming-kernels' files share this package's directory, or when the import is
    vLLM's probe for humming-kernels."""
    found = [name for name in FOREIGN_FILES if (_PACKAGE / name).exists()]
    if found:
        raise ImportError(
            f"{_PACKAGE} holds files of two packages: humming (the weight-IR kernel library) and "
            f"humming-kernels (vLLM's kernel package; found its {', '.join(found)}). Both install a top-level "
            "package named 'humming', so pip merged them and neither imports correctly. Only one of the two "
            "can live in one environment: run `pip uninstall -y humming humming-kernels`, then "
            "`pip install humming` (vLLM then runs without humming-kernels and serves humming's kernels "
            "with --quantization humming_ir) or `pip install humming-kernels` (vLLM's own humming backend); "
            "uninstalling only one of them leaves the other's files broken."
        )
    if _inside_vllm_probe():
        raise ImportError(
            "this 'humming' is the weight-IR kernel library, not humming-kernels: vLLM's humming-kernels "
            "backend stays off (has_humming() is False); humming's own vLLM method is --quantization humming_ir"
        )


def _inside_vllm_probe() -> bool:
    """Whether this import runs inside ``vllm.utils.import_utils._has_module("humming")``."""
    if "vllm.utils.import_utils" not in sys.modules:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if (
            frame.f_code.co_name == "_has_module"
            and frame.f_globals.get("__name__") == "vllm.utils.import_utils"
            and frame.f_locals.get("module_name") == "humming"
        ):
            return True
        frame = frame.f_back
    return False


check()  # importing this module is the check: a failed import leaves nothing cached, so it runs again next time
