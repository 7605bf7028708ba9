"""What a run produced: ``results``, ``download-model``, ``verify``, ``payments``,
``report``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from aitbc import run_defaults
from aitbc.cli.common import DEFAULT_HOME, HomeOption, fit, others, out, resolve_home
from aitbc.cli.progress import bars, settle_line
from aitbc.cli.training.plumbing import CoordinatorOpt, JsonOpt, RunIdOpt, emit_json, fmt, human_bytes, run_agent, say
from aitbc.cli.training.view import ENDED, span
from aitbc.errors import AitbcError
from aitbc.units import format_price

if TYPE_CHECKING:
    from aitbc.replies.money import ChainPayments, Payments
    from aitbc_agent_sdk import Agent


def results(
    training_id: RunIdOpt,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Final metrics and the trained model's CID."""
    home = resolve_home(home)
    with run_agent(home, coordinator, training_id) as a:
        res = a.get_results(training_id)
    if json_out:
        emit_json(res)
        return
    t = Table(title=f"Results of {training_id}", show_header=False)
    t.add_column("key", style="bold")
    t.add_column("value")
    rows = [
        ("status", res["status"]),
        ("rounds", f"{res['rounds_completed']}/{res['rounds'] or '-'}"),
        ("validation loss", span(res.initial_val_loss, res.final_val_loss, res.final_val_round)),
        ("validation accuracy", fmt(res["final_val_accuracy"], ".4f")),
        *([("validation perplexity", fmt(res.final_val_perplexity, ".2f"))] if res.final_val_perplexity else []),
        *([("tokens seen", f"{res.tokens_seen:,}")] if res.tokens_seen is not None else []),
        ("updates accepted / rejected", f"{res['updates_accepted']} / {res['updates_rejected']}"),
        ("bytes up / down", f"{human_bytes(res['bytes_up'])} / {human_bytes(res['bytes_down'])}"),
        ("wall time", "-" if res["wall_seconds"] is None else f"{res['wall_seconds']:.1f} s"),
        ("model CID", res["model_cid"] or "-"),
    ]
    if res.get("error"):
        rows.append(("error", res["error"]))
    for k, v in rows:
        t.add_row(k, others(v))
    out.print(fit(t, whole=("value",) if not res.get("error") else ()))  # the CID whole; an error wraps
    if res.get("workers"):
        settled = res.get("settled_round")  # None: a coordinator that does not say
        behind = ""
        if settled is not None and settled < res["rounds_completed"]:  # settlement runs behind the rounds
            behind = f"; {settled} of {res['rounds_completed']} rounds settled so far"
        w = Table(title=f"Contribution scores (mean quality of scored rounds, 0-1{behind})")
        for col in ("worker", "contract", "score", "last round", "flags"):
            w.add_column(col)
        for r in res["workers"]:
            w.add_row(
                r["worker_id"],
                r["status"],
                fmt(r["score"], ".3f"),
                fmt(r["last_quality"], ".3f"),
                ", ".join(r["score_flags"]),
            )
        out.print(fit(w, whole=("worker",), drop=("last round", "flags", "contract")))


