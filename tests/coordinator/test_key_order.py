"""Small-order keys against a real coordinator: a wallet whose address derives from the
identity point holds money; a request "signed" by that key with a signature OpenSSL accepts
(R = B, S = 1) or the trivial one (R = identity, S = 0) is a 401 and spends nothing, and
``aitbc ledger verify`` stays OK."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aitbc.ledger.keys import L
from aitbc.ledger.signing import canonical_request, sign_request
from aitbc.ledger.wallet import Wallet, address_of

AITBC = Path(sys.executable).parent / "aitbc"
IDENTITY = bytes.fromhex("01" + "00" * 31)  # small order (1): [k]A is the identity for every k
BASE = bytes.fromhex("58" + "66" * 31)


def balances(server, *addresses: str) -> list[str]:
    with server.http() as h:
        return [h.get(f"/v1/wallets/{a}/balance").json()["balance"] for a in addresses]


def test_spending_from_a_small_order_key_is_refused(server, api):
    victim = address_of(IDENTITY.hex())
    alice = server.client("alice")
    alice.post("/wallets/fund", {"amount": "10"})
    alice.post("/wallets/send", {"to": victim, "amount": "4"})
    thief = Wallet.generate("thief")
    body = json.dumps({"to": thief.address, "amount": "4"}).encode()
    before = balances(server, victim, thief.address)
    entries = server.rows("SELECT seq FROM ledger_entries")
    assert before[0] == "4"

    with server.http() as h:
        # R = B, S = 1: [1]B = B + [k]identity, so OpenSSL verifies it for this request.
        headers = sign_request(thief, "POST", "/v1/wallets/send", body)
        message = canonical_request(
            "POST",
            "/v1/wallets/send",
            hashlib.sha256(body).hexdigest(),
            headers["X-Aitbc-Timestamp"],
            headers["X-Aitbc-Nonce"],
        )
        forged = BASE + (1).to_bytes(32, "little")
        Ed25519PublicKey.from_public_bytes(IDENTITY).verify(forged, message)  # the attack is real
        headers.update({"X-Aitbc-Key": IDENTITY.hex(), "X-Aitbc-Signature": forged.hex()})
        r = h.post("/v1/wallets/send", content=body, headers={"content-type": "application/json", **headers})
        api.assert_error(r, 401, "bad_signature", "small-order", "prime-order")

        # The trivial signature, and a malleated one (S + L) of a real key.
        headers = sign_request(thief, "POST", "/v1/wallets/send", body)
        headers.update({"X-Aitbc-Key": IDENTITY.hex(), "X-Aitbc-Signature": (IDENTITY + bytes(32)).hex()})
        r = h.post("/v1/wallets/send", content=body, headers={"content-type": "application/json", **headers})
        api.assert_error(r, 401, "bad_signature", "not a canonical Ed25519 signature")
        headers = sign_request(thief, "POST", "/v1/wallets/send", body)
        sig = bytes.fromhex(headers["X-Aitbc-Signature"])
        s = int.from_bytes(sig[32:], "little") + L
        headers["X-Aitbc-Signature"] = (sig[:32] + s.to_bytes(32, "little")).hex()
        r = h.post("/v1/wallets/send", content=body, headers={"content-type": "application/json", **headers})
        api.assert_error(r, 401, "bad_signature", "S is not below the group order")

    assert balances(server, victim, thief.address) == before
    assert server.rows("SELECT seq FROM ledger_entries") == entries
    out = subprocess.run(
        [str(AITBC), "ledger", "verify", "--coordinator", server.url],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1", AITBC_HOME=str(server.home / "cli")),
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK" in out.stdout, out.stdout
