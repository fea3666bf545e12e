"""The layers point one way: an ``ast`` walk over every module's imports (at the top and inside
functions) in hgpo, toyenvs, agentenvs, studies and benchmarks.

The layer order, lowest first (a module may import its own layer and the layers below it)::

    core       hgpo.* (batch, keys, estimators, options, groups, returns, the scheme spec)
    toyenvs    toyenvs.*
    agentenvs  agentenvs.* (with the Ray plumbing, agentenvs.ray_cluster)
    train      hgpo.train.*
    integrations hgpo.integrations.* (verl, verl-agent: may use the trainer's parts)
    studies    studies.*
    benchmarks benchmarks.*

It fails on (a) a circle between modules, (b) an import of a private module (a name part that
starts with ``_``) from outside the package that holds it, (c) a library module (hgpo, toyenvs,
agentenvs, hgpo.train, hgpo.integrations) importing ``studies``, (d) an import against the layer order, (e) a core
module importing an optional extra (torch, Ray, vLLM, ...: the core needs numpy, scipy for
graphgpo's shortest paths and rapidfuzz for gigpo_similarity's pre-filter, all core dependencies).

Every import statement counts wherever it sits: at the top, inside a function (it runs later,
but the dependency is the same) or under ``if TYPE_CHECKING:`` (a circle of types is still a
circle of the design). ``from a import b`` depends on the module ``a.b`` when there is one, else
on ``a``.

``python tests/test_layers.py [ROOT]`` prints what it finds in the tree at ROOT (this one by
default) and the number of import statements inside functions.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hgpo", "toyenvs", "agentenvs", "studies", "benchmarks")
LAYERS = ("core", "toyenvs", "agentenvs", "train", "integrations", "studies", "benchmarks")
LIBRARY = ("core", "toyenvs", "agentenvs", "train", "integrations")
OTHER_EXTRAS = {"peft", "verl", "tokenizers"}
"""Top-level modules of optional packages that no extra of ``hgpo.extras.EXTRAS`` lists."""


def extras() -> set[str]:
    """Top-level modules of the optional extras (pyproject.toml's [llm], [gpu], [ray], ...):
    ``hgpo.extras.EXTRAS`` and :data:`OTHER_EXTRAS`. (Imported here, not at the top, so that
    ``python tests/test_layers.py`` can first put this tree ahead of ``tests/``, whose ``hgpo``
    test package would shadow the project's.)"""
    from hgpo.extras import EXTRAS

    return {m for mods in EXTRAS.values() for m in mods} | OTHER_EXTRAS


@dataclass(frozen=True)
class Import:
    """One project module importing another: ``line`` in ``source``, at the top or not."""

    source: str
    target: str
    line: int
    top: bool

    def __str__(self) -> str:
        where = "" if self.top else " (inside a function)"
        return f"{self.source}:{self.line} imports {self.target}{where}"


def layer(module: str) -> str:
    """The layer of a project module (see the module docstring)."""
    top = module.split(".")[0]
    if top == "hgpo":
        sub = module.split(".")[:2]
        if sub == ["hgpo", "train"]:
            return "train"
        return "integrations" if sub == ["hgpo", "integrations"] else "core"
    return top


def modules(root: Path) -> dict[str, Path]:
    """Every module of the project packages under ``root``, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _import_nodes(tree: ast.Module) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement in ``tree`` with whether it runs at import time (the module body,
    with its ``if``/``try``/``with`` blocks) or only when a function is called."""

    def walk(node: ast.AST, top: bool) -> Iterator[tuple[ast.stmt, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, top
            inner = top and not isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            yield from walk(child, inner)

    yield from walk(tree, True)


def imports(root: Path) -> tuple[list[Import], int]:
    """The imports between project modules, and the number of import statements (of anything)
    inside functions."""
    known = modules(root)
    found, inside = [], 0
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, top in _import_nodes(ast.parse(path.read_text(), str(path))):
            inside += not top
            for target in _targets(node, package, known):
                if target != name:
                    found.append(Import(name, target, node.lineno, top))
    return found, inside


def _targets(node: ast.stmt, package: str, known: dict[str, Path]) -> Iterator[str]:
    """The project modules an import statement loads by name (``from a import b`` loads ``a.b``
    when that is a module, else ``a``)."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names if a.name in known)
        return
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    for alias in node.names:
        if f"{base}.{alias.name}" in known:
            yield f"{base}.{alias.name}"
        elif base in known:
            yield base


def core_extras(root: Path) -> list[str]:
    """Imports of an optional extra in a core module (``hgpo`` outside ``hgpo.train``)."""
    found, optional = [], extras()
    for name, path in modules(root).items():
        if layer(name) != "core":
            continue
        for node, _ in _import_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            for mod in names:
                if mod and mod.split(".")[0] in optional:
                    found.append(f"{name}:{node.lineno} imports {mod}")
    return found


def _private(module: str) -> bool:
    return any(p.startswith("_") and not p.startswith("__") for p in module.split("."))


def problems(root: Path) -> dict[str, list[str]]:
    """What breaks the rules in the tree at ``root``, by rule."""
    found, _ = imports(root)
    rules: dict[str, list[str]] = {"circle": [], "private": [], "studies": [], "layer": []}
    rules["extra"] = core_extras(root)
    for imp in found:
        src, dst = layer(imp.source), layer(imp.target)
        if _private(imp.target) and not imp.source.startswith(imp.target.rpartition(".")[0] + "."):
            rules["private"].append(str(imp))
        if src in LIBRARY and dst == "studies":
            rules["studies"].append(str(imp))
        if LAYERS.index(dst) > LAYERS.index(src):
            rules["layer"].append(f"{imp} ({src} must not import {dst})")
    rules["circle"] = [" -> ".join(c) for c in circles(found)]
    return rules


def circles(found: list[Import]) -> list[list[str]]:
    """Every strongly connected group of modules larger than one, each shown as one circle
    through its first module (a group of more modules than that circle says so at its end)."""
    graph: dict[str, set[str]] = {}
    for imp in found:
        graph.setdefault(imp.source, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycle = _cycle(sorted(group), graph)
                if len(cycle) - 1 < len(group):
                    cycle[-1] += (
                        f" (one circle of {len(group)} modules: {', '.join(sorted(group))})"
                    )
                groups.append(cycle)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def _cycle(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One closed path through a strongly connected ``group``, from its first module."""
    members, start = set(group), group[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth-first: the shortest way back to start
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return group


def test_the_walk_sees_top_level_in_function_type_checking_and_relative_imports(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    files = {
        "hgpo/a.py": "def f():\n    from toyenvs import _k\n    import ray\n",
        "toyenvs/_k.py": "from . import b\n",
        "toyenvs/b.py": "import hgpo.a\n",
        "toyenvs/c.py": "from studies import s\n",
        "studies/s.py": "try:\n    import toyenvs.b\nexcept ImportError:\n    pass\n",
        "studies/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from studies.y import Y\n",
        "studies/y.py": "def g():\n    from .x import X\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    found, inside = imports(tmp_path)
    assert sorted(map(str, found)) == [
        "hgpo.a:2 imports toyenvs._k (inside a function)",
        "studies.s:2 imports toyenvs.b",
        "studies.x:3 imports studies.y",
        "studies.y:2 imports studies.x (inside a function)",
        "toyenvs._k:1 imports toyenvs.b",
        "toyenvs.b:1 imports hgpo.a",
        "toyenvs.c:1 imports studies.s",
    ]
    assert inside == 3
    rules = problems(tmp_path)
    assert rules["private"] == ["hgpo.a:2 imports toyenvs._k (inside a function)"]
    assert rules["studies"] == ["toyenvs.c:1 imports studies.s"]
    assert rules["layer"] == [
        "hgpo.a:2 imports toyenvs._k (inside a function) (core must not import toyenvs)",
        "toyenvs.c:1 imports studies.s (toyenvs must not import studies)",
    ]
    assert rules["circle"] == [
        "hgpo.a -> toyenvs._k -> toyenvs.b -> hgpo.a",
        "studies.x -> studies.y -> studies.x",
    ]
    assert rules["extra"] == ["hgpo.a:3 imports ray"]


def test_layer_of_each_package():
    assert [layer(m) for m in ("hgpo", "hgpo.batch", "hgpo.train", "hgpo.train.truth_monitor")] == [
        "core", "core", "train", "train",
    ]  # fmt: skip
    assert [layer(m) for m in ("toyenvs.truth", "agentenvs.alfworld.env", "studies.io")] == [
        "toyenvs", "agentenvs", "studies",
    ]  # fmt: skip


def test_the_project_has_no_circle():
    assert problems(ROOT)["circle"] == []


def test_no_package_imports_a_private_module_of_another():
    assert problems(ROOT)["private"] == []


def test_no_library_module_imports_studies():
    assert problems(ROOT)["studies"] == []


def test_imports_follow_the_layer_order():
    assert problems(ROOT)["layer"] == []


def test_the_core_imports_no_optional_extra():
    assert problems(ROOT)["extra"] == []


def test_no_study_imports_a_main_module():
    """The studies run the trainer through its public entry point (``hgpo.train.main``), never
    through the script module ``hgpo.train.__main__`` (issue 38)."""
    found = [str(i) for i in imports(ROOT)[0]
             if layer(i.source) == "studies" and i.target.endswith(".__main__")]  # fmt: skip
    assert found == []


if __name__ == "__main__":
    sys.path[0] = str(ROOT)  # this tree's hgpo, not the tests/hgpo test package
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for rule, lines in problems(where).items():
        print(f"{rule}: {len(lines)}")
        for line in lines:
            print("   ", line)
    print("import statements inside functions:", imports(where)[1])
