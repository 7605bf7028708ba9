"""The OpenAPI document matches the API: schemathesis generates requests from the live
coordinator's ``/openapi.json`` (valid and invalid ones, for every operation) and checks
every reply: no 5xx, only documented status codes, the documented content type, and a
body that fits the documented schema.

Signed cases carry a real signature by the suite's wallet (computed on the bytes as
sent), so generated bodies reach the handlers; path and body fields that name things
(run, job, worker, CID, ...) are often swapped for ids that exist on the coordinator
(see ``conftest.World``), so the handlers go past "no such run". Unsigned cases of every
signed operation must be refused with a documented 401 (or 400 for a malformed body,
which is rejected before anything else).
"""

from __future__ import annotations

import time
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from aitbc.ledger.signing import sign_request
from aitbc.ledger.wallet import Wallet

pytestmark = pytest.mark.schemathesis

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
# Bounded: about 2 minutes on 2 cores for both kinds of case together.
BOUNDED = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,  # the same cases on every run: a CI failure can be replayed
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure is reported as found
    suppress_health_check=list(HealthCheck),
)
MAX_WAIT = 0.2  # seconds a generated long poll may hold (the API allows 60)

COUNTED: Counter[tuple[str, str, int]] = Counter()  # (kind, operation, status) -> cases
SECONDS: Counter[str] = Counter()  # operation -> seconds spent on its cases


@pytest.fixture(scope="session")
def api_schema(live: Any, world: Any) -> Any:
    return schemathesis.openapi.from_url(live.url + "/openapi.json", config=schemathesis.Config())


def _each_operation(api_schema: Any, wanted: Callable[[Any], bool], test: Callable[[Any], None]) -> list[str]:
    """Run ``test`` on bounded valid and invalid cases of every operation ``wanted``
    selects; the failures, one message per operation and mode (every operation runs)."""
    failures = []
    for result in api_schema.get_all_operations():
        op = result.ok()
        if not wanted(op):
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @BOUNDED
            @given(case=op.as_strategy(mode))
            def run(case: Any) -> None:
                test(case)

            started = time.perf_counter()
            try:
                run()
            except Unsatisfiable:  # nothing to make invalid (e.g. only a free-text path parameter)
                assert mode is GenerationMode.NEGATIVE, op.label
            except (Exception, FailureGroup) as e:  # noqa: BLE001 - a check failed: go on, report them all
                failures.append(f"{op.label} ({mode.value}): {type(e).__name__}: {str(e)[:3000]}")
            SECONDS[op.label] += time.perf_counter() - started
    return failures


class Sign(requests.auth.AuthBase):
    """Sign the request exactly as it goes on the wire (method, raw path and query, body)."""

    def __init__(self, wallet: Wallet) -> None:
        self.wallet = wallet

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        body = r.body or b""
        if isinstance(body, str):
            body = body.encode()
        blob_upload = r.method == "PUT" and urlsplit(r.url).path.startswith("/v1/blobs/")
        r.headers.update(sign_request(self.wallet, r.method, r.path_url, body, unsigned_payload=blob_upload))
        return r


def _pick(pool: list[str], value: Any) -> str | None:
    """A real id for three generated values in four (the same one for the same value)."""
    h = zlib.crc32(repr(value).encode())
    return None if h % 4 == 0 else pool[(h >> 2) % len(pool)]


def _name_real_things(case: Any, pools: dict[str, list[str]]) -> None:
    for name, value in list((case.path_parameters or {}).items()):
        if name in pools and isinstance(value, str) and (real := _pick(pools[name], value)):
            case.path_parameters[name] = real
    query = case.query or {}
    if isinstance(query.get("wait"), int | float) and not isinstance(query["wait"], bool):
        query["wait"] = min(query["wait"], MAX_WAIT)
    if isinstance(query.get("owner"), str) and (real := _pick(pools["owner"], query["owner"])):
        query["owner"] = real
    if isinstance(case.body, dict):
        for name, value in list(case.body.items()):
            if name in pools and isinstance(value, str) and (real := _pick(pools[name], value)):
                case.body[name] = real
            elif name == "updates" and isinstance(value, list) and _pick(pools["updates"], value):
                case.body[name] = pools["updates"][: len(value)]


def _record(kind: str, case: Any, status: int, record_counts: Any) -> None:
    COUNTED[(kind, case.operation.label, status)] += 1
    lines = []
    for k in ("signed", "unsigned"):
        rows = {(op, st): n for (kk, op, st), n in COUNTED.items() if kk == k}
        if not rows:
            continue
        ops = {op for op, _ in rows}
        by_status = Counter()
        for (_, st), n in rows.items():
            by_status[st] += n
        statuses = ", ".join(f"{st}: {n}" for st, n in sorted(by_status.items()))
        lines.append(f"{k}: {sum(rows.values())} cases over {len(ops)} operations ({statuses})")
    slowest = ", ".join(f"{op} {s:.1f} s" for op, s in SECONDS.most_common(3))
    record_counts([*lines, f"slowest operations: {slowest}"])


def test_signed_cases_conform(api_schema: Any, world: Any, record_counts: Any) -> None:
    with requests.Session() as session:
        session.auth = Sign(world.wallet)

        def signed(case: Any) -> None:
            _name_real_things(case, world.pools)
            response = case.call_and_validate(session=session, checks=CHECKS, timeout=30)
            _record("signed", case, response.status_code, record_counts)

        failures = _each_operation(api_schema, lambda op: True, signed)
    assert not failures, "\n\n".join(failures)


def _signed_operation(op: Any) -> bool:
    return "401" in op.definition.raw.get("responses", {})


def test_unsigned_cases_are_refused(api_schema: Any, world: Any, record_counts: Any) -> None:
    def unsigned(case: Any) -> None:
        _name_real_things(case, world.pools)
        response = case.call_and_validate(checks=CHECKS, timeout=30)
        assert response.status_code in (400, 401), (case.operation.label, response.status_code, response.text)
        _record("unsigned", case, response.status_code, record_counts)

    failures = _each_operation(api_schema, _signed_operation, unsigned)
    assert not failures, "\n\n".join(failures)
