"""``discover-workers``: rank the live offers and hire the best."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from aitbc.cli import checks
from aitbc.cli.common import DEFAULT_HOME, HomeOption, fit, others, out, resolve_home
from aitbc.cli.training.plumbing import CoordinatorOpt, JsonOpt, RunIdOpt, WalletOpt, emit_json, run_agent
from aitbc.market.capacity import format_params


def discover_workers(
    training_id: RunIdOpt,
    required_workers: Annotated[int, typer.Option("--required-workers", help="Workers to hire.", show_default=False)],
    min_gpu: Annotated[str | None, typer.Option("--min-gpu", help="Weakest GPU class accepted, e.g. RTX3090.")] = None,
    max_price: Annotated[
        str | None, typer.Option("--max-price", help="Highest price per round accepted, in AIT.")
    ] = None,
    coordinator: CoordinatorOpt = None,
    wallet: WalletOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Rank live offers (GPU, price, reputation, availability) that can train the model and hire the best."""
    home = resolve_home(home)
    checks.at_least(required_workers, 1, "--required-workers")
    if min_gpu is not None:
        checks.gpu_class(min_gpu)
    if max_price is not None:
        checks.price(max_price, option="--max-price")
    with (
        run_agent(home, coordinator, training_id, wallet, need_wallet=True) as a,
        checks.naming_flags("required_workers", "min_gpu", "max_price"),
    ):
        res = a.hire_workers(training_id, required_workers, min_gpu=min_gpu, max_price=max_price)
    if json_out:
        emit_json(res)
        return
    out.print(offers_table(res, training_id, min_gpu))
    out.print(f"Contracted {res['count']} worker{'s' if res['count'] != 1 else ''} for {training_id}", highlight=False)


def offers_table(res: Any, training_id: str, min_gpu: str | None, console: Console | None = None) -> Table:
    """The ranked offers, fitted to the console's width: the worker's address whole, and at
    80 columns the least useful columns dropped until no word is cut (a GPU class folded
    as 'RTX409' / '0' is no longer one)."""
    t = Table(title=f"Offers for {training_id}" + (f" (GPU >= {min_gpu})" if min_gpu else ""))
    for col in ("#", "worker", "GPU", "max params", "price/round", "reputation", "availability", "score", "hired"):
        t.add_column(col, justify="right" if col not in ("worker", "GPU") else "left")
    for i, r in enumerate(res["ranked"], 1):
        t.add_row(
            str(i),
            r["worker_id"],
            others(r["gpu_type"]),  # the provider's words
            format_params(r.get("max_params")),
            f"{r['price']:.2f}",
            f"{r['reputation']:.2f}",
            f"{r['availability']:.2f}",
            f"{r['score']:.3f}",
            "yes" if r["hired"] else "",
        )
    return fit(t, whole=("worker",), drop=("availability", "reputation", "#", "score", "max params"), console=console)
