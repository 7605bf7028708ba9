"""``aitbc market offers``: the providers' live offers as the coordinator ranks them."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.table import Table

from aitbc.cli.common import (
    DEFAULT_HOME,
    CoordinatorOption,
    HomeOption,
    agent,
    err,
    fit,
    json_text,
    others,
    out,
    page,
    resolve_home,
)
from aitbc.units import format_price

app = typer.Typer(help="The marketplace of provider offers.", no_args_is_help=True)


@app.command()
def offers(
    all_offers: Annotated[bool, typer.Option("--all", help="Also offers that are not live (failed, silent).")] = False,
    coordinator: CoordinatorOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """The live offers: GPU class, largest model, price, reputation, availability, heartbeat.

    The GPU class is shown with the device really found, the largest model as the most
    parameters it trains."""
    from aitbc.market.capacity import format_params
    from aitbc.market.ranking import offer_score
    from aitbc_agent_sdk.workers import market_offer

    home = resolve_home(home)
    with agent(home, coordinator) as a:
        offers = a.get_market_offers(include_offline=all_offers)
    if json_out:
        sys.stdout.write(json_text(page(offers), sort_keys=True) + "\n")
        return
    if not offers:
        err.print("no offers" + ("" if all_offers else " live (try --all)"), highlight=False)
        return
    t = Table()
    cols = ("worker", "GPU", "device", "max params", "price/round", "reputation", "availability", "score", "status")
    for col in (*cols, "heartbeat"):
        t.add_column(col)
    for o in offers:
        score = offer_score(market_offer(o))
        t.add_row(
            o["worker_id"],
            others(o["gpu_type"]),  # the provider's words, as its device's name
            others(o["device"].get("name", "?")),
            format_params(o.get("max_params")),
            format_price(o["price_micro"]),
            f"{o['reputation']:.2f}",
            f"{o['availability']:.2f}",
            f"{score:.3f}",
            o["status"],
            f"{o['last_heartbeat_age']:.1f}s ago",
        )
    out.print(fit(t, whole=("worker",), drop=("device", "heartbeat", "availability", "reputation", "score", "status")))
