"""The package's layers, read from the source (no import runs): every ``import`` / ``from ... import`` of a
humming module, at module level or inside a function, except under ``if TYPE_CHECKING:`` (annotations only,
never run). Kernel backends loaded by name (``importlib.import_module``) are optional dependencies, not edges.

Rules: no import cycles; the IR imports only the IR and the loaders only the IR; the kernel backends never
import the layers built on them; dispatch does not import moe; the CUDA JIT does not import the driver that
loads its cubins."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "humming"
#: the import-time check (standard library only), which every layer may run
CHECK = "humming._install_check"


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
                if _is_type_checking(child):
                    continue
                inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                visit(child, top and not inner)

        visit(ast.parse(path.read_text()), True)
        graph[name] = deps
    return graph


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _within(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


def _wrong(graph, layers: tuple[str, ...], allowed=None, forbidden=()) -> list[tuple[str, str]]:
    """``(module, dependency)`` pairs from a module of ``layers`` to one outside ``allowed`` (when given) or
    inside ``forbidden``."""
    return [
        (m, d)
        for m, deps in graph.items()
        if any(_within(m, layer) for layer in layers)
        for d in deps
        if (allowed is not None and not any(_within(d, a) for a in allowed)) or any(_within(d, f) for f in forbidden)
    ]


def test_ir_imports_only_the_ir():
    assert not _wrong(_imports(_modules()), ("humming.ir",), allowed=("humming.ir", CHECK))


def test_loaders_import_only_the_ir():
    assert not _wrong(_imports(_modules()), ("humming.loaders",), allowed=("humming.loaders", "humming.ir", CHECK))


def test_kernel_backends_never_import_the_layers_above():
    above = (
        "humming.dispatch",
        "humming.linear",
        "humming.moe",
        "humming.ops",
        "humming.nn",
        "humming.engines",
        "humming.loaders",
    )
    assert not _wrong(_imports(_modules()), ("humming.cuda_kernels", "humming.triton_kernels"), forbidden=above)


def test_dispatch_does_not_import_moe():
    assert not _wrong(_imports(_modules()), ("humming.dispatch",), forbidden=("humming.moe",))


def test_jit_does_not_import_the_driver():
    graph = _imports(_modules())
    assert "humming.cuda_kernels.jit" in graph["humming.cuda_kernels._driver"]  # the graph is read
    assert "humming.cuda_kernels._driver" not in graph["humming.cuda_kernels.jit"]


def _first_cycle(graph: dict[str, list[str]]) -> str | None:
    """``a -> b -> ... -> a`` for the first cycle a depth-first walk meets, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in graph:
        if root in state:
            continue
        path, work = [root], [iter(graph[root])]
        state[root] = 1
        while work:
            dep = next(work[-1], None)
            if dep is None:
                state[path.pop()] = 2
                work.pop()
            elif state.get(dep) == 1:
                return " -> ".join([*path[path.index(dep) :], dep])
            elif dep not in state:
                state[dep] = 1
                path.append(dep)
                work.append(iter(graph[dep]))
    return None


def test_no_module_level_import_cycle():
    graph = {m: [d for d, top in deps.items() if top] for m, deps in _imports(_modules()).items()}
    assert _first_cycle(graph) is None, _first_cycle(graph)


def test_no_import_cycle_through_lazy_imports():
    graph = {m: list(deps) for m, deps in _imports(_modules()).items()}
    assert _first_cycle(graph) is None, _first_cycle(graph)


def test_cycle_finder_finds_a_cycle():
    assert _first_cycle({"d": ["a"], "a": ["b"], "b": ["c"], "c": ["a"]}) == "a -> b -> c -> a"
    assert _first_cycle({"a": ["b"], "b": [], "c": ["b"]}) is None
