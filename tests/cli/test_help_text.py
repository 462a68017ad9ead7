"""`--help` reads well in an 80-column terminal: a command's description is reflowed into the width,
not broken again at the docstring's own ~100-column line ends (which left lines like
"WAL: inserts, updates," alone on a row)."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from mooncake_assets import cli


def _command_paths() -> list[list[str]]:
    group = typer.main.get_command(cli.app)
    paths: list[list[str]] = [[]]
    for name, cmd in getattr(group, "commands", {}).items():
        paths.append([name])
        for sub in getattr(cmd, "commands", {}):
            paths.append([name, sub])
    return paths


def _description_paragraphs(text: str) -> list[list[str]]:
    """The rendered lines between the Usage line and the first box, grouped into paragraphs."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    paras: list[list[str]] = [[]]
    for line in lines[start:]:
        if line.lstrip().startswith(("╭", "┌")):
            break
        if line.strip():
            paras[-1].append(line.rstrip())
        elif paras[-1]:
            paras.append([])
    return [p for p in paras if p]


@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p) or "mooncake")
def test_help_paragraphs_fill_an_80_column_terminal(path):
    r = CliRunner().invoke(cli.app, [*path, "--help"], env={"COLUMNS": "80", "TERM": "dumb"}, terminal_width=80)
    assert r.exit_code == 0, r.output
    paras = _description_paragraphs(r.output)
    assert paras, r.output
    for para in paras:
        for line in para[:-1]:  # every line but a paragraph's last is filled to near the width
            assert len(line) >= 55, f"ragged help line in `mooncake {' '.join(path)} --help`: {line!r}\n{r.output}"


def test_reflow_keeps_paragraphs_and_words():
    doc = """First line of a
    paragraph.

    Second paragraph, its words
    all kept: <state>/x `code`."""
    assert cli._reflowed(doc) == "First line of a paragraph.\n\nSecond paragraph, its words all kept: <state>/x `code`."


@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p) or "mooncake")
def test_help_names_parameters_as_command_line_tools_do(path):
    """No Python type after a flag or an option (Typer 0.29 shows ``--no-wait <bool>``, ``--lsn <str>``,
    ``--help <bool>``): a flag shows nothing, an option's value its NAME (help_format.py)."""
    r = CliRunner().invoke(cli.app, [*path, "--help"], env={"COLUMNS": "200", "TERM": "dumb"}, terminal_width=200)
    assert r.exit_code == 0, r.output
    rows = [line.strip("│ ") for line in r.output.splitlines() if line.lstrip("│ ").startswith("--")]
    assert rows, r.output
    for row in rows:
        words = row.split()
        assert not (len(words) > 1 and words[1].startswith("<")), f"`mooncake {' '.join(path)} --help`: {row!r}"
    help_row = next(row for row in rows if row.startswith("--help"))
    assert help_row.split()[1] == "Show", help_row


def test_plain_metavars():
    r = CliRunner().invoke(cli.app, ["query", "--help"], env={"COLUMNS": "200", "TERM": "dumb"}, terminal_width=200)
    out = r.output
    assert "{SQL}" in out and "--lsn" in out and " LSN " in out and "--format" in out and " FORMAT " in out, out
    assert "SECONDS" in out, out  # what the code spelled out stays
    no_wait = next(line for line in out.splitlines() if "--no-wait" in line)
    assert no_wait.split("--no-wait", 1)[1].split()[0] == "Read", no_wait  # a flag: its help right after it
