"""``aitbc chain run/balance/fund/deposit/withdraw/refund`` against a real anvil, with
nothing but HOME/chain.json and the wallets (no coordinator: the settlement key settles
and finalizes in the test). A whole run's money through the CLI: funded, deposited,
topped up, settled, withdrawn, finalized, refunded; the timeout path, where the owner and
a provider take their money back with the settlement key silent; and every refusal one
line with nothing sent."""

from __future__ import annotations

import json

import pytest
from eth_account import Account
from tests.chain.anvil import running_anvil
from tests.conftest import wait_until

from aitbc.chain.evm.client import EvmClient
from aitbc.chain.evm.contracts import run_key
from aitbc.chain.evm.deploy import read_deployment
from aitbc.chain.evm.escrow import Escrow, Payout
from aitbc.ledger.evm_keys import evm_address, load_evm_account

pytestmark = pytest.mark.chain
RUN = "run-cli"


def _ok(result) -> dict:
    assert result.returncode == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def _refused(result, *parts: str, code: int = 1) -> str:
    """One line on stderr, exit ``code``, naming each of ``parts``."""
    assert result.returncode == code, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    for part in parts:
        assert part in result.stderr, (part, result.stderr)
    return result.stderr


class Setup:
    """A deployment by wallet ``ops`` (minter and settlement key) and wallets funded with
    AIT and gas through ``aitbc chain fund``."""

    def __init__(self, aitbc, node) -> None:
        self.aitbc, self.node = aitbc, node
        for name in ("ops", "owner", "p1", "p2", "other"):
            assert aitbc("wallet", "create", name).returncode == 0
        _ok(aitbc("chain", "deploy", "--rpc", node.url, "--wallet", "ops", "--fund-gas", "--json"))
        self.deployment = read_deployment(aitbc.home)
        self.client = EvmClient(node.url)
        self.escrow = Escrow(self.client, self.deployment)

    def account(self, name: str):
        return Account.from_key(load_evm_account(self.aitbc.home, name).private_key)

    def address(self, name: str) -> str:
        address = evm_address(self.aitbc.home, name)
        assert address is not None
        return address

    def nonces(self, *names: str) -> list[int]:
        return [self.client.pending_nonce(self.address(n)) for n in names]

    def settle(self, key: bytes, rnd: int, payouts: list[Payout]) -> None:
        signed = self.escrow.sign_settlement(self.account("ops"), key, rnd, payouts)
        self.client.broadcast(signed)
        self.client.wait_receipt(signed.tx_hash)

    def finalize(self, key: bytes) -> None:
        signed = self.escrow.sign_finalize(self.account("ops"), key)
        self.client.broadcast(signed)
        self.client.wait_receipt(signed.tx_hash)


@pytest.fixture
def setup(aitbc, tmp_path):
    with running_anvil(tmp_path / "anvil") as node:
        s = Setup(aitbc, node)
        try:
            yield s
        finally:
            s.client.close()


