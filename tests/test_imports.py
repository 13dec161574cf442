"""The package's import graph: no cycle, and no import from a lower layer to a higher one.

Every import counts, at module level or inside a function: a function-local import still ties two modules
together, and hiding a cycle in one is what this test exists to catch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mtl_bench

PACKAGE = Path(mtl_bench.__file__).resolve().parent

# Lowest first. A module may import its own layer's modules (without a cycle) and those of the layers below.
LAYERS = (
    (
        "base",
        (
            "errors",
            "settings",
            "files",
            "records",
            "tags",
            "catalog",
            "config",
            "console",
            "hydra_errors",
            "optional",
            "cpp_kernels",
            "devices",
        ),
    ),
    ("rooms", ("tasks", "models", "gradient_engine", "balancers", "optim", "loggers", "analysis", "figures", "report")),
    ("engine", ("engine",)),
    ("app", ("train", "cli", "__main__", "prepare", "study", "api")),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports when it runs (a `from package import x` where x is a submodule
    counts as x; imports for annotations only, under `if TYPE_CHECKING:`, do not)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    typing_only = {  # `if TYPE_CHECKING:` blocks: annotations' imports, never run
        id(inner)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for statement in block.body
        for inner in ast.walk(statement)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m in known and m != name}


def layer_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for index, (_, members) in enumerate(LAYERS):
        if top in members:
            return index
    raise AssertionError(f"{module} is in no layer of tests/test_imports.py: add it")


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    edges = {name: imports_of(name, path, known) for name, path in found.items()}
    # A package's __init__ re-exports its submodules: the edge from a package to its own submodules is not a tie
    # back from them.
    return {name: {m for m in deps if not m.startswith(name + ".")} for name, deps in edges.items()}


def test_every_module_is_in_a_layer():
    for name in modules():
        if name != "mtl_bench":
            layer_of(name)


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    upward = [
        f"{name} ({LAYERS[layer_of(name)][0]}) imports {dep} ({LAYERS[layer_of(dep)][0]})"
        for name, deps in graph().items()
        if name != "mtl_bench"
        for dep in deps
        if dep != "mtl_bench" and layer_of(dep) > layer_of(name)
    ]
    assert not upward, "\n".join(upward)


def test_statistics_never_import_the_report():
    """report/ renders: the engine and analysis/ (the statistics, the run record's readers) import nothing from it."""
    found = [
        f"{name} imports {dep}"
        for name, deps in graph().items()
        if name.startswith(("mtl_bench.engine", "mtl_bench.analysis"))
        for dep in deps
        if dep.startswith("mtl_bench.report")
    ]
    assert not found, "\n".join(found)


def test_the_import_graph_has_no_cycle():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            raise AssertionError("import cycle: " + " -> ".join(cycle))


def test_the_checker_finds_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The checks above can fail: on a tiny package with a cycle and an upward import they do."""
    root = tmp_path / "mtl_bench"
    (root / "engine").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "engine" / "__init__.py").write_text("")
    (root / "errors.py").write_text("def f():\n    from mtl_bench.engine import loop\n")
    (root / "engine" / "loop.py").write_text("from mtl_bench import errors\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", root)
    assert "mtl_bench.engine.loop" in graph()["mtl_bench.errors"]
    try:
        test_the_import_graph_has_no_cycle()
    except AssertionError as err:
        assert "mtl_bench.engine.loop -> mtl_bench.errors -> mtl_bench.engine.loop" in str(err)
    else:
        raise AssertionError("the cycle was not found")
    try:
        test_no_import_runs_from_a_lower_layer_to_a_higher_one()
    except AssertionError as err:
        assert "mtl_bench.errors (base) imports mtl_bench.engine.loop (engine)" in str(err)
    else:
        raise AssertionError("the upward import was not found")
