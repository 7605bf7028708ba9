"""The coordinator's one error type: an HTTP status, a stable code, and a human detail.

Service functions raise :class:`ApiError`; the app turns it into a 4xx response with the
JSON body ``{"error": code, "detail": detail}``. Raised before any write, so a refused
request leaves no state changed.
"""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


def bad_request(code: str, detail: str) -> ApiError:
    return ApiError(400, code, detail)


def forbidden(detail: str) -> ApiError:
    return ApiError(403, "forbidden", detail)


def not_found(code: str, detail: str) -> ApiError:
    return ApiError(404, code, detail)


def conflict(code: str, detail: str) -> ApiError:
    return ApiError(409, code, detail)


def unprocessable(code: str, detail: str) -> ApiError:
    return ApiError(422, code, detail)
