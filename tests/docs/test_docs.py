"""The docs stand alone and the README's timings say their machine and load (issue 27, item 17)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import readme_timings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIME = re.compile(r"(?<![\w.])\d+(\.\d+)? ?(s|min|minutes|seconds)\b")


def paragraphs(text: str) -> list[str]:
    """Blank-line separated blocks (a fenced block counts as one)."""
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def table_cells(row: str) -> int:
    """The cells of a markdown table row (a pipe inside a code span or escaped is no border)."""
    row = re.sub(r"`[^`]*`", "x", row.strip()).replace("\\|", "x")
    return row.strip("|").count("|") + 1


def table_rows(text: str) -> list[tuple[int, str, int]]:
    """(line number, row, the cells of its table's header) of every table row outside fences."""
    rows, fenced, header = [], False, None
    for number, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced, header = not fenced, None
        elif not fenced and line.startswith("|"):
            header = header or table_cells(line)
            rows.append((number, line, header))
        else:
            header = None
    return rows


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_table_row_has_its_headers_cells(doc: Path) -> None:
    """Two tables without a blank line between them, or a bare | in a cell, break a table."""
    for number, row, header in table_rows(doc.read_text()):
        assert table_cells(row) == header, (
            f"{doc.name}:{number}: {table_cells(row)} cells under a {header}-cell header: {row[:80]}"
        )


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_point_to_nothing_outside_the_repository(doc: Path) -> None:
    text = doc.read_text()
    for outside in ("shared/docs", "/work/shared", "../shared", "shared/seed"):
        assert outside not in text, f"{doc.name} points outside the repository: {outside}"


def test_every_readme_timing_says_its_load() -> None:
    """A paragraph of the README that gives a time says the load it was measured at."""
    for block in paragraphs((ROOT / "README.md").read_text()):
        if TIME.search(block):
            assert "load" in block, f"a README timing without its load:\n{block[:300]}"


def test_the_timed_commands_are_the_readmes() -> None:
    readme = (ROOT / "README.md").read_text()
    for argv, _ in readme_timings.COMMANDS.values():
        assert f"python -m {' '.join(argv)}" in readme


def test_machine_names_cores() -> None:
    assert re.fullmatch(r"\d+ cores \(.+\)", readme_timings.machine())


def _commands(lines: list[str]) -> list[str]:
    """Shell commands of ``lines`` (split at ``&&``), pip's ``-q`` and ``python -m`` dropped."""
    out = []
    for line in lines:
        for cmd in line.split("&&"):
            cmd = cmd.strip().removeprefix("python -m ")
            if cmd.startswith("pip install"):
                cmd = cmd.replace(" -q", "")
            out.append(cmd)
    return out


def test_readme_test_command_is_what_ci_runs() -> None:
    """The README's test command is .ci/run's commands, in order (setup lines aside)."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    body = [s for s in ci if s.strip() and not s.startswith(("#", "set ", "cd ", "export CI="))]
    readme = (ROOT / "README.md").read_text().splitlines()
    line = next(s for s in readme if s.startswith("pip install torch=="))
    assert _commands([line]) == _commands(body)


def _section(text: str, heading: str) -> str:
    """The text of the markdown section ``heading`` (up to the next heading of its level)."""
    start = text.index(heading + "\n")
    level = heading.split(" ")[0]
    rest = text[start + len(heading) + 1 :]
    nxt = re.search(rf"^{level} ", rest, flags=re.M)
    return rest[: nxt.start()] if nxt else rest


def test_the_own_estimator_example_runs_and_prints_what_it_says(capsys) -> None:
    """docs/estimators.md, "Your own estimator": its first python block runs as written, and
    each ``print(...)  # X`` line prints X."""
    from hgpo import ESTIMATORS, unregister_estimator

    section = _section((ROOT / "docs" / "estimators.md").read_text(), "## Your own estimator")
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    wanted = re.findall(r"^print\(.*\)  # (.+)$", code, flags=re.M)
    assert wanted, "the example prints nothing to check"
    try:
        exec(compile(code, "docs/estimators.md", "exec"), {})
        assert capsys.readouterr().out.splitlines() == wanted
    finally:
        for name in ("entropy_scaled",):
            if name in ESTIMATORS:
                unregister_estimator(name)
