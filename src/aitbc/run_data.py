"""A dataset made ready for a live run on the owner's machine: loaded, checked against the
run's model, cut into shards with a validation split, every piece named by its CID, and
the manifest that lists them. ``aitbc distributed-training upload-data`` and the SDK's
``create_data_shards`` both upload what :func:`prepare_run_data` returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aitbc.errors import AitbcError, UsageError
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.datasets import DataOptions, Dataset, load_dataset
from aitbc.training.models import build_model, model_config
from aitbc.training.packaging import PackagedDataset, manifest_bytes, package, resolve_source


@dataclass(frozen=True)
class RunData:
    dataset: Dataset
    packaged: PackagedDataset
    shard_cids: list[str]
    val_cid: str
    manifest: bytes
    manifest_cid: str

    def blobs(self) -> list[tuple[str, bytes]]:
        """``(cid, bytes)`` to upload, the manifest last (it names the others)."""
        return [
            *zip(self.shard_cids, self.packaged.shards),
            (self.val_cid, self.packaged.val),
            (self.manifest_cid, self.manifest),
        ]


def prepare_run_data(
    run: dict[str, Any], data_path: str, *, shards: int, alpha: float | None = None, max_bytes: int | None = None
) -> RunData:
    """``run``: the run's detail from the API (model_type, model_options, seed)."""
    source = resolve_source(data_path)
    mcfg = model_config(run["model_type"], run["model_options"])
    cap = {} if max_bytes is None else {"max_bytes": max_bytes}
    data = load_dataset(source, DataOptions(seed=run["seed"], seq_len=getattr(mcfg, "context", 128), **cap))
    try:
        # the owner's own machine and own run: their module:callable is their own code
        build_model(run["model_type"], data.spec, run["model_options"], allow_code=True)
    except AitbcError:
        raise
    except Exception as e:  # noqa: BLE001 - a model/data mismatch surfaces as any torch error
        raise UsageError(
            f"model {run['model_type']!r} does not fit dataset {data.name!r} ({data.spec.task}): {e}"
        ) from None
    packaged = package(data, shards, seed=run["seed"], alpha=alpha)
    cids = [cid_of_bytes(b) for b in packaged.shards]
    val_cid = cid_of_bytes(packaged.val)
    manifest = manifest_bytes(data, packaged, cids, val_cid, seed=run["seed"], alpha=alpha)
    return RunData(data, packaged, cids, val_cid, manifest, cid_of_bytes(manifest))
