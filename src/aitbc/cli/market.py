"""``aitbc market offers``: the providers' live offers as the coordinator ranks them."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.table import Table

from aitbc.cli.common import DEFAULT_HOME, HomeOption, err, out, resolve_home
from aitbc.client import CoordinatorClient, coordinator_url

app = typer.Typer(help="The marketplace of provider offers.", no_args_is_help=True)


@app.command()
def offers(
    all_offers: Annotated[bool, typer.Option("--all", help="Also offers that are not live (failed, silent).")] = False,
    coordinator: Annotated[str | None, typer.Option("--coordinator", help="Coordinator URL.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Offers: GPU class (and the device really found), price, reputation, availability, last heartbeat."""
    from aitbc.market.ranking import Offer, offer_score

    home = resolve_home(home)
    with CoordinatorClient(coordinator_url(coordinator, home)) as c:
        res = c.get("/market/offers", params={"all": "true" if all_offers else None})
    if json_out:
        sys.stdout.write(json.dumps(res, sort_keys=True) + "\n")
        return
    if not res["data"]:
        err.print("no offers" + ("" if all_offers else " live (try --all)"), highlight=False)
        return
    t = Table()
    for col in ("worker", "GPU", "device", "price/round", "reputation", "availability", "score", "status", "heartbeat"):
        t.add_column(col)
    for o in res["data"]:
        score = offer_score(
            Offer(
                worker_id=o["worker_id"],
                gpu=o["gpu_type"],
                price=o["price_micro"] / 1e6,
                reputation=o["reputation"],
                availability=o["availability"],
                last_heartbeat=o["last_heartbeat"],
            )
        )
        t.add_row(
            o["worker_id"],
            o["gpu_type"],
            str(o["device"].get("name", "?")),
            o["price"],
            f"{o['reputation']:.2f}",
            f"{o['availability']:.2f}",
            f"{score:.3f}",
            o["status"],
            f"{o['last_heartbeat_age']:.1f}s ago",
        )
    out.print(t)
