"""The URL a worker serves blobs at (peer transport), as the worker and the coordinator
both check it: one rule, one place."""

from __future__ import annotations

from urllib.parse import urlsplit

MAX_URL = 200  # characters of an advertised URL


def check_advertise(url: str) -> str:
    """An advertised URL, normalized (no trailing slash), or a ValueError naming what is
    allowed: ``http`` or ``https``, a host (and port), no credentials, path, query or
    fragment, at most :data:`MAX_URL` characters."""
    if len(url) > MAX_URL:
        raise ValueError(f"advertise URL is {len(url)} characters; at most {MAX_URL}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"advertise URL {url!r} is not a URL ({e})") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"advertise URL {url!r} must start with http:// or https://")
    if not parts.hostname:
        raise ValueError(f"advertise URL {url!r} has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"advertise URL {url!r} must not carry credentials")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"advertise URL {url!r} must be scheme://host[:port] only (no path, query or fragment)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")
