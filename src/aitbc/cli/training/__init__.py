"""``aitbc distributed-training``: the training owner's workflow against a coordinator.

    init -> upload-data -> discover-workers -> distribute -> monitor -> results

Each command drives the SDK's :class:`~aitbc_agent_sdk.Agent` (the one client of the
coordinator's ``/v1`` API: every request body and client-side rule is built there), signed
with the owner's wallet, and prints what it returns. ``init`` remembers which wallet and
coordinator a run belongs to in ``HOME/runs/<id>.json`` so the later commands need only
``--training-id``.

Modules, each below the ones that use it: ``plumbing`` (shared options, the run memory,
printing), ``view`` (a run on screen), ``follow`` (following a run to its end), then the
commands: ``runs`` (init, distribute, stop, pause, resume), ``data`` (upload-data),
``hiring`` (discover-workers), ``monitoring`` (monitor, status, list), ``results``
(results, download-model, verify, payments, report) and ``use`` (sample, evaluate: the
run's model on this machine).
"""

from __future__ import annotations

import typer

from aitbc.cli.training import data, hiring, monitoring, results, runs, use

app = typer.Typer(
    help="Train one model on hired providers: init, upload-data, discover-workers, distribute, monitor.",
    no_args_is_help=True,
)

# In the workflow's order, as --help lists them.
for _name, _command in (
    ("init", runs.init),
    ("upload-data", data.upload_data),
    ("discover-workers", hiring.discover_workers),
    ("distribute", runs.distribute),
    ("monitor", monitoring.monitor),
    ("status", monitoring.status),
    ("list", monitoring.list_runs),
    ("stop", runs.stop),
    ("pause", runs.pause),
    ("resume", runs.resume),
    ("results", results.results),
    ("download-model", results.download_model),
    ("sample", use.sample),
    ("evaluate", use.evaluate),
    ("verify", results.verify),
    ("payments", results.payments),
    ("report", results.report),
):
    app.command(_name)(_command)
