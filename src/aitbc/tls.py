"""A local certificate authority for ``aitbc up --tls``: a CA key and certificate, and a
server certificate it signs for the stack's coordinator (127.0.0.1, localhost, the host).

Files, under the directory given (the stack's ``HOME/tls``); keys are 0600:

    ca.pem  ca-key.pem  server.pem  server-key.pem

The CA is made once and reused, so clients that trust it keep working across restarts;
a new server certificate is made at each start. Clients trust the CA with
``--ca-cert HOME/tls/ca.pem`` (or ``AITBC_CA_CERT``); the stack records it in
``HOME/stack.json``, where the CLI and the SDK find it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
SERVER_DAYS = 825


class LocalTls(NamedTuple):
    ca_cert: Path
    server_cert: Path
    server_key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    tmp = path.with_suffix(".part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    tmp = path.with_suffix(".part")
    tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    os.replace(tmp, path)


def _names(hosts: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for h in dict.fromkeys(hosts):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def _ca(directory: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    cert_path, key_path = directory / "ca.pem", directory / "ca-key.pem"
    if cert_path.is_file() and key_path.is_file():
        key = serialization.load_pem_private_key(key_path.read_bytes(), None)
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        if isinstance(key, ec.EllipticCurvePrivateKey) and cert.not_valid_after_utc > dt.datetime.now(dt.UTC):
            return key, cert
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "aitbc local stack CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return key, cert


def local_tls(directory: Path, hosts: list[str] | None = None) -> LocalTls:
    """The CA (made if missing) and a fresh server certificate for ``hosts`` (default:
    127.0.0.1 and localhost) under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ca_key, ca_cert = _ca(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    names = _names(["127.0.0.1", "localhost", *(hosts or [])])
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "aitbc coordinator")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=SERVER_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = LocalTls(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
    _write_key(paths.server_key, key)
    _write_cert(paths.server_cert, cert)
    return paths
