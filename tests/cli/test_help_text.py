"""Help as typer's rich formatter shows it: a command's first paragraph is its line in its
group's list, printed with its line breaks kept (a docstring wrapped at 90 columns broke
mid-sentence at 80), so it is one line, and its later paragraphs wrap at the terminal's
width, not where the docstring's lines ended; no reST or Markdown backticks (shown raw); no text
rich would read as markup and drop ('aitbc[tensorboard]' showed as 'aitbc')."""

from __future__ import annotations

import inspect
import itertools
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from rich.text import Text
from tests.conftest import AITBC

from aitbc.cli.main import app

GROUPS = ("distributed-training", "wallet", "ipfs", "market", "coordinator", "worker", "ledger", "chain")


def _commands() -> Iterator[tuple[str, Any]]:
    root = typer.main.get_command(app)
    ctx = root.make_context("aitbc", ["--help"], resilient_parsing=True)
    for name in root.list_commands(ctx):  # the top-level commands: up, down, status, demo, simulate
        command = root.get_command(ctx, name)
        if name not in GROUPS and not hasattr(command, "list_commands"):
            yield name, command
    for group_name in GROUPS:
        group = root.get_command(ctx, group_name)
        yield group_name, group
        sub_ctx = type(ctx)(group, parent=ctx, info_name=group_name)
        for name in group.list_commands(sub_ctx):
            yield f"{group_name} {name}", group.get_command(sub_ctx, name)


def _problems(text: str) -> list[str]:
    found = []
    if "`" in text:
        found.append("backticks (shown raw)")
    if Text.from_markup(text).plain != text.replace("\\[", "["):
        found.append(f"markup rich would drop: {Text.from_markup(text).plain!r}")
    return found


@pytest.mark.parametrize(("path", "command"), list(_commands()), ids=lambda v: v if isinstance(v, str) else "")
def test_help_renders_as_written(path, command):
    help_text = inspect.cleandoc(command.help or "")
    first = help_text.split("\n\n")[0]
    problems = [f"first paragraph broken over lines: {first!r}"] if "\n" in first else []
    problems += _problems(help_text)
    for param in command.params:
        problems += [f"{param.name}: {p}" for p in _problems(getattr(param, "help", None) or "")]
    assert not problems, (path, problems)


def test_the_workflow_help_at_80_columns():
    env = dict(os.environ, COLUMNS="80")
    listing = subprocess.run([str(AITBC), "distributed-training", "--help"], capture_output=True, text=True, env=env)
    assert listing.returncode == 0 and "``" not in listing.stdout
    rows = [line.split("│")[1] for line in listing.stdout.splitlines() if line.startswith("│")]
    at = next(i for i, row in enumerate(rows) if row.split()[:1] == ["monitor"])
    wrapped = itertools.takewhile(lambda row: not row[:18].strip(), rows[at + 1 :])  # its lines after the first
    entry = [rows[at].split(None, 1)[1], *wrapped]
    assert " ".join(" ".join(entry).split()) == (
        "Watch a run until it completes, fails (exit 1) or is stopped by its owner (exit 0)."
    )
    one = subprocess.run(
        [str(AITBC), "distributed-training", "monitor", "--help"], capture_output=True, text=True, env=env
    )
    flat = " ".join(one.stdout.replace("│", " ").split())
    assert "pip install 'aitbc[tensorboard]'" in flat and "``" not in one.stdout


def _described(path: str, command: Any) -> bool:
    return "\n\n" in inspect.cleandoc(command.help or "").partition("\f")[0]


@pytest.mark.parametrize(
    ("path", "command"),
    [c for c in _commands() if _described(*c)],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_commands_details_wrap_at_the_terminals_width(path, command):
    """Every paragraph of a command's --help is wrapped at 80 columns where the next word no
    longer fits, never where the docstring's line ended (at 90 columns it broke mid-sentence:
    'metrics to the' / 'tracker until the run ends')."""
    from typer.testing import CliRunner

    shown = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert shown.exit_code == 0, shown.output
    body = shown.output.split("Usage:", 1)[1].split("╭", 1)[0].splitlines()[1:]
    paragraphs = [[]]
    for line in body:
        if line.strip():
            paragraphs[-1].append(line.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    early = [
        (line, after)
        for lines in paragraphs
        for line, after in itertools.pairwise(lines)
        if len(line) + 1 + len(after.split()[0]) <= 78  # 80 less rich's padding
    ]
    assert not early, early
