"""Creating a run and driving it: ``init``, ``distribute`` (with ``--log-to``, it follows
the run as ``monitor`` does), ``stop``, ``pause``, ``resume``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from aitbc import run_defaults as defaults
from aitbc.cli import checks
from aitbc.cli.common import DEFAULT_HOME, HomeOption, agent, err, naming_wallet, out, resolve_home
from aitbc.cli.options import (
    Aggregator,
    BatchSize,
    Buffer,
    Compression,
    Deadline,
    ErrorFeedback,
    EvalEvery,
    LocalSteps,
    Lr,
    MaxStaleness,
    Mode,
    ModelOpt,
    Outer,
    OuterLr,
    OuterMomentum,
    Quorum,
    Rounds,
    Seed,
    Staleness,
    Topology,
)
from aitbc.cli.training.follow import closing, follow, open_tracker
from aitbc.cli.training.plumbing import (
    CoordinatorOpt,
    JsonOpt,
    LogToOpt,
    RunIdOpt,
    WalletOpt,
    api_view,
    emit_json,
    recall,
    remember,
    run_agent,
    say,
)
from aitbc.core.options import parse_kv
from aitbc.errors import NotFoundError, UsageError
from aitbc.run_mode import RunMode
from aitbc.units import format_price

OwnerWallet = Annotated[
    str, typer.Option("--wallet", help="The owner's wallet (created if it does not exist).", show_default=False)
]
ModelType = Annotated[
    str | None,
    typer.Option(
        "--model-type",
        help="mlp, cnn, transformer (options bounded: see the README's trust model); a package.module:callable "
        "only where the coordinator's and the workers' operators allowed it (--allow-code).",
        show_default=False,
    ),
]
DatasetSize = Annotated[
    str,
    typer.Option(
        "--dataset-size",
        help="Declared size, e.g. 100GB (the real size is measured at upload).",
        show_default=False,
    ),
]
TargetWorkers = Annotated[
    int, typer.Option("--target-workers", help="Workers (and data shards) to plan for.", show_default=False)
]
Budget = Annotated[
    str | None,
    typer.Option(help="AIT to escrow now from the wallet (default: distribute escrows the contracts' cost)."),
]
Bond = Annotated[
    str, typer.Option(help="AIT each hired provider locks for the run (slashed for provable misbehaviour).")
]
Network = Annotated[str, typer.Option(help="Ledger network: local (this build settles on the local ledger only).")]
FromPretrained = Annotated[
    Path | None,
    typer.Option(
        "--from-pretrained",
        help="Fine-tune a local Hugging Face model directory (config.json, *.safetensors, tokenizer.json): its "
        "weights and tokenizer are uploaded for the run, --model-type and the options come from its config "
        "(--model-opt overrides, e.g. context=64). Weights are read as safetensors only; a .bin is refused.",
        show_default=False,
    ),
]
Lora = Annotated[
    str | None,
    typer.Option(
        "--lora",
        help="With --from-pretrained: train a LoRA adapter only, e.g. r=16,alpha=32,dropout=0.05,targets=q_proj,v_proj.",
        show_default=False,
    ),
]

Strategy = Annotated[str, typer.Option(help="data-parallel (the one strategy this build runs).")]
ChainTimeout = Annotated[
    int | None,
    typer.Option(
        "--chain-timeout",
        help="On an EVM coordinator: seconds without a settlement after which the run's escrow on chain closes "
        "and you and the providers take your money back without the coordinator (default 3600, at least four "
        "--deadline and 600).",
        show_default=False,
    ),
]
MinWorkers = Annotated[int | None, typer.Option(help="Fewest workers the run trains with (default 1).")]
MaxWorkers = Annotated[int | None, typer.Option(help="Most workers, joiners included (default: target workers).")]
VerifyRate = Annotated[
    float,
    typer.Option(
        min=0.0,
        max=1.0,
        help="Spot checks: the expected share of each update's local steps the coordinator re-runs "
        "(0: none). Verified updates are paid in full; one that fails is rejected and its worker slashed.",
    ),
]
Overlap = Annotated[
    int,
    typer.Option(
        min=0,
        max=2,
        help="Overlapping rounds: 1 lets a worker start round r+1 from the newest published model as soon "
        "as it has sent round r, its update applied to the newer model (one-step delay: less idle time). "
        "2 lets it train two rounds ahead and send the next round's update before that round opens "
        "(two-step delay: for rounds whose close and model download take longer than their compute). "
        "0: synchronous rounds.",
    ),
]
Precision = Annotated[
    str,
    typer.Option(
        help="The workers' inner steps: fp32, or bf16 (bfloat16 autocast on CPU and CUDA; weights, "
        "gradients and optimizer state stay float32).",
    ),
]


def init(
    wallet: OwnerWallet,
    dataset_size: DatasetSize,
    target_workers: TargetWorkers,
    model_type: ModelType = None,
    model_opt: ModelOpt = None,
    from_pretrained: FromPretrained = None,
    lora: Lora = None,
    seed: Seed = 0,
    budget: Budget = None,
    bond: Bond = "0",
    network: Network = "local",
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Create a training run."""
    from aitbc.ledger.chain import LedgerError, check_network  # not .book: no SQLAlchemy for a CLI command
    from aitbc.ledger.wallet import create_wallet, load_wallet

    home = resolve_home(home)
    checks.at_least(target_workers, 1, "--target-workers")
    try:
        check_network(network)
    except LedgerError as e:
        raise UsageError(f"--network: {e.detail}") from None
    model_options = parse_kv(model_opt or [], what="--model-opt")
    checks.size(dataset_size)
    if from_pretrained is None:
        if lora is not None:
            raise checks.OptionError("--lora: a LoRA adapter adapts pretrained weights; give --from-pretrained DIR too")
        if model_type is None:
            raise checks.OptionError("--model-type is required (or --from-pretrained DIR, whose config names it)")
        checks.model(model_type, model_options)
    else:
        checks.pretrained(from_pretrained, model_type, lora)
    if budget is not None:
        checks.amount(budget, option="--budget")
    checks.price(bond, option="--bond")
    try:
        load_wallet(home, wallet)
    except NotFoundError:
        w = create_wallet(home, wallet)
        err.print(f"created wallet {wallet} ({w.address})", highlight=False)
    with (
        agent(home, coordinator, wallet, network) as a,
        naming_wallet(wallet),
        checks.naming_flags(
            "model_type", "dataset_size", "target_workers", "seed", "budget", "bond", model_options="--model-opt"
        ),
    ):
        run = a.initialize_distributed_training(
            model_type,
            dataset_size,
            target_workers,
            model_options=model_options,
            seed=seed,
            budget=budget,
            bond=bond,
            from_pretrained=from_pretrained,
            lora=lora,
        )
        url = a.config.resolved_coordinator_url
    remember(home, run["training_id"], wallet, url)
    if json_out:
        emit_json(api_view(run))
        return
    say(
        "Distributed training initialized",
        f"Training ID: {run['training_id']}",
        f"Model Type: {run['model_type']}",
        f"Dataset Size: {run['dataset_size']}",
        f"Target Workers: {run['target_workers']}",
        f"Status: {run['status']}",
    )


