"""The README's Python examples run as written on a CPU machine: each in a fresh namespace, all in one
interpreter started without the test suite's ``TRITON_INTERPRET=1`` (tests/conftest.py sets it), so that an
example that would need it fails here; an example that warns about a missing autograd kernel fails too."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
FIXTURE = pathlib.Path(__file__).parent / "data" / "checkpoints" / "autogptq_w4_g128_sym"
#: runs each block (stdin: JSON list of sources) and prints one JSON line per block: its error or null
RUNNER = """
import json, sys, traceback, warnings
results = []
for source in json.load(sys.stdin):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            exec(compile(source, "README.md", "exec"), {})
            error = None
        except BaseException:
            error = traceback.format_exc(limit=-3)
    bad = [str(w.message) for w in caught if "autograd kernel was not registered" in str(w.message)]
    results.append(error or (bad[0] if bad else None))
print("RESULTS " + json.dumps(results))
"""


def test_readme_has_examples():
    assert BLOCKS, "the README has a Python example"


def test_readme_examples_run_on_cpu(tmp_path):
    blocks = [b.replace("/tmp/", f"{tmp_path}/").replace("path/to/model", str(FIXTURE)) for b in BLOCKS]
    if importlib.util.find_spec("transformers") is None:  # the hf extra: pip install -e ".[hf]"
        blocks = [b for b in blocks if "transformers" not in b and "from_pretrained" not in b]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(README.parent), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-c", RUNNER]
    run = subprocess.run(command, input=json.dumps(blocks), capture_output=True, text=True, env=env, cwd=tmp_path)
    line = next((x for x in run.stdout.splitlines() if x.startswith("RESULTS ")), None)
    assert line is not None, run.stderr[-3000:]
    failures = {i: error for i, error in enumerate(json.loads(line[len("RESULTS ") :])) if error}
    assert not failures, "\n".join(f"README example {i}:\n{BLOCKS[i][:300]}\n{e}" for i, e in failures.items())