def test_a_run_funded_deposited_settled_withdrawn_and_refunded_through_the_cli(setup):
    s, aitbc = setup, setup.aitbc
    assert s.deployment.minter_wallet == "ops"
    funded = _ok(aitbc("chain", "fund", "owner", "30", "--gas", "--json"))
    assert (funded["to"], funded["amount"], funded["balance"]) == (s.address("owner"), "30", "30")
    for p in ("p1", "p2"):
        _ok(aitbc("chain", "fund", p, "5", "--gas", "--json"))
    shown = _ok(aitbc("chain", "balance", "--wallet", "owner", "--json"))
    assert (shown["balance"], shown["gas_wei"]) == ("30", 100 * 10**18)

    first = _ok(
        aitbc(
            "chain", "deposit", "--training-id", RUN, "--wallet", "owner", "--amount", "20", "--price", "2.5", "--json"
        )
    )
    key = run_key(s.address("owner"), RUN)
    assert (first["action"], first["key"], first["deposited"], first["escrow"]) == (
        "deposited",
        "0x" + key.hex(),
        "20",
        "20",
    )
    more = _ok(aitbc("chain", "deposit", "--training-id", RUN, "--wallet", "owner", "--amount", "5", "--json"))
    assert (more["action"], more["amount"], more["deposited"], more["escrow"]) == ("topped up", "5", "25", "25")
    assert s.escrow.find_key(RUN) == (key, s.address("owner"))

    s.escrow.post_bond(s.account("p1"), key, 3_000_000)
    s.escrow.post_bond(s.account("p2"), key, 0)
    s.settle(key, 1, [Payout(s.address("p1"), 2_500_000), Payout(s.address("p2"), 1_000_000)])
    s.settle(key, 2, [Payout(s.address("p1"), 2_000_000), Payout(s.address("p2"), 0, slash=True)])

    run = _ok(aitbc("chain", "run", "--training-id", RUN, "--json"))
    assert (run["state"], run["owner"], run["deposited"], run["escrow"], run["price"]) == (
        "open",
        s.address("owner"),
        "25",
        "19.5",
        "2.5",
    )
    assert [(r["round"], r["paid"]) for r in run["rounds"]] == [(1, "3.5"), (2, "2")]
    by = {c["provider"]: c for c in run["contracts"]}
    assert (by[s.address("p1")]["bond"], by[s.address("p1")]["earned"]) == ("3", "4.5")
    assert by[s.address("p2")]["slashed"] and by[s.address("p2")]["earned"] == "1"
    text = aitbc("chain", "run", "--training-id", RUN)
    assert text.returncode == 0 and "open" in text.stdout and "Rounds settled: 1 (paid 3.5, burned 0), 2" in text.stdout

    assert aitbc("wallet", "evm", "other").returncode == 0
    before = s.nonces("owner", "p1", "other")
    _refused(aitbc("chain", "refund", "--training-id", RUN, "--wallet", "owner"), "run still open")
    _refused(
        aitbc("chain", "refund", "--training-id", RUN, "--wallet", "other"), "deposited no run", s.address("owner")
    )
    _refused(aitbc("chain", "withdraw", "--training-id", RUN, "--wallet", "other"), "has no contract in run")
    for cmd in ("run", "withdraw", "refund"):
        extra = () if cmd == "run" else ("--wallet", "owner")
        _refused(aitbc("chain", cmd, "--training-id", "nope", *extra), "'nope'")
    _refused(
        aitbc("chain", "deposit", "--training-id", RUN, "--wallet", "owner", "--amount", "6"),
        "holds 5 AIT",
        "needs 6",
    )
    _refused(
        aitbc("chain", "deposit", "--training-id", RUN, "--wallet", "owner", "--amount", "1", "--price", "3"),
        "fixed",
        code=2,
    )
    _refused(aitbc("chain", "fund", "owner", "1", "--minter-wallet", "other"), "is not the token's minter")
    assert s.nonces("owner", "p1", "other") == before  # nothing sent

    paid = _ok(aitbc("chain", "withdraw", "--training-id", RUN, "--wallet", "p1", "--json"))
    assert (paid["earned"], paid["bond"], paid["balance"]) == ("4.5", "0", "6.5")  # the bond waits for the close
    _refused(
        aitbc("chain", "withdraw", "--training-id", RUN, "--wallet", "p1"), "nothing to withdraw yet", "bond of 3 AIT"
    )

    s.finalize(key)
    assert _ok(aitbc("chain", "withdraw", "--training-id", RUN, "--wallet", "p1", "--json"))["bond"] == "3"
    assert _ok(aitbc("chain", "withdraw", "--training-id", RUN, "--wallet", "p2", "--json"))["earned"] == "1"
    _refused(aitbc("chain", "withdraw", "--training-id", RUN, "--wallet", "p2"), "nothing to withdraw")
    back = _ok(aitbc("chain", "refund", "--training-id", RUN, "--wallet", "owner", "--json"))
    assert (back["amount"], back["balance"]) == ("19.5", "24.5")
    _refused(aitbc("chain", "refund", "--training-id", RUN, "--wallet", "owner"), "nothing to refund")
    _refused(aitbc("chain", "deposit", "--training-id", RUN, "--wallet", "owner", "--amount", "1"), "run is finalized")
    end = _ok(aitbc("chain", "run", "--training-id", RUN, "--json"))
    assert (end["state"], end["escrow"], [c["earned"] for c in end["contracts"]]) == ("finalized", "0", ["0", "0"])
    assert s.escrow.token_balance(s.escrow.escrow.address) == 0


