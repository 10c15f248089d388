"""The README is a front door: its docs index points at pages that exist, and every command in
its commands table has a docs page that shows that command (issue 31). The README stays short."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"README has no section {title!r}"
    return match.group(1)


def command_rows() -> list[tuple[str, str]]:
    """(subcommand, linked page) for each row of the README's commands table."""
    rows = []
    for line in section("Commands").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        found = re.match(r"`strict-gate ([a-z-]+)", cells[0]) if line.startswith("|") else None
        if found:
            (page,) = LINK.findall(cells[-1])
            rows.append((found.group(1), page))
    return rows


def test_every_link_in_the_docs_index_resolves():
    links = LINK.findall(section("Docs"))
    assert len(links) >= 20
    missing = [link for link in links if not (REPO / link).is_file()]
    assert not missing, f"the README's docs index links to files that do not exist: {missing}"


def test_every_docs_page_is_in_the_index():
    linked = {Path(link).name for link in LINK.findall(section("Docs"))}
    unlisted = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name not in linked)
    assert not unlisted, f"docs pages missing from the README's index: {unlisted}"


def test_every_command_has_a_docs_page_that_shows_it():
    rows = command_rows()
    commands = {name for name, _ in rows}
    expected = {"gate", "bench", "invariance", "noise", "golden", "run", "check-engine", "capture", "compare",
                "diagnose", "show", "prompts", "nightly", "diff", "battery", "bisect", "localize", "model", "merge"}
    assert commands == expected, f"the commands table lists {sorted(commands)}"
    for name, page in rows:
        path = README.parent / page
        assert path.is_file(), f"{name}: {page} does not exist"
        assert f"strict-gate {name}" in path.read_text(encoding="utf-8"), f"{page} never shows strict-gate {name}"


def test_the_commands_table_lists_every_cli_command():
    import typer.main

    from strict_gate.cli import app

    registered = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert registered == {name for name, _ in command_rows()}


def test_every_new_page_starts_with_its_command():
    for name in ("install", "gating-an-engine", "resume", "reading-a-report", "speed", "invariance",
                 "configuring-engines", "checking-an-engine", "baselines", "engines-cpp"):
        lines = (REPO / "docs" / f"{name}.md").read_text(encoding="utf-8").splitlines()
        assert lines[0].startswith("# ") and lines[2] == "```bash", f"docs/{name}.md opens with its command"
        assert "strict-gate" in lines[3] or "scripts/" in lines[3]


def test_the_readme_is_a_front_door():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


@pytest.mark.parametrize("command, table", [("noise", "[reference]"), ("bench", "[speed]"),
                                            ("invariance", "[invariance]"), ("capture", "[reference]")])
def test_help_names_the_toml_tables_it_reads(command, table):
    """A help text naming a TOML table shows it: as rich markup, `[reference]` vanished ("its  is profiled")."""
    from typer.testing import CliRunner

    from strict_gate.cli import app

    r = CliRunner().invoke(app, [command, "--help"], terminal_width=200)
    assert r.exit_code == 0 and table in r.output, r.output
