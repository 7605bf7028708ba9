"""What every ``aitbc`` command pays before it runs: the command line's modules, and not the
SDK's clients or torch, which only the commands that use them import (inside the command).
``aitbc down`` is one of those every-command costs: on a loaded 2-core machine an import
of the SDK package added about a second to it (stopping the stack itself takes a fraction
of one)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("aitbc_agent_sdk", "torch", "numpy", "fastapi", "sqlalchemy")

PROBE = f"""
import sys
import aitbc.cli.main
print(" ".join(sorted(m for m in {HEAVY!r} if m in sys.modules)))
"""


def test_the_command_line_imports_nothing_heavy_before_a_command_runs():
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [], f"imported by aitbc.cli.main at start: {r.stdout.strip()}"
