"""A signed HTTP client of the coordinator's ``/v1`` API (used by the CLI, the worker and
the SDK). Every request that changes state is signed by the client's wallet; an error
reply becomes :class:`ApiError` carrying the server's code and detail."""

from __future__ import annotations

import json
import os
import re
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from aitbc.errors import AitbcError, IntegrityError, UsageError
from aitbc.ledger.signing import sign_request
from aitbc.ledger.wallet import Wallet

if TYPE_CHECKING:
    from aitbc.storage.blobstore import LocalBlobStore

DEFAULT_COORDINATOR = "http://127.0.0.1:8700"
_CHUNK = 1 << 20


class ApiError(AitbcError):
    """The coordinator refused a request: ``status`` (HTTP), ``code`` (stable, e.g.
    ``unknown_run``) and ``detail`` (one human line)."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


class Unreachable(AitbcError):
    """No answer from the coordinator (not running, wrong URL, network down)."""


class NotACoordinator(AitbcError):
    """Something answered, but not an aitbc coordinator (a web page, another service)."""

    code = "not_a_coordinator"


def coordinator_url(explicit: str | None, home: Path | None = None) -> str:
    """``--coordinator``, else ``AITBC_COORDINATOR``, else the local stack's (``aitbc up``
    writes ``HOME/stack.json``), else ``http://127.0.0.1:8700``."""
    if explicit:
        return explicit.rstrip("/")
    env = os.environ.get("AITBC_COORDINATOR")
    if env:
        return env.rstrip("/")
    if home is not None:
        try:
            return json.loads((home / "stack.json").read_text())["coordinator"].rstrip("/")
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return DEFAULT_COORDINATOR


def ca_cert_path(explicit: str | Path | None, home: Path | None = None) -> Path | None:
    """The CA certificate that an ``https://`` coordinator's certificate must chain to:
    ``--ca-cert``, else ``AITBC_CA_CERT``, else the local stack's (``aitbc up --tls`` writes
    it into ``HOME/stack.json``), else None (the system's trusted CAs)."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("AITBC_CA_CERT")
    if env:
        return Path(env).expanduser()
    if home is not None:
        try:
            ca = json.loads((home / "stack.json").read_text()).get("ca_cert")
        except (OSError, ValueError, AttributeError):
            ca = None
        if isinstance(ca, str) and ca:
            return Path(ca)
    return None


def tls_verify(ca_cert: Path | None) -> ssl.SSLContext | bool:
    """What httpx's ``verify=`` takes: a context trusting only ``ca_cert``, or True (the
    system's CAs). A CA file that cannot be read is one clear line."""
    if ca_cert is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(ca_cert))
    except FileNotFoundError:
        raise AitbcError(f"CA certificate {ca_cert} not found (--ca-cert / AITBC_CA_CERT)") from None
    except (OSError, ssl.SSLError) as e:
        raise AitbcError(f"CA certificate {ca_cert} is not a readable PEM certificate: {e}") from None


def coordinator_urls(base_url: str) -> list[str]:
    """The coordinators ``base_url`` names: one URL, or several separated by commas
    (replicas on one database, tried in turn)."""
    urls = [u.strip().rstrip("/") for u in base_url.split(",")]
    if not all(urls):
        raise AitbcError(f"coordinator URL {base_url!r}: give one URL, or several separated by commas, none empty")
    for u in urls:  # a URL no request can reach would be retried as an outage for ever: refused here, once
        try:
            parts = urlsplit(u)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
            parts.port  # noqa: B018 - raises on a port that is not a number from 0 to 65535
        except ValueError:  # "http://[::1" (an unclosed IPv6 host), "http://x:abc"
            ok = False
        if not ok:
            raise UsageError(f"coordinator URL {u!r} is not allowed: give http://HOST[:PORT] or https://HOST[:PORT]")
    return urls


class HttpsRequired(UsageError):
    """A CA certificate is given, so the client means to know whom it talks to, but a
    coordinator URL is ``http://``: its signed requests would go in the clear, to whoever
    answers. Refused before any request is sent."""

    code = "https_required"


def require_https(urls: list[str], ca_cert: Path | None) -> None:
    """Refuse every ``http://`` URL among ``urls`` when ``ca_cert`` is given (``--ca-cert``,
    ``AITBC_CA_CERT``, or the local stack's): one line naming the first such URL. The one
    check for every client (this one, the worker's, the SDK's agents)."""
    if ca_cert is None:
        return
    for u in urls:
        if urlsplit(u).scheme != "https":
            raise HttpsRequired(
                f"coordinator URL {u!r} is plain http, but a CA certificate is given ({ca_cert}): "
                "https is required when a CA is given (give https://HOST[:PORT], or no CA to talk plain http)"
            )


