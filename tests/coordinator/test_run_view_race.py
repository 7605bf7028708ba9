"""The run view read across the distribute that configures the run: on SQLite (and under
PostgreSQL's read committed) each SELECT sees the latest commit, so a view that read the
run before ``distribute`` committed and its jobs after it saw jobs of an unconfigured run
(a 500, seen by a CI run polling ``GET /v1/runs/{id}`` while ``distribute`` ran)."""

from __future__ import annotations

from aitbc.coordinator.runs import views
from aitbc.coordinator.store.models import Run


def test_a_run_read_before_distribute_and_its_jobs_after_is_one_view(new_coordinator, api):
    coord = new_coordinator()
    _, owner, run_id = api.hired_run(coord, 2, prefix="race")
    with coord.ctx.session() as s:
        run = s.get(Run, run_id)
        assert run is not None and not run.configured  # read before distribute
        owner.post(
            f"/runs/{run_id}/distribute", {"rounds": 2, "local_steps": 1, "batch_size": 8}
        )  # commits config + jobs
        view = views.run_detail(coord.ctx, s, run)  # its jobs are read now: after the commit
    assert len(view["workers"]) == 2 and all(w["steps"] == 1 for w in view["workers"])
    assert view["rounds"] == 2
