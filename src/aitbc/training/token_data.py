"""Language data as tokens, for a model with a tokenizer (the Hugging Face families): the
corpus's documents, the run's tokenizer (trained on them, or the owner's), one token stream
with the end-of-text id after each document, packed into windows of ``T = context`` tokens.

``x`` ``(N, T)`` and ``y`` ``(N, T)`` int32, ``y`` shifted by one token; the *last* 10% of
the stream is held out for validation, as for bytes. ``DataSpec("language", (T,), V)`` with
``V`` the tokenizer's vocabulary size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from aitbc.errors import UsageError
from aitbc.training.corpus import DEFAULT_TEXT_FIELD, Measured, read_documents
from aitbc.training.data_spec import DataSpec
from aitbc.training.datasets import DATASETS, STDLIB_BYTES, TEXT_VAL_FRACTION, Dataset, stdlib_files, windows
from aitbc.training.tokenizer import (
    DEFAULT_VOCAB,
    RunTokenizer,
    encode_documents,
    load_tokenizer,
    read_tokenizer,
    tokenizer_from_bytes,
    train_tokenizer,
)

TOKEN_DTYPE = torch.int32  # ids up to 65535 and beyond; the models' embeddings take any integer dtype
TEXT_SOURCES = ("text", "docs", "stdlib")


@dataclass(frozen=True, slots=True)
class TokenOptions:
    seq_len: int  # tokens per sample: the model's context
    max_bytes: int
    text_field: str = DEFAULT_TEXT_FIELD
    vocab_size: int = DEFAULT_VOCAB  # a trained tokenizer's size at most
    tokenizer: str | None = None  # the owner's tokenizer.json; None: train one
    tokenizer_data: bytes | None = None  # the run's own tokenizer (a pretrained model's); used first


@dataclass(frozen=True, slots=True)
class TokenizedDataset:
    dataset: Dataset
    tokenizer: RunTokenizer


def source_documents(source: str, opts: TokenOptions) -> tuple[list[str], Measured]:
    """The documents of a resolved ``--data-path`` (``text:PATH``, ``docs:PATH``, ``stdlib``)."""
    name, _, arg = source.partition(":")
    if name not in TEXT_SOURCES:
        allowed = ", ".join(n for n in DATASETS.names() if n in TEXT_SOURCES)
        raise UsageError(f"dataset {source!r} is not text; a model with a tokenizer trains on text ({allowed})")
    if name == "stdlib":
        return _stdlib_documents(opts.max_bytes)
    return read_documents(arg, opts.text_field, max_bytes=opts.max_bytes)


def _stdlib_documents(max_bytes: int) -> tuple[list[str], Measured]:
    cap, documents, size = min(max_bytes, STDLIB_BYTES), [], 0
    for f in stdlib_files():
        data = f.read_bytes()[: cap - size]
        documents.append(data.decode("utf-8", errors="replace"))
        size += len(data)
        if size >= cap:
            break
    return documents, Measured(bytes=size, documents=len(documents))


def tokenized_dataset(source: str, opts: TokenOptions) -> TokenizedDataset:
    """``source``'s documents through the run's tokenizer, packed into windows."""
    documents, measured = source_documents(source, opts)
    if opts.tokenizer_data is not None:
        tok = tokenizer_from_bytes(opts.tokenizer_data, "the run's tokenizer")
    elif opts.tokenizer is not None:
        tok = read_tokenizer(opts.tokenizer)
    else:
        tok = train_tokenizer(documents, opts.vocab_size)
    return TokenizedDataset(pack_documents(documents, tok, name=source, seq_len=opts.seq_len, measured=measured), tok)


def pack_documents(documents: list[str], tok: RunTokenizer, *, name: str, seq_len: int, measured: Measured) -> Dataset:
    """One stream (each document's ids, then end-of-text), its last 10% held out, each part
    cut into windows of ``seq_len`` tokens."""
    T = seq_len
    stream = encode_documents(load_tokenizer(tok.data), documents, tok.eot_id)
    n_val = int(len(stream) * TEXT_VAL_FRACTION)
    if len(stream) - n_val < 2 * (T + 1) or n_val < T + 1:
        raise UsageError(
            f"text corpus {name!r} has {len(stream)} tokens; need at least {10 * (T + 1)} "
            f"for sequences of {T} tokens (a larger corpus, or a smaller model context)"
        )
    ids = torch.tensor(stream, dtype=TOKEN_DTYPE)  # (L,)
    tx, ty = windows(ids[: len(ids) - n_val], T)
    vx, vy = windows(ids[len(ids) - n_val :], T)
    measured = dataclasses.replace(measured, tokens=len(stream), samples=len(tx), val_samples=len(vx))
    return Dataset(name, DataSpec("language", (T,), tok.vocab_size), tx, ty, vx, vy, measured)


__all__ = ["TOKEN_DTYPE", "TokenOptions", "TokenizedDataset", "pack_documents", "source_documents", "tokenized_dataset"]
