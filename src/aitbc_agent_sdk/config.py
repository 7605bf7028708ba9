"""Agent configuration: who the agent is (name, wallet), where it talks (coordinator) and
on which network it settles."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from aitbc.client import ca_cert_path, coordinator_url, coordinator_urls, require_https
from aitbc.errors import AitbcError
from aitbc.ledger.chain import NETWORKS
from aitbc_agent_sdk.errors import HttpsRequired, InvalidArgument

#: The networks this build settles on (the ledger's list); the documentation's others are refused clearly.
SUPPORTED_NETWORKS = NETWORKS


@dataclass
class AgentConfig:
    """``name``: a label for the agent; ``wallet_name``: the wallet under ``HOME/wallets``
    that signs every request (``start()`` creates it if missing; ``None``: a read-only
    agent, which signs nothing and can only read runs, offers and the ledger); ``blockchain_network``:
    ``local`` (this build settles on the local ledger only); ``coordinator_url``: default
    ``AITBC_COORDINATOR``, else the local stack's (``HOME/stack.json``), else
    ``http://127.0.0.1:8700``; ``home``: default ``AITBC_HOME`` or ``~/.aitbc``;
    ``timeout``: seconds per HTTP request; ``ca_cert``: the CA an ``https://``
    coordinator's certificate must chain to (default ``AITBC_CA_CERT``, else the local
    stack's from ``aitbc up --tls``, else the system's CAs); with one, every coordinator
    URL must be ``https://`` (:class:`HttpsRequired`)."""

    name: str
    blockchain_network: str = "local"
    wallet_name: str | None = "default"
    coordinator_url: str | None = None
    home: str | Path | None = None
    timeout: float = 30.0
    ca_cert: str | Path | None = None
    _resolved_home: Path = field(init=False, repr=False)
    _resolved_url: str = field(init=False, repr=False)
    _resolved_urls: list[str] = field(init=False, repr=False)
    _resolved_ca: Path | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.blockchain_network not in SUPPORTED_NETWORKS:
            raise InvalidArgument(
                "bad_network",
                f"blockchain_network {self.blockchain_network!r} is not available: this build settles on the "
                f'local ledger only (use blockchain_network="local"); mainnet and testnet are not supported',
            )
        if not self.name:
            raise InvalidArgument("bad_config", "AgentConfig.name must not be empty")
        if self.timeout <= 0:
            raise InvalidArgument("bad_config", f"AgentConfig.timeout must be > 0, got {self.timeout}")
        home = self.home if self.home is not None else os.environ.get("AITBC_HOME") or "~/.aitbc"
        self._resolved_home = Path(home).expanduser()
        self._resolved_url = coordinator_url(self.coordinator_url, self._resolved_home)
        try:
            self._resolved_urls = coordinator_urls(self._resolved_url)
        except AitbcError as e:
            raise InvalidArgument("bad_config", str(e)) from None
        self._resolved_ca = ca_cert_path(self.ca_cert, self._resolved_home)
        try:
            require_https(self._resolved_urls, self._resolved_ca)
        except AitbcError as e:
            raise HttpsRequired("https_required", str(e)) from None

    @property
    def resolved_home(self) -> Path:
        return self._resolved_home

    @property
    def resolved_coordinator_url(self) -> str:
        return self._resolved_url

    @property
    def resolved_coordinator_urls(self) -> list[str]:
        """The coordinators to try, in order: one, or replicas on one database (a
        comma-separated ``coordinator_url``); a request that cannot connect to one goes
        to the next."""
        return self._resolved_urls

    @property
    def resolved_ca_cert(self) -> Path | None:
        return self._resolved_ca
