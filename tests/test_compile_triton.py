"""Every registered Triton kernel compiles ahead of time for every architecture, with the expected
matrix instructions (humming/triton_kernels/registry.py). No GPU needed. Every specialisation compiles
for sm_90; the other architectures compile one per kernel family and minimum architecture
(``registry.specs_for_arch``), which keeps the check within CI's time on 2 cores.

Under the interpreter ``triton.jit`` returns functions that cannot be compiled, so each architecture is
compiled in a subprocess with ``TRITON_INTERPRET`` unset; the subprocesses run in parallel, one per core.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

registry = pytest.importorskip("humming.triton_kernels.registry")


def _compile(arch: int) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "humming.triton_kernels", "--arch", str(arch)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if not proc.stdout.strip():
        raise AssertionError(f"compile check for sm_{arch} printed nothing; stderr:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def _compile_all() -> dict[int, list[dict]]:
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {arch: pool.submit(_compile, arch) for arch in registry.ARCHS}
        return {arch: future.result() for arch, future in futures.items()}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[int, list[dict]]:
    """The compile check's results per architecture, computed once per run: under pytest-xdist the first
    worker to need them compiles (on every core) and the others read its results from the run's shared
    temporary folder, instead of each worker compiling everything again on the same cores."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return _compile_all()
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / "compile_triton.json"  # one folder per run, all workers
    with FileLock(f"{shared}.lock"):
        if not shared.is_file():
            shared.write_text(json.dumps(_compile_all()))
        return {int(arch): results for arch, results in json.loads(shared.read_text()).items()}


@pytest.mark.parametrize("arch", registry.ARCHS, ids=lambda a: f"sm_{a}")
def test_every_family_is_compiled_for_every_arch(arch: int) -> None:
    specs = registry.compile_specs()
    chosen = registry.specs_for_arch(specs, arch)
    assert {(s.family, s.min_arch) for s in chosen} == {(s.family, s.min_arch) for s in specs}
    if arch in registry.FULL_ARCHS:
        assert len(chosen) == len(specs)


@pytest.mark.parametrize("arch", registry.ARCHS, ids=lambda a: f"sm_{a}")
def test_every_kernel_compiles(arch: int, compiled: dict) -> None:
    results = compiled[arch]
    names = {r["name"] for r in results}
    assert any(n.startswith("wna16-") for n in names) and any(n.startswith("dequant-") for n in names)
    failed = [f"{r['name']}: {r['problem']}" for r in results if not r["ok"]]
    assert not failed, f"sm_{arch}:\n" + "\n".join(failed)
    if arch in registry.BEST_MMA:
        best = [r for r in results if registry.BEST_MMA[arch] in r["mma_ops"]]
        assert best, f"sm_{arch}: no kernel uses {registry.BEST_MMA[arch]}"


def test_split_k_specs_declare_the_workspace() -> None:
    """Split-K launches pass the zero-between-calls workspace (32-bit words) as ``ws_ptr`` and the output as
    ``out_ptr`` (``store_tile``'s last program of a tile writes it), so their specs must compile that
    signature."""
    split = [s for s in registry.compile_specs() if s.constexprs.get("SPLIT_K", 1) > 1 and "ws_ptr" in s.pointers]
    assert split, "no split-K specialisation is registered"
    wrong = [f"{s.name}: ws_ptr {s.pointers['ws_ptr']}" for s in split if s.pointers["ws_ptr"] != "*i32"]
    wrong += [f"{s.name}: out_ptr {s.pointers['out_ptr']}" for s in split if s.pointers["out_ptr"] == "*i32"]
    assert not wrong, "\n".join(wrong)


_FUSED_COMBINE = """
import triton
from triton.backends.compiler import GPUTarget
from humming.triton_kernels import moe_layer
spec = next(s for s in moe_layer._compile_specs() if s.name.startswith("moe_combine-"))
src = triton.compiler.ASTSource(spec.kernel, spec.signature(), spec.constexprs, spec.attrs())
ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=spec.options()).asm["ptx"]
print(ptx.count("fma.rn.f32"), ptx.count("mul.rn.f32") + ptx.count("mul.f32"))
"""


def test_kernels_contract_multiply_adds_whatever_the_tritons_default() -> None:
    """The combine's ``acc += w * y`` compiles to fma with Triton's default turned off (Triton 3.10's): the
    specs, like the launches, ask for contraction themselves."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "0"}
    proc = subprocess.run([sys.executable, "-c", _FUSED_COMBINE], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    fma, mul = map(int, proc.stdout.split())
    assert fma >= 8 and mul == 0, proc.stdout


def _jit_functions(tree) -> list:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list)
    ]


def test_no_kernel_branches_on_a_jit_functions_result() -> None:
    """Triton 3.6 compiles the result of a call to a jit function as a runtime value, even when every argument
    is a constexpr: an ``if`` on it builds both branches, which then must agree in every variable's type (field
    decodes of different widths do not), where newer Tritons fold the call and compile. Conditions on
    constexprs are spelled as constexpr assignments instead."""
    import humming.triton_kernels as package

    trees = {path: ast.parse(path.read_text()) for path in Path(package.__file__).parent.glob("*.py")}
    jit_names = {f.name for tree in trees.values() for f in _jit_functions(tree)}
    found = []
    for path, tree in trees.items():
        for function in _jit_functions(tree):
            for node in ast.walk(function):
                if isinstance(node, (ast.If, ast.IfExp, ast.While)):
                    calls = [c for c in ast.walk(node.test) if isinstance(c, ast.Call)]
                    names = [
                        c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", "") for c in calls
                    ]
                    if any(name in jit_names for name in names):
                        found.append(f"{path.name}:{node.lineno}: {ast.unparse(node.test)}")
    assert jit_names and not found, "\n".join(found)
