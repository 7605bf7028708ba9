"""One exception hierarchy for everything the SDK raises.

:class:`AgentError` carries ``status`` (the HTTP status, or ``None`` for errors raised
before or without a reply), ``code`` (the coordinator's stable error code, e.g.
``unknown_run``) and ``detail`` (one human line). It is an :class:`aitbc.errors.AitbcError`,
so the ``aitbc`` command line, which drives the coordinator through this SDK, prints it as
one ``error:`` line and exits 1 (2 for an :class:`InvalidArgument`)."""

from __future__ import annotations

from aitbc.errors import AitbcError


class AgentError(AitbcError):
    status: int | None = None

    def __init__(self, code: str, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail
        if status is not None:
            self.status = status

    def __str__(self) -> str:
        return f"{self.detail} ({self.code})"


class BadRequest(AgentError):
    status = 400


class Unauthorized(AgentError):
    """401: the request's signature was missing, wrong, expired or replayed."""

    status = 401


class Forbidden(AgentError):
    """403: signed by a wallet that may not do this (e.g. not the run's owner)."""

    status = 403


class NotFound(AgentError):
    """404: no such run, blob, contract or worker."""

    status = 404


class Conflict(AgentError):
    """409: not now (wrong state, not enough workers, insufficient funds)."""

    status = 409


class Unprocessable(AgentError):
    """422: the request is malformed or its values are refused."""

    status = 422


class CoordinatorUnreachable(AgentError):
    """No answer from the coordinator (not running, wrong URL)."""


class InvalidArgument(AgentError, ValueError):
    """A bad argument caught by the SDK before any request was sent."""

    exit_code = 2  # a usage error, as the command line reports its own


class HttpsRequired(InvalidArgument):
    """A CA certificate is configured but a coordinator URL is ``http://`` (code
    ``https_required``): signed requests would go in the clear. Raised by
    :class:`AgentConfig`, before any request."""


class TrainingFailed(AgentError):
    """``wait_for_completion``: the run ended as ``failed``."""


class WaitTimeout(AgentError, TimeoutError):
    """A wait ran past its timeout: ``wait_for_completion``'s run did not end (``timeout``);
    ``get_payments``' or ``refund_payments``' ended run was not settled (``unsettled``)."""


class SettlementTimeout(WaitTimeout):
    """``get_payments`` or ``refund_payments`` waited ``timeout`` seconds for an ended run's
    settlement, which is not done (code ``unsettled``); ``where`` is how far it got, one
    line naming the run's state (the message adds what to do)."""

    def __init__(self, code: str, detail: str, where: str = "") -> None:
        super().__init__(code, detail)
        self.where = where


class IntegrityFailure(AgentError):
    """A blob from the coordinator did not hash to its CID."""


_BY_STATUS: dict[int, type[AgentError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Unprocessable,
}


def error_for(status: int, code: str, detail: str) -> AgentError:
    """The exception for an error reply of the coordinator."""
    return _BY_STATUS.get(status, AgentError)(code, detail, status)


class AmbiguousRun(InvalidArgument):
    """A method that acts on a run was called without ``training_id`` and the agent has no
    current run: its wallet owns no active run, or several (``candidates``). Pass
    ``training_id=``."""

    def __init__(self, code: str, detail: str, candidates: list[str] | None = None) -> None:
        super().__init__(code, detail)
        self.candidates = list(candidates or [])
