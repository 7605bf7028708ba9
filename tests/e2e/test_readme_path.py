"""README.md's "Putting aitbc on your PATH", typed into bash from the repository's root:
without the venv on PATH there is no ``aitbc``; each of the README's two ways puts the
venv's there, and ``aitbc --help`` runs."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
VENV_BIN = ROOT / ".venv" / "bin"


def readme_lines(heading: str) -> list[str]:
    """The command lines of the first fenced block under ``heading``, as bash reads them
    (a backslash continuation joined into its line)."""
    text = README.read_text(encoding="utf-8")
    block = text[text.index(heading) :].split("```", 2)[1].split("\n", 1)[1]
    return [line for line in re.sub(r"\\\n\s*", " ", block).splitlines() if line.strip()]


def test_the_readme_puts_aitbc_on_the_path():
    """ "Putting aitbc on your PATH": without the venv on PATH there is no ``aitbc``; each of
    the README's two ways puts it there (run from the repository's root, as it says)."""
    if not (VENV_BIN / "aitbc").exists():
        pytest.skip(f"no {VENV_BIN / 'aitbc'}: the README's PATH lines name the venv the Makefile makes")
    bare = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PATH")} | {"PATH": os.defpath}
    r = subprocess.run(["bash", "-c", "command -v aitbc"], env=bare, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0, r.stdout
    lines = readme_lines("## Putting `aitbc` on your PATH")
    assert lines[-1] == "aitbc --help" and len(lines) == 3, lines
    for way in lines[:2]:  # each finds the venv's aitbc; one runs it, as the README's third line
        r = subprocess.run(
            ["bash", "-c", f"{way}\ncommand -v aitbc"], env=bare, cwd=ROOT, capture_output=True, text=True
        )
        assert r.returncode == 0 and Path(r.stdout.strip()).resolve() == (VENV_BIN / "aitbc").resolve(), (way, r)
    r = subprocess.run(["bash", "-c", f"{lines[0]}\n{lines[-1]}"], env=bare, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and "distributed-training" in r.stdout, r.stderr
