"""Ledger entries as data: their canonical form, hash, signature, and the audit.

An entry moves ``amount`` micro-AIT (an integer) from the ``debit`` account to the
``credit`` account: one row, two legs, so every entry conserves the total. Entries form
a chain: each names the hash of the one before (``prev_hash``), and its own ``hash`` is
SHA-256 over its canonical JSON (sorted keys, no spaces), signature included. Editing,
deleting or reordering any stored entry breaks the chain at that entry.

Who authorised an entry is in ``auth``:

- ``{"type": "entry"}``: the coordinator (``signer`` is its public key) signed the
  entry itself: mints from the faucet, settlements, refunds, slashing, bond returns.
- ``{"type": "request", method, path, body, timestamp, nonce, field}``: a wallet owner's
  signed HTTP request (``signature`` is that request's signature, ``signer`` its key).
  The entry must debit the signer's own wallet, and when ``field`` names a field of the
  request body, the amount may not exceed it (a transfer's ``amount``, a budget, a bond
  limit). A signed body's ``to`` names the only wallet it may credit, and a request to
  ``/v1/runs/<id>/...`` may only credit that run's escrow. One signed request authorises
  one entry, except a standing limit (a provider's ``max_bond``, which covers each bond
  it posts).

A wallet is only ever debited by its owner's signed request: the coordinator's own
signature moves money out of the faucet, escrows and bonds, never out of a wallet.

Accounts: ``wallet:<address>``, ``escrow:<run id>``, ``bond:<contract id>``,
``mint:<network>`` (the faucet; its balance is minus everything minted), ``burn:<network>``
(slashed bonds: credited only, never debited, so no party that can trigger a slash can
profit from it; the supply still counts it, and the audit refuses any entry spending it).

This module is pure: no database. :func:`audit` checks a sequence of entries as plain
dicts, from a database or from the coordinator's API alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from aitbc.errors import AitbcError
from aitbc.ledger.keys import key_problem_hex
from aitbc.ledger.signing import body_digest, canonical_json, canonical_request
from aitbc.ledger.wallet import address_of, verify_signature

GENESIS = "0" * 64
MICRO = 1_000_000
# Request fields that bound each entry separately rather than authorising one entry.
STANDING_FIELDS = frozenset({"max_bond"})
ENTRY_FIELDS = (
    "seq",
    "prev_hash",
    "network",
    "kind",
    "debit",
    "credit",
    "amount",
    "memo",
    "key",
    "signer",
    "auth",
    "created_at",
)
# Money a coordinator on an EVM chain mirrors into its books from what the chain shows: a
# run's deposit into its escrow, a contract's bond. Only the coordinator records them, out of
# the mint (the chain, not a wallet here, holds that money): kind -> the account prefix credited.
MIRROR_KINDS = {"chain-deposit": "escrow:", "chain-bond": "bond:"}
NETWORKS = ("local",)
REFUSED_NETWORKS = ("mainnet", "testnet")


class LedgerError(AitbcError):
    """A posting (or a network) refused: ``code`` says why (insufficient_funds, bad_amount, duplicate,
    unauthorised, bad_network)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


def check_network(network: str) -> str:
    if network in REFUSED_NETWORKS:
        raise LedgerError(
            "bad_network",
            f"network {network!r} is not available: this build settles on the local ledger only (--network local)",
        )
    if network not in NETWORKS:
        raise LedgerError("bad_network", f"unknown network {network!r}; this build settles on: {', '.join(NETWORKS)}")
    return network


def wallet_account(address: str) -> str:
    return f"wallet:{address}"


def escrow_account(run_id: str) -> str:
    return f"escrow:{run_id}"


def bond_account(contract_id: str) -> str:
    return f"bond:{contract_id}"


def mint_account(network: str) -> str:
    return f"mint:{network}"


def burn_account(network: str) -> str:
    return f"burn:{network}"


def signed_content(entry: Mapping[str, Any]) -> bytes:
    """What the coordinator signs for an ``entry``-type entry: every field but the
    signature and the hash."""
    return canonical_json({k: entry[k] for k in ENTRY_FIELDS})


def entry_hash(entry: Mapping[str, Any]) -> str:
    """SHA-256 hex over the entry's canonical JSON, signature included, hash excluded."""
    body = {k: entry[k] for k in ENTRY_FIELDS}
    body["signature"] = entry["signature"]
    return hashlib.sha256(canonical_json(body)).hexdigest()


def micro(value: Any) -> int | None:
    """A decimal AIT amount (as a request body carries it) in micro-AIT; None if it is not one."""
    try:
        d = Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        return None
    if not d.is_finite():
        return None
    m = d * MICRO
    return int(m) if m == m.to_integral_value() else None


