"""README.md followed as a new user types it, on a fresh HOME with ``.venv/bin`` on PATH: the
ten commands of "Train a small Llama" run as written (each line in
bash, ``<id>`` the id ``init`` printed) and each exits 0; after ``aitbc down`` and ``aitbc up``
the wallet line runs again and funds, a second run goes through the same commands, and
``results``, ``payments`` and ``report`` answer for both runs, though the stack came back on
another port (the first run's coordinator is found through the stack file)."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import pytest
from tests.e2e.test_readme_path import VENV_BIN, readme_lines

# What the test changes in the README's commands, visibly and only this: ten rounds of twenty
# local steps of the README's Llama take a quarter of an hour of a 2-core machine; two rounds
# of five steps run the same commands on the same model, data and stack.
FEWER = {"--rounds": "2", "--local-steps": "5"}


def fewer(line: str) -> str:
    for flag, value in FEWER.items():
        line = re.sub(rf"{flag} \S+", f"{flag} {value}", line)
    return line


@dataclass
class User:
    """A shell of a new user: HOME a fresh folder, no AITBC_* variables, the repository's
    ``.venv/bin`` first on PATH (the README's ``export PATH=...``), working in ``cwd``."""

    home: Path
    cwd: Path
    env: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AITBC_")}
        self.env |= {"HOME": str(self.home), "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}

    @property
    def aitbc_home(self) -> Path:
        return self.home / ".aitbc"

    def sh(self, line: str, timeout: float = 2400) -> subprocess.CompletedProcess:
        """``line`` run by bash as typed; it must exit 0."""
        r = subprocess.run(
            ["bash", "-c", line], capture_output=True, text=True, env=self.env, cwd=self.cwd, timeout=timeout
        )
        assert r.returncode == 0, (line, r.returncode, r.stdout[-3000:], r.stderr[-3000:], self.logs())
        return r

    def json(self, *args: str) -> dict:
        return json.loads(self.sh(shlex.join(["aitbc", *args, "--json"])).stdout)

    def logs(self) -> str:
        logs = self.aitbc_home / "logs"
        return (
            "".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(logs.glob("*.log")))
            if logs.exists()
            else ""
        )

    def stack(self) -> dict:
        return json.loads((self.aitbc_home / "stack.json").read_text())


@pytest.fixture
def user(tmp_path):
    if not (VENV_BIN / "aitbc").exists():
        pytest.skip(f"no {VENV_BIN / 'aitbc'}: the README's PATH lines name the venv the Makefile makes")
    u = User(tmp_path / "home", tmp_path / "work")
    yield u
    if (u.aitbc_home / "stack.json").exists():  # a failed test's stack
        subprocess.run(["aitbc", "down"], env=u.env, capture_output=True, timeout=120)


def the_ten_commands(user: User) -> str:
    """Run the README's workflow once as written (with FEWER rounds and steps); its run's id."""
    lines = readme_lines("## Train a small Llama in ten commands")
    assert lines[0].startswith("aitbc up ") and lines[-1] == "aitbc down"
    run_id = ""
    for line in lines:
        typed = fewer(line).replace("<id>", run_id)
        r = user.sh(typed)
        if " init " in line:
            run_id = re.search(r"Training ID: (training_\w+)", r.stdout).group(1)
        if line.startswith("aitbc down"):
            assert "killed" not in r.stdout and "forced" not in r.stdout, r.stdout
    assert run_id
    return run_id


@pytest.mark.long  # two live runs of the README's Llama, a CLI process per command: minutes
def test_the_readme_as_written_twice_across_down_and_up(user):
    first = the_ten_commands(user)
    assert (user.cwd / "my-llama" / "config.json").exists()
    record = user.aitbc_home / "runs" / f"{first}.json"
    old_url = json.loads(record.read_text())["coordinator"]

    # The stack comes back on another port: another program listens on the first run's
    # (SO_REUSEADDR: past the stopped coordinator's connections in TIME_WAIT), and never answers.
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", int(old_url.rsplit(":", 1)[1])))
        taken.listen()
        wallet_line = next(line for line in readme_lines("## Train a small Llama") if "wallet create" in line)
        user.sh(readme_lines("## Train a small Llama")[0])  # aitbc up --workers 3
        new_url = user.stack()["coordinator"]
        assert new_url != old_url
        balance = Decimal(user.json("wallet", "balance", "my-agent-wallet")["balance"])
        user.sh(wallet_line)  # the wallet exists: create shows it, and the funding still happens
        assert Decimal(user.json("wallet", "balance", "my-agent-wallet")["balance"]) == balance + 100

        # init .. download-model on this stack; the model goes to a new folder, as download-model
        # asks (it never writes into a folder that holds something: the first run's model)
        lines = readme_lines("## Train a small Llama")[2:-1]
        second = ""
        for line in lines:
            r = user.sh(fewer(line).replace("<id>", second).replace("-o my-llama", "-o my-llama-2"))
            if " init " in line:
                second = re.search(r"Training ID: (training_\w+)", r.stdout).group(1)
        assert (user.cwd / "my-llama-2" / "config.json").exists()

        for run_id in (first, second):
            res = user.json("distributed-training", "results", "--training-id", run_id)
            assert res["status"] == "complete" and res["rounds_completed"] == 2, res
            # payments waits for the run's settlement; scoring a Llama's rounds behind the second
            # run's training takes many minutes on a loaded 2-core machine
            pay = user.json("distributed-training", "payments", "--training-id", run_id, "--timeout", "1800")
            assert pay["finalized"] and len(pay["data"]) == 3, pay
            assert all(w["paid_micro"] > 0 for w in pay["data"]), pay  # every provider paid
            user.sh(f"aitbc distributed-training report --training-id {run_id} -o report-{run_id}")
            assert (user.cwd / f"report-{run_id}" / "report.html").exists()
        assert json.loads(record.read_text())["coordinator"] == new_url  # found again, and remembered
        down = user.sh("aitbc down")
    assert "killed" not in down.stdout and "forced" not in down.stdout, down.stdout
    assert not (user.aitbc_home / "stack.json").exists()
