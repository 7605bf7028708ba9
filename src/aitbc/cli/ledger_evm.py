"""``aitbc ledger verify --chain evm``: the coordinator's payments held to the chain's events.

The chain holds an EVM run's money; the coordinator's books only mirror it. This check
trusts neither side's word for the other: it reads every event the token and the escrow
ever logged (from the deployment's block), rebuilds every balance from them alone
(:func:`aitbc.chain.evm.books.replay`, which refuses an impossible sequence), holds the
rebuilt books to the contracts' own views, and then compares, for every EVM run the
coordinator lists, its payments view with what the chain did:

- the run's owner and the escrow deposited (``chain.deposited``, and ``escrowed``);
- per contract (matched by the provider's EVM address): paid = settled on chain, bond
  posted = bonded on chain, slashed = burned on chain; and no provider paid or bonded on
  chain that the coordinator does not list;
- the settlement transactions: each mined or final ``settle`` row's round settled on
  chain, no round settled on chain without a row, a final ``finalize`` row's run finalized,
  no ``failed`` row.

A run with a transaction still on its way (queued, signed or sent) is reported as in
flight and not compared: its books are ahead of the chain by design until it lands.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import typer

from aitbc.chain.evm.books import Books, ChainEvent
from aitbc.cli.common import agent, json_text
from aitbc.errors import AitbcError
from aitbc.units import MICRO, ait

IN_FLIGHT = ("queued", "signed", "sent")
LANDED = ("mined", "final")


@dataclass(slots=True)
class ProviderTally:
    """One contract on chain, (run, provider): every movement it ever had, summed."""

    bonded: int = 0
    settled: int = 0  # earned over all rounds, withdrawn or not
    slashed: int = 0  # burned
    withdrawn: int = 0  # earnings taken out
    bond_returned: int = 0


@dataclass(slots=True)
class RunTally:
    """One run on chain: its deposits, refunds and contracts, summed from its events."""

    owner: str
    deposited: int = 0
    refunded: int = 0
    providers: dict[str, ProviderTally] = field(default_factory=dict)

    def provider(self, address: str) -> ProviderTally:
        return self.providers.setdefault(address, ProviderTally())


@dataclass(slots=True)
class RunCheck:
    """What the check found for one coordinator run."""

    run_id: str
    differences: list[str] = field(default_factory=list)
    in_flight: int = 0  # transactions not landed yet: not compared
    paid: int = 0  # micro-AIT settled on chain
    contracts: int = 0


def tally(events: Iterable[ChainEvent]) -> dict[bytes, RunTally]:
    """Per run key, what its escrow events moved (events in chain order)."""
    runs: dict[bytes, RunTally] = {}
    for e in events:
        if e.contract != "RunEscrow":
            continue
        a = e.args
        if e.name == "Deposited":
            run = runs.setdefault(_key(a), RunTally(owner=str(a["owner"])))
            run.deposited += int(a["amount"])
        elif e.name == "ToppedUp":
            runs[_key(a)].deposited += int(a["amount"])
        elif e.name == "Refunded":
            runs[_key(a)].refunded += int(a["amount"])
        elif e.name in ("Bonded", "Settled", "Slashed", "Withdrawn") and _key(a) in runs:
            p = runs[_key(a)].provider(str(a["provider"]))
            if e.name == "Bonded":
                p.bonded += int(a["amount"])
            elif e.name == "Settled":
                p.settled += int(a["amount"])
            elif e.name == "Slashed":
                p.slashed += int(a["amount"])
            else:
                p.withdrawn += int(a["earned"])
                p.bond_returned += int(a["bond"])
    return runs


def _key(args: Mapping[str, Any]) -> bytes:
    """The run's key on chain: the escrow's events name it ``key`` (``run_id`` before the
    key was derived from the owner)."""
    return bytes(args["key"] if "key" in args else args["run_id"])


def micro(money: str | int | float) -> int:
    """A reply's AIT amount (a decimal string) in micro-AIT."""
    return int(Decimal(str(money)) * MICRO)


def key_bytes(text: str) -> bytes:
    return bytes.fromhex(text.removeprefix("0x"))


def _ait(amount: int) -> str:
    return f"{ait(amount)} AIT"