def check_authorisation(entry: Mapping[str, Any], system_key: str | None) -> str | None:
    """Why ``entry``'s signature does not authorise it, or None if it does."""
    auth, signer = entry["auth"], entry["signer"]
    if not isinstance(auth, Mapping):
        return "auth is not an object"
    why = key_problem_hex(signer)
    if why is not None:  # a small-order key "signs" any message: refused outright
        return f"signer key {str(signer)[:16]}... is {why}"
    why = _mirror_problem(entry)
    if why is not None:
        return why
    if auth.get("type") == "entry":
        if system_key is not None and signer != system_key:
            return f"signed by {str(signer)[:16]}..., not the coordinator's key"
        if not verify_signature(signer, signed_content(entry), entry["signature"]):
            return "coordinator signature does not verify"
        if str(entry["debit"]).startswith("wallet:"):
            return f"debits {entry['debit']} without its owner's signed request (the coordinator cannot spend a wallet)"
        return None
    if auth.get("type") == "request":
        try:
            body = str(auth["body"])
            message = canonical_request(
                str(auth["method"]),
                str(auth["path"]),
                body_digest(body.encode()),
                str(auth["timestamp"]),
                str(auth["nonce"]),
            )
        except (KeyError, ValueError):
            return "request authorisation is incomplete"
        if not verify_signature(signer, message, entry["signature"]):
            return "owner's request signature does not verify"
        if entry["debit"] != wallet_account(address_of(signer)):
            return f"request signed by {address_of(signer)} cannot debit {entry['debit']}"
        try:
            signed_body = json.loads(body) if body else {}
        except ValueError:
            signed_body = None
        fields = signed_body if isinstance(signed_body, dict) else {}
        name = auth.get("field")
        if name:
            value: Any = fields
            for part in str(name).split("."):  # "config.max_cost": a field of a nested object
                value = value.get(part) if isinstance(value, dict) else None
            limit = micro(value) if value is not None and not isinstance(value, (bool, dict, list)) else None
            if limit is None or entry["amount"] > limit:
                return f"amount {entry['amount']} exceeds what the signed request's {name!r} authorises"
        if "to" in fields and entry["credit"] != wallet_account(str(fields["to"])):
            return f"credits {entry['credit']}, but the signed request sends to {fields['to']}"
        parts = str(auth["path"]).split("?", 1)[0].split("/")
        if (
            len(parts) >= 4
            and parts[1:3] == ["v1", "runs"]
            and parts[3]
            and entry["credit"] != escrow_account(parts[3])
        ):
            return f"credits {entry['credit']}, but the signed request is about run {parts[3]}"
        return None
    return f"unknown authorisation type {auth.get('type')!r}"


def _mirror_problem(entry: Mapping[str, Any]) -> str | None:
    """Why an entry of a mirror kind (:data:`MIRROR_KINDS`) is not one, or None."""
    kind = entry.get("kind")
    if kind not in MIRROR_KINDS:
        return None
    if entry["auth"].get("type") != "entry":
        return f"a {kind} entry mirrors the chain: only the coordinator records one, not a signed request"
    if not str(entry["debit"]).startswith("mint:"):
        return f"a {kind} entry comes out of the mint, not out of {entry['debit']}"
    prefix = MIRROR_KINDS[str(kind)]
    if not str(entry["credit"]).startswith(prefix):
        return f"a {kind} entry credits an {prefix[:-1]} account, not {entry['credit']}"
    return None


@dataclass
class AuditResult:
    ok: bool
    entries: int = 0
    head: str = GENESIS
    minted: int = 0  # total supply: everything the faucets created
    balances: dict[str, int] = field(default_factory=dict)
    bad_seq: int | None = None  # the first bad entry's position in the chain
    bad_hash: str | None = None
    problem: str | None = None

    def describe(self) -> str:
        if self.ok:
            return (
                f"ledger OK: {self.entries} entries, head {self.head[:16]}..., "
                f"{self.minted} micro-AIT minted and held across {len(self.balances)} accounts"
            )
        at = (
            f"entry {self.bad_seq}" + (f" ({self.bad_hash[:16]}...)" if self.bad_hash else "")
            if self.bad_seq
            else "ledger"
        )
        return f"{at}: {self.problem}"


def audit(
    entries: Iterable[Mapping[str, Any]],
    *,
    system_key: str | None = None,
    cached: Mapping[str, int] | None = None,
    head: tuple[int, str | None] | None = None,
) -> AuditResult:
    """Re-check every entry in chain order: sequence, link, hash, signature, amount, no
    overdraft, no signed request used twice; then that the chain ends at ``head`` (the
    ledger's recorded head: ``(seq, hash)``, so deleting the last entries is seen), that
    the balances derived from the entries equal ``cached`` (the database's running
    balances) and sum to the supply minted. The first failure is named.

    Without ``system_key`` any key's entry signature is accepted: pass the coordinator's
    public key, obtained from somewhere you trust."""
    chain = _Chain(system_key)
    for e in entries:
        failed = chain.add(e)
        if failed is not None:
            return failed
    return chain.close(head, cached)


