"""The users' documentation's three SDK examples, run as written: each file in
``data/documented/`` is the documentation's text, verbatim, and each test applies only the
edits docs/sdk-guide.md allows (network ``local``, a real dataset folder, bounded loops and
shorter sleeps, ``AsyncAgent`` where the documentation awaits, example 2's two undefined
helpers) and checks that the text it runs differs from the documented one by exactly
those. They run as real processes against a real stack: ``aitbc up`` on loopback plus
ten more workers offering GPUs the documentation asks for (``min_gpu="RTX3090"``,
``required_workers=10``), and a real folder of text files."""

from __future__ import annotations

import ast
import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from aitbc_agent_sdk import Agent, AgentConfig

pytestmark = pytest.mark.long

DOCS = Path(__file__).parent / "data" / "documented"
ROOT = Path(__file__).resolve().parents[2]
AITBC = Path(sys.executable).parent / "aitbc"
LEASE = 5.0  # seconds of silence before a worker counts as gone (ping_worker's default)
SLEEP = 1  # the examples' 30 s and 60 s sleeps, shortened (edit 3)
EXTRA = [("RTX4090", "1.10")] * 5 + [("RTX3090", "0.90")] * 5  # ten workers the documentation's min_gpu accepts

# --- the allowed edits, applied to the documented text ---------------------------------------------

HELPERS = '''
    async def reassign_failed_jobs(self, failed):
        """Give each failed worker's job to a replacement of its GPU class."""
        for worker_id in failed:
            job = await self.agent.get_worker_job(worker_id)
            replacement = await self.agent.find_replacement_worker(gpu_type=job['gpu_type'])
            if replacement:
                await self.agent.reassign_job(job_id=job['job_id'], new_worker_id=replacement['worker_id'])

    async def refund_payments(self):
        """Return the run's unspent escrow to the owner."""
        await self.agent.refund_payments(self.training_id)
'''


def documented(name: str) -> str:
    return (DOCS / name).read_text()


def edit(name: str, *, dataset: Path | None = None, iterations: int = 0) -> str:
    """The documented example ``name`` with the guide's edits: 1 (network), 2 (dataset),
    3 (loops bounded to ``iterations``, sleeps shortened), 4 (``AsyncAgent``), 5
    (example 2's helpers)."""
    text = documented(name)
    text = text.replace('blockchain_network="mainnet"', 'blockchain_network="local"')  # 1
    if dataset is not None:
        text = text.replace('"/path/to/dataset"', json.dumps(str(dataset)))  # 2
    text = text.replace("while True:", f"for _ in range({iterations}):")  # 3
    text = re.sub(r"await asyncio\.sleep\(\d+\)", f"await asyncio.sleep({SLEEP})", text)  # 3
    if name != "example1_initialize.py":
        text = re.sub(r"\bAgent\b", "AsyncAgent", text)  # 4
    if name == "example2_coordinator.py":
        text = text.replace("\nasync def main():", HELPERS + "\nasync def main():", 1)  # 5
    return text


_LINE_EDITS = [
    (r'blockchain_network="local"', 'blockchain_network="mainnet"'),
    (r"for _ in range\(\d+\):", "while True:"),
    (r"\bAsyncAgent\b", "Agent"),
]


def check_only_allowed_edits(name: str, edited: str, dataset: Path | None) -> None:
    """``edited`` differs from the documented text only by the guide's edits: every
    changed line undoes to its original through them, and the only added lines are
    example 2's two helper methods, at the end of its class."""
    original = documented(name).splitlines()
    lines = edited.splitlines()
    added: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=original, b=lines, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        assert op in ("replace", "insert"), f"{name}: lines {i1 + 1}-{i2} deleted"
        if op == "insert" or (i2 - i1) != (j2 - j1):
            assert name == "example2_coordinator.py" and op == "insert", f"{name}: lines added at {i1 + 1}"
            assert original[i1] == "async def main():", f"{name}: lines added inside the code at {i1 + 1}"
            added += lines[j1:j2]
            continue
        for o, e in zip(original[i1:i2], lines[j1:j2]):
            undone = e
            for pattern, back in _LINE_EDITS:
                undone = re.sub(pattern, back, undone)
            if dataset is not None:
                undone = undone.replace(json.dumps(str(dataset)), '"/path/to/dataset"')
            slept = re.search(r"await asyncio\.sleep\(\d+\)", o)
            if slept:
                undone = undone.replace(f"await asyncio.sleep({SLEEP})", slept[0])
            assert undone == o, f"{name}: {o!r} became {e!r}, which no allowed edit makes"
    if added:
        tree = ast.parse(textwrap.dedent("\n".join(added)))
        names = [n.name for n in tree.body if isinstance(n, ast.AsyncFunctionDef)]
        assert names == ["reassign_failed_jobs", "refund_payments"] and len(tree.body) == 2, names