class CoordinatorClient:
    """``base_url``: one coordinator, or several replicas separated by commas. Requests go
    to one of them; when it cannot be connected to (refused, unreachable: the request was
    never sent) the request goes to the next at once; when a request was sent
    and its answer lost (the coordinator died mid-request) it fails :class:`Unreachable`
    as with one coordinator, and the next request goes to the next replica.

    An idempotent request (a GET, a blob PUT: content-addressed) whose pooled keep-alive
    connection the server closed as it was sent (``Server disconnected``, a reset) is
    sent once more, signed afresh, on a new connection: the race between a server's
    keep-alive timeout and the client's reuse of the connection. Other requests (a signed
    POST may have been applied) fail :class:`Unreachable` as before."""

    def __init__(
        self,
        base_url: str,
        wallet: Wallet | None = None,
        *,
        timeout: float = 30.0,
        ca_cert: str | Path | None = None,
    ) -> None:
        """``ca_cert``: the CA an ``https://`` coordinator's certificate must chain to
        (default: ``AITBC_CA_CERT``, else the system's CAs); with one, every URL must be
        ``https://`` (:class:`HttpsRequired`)."""
        self.urls = coordinator_urls(base_url)
        self.wallet = wallet
        ca = ca_cert_path(ca_cert)
        require_https(self.urls, ca)
        verify = tls_verify(ca)
        self.clients = [httpx.Client(base_url=u, timeout=timeout, verify=verify) for u in self.urls]
        self._current = 0
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        """The coordinator requests go to now."""
        return self.urls[self._current]

    @property
    def http(self) -> httpx.Client:
        return self.clients[self._current]

    def close(self) -> None:
        for c in self.clients:
            c.close()

    def send(self, call: Callable[[httpx.Client], httpx.Response], *, retry_dropped: bool = False) -> httpx.Response:
        """``call`` on the current coordinator, failing over to the next replicas while
        none can be connected to; ``retry_dropped`` (idempotent calls only): sent twice at
        most when the connection drops as it is sent (see the class)."""
        start = self._current
        for k in range(len(self.urls)):
            i = (start + k) % len(self.urls)
            try:
                try:
                    r = call(self.clients[i])
                except DROPPED:
                    if not retry_dropped:
                        raise
                    r = call(self.clients[i])  # the dropped connection left the pool
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                error: httpx.TransportError = e
                continue  # never sent: the next replica may take it
            except httpx.TransportError as e:
                self._next(i)
                raise Unreachable(unreachable_detail(self.urls[i], e)) from None
            with self._lock:
                self._current = i
            return r
        self._next(start)
        raise Unreachable(unreachable_detail(", ".join(self.urls), error)) from None

    def _next(self, failed: int) -> None:
        with self._lock:
            if self._current == failed:
                self._current = (failed + 1) % len(self.urls)

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing ------------------------------------------------------------------

    def _headers(self, method: str, target: str, body: bytes, *, unsigned_payload: bool = False) -> dict[str, str]:
        if self.wallet is None:
            raise AitbcError(f"{method} {target} must be signed; this client has no wallet")
        return sign_request(self.wallet, method, target, body, unsigned_payload=unsigned_payload)

    def _signatures(
        self, method: str, target: str, body: bytes, *, unsigned_payload: bool = False
    ) -> Callable[[], dict[str, str]]:
        """Signed headers for each send of one request: the first made now (no wallet:
        refused before anything is sent), a resend's afresh (a new nonce)."""
        first = [self._headers(method, target, body, unsigned_payload=unsigned_payload)]
        return lambda: first.pop() if first else self._headers(method, target, body, unsigned_payload=unsigned_payload)

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Mapping[str, str | int | float | bool | None] | None = None,
        sign: bool | None = None,
        timeout: float | None = None,
    ) -> Any:
        """``path`` is relative to ``/v1``. POST/PUT are always signed; GETs when asked."""
        target = "/v1" + path
        if params:
            target += "?" + str(httpx.QueryParams({k: v for k, v in params.items() if v is not None}))
        body = b"" if json_body is None else json.dumps(json_body).encode()
        signed = sign or (sign is None and method != "GET")
        signatures = self._signatures(method, target, body) if signed else None

        def call(http: httpx.Client) -> httpx.Response:
            headers = {"content-type": "application/json"} if json_body is not None else {}
            if signatures is not None:
                headers.update(signatures())
            return http.request(
                method,
                target,
                content=body,
                headers=headers,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )

        return _result(self.send(call, retry_dropped=idempotent(method, target)))

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.request("POST", path, json_body={} if body is None else body, **kw)

    # --- blobs -----------------------------------------------------------------------

    def put_blob(self, cid: str, data: bytes | Path) -> dict[str, Any]:
        """Upload a blob (bytes, or a file streamed in chunks) under its CID."""
        target = f"/v1/blobs/{cid}"
        signatures = self._signatures("PUT", target, b"", unsigned_payload=True)
        # Streamed in 1 MiB pieces either way: from the file, or sliced from the caller's
        # bytes (a 100 MB update is not copied whole on its way to the socket).
        size = str(data.stat().st_size if isinstance(data, Path) else len(data))

        def put(http: httpx.Client) -> httpx.Response:  # the pieces made again for each send
            headers = {**signatures(), "content-length": size}
            content = _file_chunks(data) if isinstance(data, Path) else _byte_chunks(data)
            return http.put(target, content=content, headers=headers)

        return _result(self.send(put, retry_dropped=True))

    def get_blob(self, cid: str) -> bytes:
        """A blob's bytes, re-hashed here: a coordinator cannot hand us something else."""
        from aitbc.storage.cid import cid_of_bytes

        r = self.send(lambda http: http.get(f"/v1/blobs/{cid}"), retry_dropped=True)
        if r.status_code != 200:
            _result(r)
        data = r.content
        if cid_of_bytes(data) != cid:
            raise IntegrityError(f"blob {cid} from {self.base_url} does not hash to its CID")
        return data

    def download_blob(self, cid: str, store: LocalBlobStore) -> int:
        """Stream the blob ``cid`` into ``store`` (its :meth:`~LocalBlobStore.writer`: a
        temporary file, hashed as the bytes arrive, renamed to the CID only once they hash
        to it); returns its size. At most one 1 MiB piece is in memory at a time. Bytes that
        do not hash to ``cid`` (corrupt, cut short) are an ``IntegrityError``, a body over
        the store's ``max_size`` an ``AitbcError``, a dropped connection ``Unreachable``;
        each leaves no file."""
        with store.writer(cid) as w:
            try:  # the first replica that can be connected to answers (send), streamed
                r = self.send(
                    lambda http: http.send(http.build_request("GET", f"/v1/blobs/{cid}"), stream=True),
                    retry_dropped=True,
                )
                try:
                    if r.status_code != 200:
                        r.read()
                        _result(r)
                    for block in r.iter_bytes(_CHUNK):
                        w.write(block)
                finally:
                    r.close()
            except httpx.TransportError as e:
                raise Unreachable(
                    f"download of blob {cid} from {self.base_url} cut off after {w.size} bytes "
                    f"({type(e).__name__}: {e})"
                ) from None
            try:
                w.commit()
            except IntegrityError:
                raise IntegrityError(
                    f"blob {cid} from {self.base_url} does not hash to its CID ({w.size} bytes hashing to "
                    f"{w.hasher.found()}); nothing kept"
                ) from None
            return w.size


