"""Testing only: a peer server that misbehaves, so the end-to-end tests can show that its
neighbours and the coordinator bound what it costs them.

``trickle`` (``aitbc worker start --cheat trickle``, hidden): the peer server sends each blob
a byte every :data:`TRICKLE_SECONDS`; ``endless``: it sends bytes for ever after each blob.
No torch here: the worker's settings import the peer server, and checking a flag must not
load torch.
"""

from __future__ import annotations

import logging
import time
from http.server import BaseHTTPRequestHandler
from typing import BinaryIO

log = logging.getLogger("aitbc.worker.cheats")

TRICKLE_SECONDS = 2.0  # "trickle": seconds between two bytes of a blob it serves


def serve_badly(handler: BaseHTTPRequestHandler, f: BinaryIO, how: str, *, chunk: int) -> None:
    """Testing only (:attr:`aitbc.worker.peers.BlobServer.misbehave`): ``trickle`` sends the blob a byte every
    :data:`TRICKLE_SECONDS` (an honest Content-Length: only the time is wrong); ``endless``
    sends the blob, then bytes for ever (no Content-Length: the body ends when the reader
    hangs up). Logged when it starts and when the reader cuts it."""
    data = f.read()
    peer = handler.client_address[0]
    handler.send_response(200)
    handler.send_header("Content-Type", "application/octet-stream")
    if how == "trickle":
        handler.send_header("Content-Length", str(len(data)))
    handler.send_header("Connection", "close")
    handler.end_headers()
    sent = 0
    log.warning("misbehaving (%s): serving %s to %s", how, handler.path, peer)
    try:
        if how == "trickle":
            for k in range(len(data)):
                handler.wfile.write(data[k : k + 1])
                handler.wfile.flush()
                sent += 1
                time.sleep(TRICKLE_SECONDS)
        else:
            handler.wfile.write(data)
            sent = len(data)
            junk = bytes(chunk)
            while True:
                handler.wfile.write(junk)
                sent += len(junk)
    except (BrokenPipeError, ConnectionResetError, TimeoutError, OSError) as e:
        log.warning(
            "misbehaving (%s): %s to %s cut after %d bytes (%s)", how, handler.path, peer, sent, type(e).__name__
        )