SHARED = Path("/work/shared/reference/sdk-examples")  # where the documentation's texts came from


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared reference copy is not on this machine")
def test_the_copies_are_verbatim():
    for name in ("README.md", "example1_initialize.py", "example2_coordinator.py", "example3_fault_tolerant.py"):
        assert (DOCS / name).read_bytes() == (SHARED / name).read_bytes(), name


def test_the_edits_are_only_the_allowed_ones(tmp_path):
    """The checker refuses anything else: a renamed method, a changed key, a removed line."""
    data = tmp_path / "dataset"
    for name, n in (("example1_initialize.py", 0), ("example2_coordinator.py", 5), ("example3_fault_tolerant.py", 5)):
        text = edit(name, dataset=data, iterations=n)
        check_only_allowed_edits(name, text, data)
        assert text != documented(name)
        for bad in (
            text.replace("get_training_status", "get_status"),
            text.replace("['training_id']", "['id']"),
            text.replace("pin=True", "pin=False"),
            "\n".join(line for line in text.splitlines() if "print(" not in line),
        ):
            if bad != text:
                with pytest.raises(AssertionError):
                    check_only_allowed_edits(name, bad, data)
    with pytest.raises(AssertionError):  # helpers are allowed in example 2 only
        check_only_allowed_edits("example3_fault_tolerant.py", edit("example3_fault_tolerant.py") + HELPERS, None)


# --- the stack: aitbc up plus ten workers of the documentation's GPU classes -----------------------


