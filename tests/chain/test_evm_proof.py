"""An EVM coordinator takes an EVM account named by an init or an offer only with that
account's proof: its signature over a message binding it to the signer's wallet and to
this coordinator. Without it an init could name a rich stranger's account (hire checks
count its AIT) and an offer a victim's (its place in runs then stalls unbonded). Every
refusal is one line and writes nothing; a local coordinator reads no proof."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from eth_account import Account
from tests.chain.evm_coordinator import coordinator, evm_stack
from tests.chain.test_coordinator_money import AIT, _offer, _proof, _refused, _run_body

from aitbc.chain.evm.proof import proof_message, proof_signer, sign_proof
from aitbc.coordinator.config import Settings

pytestmark = pytest.mark.chain


def test_the_message_binds_account_wallet_and_coordinator():
    acct = Account.create()
    proof = sign_proof(acct, "ait1owner", "coord_a")
    assert proof_message(acct.address, "ait1owner", "coord_a") == (
        f"aitbc: EVM account {acct.address.lower()} belongs to wallet ait1owner at coordinator coord_a"
    )
    assert proof_signer(acct.address, "ait1owner", "coord_a", proof) == acct.address
    assert proof_signer(acct.address.lower(), "ait1owner", "coord_a", proof) == acct.address  # one account
    assert proof_signer(acct.address, "ait1other", "coord_a", proof) != acct.address
    assert proof_signer(acct.address, "ait1owner", "coord_b", proof) != acct.address
    for junk in ("", "0x1234", "0x" + "zz" * 65, "0x" + "ff" * 65, "0x" + "11" * 64 + "12"):
        assert proof_signer(acct.address, "ait1owner", "coord_a", junk) is None


def _wrong_proofs(coord, client, acct) -> list[tuple[str, str]]:
    """(proof, a word of its refusal): each a proof that is not ``acct``'s for ``client`` here."""
    stranger, other_wallet = Account.create(), coord.client("other").wallet.address
    return [
        (sign_proof(stranger, client.wallet.address, coord.ctx.coordinator_id), "signed by"),  # another key's
        (sign_proof(acct, other_wallet, coord.ctx.coordinator_id), "signed by"),  # another wallet's
        (sign_proof(acct, client.wallet.address, "coordinator_elsewhere"), "signed by"),  # another coordinator's
        ("0x" + "ab" * 10, "not a signature"),
    ]


def test_init_and_offer_need_the_accounts_own_proof(tmp_path):
    with evm_stack(tmp_path) as stack, coordinator(stack.settings()) as coord:
        owner, provider = coord.client("owner"), coord.client("provider")
        rich, bonded = stack.account(1000 * AIT), stack.account(5 * AIT)  # a stranger's money; a victim's account
        posts: list[tuple[Any, Any, Any]] = [
            (rich, lambda p: owner.post("/runs", _run_body(rich.address, p)), owner),
            (bonded, lambda p: provider.post("/workers", _offer(bonded.address, p)), provider),
        ]
        for acct, post, client in posts:
            _refused(coord, partial(post, None), 422, "evm_proof_required", acct.address, "evm_proof")
            for proof, words in _wrong_proofs(coord, client, acct):
                _refused(coord, partial(post, proof), 422, "bad_evm_proof", words, f"not by {acct.address}")
        run = owner.post("/runs", _run_body(rich.address, _proof(coord, owner, rich)))
        assert coord.rows("SELECT owner_evm FROM runs WHERE id = :r", r=run["training_id"]) == [
            {"owner_evm": rich.address}
        ]
        provider.post("/workers", _offer(bonded.address, _proof(coord, provider, bonded)))
        assert coord.rows("SELECT evm_address FROM offers") == [{"evm_address": bonded.address}]


def test_a_local_coordinator_reads_no_proof(tmp_path):
    with coordinator(Settings(home=tmp_path / "local", lease_seconds=600.0)) as coord:
        owner = coord.client("owner")
        acct = Account.create()
        assert owner.post("/runs", _run_body(acct.address, "0x1234"))["training_id"]
        assert owner.post("/runs", _run_body(acct.address))["training_id"]
