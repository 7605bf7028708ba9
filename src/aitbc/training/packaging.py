"""A dataset as blobs for a live run: one safetensors blob per shard, one for the
validation split, the tokenizer's JSON (token data), and a JSON manifest that names them by
CID (``aitbc.manifest/1``), with what was measured (bytes, documents, tokens, samples).

``upload-data`` builds these on the owner's machine and uploads them; the coordinator reads
the manifest to plan jobs and to evaluate each round's model on the validation split.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from aitbc.errors import NotFoundError, UsageError
from aitbc.training.checkpoint import shard_bytes
from aitbc.training.corpus import is_document_corpus
from aitbc.training.datasets import DATASETS, Dataset
from aitbc.training.sharding import shard_indices

MANIFEST_FORMAT = "aitbc.manifest/1"
MAX_VAL_SAMPLES = 2048  # the coordinator scores every round on at most this many


def resolve_source(source: str) -> str:
    """What ``--data-path`` names, as a dataset spec: a registered dataset (``digits``,
    ``stdlib``, ``text:PATH``, ``docs:PATH``, ``npz:PATH``), an ``.npz`` file, documents
    (``docs:``: a ``.jsonl`` or ``.parquet`` file, a ``save_to_disk`` directory, a folder
    holding any of them), or a text file or folder (``text:``, read as bytes)."""
    name, sep, _ = source.partition(":")
    if name in DATASETS.names() and (sep or not Path(source).exists()):
        return source
    path = Path(source).expanduser()
    if not path.exists():
        raise NotFoundError(
            f"--data-path {source!r}: no such file or folder, and not a dataset name "
            f"(one of: {', '.join(DATASETS.names())}, or a text, .jsonl or .parquet file, a folder of them, "
            f"a save_to_disk directory, or an .npz file)"
        )
    if path.is_file() and path.suffix == ".npz":
        return f"npz:{path}"
    return f"docs:{path}" if is_document_corpus(path) else f"text:{path}"


@dataclass(frozen=True, slots=True)
class TokenizerBlob:
    """The run's tokenizer as the manifest names it."""

    cid: str
    vocab_size: int


@dataclass(frozen=True, slots=True)
class PackagedDataset:
    shards: list[bytes]  # one safetensors blob per shard
    samples: list[int]
    val: bytes
    val_samples: int


def package(data: Dataset, k: int, *, seed: int, alpha: float | None = None) -> PackagedDataset:
    n = data.train_x.shape[0]
    if n < k:
        raise UsageError(f"dataset {data.name!r} has {n} training samples; cannot split it into {k} shards")
    parts = shard_indices(n, k, seed=seed, labels=data.labels, alpha=alpha)
    shards = [
        shard_bytes(data.train_x[p], data.train_y[p], dataset=data.name, index=i, count=k) for i, p in enumerate(parts)
    ]
    m = min(MAX_VAL_SAMPLES, data.val_x.shape[0])
    val = shard_bytes(data.val_x[:m], data.val_y[:m], dataset=f"{data.name}:val", index=0, count=1)
    return PackagedDataset(shards, [len(p) for p in parts], val, m)


def manifest_bytes(
    data: Dataset,
    packaged: PackagedDataset,
    shard_cids: list[str],
    val_cid: str,
    *,
    seed: int,
    alpha: float | None,
    tokenizer: TokenizerBlob | None = None,
) -> bytes:
    """The manifest's JSON: ``tokenizer`` (token data only) and ``measured`` are newer keys;
    a reader of older manifests finds neither."""
    manifest: dict[str, object] = {
        "format": MANIFEST_FORMAT,
        "dataset": data.name,
        "seed": seed,
        "alpha": alpha,
        "spec": {
            "task": data.spec.task,
            "input_shape": list(data.spec.input_shape),
            "num_classes": data.spec.num_classes,
        },
        "shards": [{"cid": c, "samples": s} for c, s in zip(shard_cids, packaged.samples)],
        "val": {"cid": val_cid, "samples": packaged.val_samples},
    }
    if data.measured is not None:
        manifest["measured"] = data.measured.as_dict()
    if tokenizer is not None:
        manifest["tokenizer"] = {"cid": tokenizer.cid, "vocab_size": tokenizer.vocab_size}
    return json.dumps(manifest, sort_keys=True).encode()