def _start_extra(home: Path, url: str, env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen]]:
    from aitbc.ledger.wallet import ensure_wallet

    for k, (gpu, price) in enumerate(EXTRA, 1):
        whome = home / "extra" / f"x{k}"
        wallet = ensure_wallet(whome, f"extra-{k}")
        log = (home / f"extra-{k}.log").open("wb")
        args = ["worker", "start", "--coordinator", url, "--home", str(whome), "--wallet", wallet.name]
        args += ["--gpu", gpu, "--price", price, "--availability", "0.98", "--heartbeat", "1", "--max-bond", "100"]
        yield wallet.address, subprocess.Popen([str(AITBC), *args], stdout=log, stderr=subprocess.STDOUT, env=env)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, start_stack):
    """``(home, env, stack.json, {worker address: pid})``: the coordinator, 2 stack
    workers and the 10 extra ones, all live in the market."""
    home = tmp_path_factory.mktemp("documented") / "home"
    with start_stack(home, workers=2, lease=LEASE) as (home, env, st):
        extra = dict(_start_extra(home, st["coordinator"], env))
        try:
            deadline = time.monotonic() + 120
            while True:
                live = {o["worker_id"] for o in httpx.get(f"{st['coordinator']}/v1/market/offers").json()["data"]}
                if set(extra) <= live:
                    break
                assert time.monotonic() < deadline, f"extra workers not live: {set(extra) - live}"
                time.sleep(0.5)
            pids = {p["address"]: p["pid"] for p in st["processes"] if p.get("address")}
            pids.update({a: p.pid for a, p in extra.items()})
            yield home, env, st, pids
        finally:
            for p in extra.values():
                p.kill()
                p.wait(timeout=30)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """A real folder of text files (Python's own json package and a few modules, ~110 KB),
    one of them in a subfolder."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    out = tmp_path_factory.mktemp("data") / "dataset"
    shutil.copytree(lib / "json", out / "json", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("textwrap.py", "string.py", "glob.py", "fnmatch.py"):
        shutil.copy(lib / name, out / name)
    return out


def _agent(home: Path, wallet: str | None) -> Agent:
    return Agent(AgentConfig(name="test", wallet_name=wallet, home=home))


def _run(path: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-u", str(path)], capture_output=True, text=True, env=env, cwd=path.parent, timeout=timeout
    )


def _verify_ledger(env: dict[str, str], home: Path) -> None:
    p = subprocess.run([str(AITBC), "ledger", "verify", "--home", str(home)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr


# --- example 1 ---------------------------------------------------------------------------------


def test_example1_initializes_and_uploads_the_folder(stack, dataset, tmp_path):
    from aitbc.storage.unixfs_add import add_path

    home, env, _, _ = stack
    text = edit("example1_initialize.py", dataset=dataset)
    check_only_allowed_edits("example1_initialize.py", text, dataset)
    script = tmp_path / "example1.py"
    script.write_text(text)
    p = _run(script, env, 300)
    assert p.returncode == 0, p.stdout + p.stderr
    tid = re.search(r"^Distributed training: (training_\S+)$", p.stdout, re.M)[1]
    cid = re.search(r"^Dataset IPFS CID: (\S+)$", p.stdout, re.M)[1]
    assert cid == add_path(dataset).root  # the folder's UnixFS root, as ipfs add -r --cid-version=1
    with _agent(home, None) as reader:
        run = reader.get_training_status(tid)
    # uploaded while the run was initializing: it became the run's dataset, cut per target worker
    assert run["phase"] == "initializing" and run["data_source"] == f"ipfs://{cid}"
    assert run["shards"] == 10 and run["model_type"] == "transformer"


# --- example 2 ---------------------------------------------------------------------------------


def test_example2_trains_completes_and_pays(stack, dataset, tmp_path):
    home, env, _, pids = stack
    with _agent(home, "training-wallet") as owner:  # the documentation's wallet, funded first
        owner.start()
        owner.fund_wallet(1000)
        before = owner.get_ledger_balances()
        me = f"wallet:{owner.address}"
    text = edit("example2_coordinator.py", dataset=dataset, iterations=300)
    check_only_allowed_edits("example2_coordinator.py", text, dataset)
    script = tmp_path / "example2.py"
    script.write_text(text)
    p = _run(script, env, 900)
    out = p.stdout
    assert p.returncode == 0, out + p.stderr
    tid = re.search(r"^Training initialized: (training_\S+)$", out, re.M)[1]
    assert re.search(r"^Dataset CID: b\S+$", out, re.M)
    assert "Discovered 10 workers" in out and "Selected 10 workers" in out
    sent = re.findall(r"^Sent job to worker (\S+): (job_\S+)$", out, re.M)
    assert len(sent) == 10 and len({w for w, _ in sent}) == 10
    model_id = re.search(r"^Aggregated model: (\S+)$", out, re.M)[1]
    paid = re.findall(r"^Paid worker (\S+)$", out, re.M)
    assert sorted(paid) == sorted(w for w, _ in sent)
    assert out.rstrip().endswith("Training complete and payments processed")
    # the progress lines are numbers as documented: % of each job, a loss, an epoch
    losses = [float(x) for x in re.findall(r"^  Loss: (\S+)$", out, re.M)]
    assert losses and all(x == x for x in losses)  # not NaN

    with _agent(home, None) as reader:
        run = reader.get_training_status(tid)
        results = reader.get_results(tid)
        payments = reader.get_payments(tid)
        after = reader.get_ledger_balances()
        rounds = reader.get_round_checkpoints(tid)
    assert run["phase"] == "complete" and run["rounds_completed"] == 1
    # trained: the aggregated model's validation loss is below the initial model's
    assert rounds[1]["checkpoint_cid"] == model_id
    assert results["final_val_loss"] < results["initial_val_loss"], results
    # the result is the aggregated model as uploaded (a safetensors checkpoint) with the owner's metrics
    with _agent(home, None) as reader:
        assert reader.verify_checkpoint(results["model_cid"]), results["model_cid"]
    assert results["metrics"]["workers"] == 10 and results["metrics"]["epochs"] == 10
    assert results["metrics"]["final_loss"] == pytest.approx(rounds[1]["val_loss"])
    # paid: each worker got its contract's price, once, from the run's escrow
    rows = {r["worker_id"]: r for r in payments["data"]}
    assert set(rows) == set(paid)
    for w in paid:
        assert rows[w]["paid_micro"] == rows[w]["price_micro"] > 0, rows[w]
        assert after.get(f"wallet:{w}", 0) - before.get(f"wallet:{w}", 0) == rows[w]["price_micro"]
    # what left the owner's wallet is what was paid plus what the escrow still holds (refund_payments returns it)
    paid_total = sum(rows[w]["paid_micro"] for w in paid)
    assert before[me] - after[me] == paid_total + after[f"escrow:{tid}"]
    _verify_ledger(env, home)


# --- example 3 ---------------------------------------------------------------------------------


def _owned_run(home: Path, wallet: str, timeout: float) -> dict[str, Any]:
    from aitbc.ledger.wallet import ensure_wallet

    address = ensure_wallet(home, wallet).address
    deadline = time.monotonic() + timeout
    with _agent(home, None) as reader:
        while time.monotonic() < deadline:
            runs = reader.list_trainings(owner=address)
            live = [r for r in runs if r["status"] == "training" and (r["round"] or 0) >= 1]
            if live:
                return reader.get_training_status(live[0]["training_id"])
            time.sleep(0.5)
    raise AssertionError(f"no training run of {wallet} within {timeout} s")


def test_example3_replaces_a_killed_worker_beside_a_live_run(stack, tmp_path):
    home, env, _, pids = stack
    # The live run: owned by the documentation's ft-wallet, driven phase by phase by the
    # project's own example of the documented coordinator (examples/phase_driven.py).
    driver = subprocess.Popen(
        [sys.executable, "-u", str(ROOT / "examples" / "phase_driven.py"), "--wallet", "ft-wallet", "--rounds", "200"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT / "examples",
    )
    example = None
    try:
        run = _owned_run(home, "ft-wallet", 180)
        tid = run["training_id"]
        victim = next(w for w in run["workers"] if w["job_status"] == "active")
        text = edit("example3_fault_tolerant.py", iterations=25)
        check_only_allowed_edits("example3_fault_tolerant.py", text, None)
        script = tmp_path / "example3.py"
        script.write_text(text)
        # Example 3 scales the run up (add_worker, once per straggler it sees): a hire mid-run
        # needs its ~200 rounds left in hand beside the escrow (issue 33), and phase_driven
        # escrowed all of ft-wallet's money.
        with _agent(home, "ft-wallet") as owner:
            owner.fund_wallet(20000)
        example = subprocess.Popen(
            [sys.executable, "-u", str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        time.sleep(2)  # it found the run by itself and is watching
        os.kill(pids[victim["worker_id"]], signal.SIGKILL)
        out, _ = example.communicate(timeout=600)
        assert example.returncode == 0, out
        assert f"Worker {victim['worker_id']} unresponsive" in out, out
        by = re.search(r"^Reassigned job to (\S+)$", out, re.M)
        assert by, out
        with _agent(home, None) as reader:
            jobs = reader.get_training_status(tid)["workers"]
            shards = {sh["shard_index"]: sh for sh in reader.get_shards(tid)}
            old = next(j for j in jobs if j["job_id"] == victim["job_id"])
            assert old["job_status"] == "failed" and old["end_reason"] == "marked failed by the owner", (old, out)
            new = [j for j in jobs if j["replaces"] == victim["job_id"]]
            assert len(new) == 1 and new[0]["worker_id"] == by[1] != victim["worker_id"], (new, out)
            trained = [u["shard_index"] for u in reader.get_worker_checkpoints(new[0]["job_id"])]
        # The replacement took the victim's shard. It may have moved since, more than once:
        # example 3 splits a straggler (it keeps the first half), and with example 3's added
        # workers over the target the coordinator moves a worker to the shard of a released
        # one. Its job keeps only its last move; its updates name every shard it trained.
        took = {new[0]["shard_index"], new[0]["moved_from"], shards[new[0]["shard_index"]]["split_from"], *trained}
        assert old["shard_index"] in took, (new, trained, shards, out)
    finally:
        if example is not None and example.poll() is None:
            example.kill()
        driver.send_signal(signal.SIGINT)  # the driver stops its run on the way out
        try:
            driver.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            driver.kill()
    _verify_ledger(env, home)
