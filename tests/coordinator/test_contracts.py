"""Hiring one named provider at an offered price (POST /v1/runs/{id}/contracts)."""

from __future__ import annotations

import pytest


def test_hire_at_or_above_the_asking_price(new_coordinator, api):
    coord = new_coordinator()
    w = api.register_worker(coord, "cheap", price="1.5")
    owner = coord.client("owner")
    run_id = api.create_run(owner)
    before = coord.snapshot()
    # Below the ask: refused, nothing written.
    with pytest.raises(api.ApiError) as e:
        owner.post(f"/runs/{run_id}/contracts", {"worker_id": w.wallet.address, "price": "1.2"})
    api.assert_api_error(e, 409, "price_rejected", "asks 1.5 AIT", "1.2 was offered")
    assert coord.snapshot() == before
    # Someone else cannot hire for this run.
    with pytest.raises(api.ApiError) as e:
        coord.client("stranger").post(f"/runs/{run_id}/contracts", {"worker_id": w.wallet.address, "price": "2"})
    api.assert_api_error(e, 403, "forbidden")
    # An unknown worker.
    with pytest.raises(api.ApiError) as e:
        owner.post(f"/runs/{run_id}/contracts", {"worker_id": "ait1" + "0" * 40, "price": "2"})
    api.assert_api_error(e, 404, "unknown_worker")
    # At a higher price: a contract at the offered price.
    c = owner.post(f"/runs/{run_id}/contracts", {"worker_id": w.wallet.address, "price": "1.75"})
    assert c["price"] == "1.75" and c["price_micro"] == 1_750_000 and c["status"] == "hired"
    assert [ct["contract_id"] for ct in owner.get(f"/runs/{run_id}")["contracts"]] == [c["contract_id"]]
    with pytest.raises(api.ApiError) as e:
        owner.post(f"/runs/{run_id}/contracts", {"worker_id": w.wallet.address, "price": "2"})
    api.assert_api_error(e, 409, "already_contracted")