DISTRIBUTE_FIELDS = (
    "rounds",
    "local_steps",
    "batch_size",
    "lr",
    "outer",
    "aggregator",
    "compression",
    "error_feedback",
    "deadline",
    "quorum",
    "min_workers",
    "max_workers",
    "eval_every",
    "verify_rate",
    "overlap",
    "precision",
    "mode",
    "buffer",
    "max_staleness",
    "staleness",
    "topology",
)


def distribute(
    training_id: RunIdOpt,
    strategy: Strategy = "data-parallel",
    rounds: Rounds = defaults.ROUNDS,
    local_steps: LocalSteps = defaults.LOCAL_STEPS,
    batch_size: BatchSize = defaults.BATCH_SIZE,
    lr: Lr = defaults.LR,
    outer: Outer = defaults.OUTER,
    outer_lr: OuterLr = None,
    outer_momentum: OuterMomentum = None,
    aggregator: Aggregator = None,
    compression: Compression = defaults.COMPRESSION,
    error_feedback: ErrorFeedback = defaults.ERROR_FEEDBACK,
    mode: Mode = defaults.MODE,
    deadline: Deadline = None,
    quorum: Quorum = None,
    min_workers: MinWorkers = None,
    max_workers: MaxWorkers = None,
    eval_every: EvalEvery = defaults.EVAL_EVERY,
    verify_rate: VerifyRate = defaults.VERIFY_RATE,
    overlap: Overlap = defaults.OVERLAP,
    precision: Precision = defaults.PRECISION,
    buffer: Buffer = None,
    max_staleness: MaxStaleness = 4,
    staleness: Staleness = "polynomial",
    topology: Topology = "ring",
    chain_timeout: ChainTimeout = None,
    log_to: LogToOpt = None,
    coordinator: CoordinatorOpt = None,
    wallet: WalletOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Assign shards to the hired workers and start the rounds.

    With --log-to, stay attached like monitor: write each closed round's metrics to the
    tracker until the run ends (exit 1 if it fails; Ctrl-C detaches, the run goes on).
    On an EVM coordinator the run's escrow is deposited on chain first (once)."""
    knobs = {name: value for name, value in locals().items() if name in DISTRIBUTE_FIELDS}  # as the SDK names them
    home = resolve_home(home)
    outer_options = checks.outer_options(outer_lr, outer_momentum)
    _check_distribute(strategy, mode, topology, outer, aggregator, compression, precision, outer_options)
    _check_chain_timeout(chain_timeout, deadline)
    tracker = open_tracker(log_to, training_id)  # refused (exit 2) before anything is distributed
    with (
        closing(tracker),
        run_agent(home, coordinator, training_id, wallet, need_wallet=True) as a,
        naming_wallet(wallet or recall(home, training_id).get("wallet")),
        checks.naming_flags(*DISTRIBUTE_FIELDS, "chain_timeout"),
    ):
        # A run without a budget escrows its contracts' cost now; the SDK signs the most
        # it may be (price x rounds) as max_cost.
        run = a.start_training(
            training_id,
            **knobs,
            outer_options=outer_options or None,
            chain_timeout=chain_timeout,
            progress=_deposit_lines,
        )
        if json_out:
            emit_json(api_view(run))
        else:
            _say_distributed(api_view(run), strategy)
        if tracker is not None:
            follow(a, training_id, tracker, log_to, quiet=json_out)


def _check_chain_timeout(chain_timeout: int | None, deadline: float | None) -> None:
    least = defaults.min_chain_timeout(deadline)
    if chain_timeout is not None and chain_timeout < least:
        raise UsageError(
            f"--chain-timeout must be at least {least} s (600, and four round deadlines of "
            f"{deadline or defaults.DEADLINE:g} s), got {chain_timeout}"
        )


def _deposit_lines(stage: str, done: int, total: int) -> None:
    """The SDK's ``deposit`` stage on standard error: once before its transactions, once after."""
    if stage != "deposit":
        return
    if done < total:
        err.print(
            f"depositing {format_price(total - done)} AIT into the run's escrow on chain (approve, then deposit) ...",
            highlight=False,
        )
    else:
        err.print(f"deposited on chain: the run's escrow holds {format_price(total)} AIT", highlight=False)


def _check_distribute(
    strategy: str,
    mode: str,
    topology: str,
    outer: str,
    aggregator: str | None,
    compression: str,
    precision: str,
    outer_options: dict[str, float] | None = None,
) -> None:
    """The choices ``distribute`` refuses before it talks to the coordinator (exit 2)."""
    if strategy != "data-parallel":
        raise UsageError(f"--strategy {strategy!r} is not available; this build runs: data-parallel")
    run_mode = RunMode.parse(mode)
    if run_mode is None:
        raise UsageError(f"--mode {mode!r} is not a mode; choose one of: {', '.join(RunMode)}")
    if run_mode.peer_to_peer:
        checks.topology(topology)
    checks.outer(outer, outer_options)
    if aggregator is not None:  # none: the codec's, resolved by the coordinator
        checks.aggregator(aggregator)
    checks.codec(compression)
    if precision not in defaults.PRECISIONS:
        raise UsageError(f"--precision {precision!r} is not available; choose one of: {', '.join(defaults.PRECISIONS)}")


def _say_distributed(run: dict[str, Any], strategy: str) -> None:
    cfg = run["config"]
    per_round = sum(ct["price_micro"] for ct in run["contracts"] if ct["status"] == "working")
    say(
        "Training distributed",
        f"Training ID: {run['training_id']}",
        f"Strategy: {strategy}",
        f"Workers: {len(run['workers'])} on {run['shards']} shards",
        f"Rounds: {cfg['rounds']} x {cfg['local_steps']} local steps",
        f"Aggregator: {cfg['aggregator']}   Compression: {cfg['compression']}   Outer: {cfg['outer']}",
        f"Verification: {_verification_line(cfg)}",
        f"Rounds overlap: {_overlap_line(cfg.get('overlap') or 0)}",
        f"Estimated cost: {format_price(per_round * cfg['rounds'])} AIT",
        f"Status: {run['status']}",
    )


def _overlap_line(overlap: int) -> str:
    if not overlap:
        return "no (synchronous)"
    return "yes (one-step delay)" if overlap == 1 else f"yes ({overlap} rounds ahead, {overlap}-step delay)"


def _verification_line(cfg: dict[str, Any]) -> str:
    rate = float(cfg.get("verify_rate") or 0.0)
    if not rate:
        return "none (updates are scored, not re-run; --verify-rate to spot-check them)"
    return f"spot checks re-run {rate:.0%} of each update's steps (about {rate:.0%} extra compute on the coordinator)"


def _control(
    action: str, training_id: str, coordinator: str | None, wallet: str | None, json_out: bool, home: Path
) -> None:
    """``action``: stop, pause or resume (the agent's ``<action>_training``)."""
    home = resolve_home(home)
    with run_agent(home, coordinator, training_id, wallet, need_wallet=True) as a:
        run = getattr(a, f"{action}_training")(training_id)
    if json_out:
        emit_json(run)
    else:
        out.print(f"Run {training_id}: {run['status']}", highlight=False)


def stop(
    training_id: RunIdOpt,
    coordinator: CoordinatorOpt = None,
    wallet: WalletOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """End a run now (its workers are released)."""
    _control("stop", training_id, coordinator, wallet, json_out, home)


def pause(
    training_id: RunIdOpt,
    coordinator: CoordinatorOpt = None,
    wallet: WalletOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Hold a run after its current round's updates (resume continues it)."""
    _control("pause", training_id, coordinator, wallet, json_out, home)


def resume(
    training_id: RunIdOpt,
    coordinator: CoordinatorOpt = None,
    wallet: WalletOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Continue a paused run."""
    _control("resume", training_id, coordinator, wallet, json_out, home)
