"""The README's Python example runs as written."""

from __future__ import annotations

import pathlib
import re


def test_readme_example_runs(tmp_path, monkeypatch):
    text = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "the README has a Python example"
    monkeypatch.chdir(tmp_path)
    runnable = [b for b in blocks if "path/to/model" not in b]  # the loader example needs a real folder
    for block in runnable:
        exec(compile(block.replace("/tmp/", f"{tmp_path}/"), "README.md", "exec"), {})
