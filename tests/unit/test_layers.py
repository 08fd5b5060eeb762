"""The package's layers: imports flow one way and never in a circle (no Spark needed).

``cli → client / service → engine → consumers / bulk → tables / state / changes /
pipeline → spec / config / expectations → errors``: a module may import modules of
its own layer or of the layers below it, and the two wings of the top (``client``
and ``service``) never import each other. Every import counts, including those
inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "lakeprop"

LAYERS = {
    "errors": 0,
    "identifiers": 1,
    "spec": 1,
    "config": 1,
    "changelog": 1,
    "kafka": 1,
    "notifications": 1,
    "faults": 1,
    "session": 1,
    "stack": 1,
    "storage": 1,
    "tenants": 1,
    "dev": 1,
    "registry": 1,
    "expectations": 1,
    "pipeline": 2,
    "state": 2,
    "changes": 2,
    "tables": 2,
    "membership": 2,
    "consumers": 3,
    "bulk": 3,
    "engine": 4,
    "service": 5,
    "client": 5,
    "cli": 6,
}
SIBLINGS = [("client", "service")]
"""Wings of one layer that stay apart."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every lakeprop module ``path`` imports (a package import counts as its __init__)."""
    found: set[str] = set()
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("lakeprop"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            if not base.startswith("lakeprop"):
                continue
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in MODULES else base)
    return {m for m in found if m in MODULES and m != here}


MODULES = {module_name(p) for p in PACKAGE.rglob("*.py")}
GRAPH = {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def layer(module: str) -> int | None:
    parts = module.split(".")
    return None if len(parts) < 2 else LAYERS[parts[1]]


def test_every_module_has_a_layer() -> None:
    assert {m.split(".")[1] for m in MODULES if "." in m} <= set(LAYERS)


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [
        f"{module} ({layer(module)}) imports {target} ({layer(target)})"
        for module, targets in GRAPH.items()
        for target in targets
        if layer(module) is not None and layer(target) is not None and layer(target) > layer(module)  # type: ignore[operator]
    ]
    assert upward == []


def test_siblings_do_not_import_each_other() -> None:
    def wing(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else None

    crossing = [
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        for target in targets
        for a, b in SIBLINGS
        if {wing(module), wing(target)} == {a, b}
    ]
    assert crossing == []


def test_there_is_no_import_circle() -> None:
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(GRAPH.get(module, ())):
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], module, target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state and module != "lakeprop":
            visit(module, [module])
    assert circles == []