def compare_run(payments: Mapping[str, Any], books: Books, runs: Mapping[bytes, RunTally]) -> RunCheck:
    """The differences between one EVM run's payments view and the chain."""
    chain = payments["chain"]
    check = RunCheck(run_id=str(payments["training_id"]))
    txs = list(chain.get("txs") or [])
    check.in_flight = sum(t["status"] in IN_FLIGHT for t in txs)
    if check.in_flight:
        return check
    where = f"run {check.run_id}"
    diff = check.differences.append
    for t in txs:
        if t["status"] == "failed":
            diff(f"{where}: its {t['kind']} transaction of round {t['round']} failed on chain ({t.get('tx_hash')})")
    key = key_bytes(str(chain["key"]))
    run, book = runs.get(key), books.runs.get(key)
    if run is None or book is None:
        if int(chain.get("deposited") or 0) or micro(payments["escrowed"]):
            diff(
                f"{where}: the coordinator holds an escrow for it, but nothing was deposited on chain under key {chain['key']}"
            )
        return check
    if str(chain["owner"]).lower() != run.owner.lower():
        diff(f"{where}: owner {chain['owner']} in the coordinator's view, {run.owner} on chain")
    for what, theirs in (("chain.deposited", int(chain["deposited"])), ("escrowed", micro(payments["escrowed"]))):
        if theirs != run.deposited:
            diff(f"{where}: {what} {_ait(theirs)} in the coordinator's view, {_ait(run.deposited)} deposited on chain")
    _compare_contracts(check, payments["data"], run)
    _compare_rounds(check, txs, book.rounds, book.finalized)
    check.paid = sum(p.settled for p in run.providers.values())
    return check


def _compare_contracts(check: RunCheck, rows: list[Mapping[str, Any]], run: RunTally) -> None:
    seen: set[str] = set()
    diff = check.differences.append
    for row in rows:
        check.contracts += 1
        address = row.get("evm_address")
        where = f"run {check.run_id}, contract {row['contract_id']} ({address or 'no EVM address'})"
        if not address:
            diff(f"{where}: the coordinator names no EVM account for it")
            continue
        seen.add(address.lower())
        p = next((v for k, v in run.providers.items() if k.lower() == address.lower()), ProviderTally())
        for what, ours, theirs in (
            ("paid", int(row["paid_micro"]), p.settled),
            ("bond", micro(row["bond"]), p.bonded),
            ("slashed", int(row["slashed_micro"]), p.slashed),
        ):
            if ours != theirs:
                diff(f"{where}: {what} {_ait(ours)} in the coordinator's books, {_ait(theirs)} on chain")
    for address, p in run.providers.items():
        if address.lower() not in seen and (p.settled or p.bonded):
            diff(
                f"run {check.run_id}: {address} bonded {_ait(p.bonded)} and was paid {_ait(p.settled)} on chain, "
                "and has no contract in the coordinator's view"
            )


def _compare_rounds(check: RunCheck, txs: list[Mapping[str, Any]], rounds: set[int], finalized: bool) -> None:
    diff = check.differences.append
    sent = {int(t["round"]) for t in txs if t["kind"] == "settle" and t["status"] in LANDED}
    for r in sorted(sent - rounds):
        diff(f"run {check.run_id}: round {r}'s settlement is mined in the coordinator's view, not settled on chain")
    for r in sorted(rounds - sent):
        diff(f"run {check.run_id}: round {r} settled on chain, with no mined settlement in the coordinator's view")
    if any(t["kind"] == "finalize" and t["status"] in LANDED for t in txs) and not finalized:
        diff(f"run {check.run_id}: its finalize is mined in the coordinator's view, the run is not finalized on chain")


# --- reading the chain ------------------------------------------------------------------------


@dataclass(slots=True)
class ChainRead:
    """Every event of a deployment, replayed, and the differences between the replay and
    the contracts' own views (an event the node left out, a view that lies)."""

    events: list[ChainEvent]
    books: Books
    runs: dict[bytes, RunTally]
    differences: list[str]
    head: int