def _entry_problem(e: Mapping[str, Any], system_key: str | None) -> str | None:
    """What is wrong with one entry on its own (its place in the chain aside), or None."""
    try:
        actual = entry_hash(e)
    except (KeyError, TypeError, ValueError) as err:
        return f"malformed entry: {err}"
    if actual != e.get("hash"):
        return "hash does not match its content: the entry was edited"
    amount = e["amount"]
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        return f"amount {amount!r} is not a positive integer of micro-AIT"
    if not (isinstance(e["debit"], str) and isinstance(e["credit"], str) and isinstance(e["auth"], Mapping)):
        return "malformed entry: debit, credit or auth has the wrong type"
    if e["debit"] == e["credit"]:
        return "debits and credits the same account"
    try:
        why = check_authorisation(e, system_key)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        why = f"malformed authorisation: {err}"
    if why:
        return why
    if e["debit"].startswith("mint:") and e["auth"].get("type") != "entry":
        return "only the coordinator can mint"
    if e["debit"].startswith("burn:"):
        return f"spends from {e['debit']}: burned money never moves again"
    return None


def _one_shot_request(e: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The signed request that authorised ``e``, if it may authorise only one entry."""
    a = e["auth"]
    if a.get("type") != "request" or a.get("field") in STANDING_FIELDS:
        return None
    # The request itself, not its nonce alone: a client may reuse a nonce once the
    # server has forgotten it, in a new request (new timestamp) that is not a replay.
    return (str(e["signer"]).lower(), *(str(a.get(k)) for k in ("method", "path", "body", "timestamp", "nonce")))


@dataclass
class _Chain:
    """The audit's running state: what the entries accepted so far add up to."""

    system_key: str | None
    balances: dict[str, int] = field(default_factory=dict)
    prev_hash: str = GENESIS
    n: int = 0  # entries accepted
    used: dict[tuple[str, ...], int] = field(default_factory=dict)  # one-shot signed request -> its entry

    def bad(self, e: Mapping[str, Any] | None, problem: str, seq: int | None = None) -> AuditResult:
        return AuditResult(
            ok=False,
            entries=self.n,
            head=self.prev_hash,
            balances=self.balances,
            bad_seq=seq if seq is not None else (e.get("seq") if e else None),
            bad_hash=e.get("hash") if e and seq is None else None,
            problem=problem,
        )

    def add(self, e: Mapping[str, Any]) -> AuditResult | None:
        """Check ``e`` as the next entry and apply it: None, or the failed result."""
        expected_seq = self.n + 1
        if e.get("seq") != expected_seq:
            found = f"entry {e.get('seq')} ({str(e.get('hash'))[:16]}...)"
            return self.bad(
                e,
                f"out of sequence: expected entry {expected_seq} here, found {found} "
                "(an entry was deleted or reordered)",
                seq=expected_seq,
            )
        if e.get("prev_hash") != self.prev_hash:
            return self.bad(
                e,
                "does not link to the entry before it (prev_hash differs): an entry before it was changed, removed or moved",
            )
        why = _entry_problem(e, self.system_key)
        if why:
            return self.bad(e, why)
        once = _one_shot_request(e)
        if once is not None:
            if once in self.used:
                return self.bad(e, f"replays the signed request that authorised entry {self.used[once]}")
            self.used[once] = e["seq"]
        amount, balances = e["amount"], self.balances
        balances[e["debit"]] = balances.get(e["debit"], 0) - amount
        balances[e["credit"]] = balances.get(e["credit"], 0) + amount
        if balances[e["debit"]] < 0 and not e["debit"].startswith("mint:"):
            return self.bad(e, f"overdraws {e['debit']} to {balances[e['debit']]}")
        self.prev_hash, self.n = e["hash"], self.n + 1
        return None

    def close(self, head: tuple[int, str | None] | None, cached: Mapping[str, int] | None) -> AuditResult:
        """The chain's end: the supply, the recorded head and the cached balances."""
        n, prev_hash, balances = self.n, self.prev_hash, self.balances
        minted = -sum(v for k, v in balances.items() if k.startswith("mint:"))
        held = {k: v for k, v in balances.items() if not k.startswith("mint:")}
        if sum(held.values()) != minted:  # cannot fail for single-row double entries; kept as the stated invariant
            return self.bad(None, f"balances sum to {sum(held.values())}, but {minted} were minted")
        if head is not None:
            head_seq, head_hash = int(head[0]), head[1] or GENESIS
            if head_seq > n:
                return AuditResult(
                    ok=False,
                    entries=n,
                    head=prev_hash,
                    balances=balances,
                    bad_seq=n + 1,
                    problem=f"missing: the chain ends at entry {n}, but the ledger's head is entry "
                    f"{head_seq} ({head_hash[:16]}...): the last entries were deleted",
                )
            if head_seq < n or head_hash != prev_hash:
                return AuditResult(
                    ok=False,
                    entries=n,
                    head=prev_hash,
                    balances=balances,
                    bad_seq=n or None,
                    bad_hash=prev_hash if n else None,
                    problem=f"is not the ledger's recorded head (entry {head_seq}, {head_hash[:16]}...): "
                    "the chain was extended or rewritten without moving the head",
                )
        if cached is not None:
            for account in sorted(set(cached) | set(balances)):
                if cached.get(account, 0) != balances.get(account, 0):
                    return self.bad(
                        None,
                        f"cached balance of {account} is {cached.get(account, 0)}, "
                        f"but its entries give {balances.get(account, 0)}",
                    )
        return AuditResult(ok=True, entries=n, head=prev_hash, minted=minted, balances=balances)