# A connection the server closed as the request went out: the keep-alive race.
DROPPED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def idempotent(method: str, target: str) -> bool:
    """Whether sending a request twice is the same as once: reads, and blob uploads (the
    path is the content's hash). Signed POSTs move money and state: never sent again."""
    return method == "GET" or (method == "PUT" and target.startswith("/v1/blobs/"))


def _byte_chunks(data: bytes) -> Iterator[bytes]:
    view = memoryview(data)
    for i in range(0, len(view), _CHUNK):
        yield bytes(view[i : i + _CHUNK])


def _file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            yield block


def unreachable_detail(url: str, e: Exception) -> str:
    """What a client says when the coordinator does not answer (the SDK says the same)."""
    if "CERTIFICATE_VERIFY_FAILED" in str(e) or "certificate verify failed" in str(e):
        reason = re.sub(r"\s*\(_ssl\.c:\d+\)", "", str(e).rpartition("certificate verify failed:")[2]).strip()
        return (
            f"TLS certificate of coordinator {url} could not be verified ({reason}); "
            "give the CA that signed it with --ca-cert FILE or AITBC_CA_CERT"
        )
    if isinstance(e, httpx.RemoteProtocolError) and url.startswith("http://"):
        return f"coordinator at {url} did not answer plain HTTP ({e}); does it serve HTTPS? (use https://)"
    return f"coordinator at {url} is unreachable ({type(e).__name__}: {e}); is it running? (aitbc up / aitbc coordinator serve)"


def not_a_coordinator(r: httpx.Response) -> str | None:
    """What answered, when the reply is not the coordinator's JSON API (every reply of it,
    errors included, is ``application/json``; a blob is asked for as raw bytes): None for
    the API, else one line naming the server, its status and content type. Every client of
    the API (this one, the SDK's) passes each reply through here, so no command prints a
    web page's HTML or fails parsing it."""
    ctype = r.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "application/json" or (not r.content and r.status_code < 400):
        return None
    url = r.request.url
    origin = f"{url.scheme}://{url.host}" + (f":{url.port}" if url.port else "")
    return (
        f"{origin} answered {r.status_code} {ctype or 'without a content type'} to {r.request.method} {url.path}, "
        f"not an aitbc coordinator (no JSON API at {origin}/v1/health); check --coordinator or AITBC_COORDINATOR"
    )


def error_fields(r: httpx.Response) -> tuple[str, str]:
    """``(code, detail)`` of an error reply: the API's JSON body, what answered when it is
    not the coordinator (:func:`not_a_coordinator`), or the reply's first line of text."""
    other = not_a_coordinator(r)
    if other is not None:
        return NotACoordinator.code, other
    try:
        body = r.json()
        return str(body.get("error", "error")), str(body.get("detail", r.text))
    except (ValueError, AttributeError):
        return "error", (r.text.strip().splitlines() or [r.reason_phrase])[0]


def _result(r: httpx.Response) -> Any:
    if r.status_code < 400:
        other = not_a_coordinator(r)
        if other is not None:
            raise NotACoordinator(other)
        return r.json() if r.content else None
    raise ApiError(r.status_code, *error_fields(r))
