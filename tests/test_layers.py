"""The package's layers, read from the source (no import runs): every ``import`` / ``from ... import`` of a
humming module, at module level or inside a function, except under ``if TYPE_CHECKING:`` (annotations only,
never run), and every module loaded by name: ``importlib.import_module("humming...")`` and the names of
modules that a module lists to import on first use (a string that is a humming module's full name, such as
the kernel modules ``humming.dispatch.kernels`` lists). Those run later, when first used: lazy edges.

The house (bottom up): the IR (``humming.ir``), the device facts (``humming.device``), the kernel protocol
(``humming.kernel``) and the kernels' shared split-K workspaces (``humming.workspaces``); the references
(``humming.reference``); the kernel backends (``humming.cuda_kernels``, ``humming.triton_kernels``); the
dispatcher (``humming.dispatch``); the entry points (``humming.linear``, ``humming.moe``, ``humming.norm``,
``humming.ops``, ``humming.warmup``); the modules and loaders (``humming.nn``, ``humming.loaders``,
``humming.engines``); the benchmarks (``humming.bench``).

Rules: no import cycles, lazy edges included; each layer imports only downward; no module imports its own
package's face (its ``__init__``, which only names what the package's modules define); the CUDA JIT does
not import the driver that loads its cubins."""

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


def _package(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(mods: dict[str, Path]) -> dict[str, dict[str, bool]]:
    """module -> {humming module it imports: True if at module level (else inside a function, or by name)};
    imports of a module's own ancestor packages are left out (Python initialises those first in any case)."""
    graph: dict[str, dict[str, bool]] = {}
    for name, path in mods.items():
        package = _package(name, path)
        deps: dict[str, bool] = {}

        def add(target: str, top: bool, name=name, deps=deps) -> None:
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                deps[target] = deps.get(target, False) or top

        def visit(node, top: bool, package=package, add=add) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Import):
                    for alias in child.names:
                        add(alias.name, top)
                elif isinstance(child, ast.ImportFrom) and child.module != "__future__":
                    base = _absolute(child, package)
                    for target in [base] + [f"{base}.{a.name}" for a in child.names]:
                        add(target, top)
                for module in _loaded_by_name(child, top, mods):
                    add(module, False)  # runs when first used
                if _is_type_checking(child):
                    continue
                inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                visit(child, top and not inner)

        visit(ast.parse(path.read_text()), True)
        graph[name] = deps
    return graph


def _loaded_by_name(node: ast.AST, top: bool, mods) -> list[str]:
    """The humming modules ``node`` loads by name: the argument of an ``import_module("humming...")`` call,
    and the module names listed in a module-level assignment's value (modules to import on first use)."""
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module":
        args = node.args[:1]
    elif top and isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        args = list(ast.walk(node.value))
    else:
        return []
    return [a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value in mods]


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module an ``ImportFrom`` imports from, relative levels resolved against ``package``."""
    if not node.level:
        return node.module or ""
    up = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(up + ([node.module] if node.module else []))


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


#: The layers above the kernel backends: nothing below imports them.
ENTRY_POINTS = ("humming.linear", "humming.moe", "humming.norm", "humming.ops", "humming.warmup")
MODULES = ("humming.nn", "humming.engines", "humming.loaders")


def test_the_graph_follows_lazy_and_by_name_imports():
    graph = _imports(_modules())
    assert "humming.cuda_kernels.jit" in graph["humming.cuda_kernels._driver"]  # the graph is read
    kernels = graph["humming.dispatch.kernels"]
    assert kernels["humming.cuda_kernels.wna16_decode"] is False and kernels["humming.reference.gemm"] is False
    assert graph["humming.moe.fused"]["humming.triton_kernels.moe_layer"] is False  # importlib.import_module


def test_ir_imports_only_the_ir():
    assert not _wrong(_imports(_modules()), ("humming.ir",), allowed=("humming.ir", CHECK))


def test_device_facts_the_kernel_protocol_and_the_environment_import_nothing_of_humming():
    graph = _imports(_modules())
    bottom = ("humming.device", "humming.kernel", "humming._env", "humming.workspaces", CHECK)
    assert not any(graph[name] for name in bottom)


def test_loaders_import_only_the_ir():
    assert not _wrong(_imports(_modules()), ("humming.loaders",), allowed=("humming.loaders", "humming.ir", CHECK))


def test_the_references_import_only_the_ir():
    """The torch definitions: the IR, the kernel protocol they export their kernels through, and the
    deterministic-mode flag (the reference GEMM's fixed summation order)."""
    allowed = ("humming.reference", "humming.ir", "humming.kernel", "humming.deterministic")
    assert not _wrong(_imports(_modules()), ("humming.reference",), allowed=allowed)


def test_kernels_import_only_downward():
    """The IR, the references, the device facts, the kernel protocol, the environment reader, the shared split-K
    workspaces and the import-time check; the CUDA backend also runs the Triton activation quantizer (the pass
    before its GEMMs), and nothing else of the Triton backend."""
    graph = _imports(_modules())
    below = ("humming.ir", "humming.reference", "humming.device", "humming.kernel", "humming._env", CHECK)
    below += ("humming.workspaces",)
    assert not _wrong(graph, ("humming.triton_kernels",), allowed=("humming.triton_kernels", *below))
    cuda = ("humming.cuda_kernels", "humming.triton_kernels.act_quant", *below)
    assert not _wrong(graph, ("humming.cuda_kernels",), allowed=cuda)


def test_dispatch_imports_no_layer_above_it():
    above = (*ENTRY_POINTS, *MODULES, "humming.bench")
    assert not _wrong(_imports(_modules()), ("humming.dispatch",), forbidden=above)


def test_only_the_command_line_imports_the_benchmarks():
    graph = _imports(_modules())
    importers = {m for m, deps in graph.items() if any(_within(d, "humming.bench") for d in deps)}
    assert {m for m in importers if not _within(m, "humming.bench")} == {"humming.__main__"}


def test_no_module_imports_its_own_face():
    """A module of a package imports its siblings, never the package's ``__init__`` (what the face names
    comes from the siblings, and importing it back is how import loops start): ``from . import sibling`` is
    fine, ``from . import name_the_face_defines`` or ``from humming.moe import fused_moe`` inside
    ``humming.moe`` is not."""
    mods = _modules()
    wrong = []
    for name, path in mods.items():
        if path.name in ("__init__.py", "__main__.py"):  # the face itself; the command line, a user of it
            continue
        package = _package(name, path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                base = _absolute(node, package)
                names = [a.name for a in node.names if f"{base}.{a.name}" not in mods]
                if base == package and names:
                    wrong.append((name, base, names))
            elif isinstance(node, ast.Import):
                wrong += [(name, a.name, []) for a in node.names if a.name == package]
    assert not wrong, wrong


def test_jit_does_not_import_the_driver():
    graph = _imports(_modules())
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