def read_chain(escrow: Any) -> ChainRead:
    """``escrow``: a :class:`aitbc.chain.evm.escrow.Escrow`. Reads every token and escrow
    event from the deployment's block in chain order; replays them; checks the views."""
    from aitbc.chain.evm.books import replay
    from aitbc.chain.evm.contracts import AIT, RUN_ESCROW

    head = escrow.client.block_number()
    start = escrow.deployment.block
    logged = [
        (e.block_number, e.log_index, ChainEvent(contract=name, name=e.name, args=e.args))
        for name, contract in ((AIT, escrow.token), (RUN_ESCROW, escrow.escrow))
        for e in contract.events(from_block=start, to_block=head)
    ]
    events = [e for _, _, e in sorted(logged, key=lambda x: (x[0], x[1]))]
    books = replay(events)
    return ChainRead(events, books, tally(events), _views_differ(escrow, books, head), head)


def _views_differ(escrow: Any, books: Books, head: int) -> list[str]:
    out = []
    for address, balance in sorted(books.balances.items()):
        held = int(escrow.token.call("balanceOf", address, block=hex(head)))
        if held != balance:
            out.append(f"token balance of {address}: {held} on chain, {balance} from the events")
    for key, run in books.runs.items():
        view = escrow.run(key)
        if int(view.escrow) != run.escrow:
            out.append(f"escrow of run key 0x{key.hex()}: {view.escrow} on chain, {run.escrow} from the events")
    for (key, provider), c in books.contracts.items():
        view = escrow.contract(key, provider)
        if (int(view.bond), int(view.earned)) != (c.bond, c.earned):
            out.append(
                f"contract of {provider} in run key 0x{key.hex()}: bond {view.bond}, earned {view.earned} on chain; "
                f"bond {c.bond}, earned {c.earned} from the events"
            )
    return out


# --- the command ------------------------------------------------------------------------------


def verify_evm(coordinator: str | None, home: Path, chain_file: Path | None, *, json_out: bool) -> None:
    """Compare every EVM run of the coordinator with the chain; exit 1 on the first difference."""
    from aitbc.chain.evm.client import EvmClient
    from aitbc.chain.evm.deploy import CHAIN_FILE, check_deployment, read_deployment_file
    from aitbc.chain.evm.escrow import Escrow

    path = chain_file or home / CHAIN_FILE
    deployment = read_deployment_file(path)
    with agent(home, coordinator) as a:
        where = a.config.resolved_coordinator_url
        pays = [a.get_payments(r.training_id, wait=False).model_dump(mode="json") for r in a.list_trainings()]
    local = sum(not p.get("chain") for p in pays)
    pays = [p for p in pays if p.get("chain")]
    if local and not pays:
        raise AitbcError(
            f"the coordinator at {where} holds its {local} run(s)' money on its own ledger, not on a chain: "
            "audit it with aitbc ledger verify (without --chain evm)"
        )
    for p in pays:
        c = p["chain"]
        if int(c["chain_id"]) != deployment.chain_id or str(c["escrow"]).lower() != deployment.escrow.lower():
            raise AitbcError(
                f"run {p['training_id']} at {where} settles on chain {c['chain_id']} escrow {c['escrow']}, not on the "
                f"deployment in {path} (chain {deployment.chain_id}, escrow {deployment.escrow}): pass its --chain-file"
            )
    with EvmClient(deployment.rpc) as client:
        check_deployment(client, deployment)
        read = read_chain(Escrow(client, deployment))
    checks = [compare_run(p, read.books, read.runs) for p in pays]
    differences = read.differences + [d for c in checks for d in c.differences]
    summary = _summary(checks, read, where)
    if json_out:
        typer.echo(
            json_text(
                {
                    "ok": not differences,
                    "differences": differences,
                    "summary": summary,
                    "runs": [dataclasses.asdict(c) for c in checks],
                }
            )
        )
        if differences:
            raise typer.Exit(1)
        return
    if differences:
        more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
        raise AitbcError(differences[0] + more)
    typer.echo(summary)


def _summary(checks: list[RunCheck], read: ChainRead, where: str) -> str:
    compared = [c for c in checks if not c.in_flight]
    flying = len(checks) - len(compared)
    paid = sum(c.paid for c in compared)
    line = (
        f"{len(compared)} EVM run(s) of {where} agree with the chain: {sum(c.contracts for c in compared)} contracts, "
        f"{_ait(paid)} settled, {len(read.events)} events replayed to block {read.head}"
    )
    if flying:
        line += f"; {flying} run(s) with transactions in flight not compared (verify again once they are final)"
    return line