def download_model(
    training_id: RunIdOpt,
    output: Annotated[
        Path,
        typer.Option(
            "-o",
            "--output",
            help="File to write (safetensors), or with --format hf a new or empty folder.",
            show_default=False,
        ),
    ],
    round: Annotated[
        int | None, typer.Option("--round", help="A given round's checkpoint (default: the latest).")
    ] = None,
    format: Annotated[
        str,
        typer.Option(
            "--format",
            help="safetensors: the checkpoint as stored (a built-in model loads it in plain PyTorch, see "
            "docs/owner.md); hf: a folder that transformers' AutoModelForCausalLM and AutoTokenizer load "
            "(hf:... models only; a LoRA run's model merged into its base).",
        ),
    ] = "safetensors",
    adapter_only: Annotated[
        bool,
        typer.Option(
            "--adapter-only",
            help="With --format hf, of a LoRA run: the adapter alone (adapter_config.json, "
            "adapter_model.safetensors), which peft loads onto its base: the model folder given to "
            "init --from-pretrained.",
        ),
    ] = False,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Download the model, verified against its CID.

    A safetensors checkpoint, or (--format hf) a Hugging Face model folder that loads with
    nothing of aitbc installed."""
    home = resolve_home(home)
    with run_agent(home, coordinator, training_id) as a, bars(json_out) as progress:
        res = a.download_model(
            training_id, output, round=round, format=format, adapter_only=adapter_only, progress=progress
        )
    if json_out:
        emit_json(res)
    else:
        what = "" if format == "safetensors" else (" (adapter only)" if adapter_only else " (Hugging Face folder)")
        out.print(f"Wrote {res['path']}{what} ({human_bytes(res['bytes'])}, CID {res['cid']})", highlight=False)


def verify(
    training_id: RunIdOpt,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Download every round's checkpoint and check it against its recorded CID.

    Each is re-hashed and checked to be a loadable checkpoint of its round. A checkpoint
    whose bytes the coordinator's blob retention deleted is reported as pruned; the latest
    must be there. Exit 1 if any fails."""
    home = resolve_home(home)
    rows = []
    with run_agent(home, coordinator, training_id) as a:
        for ck in a.get_round_checkpoints(training_id):
            v = a.verify_checkpoint(ck)
            rows.append(
                {
                    "round": ck["round"],
                    "cid": ck["checkpoint_cid"],
                    "ok": v["valid"],
                    "pruned": bool(v.get("pruned")),
                    "detail": v["detail"],
                }
            )
    if rows and rows[-1]["pruned"]:  # retention always keeps the latest: its absence is a failure
        rows[-1]["pruned"] = False
        rows[-1]["detail"] = "the latest checkpoint is missing"
    bad = [row for row in rows if not row["ok"] and not row["pruned"]]
    pruned = sum(row["pruned"] for row in rows)
    if json_out:
        emit_json({"training_id": training_id, "checkpoints": rows, "ok": not bad, "pruned": pruned})
    else:
        t = Table(title=f"Checkpoints of {training_id}")
        for col in ("round", "CID", "verified"):
            t.add_column(col)
        for row in rows:
            shown = "OK" if row["ok"] else "pruned" if row["pruned"] else f"[red]FAILED: {row['detail']}[/red]"
            t.add_row(str(row["round"]), row["cid"], shown)
        out.print(fit(t, whole=("CID",)))
    if not rows:
        raise AitbcError(f"run {training_id} has no checkpoints yet")
    if bad:
        raise AitbcError(
            f"{len(bad)} of {len(rows)} checkpoints failed verification (first: round {bad[0]['round']}: {bad[0]['detail']})"
        )
    if not json_out:
        kept = len(rows) - pruned
        tail = f"; {pruned} older ones pruned by blob retention (CIDs recorded, bytes deleted)" if pruned else ""
        out.print(f"All {kept} {'kept ' if pruned else ''}checkpoints verified{tail}", highlight=False)


NoWaitOpt = Annotated[
    bool,
    typer.Option(
        "--no-wait",
        help="Answer at once with the payments so far: an ended run's last rounds may not be settled yet.",
    ),
]
SettleTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout",
        min=0,
        help="Seconds to wait for an ended run's settlement before giving up (exit 1, naming how far it got).",
    ),
]


