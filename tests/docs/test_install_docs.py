"""The install commands agree (README, docs/train.md, .ci/run) and docs/train.md lists every
built-in estimator (issue 38, items 18 and 19)."""

from __future__ import annotations

import re
from pathlib import Path

import hgpo
from hgpo.estimator_registry import get_spec

ROOT = Path(__file__).resolve().parents[2]


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text().splitlines()
    return next(s for s in readme if s.startswith("pip install torch=="))


def test_readme_test_command_takes_torch_from_the_index_its_install_section_names() -> None:
    """The README's test command installs torch as its "Install extras" section advises (the
    CPU wheel index), and the rest with the constraints file."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Install extras\n") :]
    advised = re.search(r"^\s*(pip install torch==\S+ --index-url \S+)$", section, flags=re.M)
    assert advised, "the Install extras section gives no torch command with an index URL"
    first, rest = _readme_test_command().split(" && ", 1)
    assert first == advised.group(1)
    assert rest.startswith("pip install -c constraints.txt -e ")


def test_constraints_are_exact_pins_of_distinct_packages() -> None:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pins = [s.split("#")[0].strip() for s in lines if s.split("#")[0].strip()]
    assert pins, "constraints.txt pins nothing"
    names = []
    for pin in pins:
        assert re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][0-9A-Za-z.+!-]*", pin), f"not a pin: {pin}"
        names.append(re.sub(r"[-_.]+", "-", pin.split("==")[0]).lower())
    assert len(names) == len(set(names)), f"a package pinned twice: {names}"


def test_train_md_test_install_line_is_the_readmes() -> None:
    train = (ROOT / "docs" / "train.md").read_text().splitlines()
    row = next(s for s in train if s.startswith("| the tests"))
    cmd = re.search(r"\| `(.+)` \|$", row)
    assert cmd, f"docs/train.md's test row has no command: {row}"
    assert cmd.group(1) == _readme_test_command()


def test_train_md_lists_every_built_in_estimator() -> None:
    """docs/train.md's list of the known estimators (the unknown-name error) names every
    built-in one, in the registry's order."""
    train = (ROOT / "docs" / "train.md").read_text()
    listed = re.search(r"known\s+estimators: (.+?) \(see\s+--help\)", train, flags=re.S)
    assert listed, "docs/train.md has no 'known estimators: ...' list"
    names = [n.strip() for n in listed.group(1).split(",")]
    builtins = [n for n in hgpo.ESTIMATORS if get_spec(n).builtin]
    assert names == builtins
