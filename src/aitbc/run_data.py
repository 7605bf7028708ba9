"""A dataset made ready for a live run on the owner's machine: loaded, checked against the
run's model, cut into shards with a validation split, every piece named by its CID, and
the manifest that lists them. ``aitbc distributed-training upload-data`` and the SDK's
``create_data_shards`` both upload what :func:`prepare_run_data` returns.

A model with a tokenizer (the Hugging Face families) trains on tokens: its text is
tokenized (a BPE trained on it, or the owner's ``tokenizer.json``), the tokenizer is one more
blob, and the shards hold token windows of the model's context. The built-in models read
bytes and arrays as before."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aitbc.errors import AitbcError, UsageError
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.datasets import DataOptions, Dataset, load_dataset
from aitbc.training.hf_models import is_hf
from aitbc.training.models import build_model, model_config
from aitbc.training.packaging import (
    PackagedDataset,
    TokenizerBlob,
    manifest_bytes,
    package,
    resolve_source,
)
from aitbc.training.tokenizer import DEFAULT_VOCAB, check_vocab_size


@dataclass(frozen=True, slots=True)
class TextOptions:
    """How text becomes a run's data: ``text_field`` of ``.jsonl``/``.parquet``/saved records;
    for a model with a tokenizer, ``vocab_size`` of the BPE trained on the corpus, or the
    owner's ``tokenizer`` (a tokenizer.json path) instead; ``run_tokenizer``: the bytes of
    the tokenizer the run's model came with (its options' ``tokenizer`` blob, from
    ``init --from-pretrained``), which the data must use."""

    text_field: str = "text"
    vocab_size: int | None = None  # None: DEFAULT_VOCAB
    tokenizer: str | None = None
    run_tokenizer: bytes | None = None

    def check(self, model_type: str) -> None:
        if not is_hf(model_type) and (self.tokenizer is not None or self.vocab_size is not None):
            raise UsageError(
                f"--tokenizer and --vocab-size are for models with a tokenizer (hf:...); {model_type!r} reads bytes"
            )
        if (self.tokenizer is not None or self.run_tokenizer is not None) and self.vocab_size is not None:
            raise UsageError(
                "--vocab-size is for a tokenizer trained on the corpus; this one brings its own vocabulary"
            )
        if self.tokenizer is not None and self.run_tokenizer is not None:
            raise UsageError(
                "the run's pretrained model came with its tokenizer (its options' tokenizer); drop --tokenizer"
            )
        if self.vocab_size is not None:
            check_vocab_size(self.vocab_size)


@dataclass(frozen=True)
class RunData:
    dataset: Dataset
    packaged: PackagedDataset
    shard_cids: list[str]
    val_cid: str
    manifest: bytes
    manifest_cid: str
    tokenizer: bytes | None = None  # the tokenizer.json the manifest names (token data)
    tokenizer_blob: TokenizerBlob | None = field(default=None)

    def blobs(self) -> list[tuple[str, bytes]]:
        """``(cid, bytes)`` to upload, the manifest last (it names the others)."""
        tok = (
            [] if self.tokenizer is None or self.tokenizer_blob is None else [(self.tokenizer_blob.cid, self.tokenizer)]
        )
        return [
            *zip(self.shard_cids, self.packaged.shards),
            (self.val_cid, self.packaged.val),
            *tok,
            (self.manifest_cid, self.manifest),
        ]


def prepare_run_data(
    run: dict[str, Any],
    data_path: str,
    *,
    shards: int,
    alpha: float | None = None,
    max_bytes: int | None = None,
    text: TextOptions | None = None,
) -> RunData:
    """``run``: the run's detail from the API (model_type, model_options, seed)."""
    text = text or TextOptions()
    source = resolve_source(data_path)
    tokenized = is_hf(run["model_type"])
    text.check(run["model_type"])
    mcfg = model_config(run["model_type"], run["model_options"])
    seq_len = int(getattr(mcfg, "context", 128))
    cap = {} if max_bytes is None else {"max_bytes": max_bytes}
    opts = DataOptions(seed=run["seed"], seq_len=seq_len, text_field=text.text_field, **cap)
    tok_bytes, tok_blob = None, None
    if tokenized:
        from aitbc.training.token_data import TokenOptions, tokenized_dataset  # tokenizers: on use

        td = tokenized_dataset(
            source,
            TokenOptions(
                seq_len,
                opts.max_bytes,
                text.text_field,
                text.vocab_size or DEFAULT_VOCAB,
                text.tokenizer,
                text.run_tokenizer,
            ),
        )
        data, tok_bytes = td.dataset, td.tokenizer.data
        tok_blob = TokenizerBlob(cid_of_bytes(tok_bytes), td.tokenizer.vocab_size)
    else:
        data = load_dataset(source, opts)
    if tokenized:
        _check_vocab(run, data)
    else:
        _check_fit(run, data)
    packaged = package(data, shards, seed=run["seed"], alpha=alpha)
    cids = [cid_of_bytes(b) for b in packaged.shards]
    val_cid = cid_of_bytes(packaged.val)
    manifest = manifest_bytes(data, packaged, cids, val_cid, seed=run["seed"], alpha=alpha, tokenizer=tok_blob)
    return RunData(data, packaged, cids, val_cid, manifest, cid_of_bytes(manifest), tok_bytes, tok_blob)


def _check_vocab(run: dict[str, Any], data: Dataset) -> None:
    """A model with a tokenizer takes its vocabulary from the data; one set in its options
    must cover it (a pretrained model may have more embedding rows than its tokenizer has
    tokens; the model's own build, on the coordinator and the workers, checks the rest)."""
    fixed = (run.get("model_options") or {}).get("vocab_size")
    if isinstance(fixed, int) and fixed < data.spec.num_classes:
        raise UsageError(
            f"model {run['model_type']!r} has vocab_size {fixed}; the data's tokenizer has {data.spec.num_classes} "
            f"tokens (use a tokenizer of at most {fixed} tokens, or leave vocab_size unset)"
        )


def _check_fit(run: dict[str, Any], data: Dataset) -> None:
    try:
        # the owner's own machine and own run: their module:callable is their own code
        build_model(run["model_type"], data.spec, run["model_options"], allow_code=True)
    except AitbcError:
        raise
    except Exception as e:  # noqa: BLE001 - a model/data mismatch surfaces as any torch error
        raise UsageError(
            f"model {run['model_type']!r} does not fit dataset {data.name!r} ({data.spec.task}): {e}"
        ) from None
