"""Training runs: the owner's workflow (create, data, discover, distribute, control) and
the views everyone may read (status, rounds, results)."""

from __future__ import annotations

from fastapi import APIRouter, Query

from aitbc.coordinator.api.deps import CtxDep, SessionDep, SignerDep
from aitbc.coordinator.api.responses import OWNED, errors
from aitbc.coordinator.runs import owner as runs
from aitbc.coordinator.runs import views
from aitbc.coordinator.schemas import ContractCreate, DataAttach, Discover, Distribute, PaymentCreate, RunCreate
from aitbc.coordinator.store import repository
from aitbc.replies.base import Page
from aitbc.replies.money import ManualPayment, Payments
from aitbc.replies.results import Results, RoundView, ScorePage
from aitbc.replies.runs import ContractView, Discovery, RunDetail, RunSummary

router = APIRouter(prefix="/runs", tags=["runs"])
MAX_SCORES = 5000  # score rows per page (64k rows in one reply were 14 MB and ~4 s of the coordinator)
MAX_ROW_ID = 2**31 - 1  # the largest row id the column holds on every backend


@router.post("", status_code=201, response_model=RunSummary, responses=errors(409, 422))
def create_run(body: RunCreate, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> RunSummary:
    run = runs.create_run(ctx, s, body, owner=signer.address, owner_key=signer.public_key, request=signer.auth())
    return views.run_summary(run)


@router.get("", response_model=Page[RunSummary], responses=errors(422))
def list_runs(s: SessionDep, owner: str | None = None, status: str | None = None) -> Page[RunSummary]:
    data = [views.run_summary(r) for r in views.list_runs(s, owner=owner, status=status)]
    return Page[RunSummary](data=data, count=len(data))


@router.get("/{run_id}", response_model=RunDetail, responses=errors(404))
def get_run(run_id: str, ctx: CtxDep, s: SessionDep) -> RunDetail:
    return views.run_detail(ctx, s, repository.get_run(s, run_id))


@router.post("/{run_id}/data", response_model=RunDetail, responses=OWNED)
def attach_data(run_id: str, body: DataAttach, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> RunDetail:
    run = runs.attach_data(ctx, s, repository.owned_run(s, run_id, signer.address), body)
    return views.run_detail(ctx, s, run)


@router.post("/{run_id}/discover", response_model=Discovery, responses=OWNED)
def discover(run_id: str, body: Discover, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> Discovery:
    return runs.discover(ctx, s, repository.owned_run(s, run_id, signer.address), body)


@router.post("/{run_id}/contracts", status_code=201, response_model=ContractView, responses=OWNED)
def hire(run_id: str, body: ContractCreate, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> ContractView:
    """Hire one named provider at an offered price (at least its asking price)."""
    return runs.hire(ctx, s, repository.owned_run(s, run_id, signer.address), body)


@router.post("/{run_id}/distribute", response_model=RunDetail, responses=OWNED)
def distribute(run_id: str, body: Distribute, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> RunDetail:
    run = runs.distribute(ctx, s, repository.owned_run(s, run_id, signer.address), body, signer.auth())
    return views.run_detail(ctx, s, run)


@router.post("/{run_id}/stop", response_model=RunSummary, responses=OWNED)
def stop(run_id: str, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> RunSummary:
    return views.run_summary(runs.stop(ctx, s, repository.owned_run(s, run_id, signer.address)))


@router.post("/{run_id}/pause", response_model=RunSummary, responses=OWNED)
def pause(run_id: str, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> RunSummary:
    return views.run_summary(runs.pause(ctx, s, repository.owned_run(s, run_id, signer.address)))


@router.post("/{run_id}/resume", response_model=RunSummary, responses=OWNED)
def resume(run_id: str, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> RunSummary:
    return views.run_summary(runs.resume(ctx, s, repository.owned_run(s, run_id, signer.address)))


@router.get("/{run_id}/rounds", response_model=Page[RoundView], responses=errors(404))
def rounds(run_id: str, s: SessionDep) -> Page[RoundView]:
    data = views.rounds_view(s, repository.get_run(s, run_id))
    return Page[RoundView](data=data, count=len(data))


@router.get("/{run_id}/scores", response_model=ScorePage, responses=errors(404, 422))
def scores(
    run_id: str,
    s: SessionDep,
    after: int = Query(0, ge=0, le=MAX_ROW_ID),
    limit: int = Query(MAX_SCORES, ge=1, le=MAX_SCORES),
) -> ScorePage:
    """Every worker's score in every round, as written (round by round), in pages of at
    most ``limit`` rows (an unsigned read: a long run has rounds x workers of them); page
    with ``next``."""
    return views.scores_view(s, repository.get_run(s, run_id), after=after, limit=limit)


@router.get("/{run_id}/results", response_model=Results, responses=errors(404))
def results(run_id: str, ctx: CtxDep, s: SessionDep) -> Results:
    return views.results(ctx, s, repository.get_run(s, run_id))


@router.get("/{run_id}/payments", response_model=Payments, responses=errors(404))
def payments(run_id: str, ctx: CtxDep, s: SessionDep) -> Payments:
    """Per worker: rounds accepted, mean score, paid, bond, slashed, reputation."""
    return views.payments_view(ctx, s, repository.get_run(s, run_id))


@router.post("/{run_id}/payments", status_code=201, response_model=ManualPayment, responses=OWNED)
def pay_contract(run_id: str, body: PaymentCreate, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> ManualPayment:
    """The owner pays a contract from the run's escrow by hand (manual control)."""
    return runs.manual_payment(ctx, s, repository.owned_run(s, run_id, signer.address), body.contract_id, body.amount)


@router.post("/{run_id}/refund", response_model=Payments, responses=OWNED)
def refund(run_id: str, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> Payments:
    """Return an ended run's unspent escrow to the owner (and honest providers' bonds)."""
    return runs.refund(ctx, s, repository.owned_run(s, run_id, signer.address))
