"""Training runs: the owner's workflow (create, data, discover, distribute, control) and
the views everyone may read (status, rounds, results)."""

from __future__ import annotations

from fastapi import APIRouter

from aitbc.coordinator import payments as pay
from aitbc.coordinator import runs
from aitbc.coordinator.api.deps import CtxDep, SessionDep, SignerDep
from aitbc.coordinator.schemas import ContractCreate, DataAttach, Discover, Distribute, PaymentCreate, RunCreate

router = APIRouter(prefix="/runs", tags=["runs"])


@router.post("", status_code=201)
def create_run(body: RunCreate, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> dict:
    run = runs.create_run(ctx, s, body, owner=signer.address, owner_key=signer.public_key, request=signer.auth())
    return runs.run_summary(run)


@router.get("")
def list_runs(s: SessionDep, owner: str | None = None, status: str | None = None) -> dict:
    data = [runs.run_summary(r) for r in runs.list_runs(s, owner=owner, status=status)]
    return {"data": data, "count": len(data)}


@router.get("/{run_id}")
def get_run(run_id: str, ctx: CtxDep, s: SessionDep) -> dict:
    return runs.run_detail(ctx, s, runs.get_run(s, run_id))


@router.post("/{run_id}/data")
def attach_data(run_id: str, body: DataAttach, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> dict:
    run = runs.attach_data(ctx, s, runs.owned_run(s, run_id, signer.address), body)
    return runs.run_detail(ctx, s, run)


@router.post("/{run_id}/discover")
def discover(run_id: str, body: Discover, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> dict:
    return runs.discover(ctx, s, runs.owned_run(s, run_id, signer.address), body)


@router.post("/{run_id}/contracts", status_code=201)
def hire(run_id: str, body: ContractCreate, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> dict:
    """Hire one named provider at an offered price (at least its asking price)."""
    return runs.hire(ctx, s, runs.owned_run(s, run_id, signer.address), body)


@router.post("/{run_id}/distribute")
def distribute(run_id: str, body: Distribute, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> dict:
    run = runs.distribute(ctx, s, runs.owned_run(s, run_id, signer.address), body, signer.auth())
    return runs.run_detail(ctx, s, run)


@router.post("/{run_id}/stop")
def stop(run_id: str, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> dict:
    return runs.run_summary(runs.stop(ctx, s, runs.owned_run(s, run_id, signer.address)))


@router.post("/{run_id}/pause")
def pause(run_id: str, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> dict:
    return runs.run_summary(runs.pause(ctx, s, runs.owned_run(s, run_id, signer.address)))


@router.post("/{run_id}/resume")
def resume(run_id: str, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> dict:
    return runs.run_summary(runs.resume(ctx, s, runs.owned_run(s, run_id, signer.address)))


@router.get("/{run_id}/rounds")
def rounds(run_id: str, s: SessionDep) -> dict:
    data = runs.rounds_view(s, runs.get_run(s, run_id))
    return {"data": data, "count": len(data)}


@router.get("/{run_id}/results")
def results(run_id: str, ctx: CtxDep, s: SessionDep) -> dict:
    return runs.results(ctx, s, runs.get_run(s, run_id))


@router.get("/{run_id}/payments")
def payments(run_id: str, ctx: CtxDep, s: SessionDep) -> dict:
    """Per worker: rounds accepted, mean score, paid, bond, slashed, reputation."""
    return pay.payments_view(ctx, s, runs.get_run(s, run_id))


@router.post("/{run_id}/payments", status_code=201)
def pay_contract(run_id: str, body: PaymentCreate, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> dict:
    """The owner pays a contract from the run's escrow by hand (manual control)."""
    return pay.manual_payment(ctx, s, runs.owned_run(s, run_id, signer.address), body.contract_id, body.amount)


@router.post("/{run_id}/refund")
def refund(run_id: str, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> dict:
    """Return an ended run's unspent escrow to the owner (and honest providers' bonds)."""
    return pay.refund(ctx, s, runs.owned_run(s, run_id, signer.address))
