"""The package's layers, read from the source (no import runs): the IR imports nothing above it, the kernel
backends never import the dispatcher, and no module-level imports form a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "humming"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, dict[str, bool]]:
    """module -> {humming module it imports: True if at module level (else inside a function)}; imports of a
    module's own ancestor packages are left out (Python initialises those first in any case)."""
    graph: dict[str, dict[str, bool]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: dict[str, bool] = {}

        def visit(node, top: bool, name=name, package=package, deps=deps) -> None:
            for child in ast.iter_child_nodes(node):
                targets = []
                if isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom) and child.module != "__future__":
                    base = child.module or ""
                    if child.level:
                        up = package.split(".")[: len(package.split(".")) - child.level + 1]
                        base = ".".join(up + ([child.module] if child.module else []))
                    targets = [base] + [f"{base}.{a.name}" for a in child.names]
                for target in targets:
                    while target and target not in mods:
                        target = target.rpartition(".")[0]
                    if target and target != name and not name.startswith(target + "."):
                        deps[target] = deps.get(target, False) or top
                inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                visit(child, top and not inner)

        visit(ast.parse(path.read_text()), True)
        graph[name] = deps
    return graph


def _within(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


def test_ir_imports_nothing_above_it():
    graph = _imports(_modules())
    above = ("humming.dispatch", "humming.loaders", "humming.cuda_kernels", "humming.triton_kernels")
    wrong = [
        (m, d)
        for m, deps in graph.items()
        if _within(m, "humming.ir")
        for d in deps
        if any(_within(d, a) for a in above)
    ]
    assert not wrong, wrong


def test_kernel_backends_never_import_the_dispatcher():
    graph = _imports(_modules())
    backends = ("humming.cuda_kernels", "humming.triton_kernels")
    wrong = [
        (m, d)
        for m, deps in graph.items()
        if any(_within(m, b) for b in backends)
        for d in deps
        if _within(d, "humming.dispatch")
    ]
    assert not wrong, wrong


def test_no_module_level_import_cycle():
    graph = {m: [d for d, top in deps.items() if top] for m, deps in _imports(_modules()).items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in graph[module]:
            assert state.get(dep) != 1, " -> ".join([*path, module, dep])
            if dep not in state:
                walk(dep, [*path, module])
        state[module] = 2

    for module in graph:
        if module not in state:
            walk(module, [])
