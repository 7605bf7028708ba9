"""What every ``distributed-training`` command shares: its options, the run memory in
``HOME/runs/<id>.json`` (which wallet and coordinator a run belongs to), the agent for a
run, and how numbers and JSON are printed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import typer

from aitbc.cli.common import CoordinatorOption, agent, json_text, out
from aitbc.errors import UsageError

if TYPE_CHECKING:
    from aitbc_agent_sdk import Agent
    from aitbc_agent_sdk.results import NewRun, TrainingStatus

CoordinatorOpt = CoordinatorOption
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
RunIdOpt = Annotated[
    str, typer.Option("--training-id", help="The run, as printed by init (training_...).", show_default=False)
]
WalletOpt = Annotated[str | None, typer.Option("--wallet", help="Owner's wallet (default: the one init used).")]
LogToOpt = Annotated[
    str | None,
    typer.Option(
        "--log-to",
        help="Also write each closed round's metrics to an experiment tracker, from this machine as rounds "
        "close: tensorboard:DIR (TensorBoard event files; needs the extra: pip install 'aitbc\\[tensorboard]').",
        show_default=False,
    ),
]


def _runs_dir(home: Path) -> Path:
    return home / "runs"


def remember(home: Path, run_id: str, wallet: str, url: str, coordinator_id: str | None = None) -> None:
    """Which wallet and coordinator a run belongs to: the coordinator by URL and by id
    (asked of it when not given), so the run is found again when the URL changes."""
    from aitbc.cli.training.locate import identity

    found = coordinator_id or identity(url, home)
    d = _runs_dir(home)
    d.mkdir(parents=True, exist_ok=True)
    record = {
        "training_id": run_id,
        "wallet": wallet,
        "coordinator": url,
        **({"coordinator_id": found} if found else {}),
    }
    (d / f"{run_id}.json").write_text(json.dumps(record))


class Remembered(TypedDict, total=False):
    """What :func:`remember` wrote of a run (nothing when its file is gone or unreadable)."""

    training_id: str
    wallet: str
    coordinator: str
    coordinator_id: str  # absent in a record from before coordinators had ids


def recall(home: Path, run_id: str) -> Remembered:
    """What :func:`remember` wrote of a run; when its coordinator no longer answers at the
    URL remembered but is the local stack's, and that one has the run, the stack's URL
    (remembered from now on)."""
    try:
        known: Remembered = json.loads((_runs_dir(home) / f"{run_id}.json").read_text())
    except (OSError, ValueError):
        return {}
    url, coordinator_id = known.get("coordinator"), known.get("coordinator_id")
    if url and coordinator_id:
        from aitbc.cli.training.locate import moved_to

        moved = moved_to(home, run_id, url, coordinator_id)
        if moved is not None:
            remember(home, run_id, known.get("wallet", ""), moved, coordinator_id)
            known["coordinator"] = moved
    return known


def run_agent(
    home: Path,
    coordinator: str | None,
    run_id: str | None = None,
    wallet: str | None = None,
    *,
    need_wallet: bool = False,
) -> Agent:
    """The agent for a run: at the coordinator ``init`` used (unless ``--coordinator``),
    signed by the owner's wallet when the command changes the run (``need_wallet``);
    read-only otherwise."""
    known: Remembered = recall(home, run_id) if run_id else {}
    url = coordinator or known.get("coordinator")
    if need_wallet and run_id and not known:
        _check_exists(home, url, run_id)
    name = wallet or known.get("wallet")
    if need_wallet and not name:
        raise UsageError(f"run {run_id} was not started from {home}; pass --wallet NAME (the owner's wallet)")
    return agent(home, url, name if need_wallet else None)


def _check_exists(home: Path, url: str | None, run_id: str) -> None:
    """A run this HOME did not start is looked up before any wallet is asked for or
    loaded: a mistyped id then fails as it does for every command (the coordinator's
    not-found: the id and how to list runs, exit 1), not as a missing or unknown wallet."""
    with agent(home, url) as a:
        a.get_training_status(run_id)


def api_view(run: NewRun | TrainingStatus) -> dict[str, Any]:
    """A run as the API sends it (JSON): without the ``phase`` the SDK adds (it repeats ``status``)."""
    return run.model_dump(mode="json", by_alias=True, exclude={"phase"})


def say(*lines: str) -> None:
    for line in lines:
        out.print(line, highlight=False)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json_text(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    x = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(x) < 1000 or unit == "TB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1000
    return str(x)


def measured_line(measured: dict[str, Any] | None, data_bytes: int | None) -> str:
    """A run's data size as measured when it was read: bytes, documents and tokens of
    text; an older manifest's: the stored bytes."""
    if not measured:
        return f"{human_bytes(data_bytes)} stored"
    parts = [human_bytes(measured["bytes"])]
    if measured.get("documents") is not None:
        parts.append(f"{measured['documents']:,} documents")
    if measured.get("tokens") is not None:
        parts.append(f"{measured['tokens']:,} tokens")
    return ", ".join(parts) + " measured"


def fmt(v: Any, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec)
