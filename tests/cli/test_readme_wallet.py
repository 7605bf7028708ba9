"""The payments lines of README.md and docs/owner.md, as typed, against a real `aitbc up` stack:

    aitbc wallet create my-agent-wallet && aitbc wallet fund my-agent-wallet 100
    aitbc wallet send my-agent-wallet provider-1 5  # or an ait1... address

The stack's provider wallets live under each worker's home (HOME/workers/wK), not
HOME/wallets; ``send`` finds a recipient's address through the stack's record."""

from __future__ import annotations

import json

import pytest

from aitbc import stack as stk


@pytest.fixture
def home_stack(aitbc):
    yield aitbc
    if stk.stack_file(aitbc.home).exists():
        stk.down(aitbc.home, grace=5.0)


def _balance(aitbc, name: str, *extra: str) -> str:
    r = aitbc("wallet", "balance", name, "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["balance"]


def test_wallet_send_to_a_provider_of_the_local_stack_by_name(home_stack):
    aitbc, home = home_stack, home_stack.home
    up = aitbc("up", "--workers", "2", "--json", timeout=180)
    assert up.returncode == 0, up.stderr
    stack = json.loads(up.stdout)
    assert stack["dashboard"] == stack["coordinator"] + "/"
    assert stack["metrics"] == stack["coordinator"] + "/metrics"
    providers = {p["wallet"]: p["address"] for p in stack["processes"] if p["role"] == "worker"}
    assert set(providers) == {"provider-1", "provider-2"}
    url = ("--coordinator", stack["coordinator"])

    assert aitbc("wallet", "create", "my-agent-wallet").returncode == 0
    assert aitbc("wallet", "fund", "my-agent-wallet", "100").returncode == 0
    sent = aitbc("wallet", "send", "my-agent-wallet", "provider-1", "5")

    assert sent.returncode == 0, sent.stderr
    assert f"Sent 5 AIT from my-agent-wallet to {providers['provider-1']}" in sent.stdout
    assert _balance(aitbc, "my-agent-wallet") == "95"
    assert _balance(aitbc, "provider-1", "--home", str(home / "workers" / "w1"), *url) == "5"
    # worker-2 (the process's name) names the same provider as provider-2; an address still works
    assert aitbc("wallet", "send", "my-agent-wallet", "worker-2", "1").returncode == 0
    assert aitbc("wallet", "send", "my-agent-wallet", providers["provider-2"], "1.5").returncode == 0
    assert _balance(aitbc, "provider-2", "--home", str(home / "workers" / "w2"), *url) == "2.5"

    # A name that is neither a wallet here nor a provider of the stack: one line, nothing moved.
    bad = aitbc("wallet", "send", "my-agent-wallet", "provider-9", "5")
    assert bad.returncode == 1
    assert bad.stderr.strip() == (
        f"error: no wallet 'provider-9' in {home / 'wallets'}, nor a provider of the local stack "
        "(provider-1, provider-2); give a wallet name or an address (ait1...)"
    )
    assert _balance(aitbc, "my-agent-wallet") == "92.5"
    verify = aitbc("ledger", "verify", "--json")
    assert verify.returncode == 0 and json.loads(verify.stdout)["ok"], verify.stdout

    down = aitbc("down", "--json", timeout=60)
    assert down.returncode == 0
    outcome = json.loads(down.stdout)["stopped"]
    assert set(outcome) == {"coordinator", "worker-1", "worker-2"} and set(outcome.values()) <= {"stopped", "killed"}