def test_after_the_timeout_the_owner_and_a_provider_take_their_money_back_through_the_cli(setup):
    s, aitbc = setup, setup.aitbc
    _ok(aitbc("chain", "fund", "owner", "3", "--gas", "--json"))
    _ok(aitbc("chain", "fund", "p1", "1", "--gas", "--json"))
    args = ("--training-id", RUN, "--wallet", "owner")
    deposited = _ok(aitbc("chain", "deposit", *args, "--amount", "3", "--price", "1", "--timeout", "600", "--json"))
    key = run_key(s.address("owner"), RUN)
    s.escrow.post_bond(s.account("p1"), key, 1_000_000)
    s.settle(key, 1, [Payout(s.address("p1"), 1_000_000)])
    deadline = s.escrow.run(key).deadline
    assert deadline >= deposited["deadline"]
    _refused(aitbc("chain", "refund", *args), "run still open", "deadline")
    assert _ok(aitbc("chain", "withdraw", "--training-id", RUN, "--wallet", "p1", "--json"))["earned"] == "1"

    # the settlement key stays silent: the chain's clock moves past the deadline (a mined block carries it)
    s.client.rpc.call("evm_increaseTime", 600)
    wait_until(
        lambda: s.client.rpc.call("evm_mine") is not None and s.escrow.run(key).timed_out,
        "the chain's time past the deadline",
    )
    assert _ok(aitbc("chain", "run", "--training-id", RUN, "--json"))["state"] == "timed out"
    back = _ok(aitbc("chain", "refund", *args, "--json"))
    assert (back["amount"], back["balance"]) == ("2", "2")
    bond = _ok(aitbc("chain", "withdraw", "--training-id", RUN, "--wallet", "p1", "--json"))
    assert (bond["earned"], bond["bond"], bond["balance"]) == ("0", "1", "2")
    _refused(aitbc("chain", "refund", *args), "nothing to refund")
    _refused(aitbc("chain", "withdraw", "--training-id", RUN, "--wallet", "p1"), "nothing to withdraw")
    _refused(aitbc("chain", "deposit", *args, "--amount", "1"), "run is timed out")


def test_bad_input_is_one_line_and_reads_no_chain(aitbc):
    assert aitbc("wallet", "create", "owner").returncode == 0
    deposit = ("chain", "deposit", "--training-id", RUN, "--wallet", "owner")
    for amount, says in (
        ("-1", "more than 0"),
        ("0", "more than 0"),
        ("abc", "not a number"),
        ("1.0000001", "more than 6 decimals"),
    ):
        _refused(aitbc(*deposit, "--amount", amount, "--price", "1"), "--amount", says, code=2)
    _refused(aitbc(*deposit, "--amount", "1", "--price", "x"), "--price 'x' is not a number", code=2)
    for timeout in ("0", "315360001"):
        _refused(aitbc(*deposit, "--amount", "1", "--price", "1", "--timeout", timeout), "--timeout", code=2)
    _refused(aitbc("chain", "fund", "owner", "-2"), "more than 0", code=2)
    # no deployment record: said with what to do, before any node is asked
    _refused(aitbc(*deposit, "--amount", "1", "--price", "1"), "chain.json", "aitbc chain deploy")
    _refused(aitbc("chain", "balance", "--wallet", "nobody"), "nobody")
