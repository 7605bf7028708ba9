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
    measured_line,
    run_agent,
    say,
)
from aitbc.training.tokenizer import DEFAULT_VOCAB, MAX_VOCAB, MIN_VOCAB, check_vocab_size  # tokenizers: on use


def upload_data(
    training_id: RunIdOpt,
    data_path: Annotated[
        str,
        typer.Option(
            "--data-path",
            help="digits, stdlib, a text file or folder, a .jsonl or .parquet file or a folder of them, "
            "a datasets save_to_disk directory, or an .npz file.",
            show_default=False,
        ),
    ],
    alpha: Annotated[float | None, typer.Option(help="Dirichlet label skew of the shards (IID if unset).")] = None,
    max_bytes: MaxBytes = defaults.MAX_CORPUS_BYTES,
    text_field: Annotated[str, typer.Option(help=".jsonl/.parquet/saved dataset: the records' text field.")] = "text",
    vocab_size: Annotated[
        int | None,
        typer.Option(
            help=f"hf:... models: tokens of the BPE trained on the corpus ({MIN_VOCAB + 1}..{MAX_VOCAB}; "
            f"default {DEFAULT_VOCAB}, fewer if the corpus supports fewer).",
            show_default=False,
        ),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="hf:... models: your own tokenizer.json instead of training one.", show_default=False),
    ] = None,
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
    if not text_field:
        raise checks.OptionError("--text-field must not be empty")
    if vocab_size is not None:
        check_vocab_size(vocab_size)
    with (
        run_agent(home, coordinator, training_id, wallet, need_wallet=True) as a,
        checks.naming_flags("alpha", "max_bytes", "text_field", "vocab_size", "tokenizer", data_path="--data-path"),
        bars(json_out) as progress,  # packaging, uploading: on stderr, at a terminal only
    ):
        up = a.upload_data(
            training_id,
            data_path,
            alpha=alpha,
            max_bytes=max_bytes,
            text_field=text_field,
            vocab_size=vocab_size,
            tokenizer=tokenizer,
            progress=progress,
        )
    if json_out:
        keys = ("training_id", "manifest_cid", "shards", "val_cid", "samples", "data_bytes", "dataset")
        emit_json({k: up[k] for k in (*keys, "measured", "tokenizer_cid", "vocab_size")})
        return
    say(
        "Data uploaded",
        f"Training ID: {training_id}",
        f"Dataset: {up['dataset']} ({up['task']}, {up['samples']} training samples, {up['val_samples']} validation)",
        f"Shards: {len(up['shards'])}",
        f"Size: {measured_line(up['measured'], up['data_bytes'])} (declared {up['dataset_size']})",
        *([f"Tokenizer: {up['vocab_size']} tokens, CID {up['tokenizer_cid']}"] if up.get("tokenizer_cid") else []),
        f"Manifest CID: {up['manifest_cid']}",
    )
