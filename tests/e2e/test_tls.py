"""Transport and keys at rest (issue 12, part 10), with real processes.

A coordinator serves HTTPS with a certificate from a generated local CA; a worker whose
wallet key is encrypted (opened with AITBC_WALLET_PASSPHRASE) and the owner's CLI talk to
it with --ca-cert and train a run. Without the CA a client refuses the coordinator in one
clear line; a worker without the passphrase does not start. ``aitbc up --tls`` runs the
local stack over HTTPS and the CLI trusts it from the stack's home.
"""

from __future__ import annotations

import json
import ssl
import stat
import time
from pathlib import Path

import httpx
import pytest

from aitbc.tls import local_tls

pytestmark = [pytest.mark.slow, pytest.mark.long]

PASSPHRASE = "correct horse battery staple"


def _start_tls_coordinator(stack, certs) -> None:
    stack.url = f"https://127.0.0.1:{stack.port}"
    stack.env.update(AITBC_COORDINATOR=stack.url, AITBC_CA_CERT=str(certs.ca_cert))
    stack._spawn(
        "coordinator",
        [
            "coordinator",
            "serve",
            "--home",
            str(stack.root / "coordinator"),
            "--port",
            str(stack.port),
            "--log-level",
            "warning",
            "--tls-cert",
            str(certs.server_cert),
            "--tls-key",
            str(certs.server_key),
        ],
    )
    ctx = ssl.create_default_context(cafile=str(certs.ca_cert))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{stack.url}/v1/health", timeout=1, verify=ctx).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert stack.procs["coordinator"].poll() is None, stack.log("coordinator")
        time.sleep(0.1)
    raise AssertionError(f"coordinator did not start over TLS:\n{stack.log('coordinator')}")


def test_https_coordinator_with_a_local_ca_worker_and_cli(stack, tmp_path: Path):
    certs = local_tls(tmp_path / "tls")
    for key in (certs.server_key, tmp_path / "tls" / "ca-key.pem"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    _start_tls_coordinator(stack, certs)
    ctx = ssl.create_default_context(cafile=str(certs.ca_cert))

    # The provider's key is encrypted at rest; the worker opens it with the env passphrase.
    stack.env["AITBC_WALLET_PASSPHRASE"] = PASSPHRASE
    r = stack.cli("wallet", "create", "w0", "--encrypt", "--home", str(stack.root / "w0"))
    assert r.returncode == 0, r.stderr
    del stack.env["AITBC_WALLET_PASSPHRASE"]
    key_text = (stack.root / "w0" / "wallets" / "w0" / "key.json").read_text()
    assert '"private_key"' not in key_text and '"encrypted_key"' in key_text

    # Without the passphrase the worker stops at once with one line.
    del stack.env["AITBC_CA_CERT"]
    stack.start_worker("w0")
    assert stack.procs["w0"].wait(timeout=60) != 0
    assert "wallet 'w0' is encrypted: set AITBC_WALLET_PASSPHRASE" in stack.log("w0")
    assert "Traceback" not in stack.log("w0")

    stack.env["AITBC_WALLET_PASSPHRASE"] = PASSPHRASE
    stack.env["AITBC_CA_CERT"] = str(certs.ca_cert)  # the worker and the CLI trust the local CA
    stack.start_worker("w0")
    offers = httpx.get(f"{stack.url}/v1/market/offers", timeout=5, verify=ctx)
    deadline = time.monotonic() + 60
    while not offers.json()["count"]:
        assert time.monotonic() < deadline, stack.log("w0")
        time.sleep(0.2)
        offers = httpx.get(f"{stack.url}/v1/market/offers", timeout=5, verify=ctx)
    assert offers.json()["data"][0]["worker_id"] == json.loads(key_text)["address"]

    # The owner's CLI, with --ca-cert given explicitly (no AITBC_CA_CERT), runs a short job.
    del stack.env["AITBC_CA_CERT"]
    del stack.env["AITBC_WALLET_PASSPHRASE"]
    ca = ["--ca-cert", str(certs.ca_cert)]
    r = stack.cli(*ca, "market", "offers")
    assert r.returncode == 0, r.stderr
    stack.env["AITBC_CA_CERT"] = str(certs.ca_cert)  # init_run / start_run go through stack.cli
    run_id = stack.init_run(workers=1)
    stack.start_run(run_id, workers=1, rounds=2, local_steps=10)
    del stack.env["AITBC_CA_CERT"]
    r = stack.cli(*ca, "distributed-training", "monitor", "--training-id", run_id, "--timeout", "180")
    assert r.returncode == 0, r.stdout + r.stderr
    r = stack.cli(*ca, "distributed-training", "verify", "--training-id", run_id)
    assert r.returncode == 0 and "All 3 checkpoints verified" in r.stdout, r.stdout + r.stderr

    # Without the CA: one clear line, exit 1, nothing else.
    r = stack.cli("market", "offers")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "TLS certificate of coordinator" in lines[0] and "--ca-cert" in lines[0], r.stderr
    # A plain-HTTP URL to the HTTPS port says so.
    r = stack.cli("market", "offers", "--coordinator", f"http://127.0.0.1:{stack.port}")
    assert r.returncode == 1 and "does it serve HTTPS" in r.stderr, r.stderr
    # A CA file that does not exist: one line naming it.
    r = stack.cli("--ca-cert", str(tmp_path / "nope.pem"), "market", "offers")
    assert r.returncode != 0 and "nope.pem" in r.stderr and "Traceback" not in r.stderr


def test_up_tls_runs_the_local_stack_over_https(aitbc):
    home = aitbc.home
    try:
        up = aitbc("up", "--workers", "1", "--tls", timeout=180)
        assert up.returncode == 0, up.stderr
        recorded = json.loads((home / "stack.json").read_text())
        assert recorded["coordinator"].startswith("https://127.0.0.1:")
        ca = Path(recorded["ca_cert"])
        assert ca == home / "tls" / "ca.pem" and ca.is_file()
        for key in ("ca-key.pem", "server-key.pem"):
            assert stat.S_IMODE((home / "tls" / key).stat().st_mode) == 0o600
        assert "--ca-cert" in up.stdout
        # The CLI finds the URL and the CA in the stack's home: no flag needed.
        r = aitbc("market", "offers", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["count"] == 1
        # Plain HTTP to it is no answer; and nothing that skips the CA verifies.
        with httpx.Client(verify=True) as c:
            try:
                c.get(f"{recorded['coordinator']}/v1/health", timeout=5)
                raise AssertionError("the system CAs accepted the local CA's certificate")
            except httpx.ConnectError as e:
                assert "CERTIFICATE_VERIFY_FAILED" in str(e)
        ctx = ssl.create_default_context(cafile=str(ca))
        assert httpx.get(f"{recorded['coordinator']}/v1/health", timeout=5, verify=ctx).status_code == 200
    finally:
        aitbc("down", timeout=60)
