"""The README's Python example runs as written."""

from __future__ import annotations

import pathlib
import re


def test_readme_example_runs(tmp_path, monkeypatch):
    text = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "the README has a Python example"
    monkeypatch.chdir(tmp_path)
    fixture = pathlib.Path(__file__).parent / "data" / "checkpoints" / "autogptq_w4_g128_sym"
    for block in blocks:  # the loader example reads a real producer's checkpoint
        code = block.replace("/tmp/", f"{tmp_path}/").replace("path/to/model", str(fixture))
        exec(compile(code, "README.md", "exec"), {})
