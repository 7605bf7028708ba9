"""``upload-data``: one shard per target worker, uploaded with the manifest."""

from __future__ import annotations

from typing import Annotated

import typer

from aitbc import run_defaults as defaults
from aitbc.cli import checks
from aitbc.cli.common import DEFAULT_HOME, HomeOption, resolve_home
from aitbc.cli.options import MaxBytes
from aitbc.cli.progress import bars
from aitbc.cli.training.plumbing import (
    CoordinatorOpt,
    JsonOpt,
    RunIdOpt,
    WalletOpt,
    emit_json,
    human_bytes,
    run_agent,
    say,
)


def upload_data(
    training_id: RunIdOpt,
    data_path: Annotated[
        str,
        typer.Option("--data-path", help="digits, stdlib, a text file or folder, or an .npz file.", show_default=False),
    ],
    alpha: Annotated[float | None, typer.Option(help="Dirichlet label skew of the shards (IID if unset).")] = None,
    max_bytes: MaxBytes = defaults.MAX_CORPUS_BYTES,
    coordinator: CoordinatorOpt = None,
    wallet: WalletOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Split the dataset into one shard per target worker and upload shards and manifest."""
    home = resolve_home(home)
    checks.at_least(max_bytes, 1, "--max-bytes")
    checks.more_than(alpha, 0, "--alpha")
    checks.dataset(data_path)
    with (
        run_agent(home, coordinator, training_id, wallet, need_wallet=True) as a,
        checks.naming_flags("alpha", "max_bytes", data_path="--data-path"),
        bars(json_out) as progress,  # packaging, uploading: on stderr, at a terminal only
    ):
        up = a.upload_data(training_id, data_path, alpha=alpha, max_bytes=max_bytes, progress=progress)
    if json_out:
        keys = ("training_id", "manifest_cid", "shards", "val_cid", "samples", "data_bytes", "dataset")
        emit_json({k: up[k] for k in keys})
        return
    say(
        "Data uploaded",
        f"Training ID: {training_id}",
        f"Dataset: {up['dataset']} ({up['task']}, {up['samples']} training samples, {up['val_samples']} validation)",
        f"Shards: {len(up['shards'])}",
        f"Size: {human_bytes(up['data_bytes'])} measured (declared {up['dataset_size']})",
        f"Manifest CID: {up['manifest_cid']}",
    )
