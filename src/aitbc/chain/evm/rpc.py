"""Ethereum JSON-RPC over HTTP: one request, one answer, errors as one line.

A node's error object (``{"code", "message", "data"}``) becomes :class:`RpcError` carrying
all three, so callers can tell a revert (``data`` holds the revert's bytes) from a nonce
already used; a node that does not answer becomes :class:`NodeUnreachable`.
"""

from __future__ import annotations

import itertools
from typing import Any

import httpx

from aitbc.errors import AitbcError


class NodeUnreachable(AitbcError):
    """No HTTP answer from the node (refused, timed out, not JSON-RPC)."""


class RpcError(AitbcError):
    """The node answered with a JSON-RPC error."""

    def __init__(self, method: str, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{method}: {message} (JSON-RPC error {code})")
        self.method = method
        self.code = code
        self.message = message
        self.data = data


class JsonRpc:
    """A JSON-RPC 2.0 connection to ``url`` (``http://`` or ``https://``)."""

    def __init__(self, url: str, *, timeout: float = 30.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise AitbcError(f"bad RPC URL {url!r}: want http://HOST:PORT or https://...")
        self.url = url
        self._http = httpx.Client(timeout=timeout)
        self._ids = itertools.count(1)

    def call(self, method: str, *params: Any) -> Any:
        """``method(params)``'s result; ``RpcError`` or ``NodeUnreachable``."""
        request = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": list(params)}
        try:
            response = self._http.post(self.url, json=request)
            reply = response.json()
        except httpx.HTTPError as e:
            raise NodeUnreachable(f"EVM node at {self.url} did not answer {method}: {e}") from None
        except ValueError:
            raise NodeUnreachable(
                f"EVM node at {self.url} answered {method} with HTTP {response.status_code}, not JSON-RPC"
            ) from None
        if not isinstance(reply, dict):
            raise NodeUnreachable(f"EVM node at {self.url} answered {method} with {type(reply).__name__}, not JSON-RPC")
        error = reply.get("error")
        if isinstance(error, dict):
            raise RpcError(method, int(error.get("code", 0)), str(error.get("message", "")), error.get("data"))
        if "result" not in reply:
            raise NodeUnreachable(f"EVM node at {self.url} answered {method} without a result or an error")
        return reply["result"]

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> JsonRpc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