def payments(
    training_id: RunIdOpt,
    no_wait: NoWaitOpt = False,
    timeout: SettleTimeoutOpt = run_defaults.SETTLE_TIMEOUT,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Per worker: rounds accepted, score, paid, bond, slashed, reputation; and the escrow.

    The coordinator pays each closed round behind the training, so for an ended run this
    waits until every round is settled and the run's end booked (a line on standard error
    says how far settlement is), at most --timeout seconds; --no-wait answers at once."""
    from aitbc_agent_sdk import SettlementTimeout

    home = resolve_home(home)
    with run_agent(home, coordinator, training_id) as a, settle_line(json_out) as progress:
        try:
            res = a.get_payments(training_id, wait=not no_wait, timeout=timeout, progress=progress)
        except SettlementTimeout as e:
            raise AitbcError(
                f"{e.where}; wait longer (--timeout SECONDS) or see the payments so far (--no-wait)"
            ) from None
    if json_out:
        emit_json(res)
        return
    out.print(payments_table(res.model_dump(mode="json")))
    out.print(
        f"Escrowed {res['escrowed']} AIT; left in escrow {res['escrow_balance']} AIT; "
        f"settled through round {res.settled_round} of {res.rounds_closed}" + ("; finalized" if res.finalized else ""),
        highlight=False,
    )
    if res.chain is not None:
        out.print(chain_table(res.chain))
    if not res.settled:
        out.print(partial_note(res), highlight=False)


def chain_table(chain: ChainPayments) -> Table:
    """An EVM run's settlement transactions: each one's hash, state and confirmations."""
    t = Table(
        title=f"On chain {chain.chain_id}: escrow {chain.escrow}, deposited {format_price(chain.deposited)} AIT"
        + ("" if chain.final else " (not final yet)")
    )
    for col in ("transaction", "hash", "status", "confirmations", "gas"):
        t.add_column(col, justify="right" if col in ("confirmations", "gas") else "left")
    for x in chain.txs:
        t.add_row(
            "finalize" if x.kind == "finalize" else f"round {x.round}",
            x.tx_hash or "-",
            x.status,
            str(x.confirmations),
            "-" if x.gas_used is None else str(x.gas_used),
        )
    return fit(t, whole=("hash",), drop=("gas", "confirmations"))


def partial_note(res: Payments) -> str:
    """Why the payments shown may still grow: the run goes on, or its settlement does."""
    if res.status not in ENDED:
        return f"Payments so far: the run is {res.status}; each round is paid once it is settled."
    return (
        f"Partial: the run is {res.status} but the coordinator is still settling it; "
        "amounts may still grow (without --no-wait, payments waits for them)."
    )


def payments_table(res: dict[str, Any]) -> Table:
    chain = res.get("chain")
    where = f"EVM chain {chain['chain_id']}, AIT" if chain else f"{res['network']} network, AIT"
    t = Table(title=f"Payments of {res['training_id']} ({where})")
    for col in (
        "worker",
        "price/round",
        "rounds accepted",
        "score",
        "paid",
        "bond",
        "slashed",
        "reputation",
        "flags",
        "contract",
    ):
        t.add_column(col, justify="left" if col in ("worker", "flags", "contract") else "right")
    for r in res["data"]:
        t.add_row(
            r["worker_id"],
            format_price(r["price_micro"]),
            str(r["rounds_accepted"]),
            fmt(r["score"], ".3f"),
            r["paid"],
            r["bond"],
            r["slashed"],
            fmt(r["reputation"], ".2f"),
            ", ".join(r["flags"]),
            r["status"],
        )
    return fit(
        t,
        whole=("worker",),
        drop=("reputation", "flags", "contract", "rounds accepted", "bond", "score", "price/round"),
    )


def report(
    training_id: RunIdOpt,
    output: Annotated[
        Path,
        typer.Option("-o", "--output", help="Folder to write the report into (made if missing).", show_default=False),
    ],
    coordinator: CoordinatorOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the written paths as JSON.")] = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Write a report of the run into a folder: PNG plots and a self-contained report.html.

    The plots: loss and accuracy (or perplexity) by round, a worker-by-round heatmap of
    scores, bytes per round; the page adds the run's numbers. Of a running run: the report
    so far."""
    from aitbc.reports import from_run, prepare_dir, write_report

    home = resolve_home(home)
    prepare_dir(output)  # a folder we cannot write refuses (exit 2) before anything is fetched
    with run_agent(home, coordinator, training_id) as a:
        res = a.get_results(training_id)
        data = from_run(  # the reports read the replies as the JSON they came as
            results=res.model_dump(mode="json"),
            rounds=_rounds_evaluated(a, training_id, ended=res["status"] in ENDED),
            scores=[s.model_dump(mode="json") for s in a.get_round_scores(training_id)],
            payments=_settled_payments(a, training_id).model_dump(mode="json"),
        )
    paths = write_report(data, output)
    if json_out:
        emit_json({"training_id": training_id, **{k: str(v) for k, v in paths.items()}})
        return
    say(f"Report of {training_id} ({res['status']}, {res['rounds_completed']} rounds) in {output}:")
    say(*(f"  {p}" for p in paths.values()))


EVAL_WAIT_SECONDS = 30.0  # an ended run's last evaluations land a moment after it ends


def _settled_payments(a: Agent, training_id: str) -> Payments:
    """An ended run's payments once settled, waiting at most ``EVAL_WAIT_SECONDS``; then as
    they stand (the report shows the round they are settled through)."""
    from aitbc_agent_sdk import SettlementTimeout

    try:
        return a.get_payments(training_id, timeout=EVAL_WAIT_SECONDS)
    except SettlementTimeout:
        return a.get_payments(training_id, wait=False)


def _rounds_evaluated(a: Agent, training_id: str, *, ended: bool) -> list[dict[str, Any]]:
    """The run's rounds (as JSON), an ended run's once the evaluations due have landed, for
    at most ``EVAL_WAIT_SECONDS``; any still pending the report marks, not draws across."""
    until = time.monotonic() + EVAL_WAIT_SECONDS
    while True:
        rounds = [r.model_dump(mode="json") for r in a.get_rounds(training_id)]
        if not ended or not any(r["eval_pending"] for r in rounds) or time.monotonic() > until:
            return rounds
        time.sleep(0.5)
