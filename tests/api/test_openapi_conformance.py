"""The OpenAPI document matches the API: schemathesis generates requests from the live
coordinator's ``/openapi.json`` (valid and invalid ones, for every operation) and checks
every reply: no 5xx, only documented status codes, the documented content type, and a
body that fits the documented schema.

Signed cases carry a real signature by the suite's wallet (computed on the bytes as
sent), so generated bodies reach the handlers; path and body fields that name things
(run, job, worker, CID, ...) are often swapped for ids that exist on the coordinator
(see ``conftest.World``), so the handlers go past "no such run". Unsigned cases of every
signed operation must be refused with a documented 401, before the body is read (so even
a malformed body gets the 401).
"""

from __future__ import annotations

import os
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
# Bounded: about 2 minutes on 2 cores for both kinds of case together. A deeper hunt:
# AITBC_API_EXAMPLES=500 make test-api
BOUNDED = settings(
    max_examples=int(os.environ.get("AITBC_API_EXAMPLES", "20")),
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


def _pick(pool: list[Any], value: Any) -> Any:
    """A real value for three generated values in four (the same one for the same value),
    of the generated value's JSON type (a valid case stays valid); None: keep it."""
    h = zlib.crc32(repr(value).encode())
    real = pool[(h >> 2) % len(pool)]
    return real if h % 4 and type(real) is type(value) else None


def _swap(fields: dict[str, Any], pools: dict[str, list[Any]]) -> None:
    for name, value in list(fields.items()):
        if name in pools and (real := _pick(pools[name], value)) is not None:
            fields[name] = real
        elif isinstance(value, dict):
            _swap(value, pools)


# Stopped or paused early, the manual run would answer 409 to every later case: these
# operations name the other runs only.
ENDING = {"POST /v1/runs/{run_id}/stop", "POST /v1/runs/{run_id}/pause", "POST /v1/runs/{run_id}/resume"}


def _name_real_things(case: Any, pools: dict[str, list[Any]]) -> None:
    if case.operation.label in ENDING:
        pools = {**pools, "run_id": pools["ending_run_id"]}
    for fields in (case.path_parameters, case.body):
        if isinstance(fields, dict):
            _swap(fields, pools)
    if isinstance(case.query, dict):
        _swap(case.query, {**pools, "status": pools["run_status"]})  # a body's status is another field
    updates = case.body.get("updates") if isinstance(case.body, dict) else None
    if isinstance(updates, list) and updates and _pick(pools["updates"], updates[0]) is not None:
        case.body["updates"] = pools["updates"][: len(updates)]
    query = case.query or {}
    if isinstance(query.get("wait"), int | float) and not isinstance(query["wait"], bool):
        query["wait"] = min(query["wait"], MAX_WAIT)


def _statuses(counts: dict[int, int]) -> str:
    return ", ".join(f"{st}: {n}" for st, n in sorted(counts.items()))


def _record(kind: str, case: Any, status: int, record_counts: Any) -> None:
    """Count the case; the summary so far: totals per kind, then per operation."""
    COUNTED[(kind, case.operation.label, status)] += 1
    totals: dict[str, Counter[int]] = {}
    per_op: dict[str, dict[str, Counter[int]]] = {}
    for (k, op, st), n in COUNTED.items():
        totals.setdefault(k, Counter())[st] += n
        per_op.setdefault(op, {}).setdefault(k, Counter())[st] += n
    lines = [
        f"{k}: {sum(c.values())} cases over {sum(k in v for v in per_op.values())} operations ({_statuses(c)})"
        for k, c in totals.items()
    ]
    slowest = ", ".join(f"{op} {s:.1f} s" for op, s in SECONDS.most_common(3))
    lines.append(f"slowest operations: {slowest}")
    for op, kinds in per_op.items():
        lines.append(f"  {op}: " + "; ".join(f"{k} {_statuses(c)}" for k, c in kinds.items()))
    record_counts(lines)


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
        assert response.status_code == 401, (case.operation.label, response.status_code, response.text)
        _record("unsigned", case, response.status_code, record_counts)

    failures = _each_operation(api_schema, _signed_operation, unsigned)
    assert not failures, "\n\n".join(failures)


def test_the_coordinator_logged_no_internal_error(live: Any) -> None:
    """After the cases above (this module runs in order): nothing failed inside a request,
    and the coordinator is still up."""
    log = live.log.read_text(errors="replace")
    assert "internal error on" not in log, log[-4000:]
    assert live.proc.poll() is None, log[-4000:]
