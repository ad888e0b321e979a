"""The README's Python examples run as written."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

README = pathlib.Path(__file__).parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert BLOCKS, "the README has a Python example"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path, monkeypatch):
    block = BLOCKS[index]
    if "from_pretrained" in block and importlib.util.find_spec("transformers") is None:
        pytest.skip("the example needs the hf extra (transformers)")
    monkeypatch.chdir(tmp_path)
    fixture = pathlib.Path(__file__).parent / "data" / "checkpoints" / "autogptq_w4_g128_sym"
    # the loader examples read a real producer's checkpoint
    code = block.replace("/tmp/", f"{tmp_path}/").replace("path/to/model", str(fixture))
    exec(compile(code, "README.md", "exec"), {})
