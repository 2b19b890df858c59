"""The folders show the architecture: every import of a shardfs module runs down the floors
(docs/design.md, "Layers"), never up and never sideways into another floor's package."""

from __future__ import annotations

import ast
from pathlib import Path

import shardfs

PACKAGE = Path(shardfs.__file__).parent

#: Each floor, from the ground up. A module may import its own floor and those below it.
FLOORS: list[tuple[str, ...]] = [
    ("primitives",),
    ("formats",),
    ("storage",),
    ("view",),
    ("writeback", "maintenance"),
    ("checksum",),
    ("fuse",),
    ("options",),
    ("sources",),
    ("cli",),
    ("__main__",),
]
RANK = {name: rank for rank, names in enumerate(FLOORS) for name in names}


def _floor(module: str) -> str:
    """`shardfs.view.base` -> "view"; `shardfs.sources` -> "sources"."""
    return module.split(".")[1]


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every shardfs import in `path`, type-checking ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "shardfs":  # modules of the package, not its attributes
                names = [f"shardfs.{a.name}" for a in node.names if a.name in RANK]
            found += [(node.lineno, name) for name in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name) for line, name in found if name.startswith("shardfs.")]


def test_every_module_has_a_floor() -> None:
    floors = {
        p.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for p in PACKAGE.rglob("*.py")
        if p.relative_to(PACKAGE).parts != ("__init__.py",)
    }
    assert floors <= set(RANK), f"modules outside every floor: {floors - set(RANK)}"


def test_imports_run_down() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts == ("__init__.py",):
            continue
        here = relative.parts[0].removesuffix(".py")
        for line, name in _imports(path):
            there = _floor(name)
            if there != here and RANK[there] >= RANK[here]:
                upward.append(f"{relative}:{line} ({here}) imports {name} ({there})")
    assert not upward, "imports that do not run down:\n" + "\n".join(upward)


def _module(path: Path) -> str:
    """`.../shardfs/view/base.py` -> "shardfs.view.base" (a package: its `__init__`'s name)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_circle_of_imports_inside_a_floor() -> None:
    """No module reaches itself through imports, type-checking ones included: a circle makes
    the order of imports matter and hides which module is the lower one. (`from package
    import module` imports that module, not the package.)"""
    paths = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                submodules = {f"{node.module}.{a.name}" for a in node.names} & paths.keys()
                named = {a.name for a in node.names if f"{node.module}.{a.name}" in submodules}
                edges |= submodules
                if len(named) < len(node.names):  # something of the module itself
                    edges.add(node.module)
            elif isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names}
        graph[name] = {e for e in edges if e in paths and e != name}
    circles = []
    for start in sorted(graph):
        # a path back to `start` through modules after it in order (each circle once)
        stack, seen = [(start, [start])], {start}
        while stack:
            here, trail = stack.pop()
            for there in sorted(graph[here]):
                if there == start:
                    circles.append(" -> ".join([*trail, start]))
                elif there > start and there not in seen:
                    seen.add(there)
                    stack.append((there, [*trail, there]))
    assert not circles, "circles of imports:\n" + "\n".join(circles)
