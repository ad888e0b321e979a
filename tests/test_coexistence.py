"""humming next to humming-kernels (vLLM's kernel package, import name also ``humming``), as pip leaves them:
both packages' files in one ``humming/`` directory, the later install's copy of a shared file winning. Each
case runs a fresh interpreter on a site directory built in ``tmp_path``.

humming-kernels' files come from its installed distribution where one is installed (a vLLM >= 0.33
environment), otherwise from the minimal tree below (its ``__init__.py`` as released, which imports its
``ops`` package and ``dtypes`` module, and its ``device.py``) with its dist-info."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HK_INIT = "import humming.ops  # noqa\nimport humming.dtypes  # noqa\n"
MINIMAL_HK = {
    "humming/__init__.py": HK_INIT,
    "humming/_version.py": "version = '0.1.19'\n",
    "humming/device.py": "import torch\n",
    "humming/dtypes.py": "class DataType:\n    pass\n",
    "humming/ops/__init__.py": "from humming.device import torch\n",
    "humming/forward.py": "",
    "humming/schema/__init__.py": "",
    "humming_kernels-0.1.19.dist-info/METADATA": "Metadata-Version: 2.4\nName: humming-kernels\nVersion: 0.1.19\n",
}


def _install_humming_kernels(site: Path) -> None:
    try:
        dist = importlib.metadata.distribution("humming-kernels")
    except importlib.metadata.PackageNotFoundError:
        for name, text in MINIMAL_HK.items():
            (site / name).parent.mkdir(parents=True, exist_ok=True)
            (site / name).write_text(text)
        return
    for file in dist.files:
        if file.parts[0] == "humming" and "__pycache__" not in file.parts:
            (site / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file.locate(), site / file)


def _install_humming(site: Path) -> None:
    for path in (ROOT / "humming").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            target = site / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def _run(site: Path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=site, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _merged(tmp_path: Path, order: str) -> Path:
    site = tmp_path / "site-packages"
    site.mkdir()
    steps = [_install_humming_kernels, _install_humming]
    for step in steps if order == "humming-kernels, then humming" else steps[::-1]:
        step(site)
    return site


def _assert_names_both(result: subprocess.CompletedProcess) -> None:
    assert result.returncode != 0, result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:"), result.stderr[-2000:]
    assert "humming-kernels" in last and "pip uninstall -y humming humming-kernels" in last, last


def test_humming_installed_last(tmp_path):
    """humming's ``__init__.py`` won: ``import humming`` stops at once."""
    site = _merged(tmp_path, "humming-kernels, then humming")
    _assert_names_both(_run(site, "import humming"))


@pytest.mark.parametrize(
    "statement", ["import humming.nn", "from humming import linear", "import humming.engines", "import humming.loaders"]
)
def test_humming_kernels_installed_last(tmp_path, statement):
    """humming-kernels' ``__init__.py`` won: ``import humming`` is humming-kernels', and importing any of
    humming's own modules stops at once (never a shadowed-module error)."""
    site = _merged(tmp_path, "humming, then humming-kernels")
    _assert_names_both(_run(site, statement))


def test_humming_alone_imports(tmp_path):
    site = tmp_path / "site-packages"
    site.mkdir()
    _install_humming(site)
    result = _run(site, "import humming; print(humming.__file__)")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == str(site / "humming" / "__init__.py")
