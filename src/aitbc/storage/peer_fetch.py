"""One bounded read from another party's HTTP server: a wall-clock deadline that holds
however the bytes arrive, and a byte cap checked as they arrive.

httpx's timeouts are per socket operation: a server that sends one byte every few seconds
never trips them, and a deadline checked only when a chunk arrives is checked only when
the server chooses to send one (httpx's ``iter_bytes`` even gathers a whole chunk first).
:func:`bounded_get` arms a timer when the request starts; when it fires it shuts the
connection's socket down, which ends a read blocked in the kernel at once (the headers',
the body's or the TLS handshake's), so the caller gets its answer by the deadline whatever
the server does. The body is handed to ``take`` block by block as it arrives, never more
than ``max_bytes`` in all: a body longer than that is refused at that byte.

Every fetch opens its own connection (peer servers answer ``Connection: close``); the
socket is taken from httpcore's trace of the connect, before a byte is sent.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpcore
import httpx

_BLOCK = 1 << 16


class TooLong(Exception):
    """The body went past ``max_bytes``: stopped at that byte."""


class TooSlow(Exception):
    """The deadline passed before the whole answer came."""


@dataclass
class Answer:
    status: int
    headers: httpx.Headers
    size: int  # body bytes handed to take


class _Watchdog:
    """Shut the fetch's socket down at the deadline (or at once if it is already past)."""

    def __init__(self, seconds: float) -> None:
        self.fired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def trace(self, event: str, info: Mapping[str, object]) -> None:
        """httpcore's trace hook: ``info`` holds the traced call's arguments or result."""
        if event != "connection.connect_tcp.complete":
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if isinstance(stream, httpcore.NetworkStream) else None
        with self._lock:
            self._sock = sock
            if self.fired:
                self._shut()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            self._shut()

    def _shut(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):  # closed already
                self._sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


def bounded_get(
    http: httpx.Client,
    url: str,
    *,
    seconds: float,
    max_bytes: int,
    take: Callable[[bytes], None] | None = None,
    params: Mapping[str, str | int] | None = None,
) -> Answer:
    """``GET url`` through ``http`` (no redirects), done within ``seconds`` of the call
    however slowly the server sends (:class:`TooSlow` past it), its body handed to
    ``take`` as it arrives (not read when the status is not 200), at most ``max_bytes``
    of it (:class:`TooLong` at the byte past it). ``httpx.HTTPError``: no usable answer
    (refused, reset, a transport error). ``take`` may raise to stop."""
    dog = _Watchdog(seconds)
    size = 0
    try:
        with http.stream("GET", url, params=params, extensions={"trace": dog.trace}) as r:
            if r.status_code == 200:
                for block in r.iter_raw(_BLOCK):
                    if size + len(block) > max_bytes:
                        if take is not None and max_bytes > size:
                            take(block[: max_bytes - size])
                        raise TooLong(f"{url} sent more than {max_bytes} bytes")
                    size += len(block)
                    if take is not None:
                        take(block)
            if dog.fired:
                raise TooSlow(f"{url} took longer than {seconds:g} s")
            return Answer(r.status_code, r.headers, size)
    except httpx.HTTPError:
        if dog.fired:
            raise TooSlow(f"{url} took longer than {seconds:g} s") from None
        raise
    finally:
        dog.cancel()
