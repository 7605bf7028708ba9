"""``aitbc up``, ``down`` and ``status``: a whole marketplace on this machine.

``up`` starts a coordinator and N workers in the background under HOME (see
:mod:`aitbc.stack`); the other commands find its coordinator through ``HOME/stack.json``.
``aitbc demo`` (:mod:`aitbc.cli.demo`) runs the owner's workflow on that stack.
"""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer
from rich.table import Table

from aitbc import stack as stk
from aitbc import stack_status
from aitbc.cli.common import DEFAULT_HOME, HomeOption, err, json_text, out, resolve_home
from aitbc.coordinator.api.web import dashboard_url, metrics_url

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def emit(obj: Any) -> None:
    sys.stdout.write(json_text(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def processes_table(st: stk.Stack, alive: dict[str, bool] | None = None) -> Table:
    t = Table(caption=f"logs: {st.home / 'logs'}/<name>.log", caption_justify="left")
    for col in ("name", "pid", *(("alive",) if alive is not None else ()), "offer"):
        t.add_column(col, justify="right" if col == "pid" else "left")
    for p in st.processes:
        row = [p.name, str(p.pid)]
        if alive is not None:
            row.append("yes" if alive[p.name] else "[red]no[/red]")
        row.append(f"{p.gpu} at {p.price} AIT/round, avail. {p.availability:g}" if p.role == "worker" else "")
        t.add_row(*row)
    return t


# --- up / down / status ---------------------------------------------------------------


def up(
    workers: Annotated[int, typer.Option("--workers", "-n", help="Workers to start.")] = 3,
    port: Annotated[int | None, typer.Option(help="Coordinator port (default: a free one).")] = None,
    lease: Annotated[
        float | None,
        typer.Option(
            help="Seconds without a heartbeat before the coordinator fails a worker "
            "(default: AITBC_LEASE_SECONDS, else the coordinator's default)."
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the coordinator and every worker's offer.")
    ] = 60.0,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls", help="Serve HTTPS with a local CA made under HOME/tls (the CLI and SDK trust it from HOME)."
        ),
    ] = False,
    chain: Annotated[
        str,
        typer.Option(
            "--chain",
            help="Where runs' money is held: local (the coordinator's ledger) or evm (a local anvil node started "
            "with the stack, the contracts deployed on it, the workers given gas and AIT for their bonds).",
        ),
    ] = "local",
    home: HomeOption = DEFAULT_HOME,
    json_out: JsonOpt = False,
) -> None:
    """Start a local coordinator and N workers in the background (stop them with: aitbc down)."""
    home = resolve_home(home).absolute()
    cfg = stk.StackConfig(
        home=home, workers=workers, port=port, lease=lease, ready_timeout=timeout, tls=tls, chain=chain
    )
    t0 = time.monotonic()
    st = stk.up(cfg, on_start=lambda url: err.print(starting(cfg, url), highlight=False))
    if json_out:
        took = round(time.monotonic() - t0, 3)
        emit(
            {
                "home": str(home),
                "running": True,
                "seconds": took,
                **st.to_json(),
                "dashboard": dashboard_url(st.coordinator),
                "metrics": metrics_url(st.coordinator),
            }
        )
        return
    print_up(st, time.monotonic() - t0)
    if st.ca_cert:
        out.print(f"TLS: other machines' clients trust it with --ca-cert {st.ca_cert}", highlight=False)
    out.print(f"Stop it with: aitbc down --home {home}", highlight=False)


def starting(cfg: stk.StackConfig, url: str) -> str:
    node = "an EVM dev node (anvil), " if cfg.chain == "evm" else ""
    return (
        f"Starting {node}a coordinator at {url} and {cfg.workers} worker{'s' if cfg.workers != 1 else ''} "
        f"in {cfg.home} ..."
    )


def print_up(st: stk.Stack, seconds: float) -> None:
    n = len(st.workers)
    out.print(
        f"Local stack up in {st.home} ({seconds:.1f} s): coordinator {st.coordinator}, "
        f"{n} worker{'s' if n != 1 else ''} in the marketplace",
        highlight=False,
    )
    out.print(processes_table(st))
    if st.chain == "evm":
        out.print(
            f"Money on chain: a local chain (anvil; kept in {st.home / 'chain-state.json'} across down and up), "
            f"contracts in "
            f"{st.home / 'chain.json'}; workers funded, fund your wallet with: aitbc wallet fund NAME AMOUNT",
            highlight=False,
        )
    out.print(f"Dashboard: {dashboard_url(st.coordinator)}", highlight=False)
    out.print(f"Metrics (Prometheus): {metrics_url(st.coordinator)}", highlight=False)


def down(home: HomeOption = DEFAULT_HOME, json_out: JsonOpt = False) -> None:
    """Stop the stack that aitbc up started in HOME (only the processes it started)."""
    home = resolve_home(home).absolute()
    res = stk.down(home)
    if json_out:  # each process: stopped, forced, killed, or not running
        emit({"home": str(home), "stopped": {} if res is None else res[1]})
        return
    if res is None:
        out.print(f"no stack running in {home}", highlight=False)
        return
    st, outcome = res
    _print_down(st, outcome)


def _print_down(st: stk.Stack, outcome: dict[str, str]) -> None:
    stopped = [p for p in st.processes if outcome[p.name] != "not running"]
    if not stopped:
        out.print(f"no stack running in {st.home} (removed the record of one that had already exited)", highlight=False)
        return
    out.print(f"Stopped the local stack in {st.home}:", highlight=False)
    for p in st.processes:
        out.print(f"  {p.name:<12} pid {p.pid:<8} {outcome[p.name]}", highlight=False)


def status(home: HomeOption = DEFAULT_HOME, json_out: JsonOpt = False) -> None:
    """The local stack's processes, its coordinator's health and the live offers."""
    home = resolve_home(home).absolute()
    s = stack_status.status(home)
    if json_out:
        emit(s if s is not None else {"home": str(home), "running": False, "processes": []})
        return
    if s is None:
        out.print(f"no stack running in {home}", highlight=False)
        return
    st = stk.load(home)
    assert st is not None
    alive = {p["name"]: p["alive"] for p in s["processes"]}
    n_alive = sum(alive.values())
    state = "running" if n_alive == len(alive) else ("partly running" if n_alive else "not running (stale record)")
    out.print(f"Local stack in {home}: {state}, {n_alive}/{len(alive)} processes alive", highlight=False)
    health = "ok" if s["healthy"] else f"[red]unreachable[/red] ({s['health_error']})"
    out.print(
        f"Coordinator: {s['coordinator']}  health: {health}  live offers: "
        f"{'-' if s['live_offers'] is None else s['live_offers']}",
        highlight=False,
    )
    out.print(processes_table(st, alive))
    if n_alive < len(alive):
        out.print(f"Clean up with: aitbc down --home {home}", highlight=False)
