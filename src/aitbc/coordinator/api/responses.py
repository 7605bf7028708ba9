"""The error responses each route declares (``responses=``), so the OpenAPI document says
exactly what a client receives on each status. The replies themselves are the models of
:mod:`aitbc.replies`.
"""

from __future__ import annotations

from typing import Any

from aitbc.replies.base import ErrorBody

_WHY = {
    400: "Malformed request: the body is not valid JSON (malformed_json), or a bad CID",
    401: "Missing, wrong, expired or replayed request signature (X-Aitbc-* headers)",
    403: "The signer may not do this (not the owner of the run, job or worker)",
    404: "No such run, job, worker, contract or blob",
    409: "Refused in the current state (run ended, wrong phase, a conflict with what exists; a pin over max_pinned_bytes or of an incomplete folder)",
    413: "The body is larger than this coordinator takes (blob_too_large: max_blob_bytes; body_too_large: a JSON body over max_json_bytes)",
    408: "The upload's body came slower than this coordinator's floor (upload_too_slow: min_upload_rate over upload_rate_window); nothing stored",
    429: "Too many blob uploads in flight at once, or from this signer (too_many_uploads: max_uploads, max_uploads_per_signer); try again later",
    422: "A field is missing, of the wrong type, out of range, or not allowed here",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` entries for the error statuses a route can send, each with
    :class:`ErrorBody`."""
    return {s: {"model": ErrorBody, "description": _WHY[s]} for s in statuses}


# A signed action on a run or a job: not the signer's (403), no such one (404), not in
# its current state (409). The app adds 401 to every signed route, and 400 and 422 to
# every route with a JSON body (see ``aitbc.coordinator.app``).
OWNED = errors(403, 404, 409)
