"""No two source files share a name (issue 28): a file's name says which one it is.

The source tree is hgpo, toyenvs, agentenvs, studies and benchmarks. A private file counts as
its name without the leading ``_`` (``toyenvs/_rollout.py`` would clash with
``toyenvs/rollout.py``); ``__init__.py`` and ``__main__.py`` are exempt. Files of the same role
in parallel packages may share a name when each one's docstring names the others (by path,
``agentenvs/webshop/env.py``, or module, ``agentenvs.webshop.env``); they are listed in
:data:`PARALLEL`.

``python tests/test_file_names.py [ROOT]`` prints every shared name in the tree at ROOT.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hgpo", "toyenvs", "agentenvs", "studies", "benchmarks")
EXEMPT = ("__init__.py", "__main__.py")
PARALLEL = {"env.py": ("agentenvs/alfworld/env.py", "agentenvs/webshop/env.py")}
"""Shared names allowed: the same role in parallel packages (each docstring names the others)."""


def shared_names(root: Path) -> dict[str, list[str]]:
    """Every file name held by more than one source file under ``root`` (``_`` stripped), with
    the files' paths relative to ``root``."""
    by_name: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if path.name not in EXEMPT:
                rel = path.relative_to(root).as_posix()
                by_name.setdefault(path.name.lstrip("_"), []).append(rel)
    return {name: paths for name, paths in sorted(by_name.items()) if len(paths) > 1}


def test_the_check_sees_private_and_nested_files(tmp_path):
    for rel in ("hgpo/rollout.py", "toyenvs/_rollout.py", "hgpo/train/__init__.py",
                "toyenvs/__init__.py", "studies/a/b.py", "benchmarks/b.py", "studies/c.py"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert shared_names(tmp_path) == {
        "b.py": ["studies/a/b.py", "benchmarks/b.py"],
        "rollout.py": ["hgpo/rollout.py", "toyenvs/_rollout.py"],
    }


def test_no_two_source_files_share_a_name():
    shared = {k: v for k, v in shared_names(ROOT).items() if tuple(v) != PARALLEL.get(k)}
    assert shared == {}


def test_files_sharing_a_name_say_they_play_the_same_role():
    for paths in PARALLEL.values():
        for path in paths:
            doc = ast.get_docstring(ast.parse((ROOT / path).read_text())) or ""
            for other in paths:
                dotted = other.removesuffix(".py").replace("/", ".")
                if other != path:
                    assert other in doc or dotted in doc, (path, other)


if __name__ == "__main__":
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for name, paths in shared_names(where).items():
        print(f"{name}: {' '.join(paths)}")
