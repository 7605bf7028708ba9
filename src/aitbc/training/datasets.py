"""Dataset registry: ``digits``, ``text:PATH``, ``docs:PATH``, ``stdlib``, ``npz:PATH``.

A dataset is a pair of train and validation tensors plus its :class:`DataSpec`.
Classification data: ``x`` ``(N, *S)`` float32, ``y`` ``(N,)`` int64. Language data is
cut into consecutive windows of ``T = seq_len`` bytes: ``x`` ``(N, T)`` and ``y``
``(N, T)`` uint8, ``y`` being ``x`` shifted by one byte (so a window's last target is the
next window's first input). Splits are fixed by seed;
text corpora hold out their *last* 10% so no validation byte is seen in training.
``text:PATH`` reads files as raw bytes; ``docs:PATH`` reads documents (``.jsonl``,
``.parquet``, a saved dataset; see :mod:`aitbc.training.corpus`) joined by ``"\n"``.

Everything is local or shipped with installed packages: nothing is downloaded.
"""

from __future__ import annotations

import sysconfig
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from aitbc import run_defaults
from aitbc.core.registry import Registry
from aitbc.errors import NotFoundError, UsageError
from aitbc.training.corpus import DEFAULT_TEXT_FIELD, CorpusTruncated, Measured, list_files, read_documents
from aitbc.training.data_spec import DataSpec

VAL_FRACTION = 0.2  # classification hold-out
TEXT_VAL_FRACTION = 0.1
STDLIB_BYTES = 4 << 20  # the stdlib corpus: the first 4 MiB of the standard library's sources (a sample)


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    spec: DataSpec
    train_x: Tensor
    train_y: Tensor
    val_x: Tensor
    val_y: Tensor
    measured: Measured | None = None  # what was read (bytes, documents, tokens, samples)

    @property
    def labels(self) -> Tensor | None:
        """Per-sample labels for label-skewed sharding (None for language data)."""
        return self.train_y if self.spec.task == "classification" else None


@dataclass(frozen=True, slots=True)
class DataOptions:
    seed: int = 0
    seq_len: int = 128  # language data: bytes per sample
    max_bytes: int = run_defaults.MAX_CORPUS_BYTES  # language data: corpus cap (text:PATH)
    text_field: str = DEFAULT_TEXT_FIELD  # docs:PATH: the records' text field


Loader = Callable[[str | None, DataOptions], Dataset]
DATASETS: Registry[Loader] = Registry("dataset")


def load_dataset(spec: str, opts: DataOptions | None = None) -> Dataset:
    """``spec`` is ``NAME`` or ``NAME:ARG`` (e.g. ``text:/data/corpus``)."""
    opts = opts or DataOptions()
    if opts.seq_len <= 0 or opts.max_bytes <= 0:
        raise UsageError(f"seq_len and max_bytes must be positive, got {opts.seq_len}, {opts.max_bytes}")
    name, sep, arg = spec.partition(":")
    loader = DATASETS.get(name)
    return loader(arg if sep else None, opts)


def _split(x: Tensor, y: Tensor, seed: int, name: str, spec: DataSpec) -> Dataset:
    n = x.shape[0]
    if n < 2:
        raise UsageError(f"dataset {name!r} has {n} samples; need at least 2 to hold out validation")
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g)
    n_val = max(1, int(round(n * VAL_FRACTION)))
    val, train = perm[:n_val], perm[n_val:]
    measured = Measured(bytes=x.nbytes + y.nbytes, samples=len(train), val_samples=len(val))
    return Dataset(name, spec, x[train], y[train], x[val], y[val], measured)


def _no_arg(name: str, arg: str | None) -> None:
    if arg is not None:
        raise UsageError(f"dataset {name!r} takes no argument, got {name}:{arg}")


def _need_arg(name: str, arg: str | None) -> Path:
    if not arg:
        raise UsageError(f"dataset {name!r} needs a path: {name}:PATH")
    path = Path(arg).expanduser()
    if not path.exists():
        raise NotFoundError(f"no such file or directory: {arg}")
    return path


@DATASETS.register("digits")
def _digits(arg: str | None, opts: DataOptions) -> Dataset:
    """scikit-learn's bundled 8x8 handwritten digits (1797 samples, 10 classes)."""
    _no_arg("digits", arg)
    from sklearn.datasets import load_digits  # shipped with scikit-learn, no download

    d = load_digits()
    x = torch.from_numpy(d.images.astype(np.float32) / 16.0).unsqueeze(1)  # (N, 8, 8) -> (N, 1, 8, 8)
    y = torch.from_numpy(d.target.astype(np.int64))
    return _split(x, y, opts.seed, "digits", DataSpec("classification", (1, 8, 8), 10))


@DATASETS.register("npz")
def _npz(arg: str | None, opts: DataOptions) -> Dataset:
    """A NumPy ``.npz`` with arrays ``x`` (samples first) and integer labels ``y``."""
    path = _need_arg("npz", arg)
    try:
        f = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read {path} as .npz: {e}") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise UsageError(f"{path} is a single .npy array; npz:PATH needs an .npz archive with arrays 'x' and 'y'")
    with f:
        if "x" not in f.files or "y" not in f.files:
            raise UsageError(f"{path} must hold arrays 'x' and 'y'; it holds: {', '.join(f.files) or 'nothing'}")
        try:
            x_np, y_np = f["x"], f["y"]
        except (OSError, ValueError) as e:
            raise UsageError(f"cannot read arrays of {path}: {e}") from None
    if x_np.ndim < 2 or y_np.ndim != 1 or len(x_np) != len(y_np):
        raise UsageError(f"{path}: need x of shape (N, ...) and y of shape (N,); got {x_np.shape} and {y_np.shape}")
    if not (np.issubdtype(x_np.dtype, np.number) or x_np.dtype == np.bool_):
        raise UsageError(f"{path}: x must be numeric, got dtype {x_np.dtype}")
    if not np.issubdtype(y_np.dtype, np.integer) or (y_np < 0).any():
        raise UsageError(f"{path}: y must hold non-negative integer class labels, got dtype {y_np.dtype}")
    if not np.isfinite(x_np.astype(np.float64)).all():
        raise UsageError(f"{path}: x contains NaN or Inf")
    x = torch.from_numpy(x_np.astype(np.float32))
    y = torch.from_numpy(y_np.astype(np.int64))
    spec = DataSpec("classification", tuple(x.shape[1:]), int(y.max()) + 1)
    return _split(x, y, opts.seed, f"npz:{arg}", spec)


def _read_corpus(files: list[Path], max_bytes: int) -> tuple[bytes, int]:
    """The files' bytes joined by newlines, cut at ``max_bytes``, and how many were read."""
    parts, total = [], 0
    for f in files:
        data = f.read_bytes()[: max_bytes - total]
        parts.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return b"\n".join(parts)[:max_bytes], len(parts)


def _language(corpus: bytes, name: str, opts: DataOptions, documents: int) -> Dataset:
    T = opts.seq_len
    n_val_bytes = int(len(corpus) * TEXT_VAL_FRACTION)
    train, val = corpus[: len(corpus) - n_val_bytes], corpus[len(corpus) - n_val_bytes :]
    if len(train) < 2 * (T + 1) or len(val) < T + 1:
        raise UsageError(
            f"text corpus {name!r} has {len(corpus)} bytes; need at least {10 * (T + 1)} "
            f"for sequences of {T} bytes (lower the model context)"
        )
    spec = DataSpec("language", (T,), 256)
    tx, ty = windows(torch.frombuffer(bytearray(train), dtype=torch.uint8), T)
    vx, vy = windows(torch.frombuffer(bytearray(val), dtype=torch.uint8), T)
    measured = Measured(len(corpus), documents, len(corpus), len(tx), len(vx))
    return Dataset(name, spec, tx, ty, vx, vy, measured)


def windows(buf: Tensor, T: int) -> tuple[Tensor, Tensor]:
    """A stream of ``L`` tokens (bytes or ids) ``(L,)`` as ``N = (L - 1) // T`` consecutive
    windows: ``x`` ``(N, T)`` and ``y`` ``(N, T)``, ``y`` shifted by one token."""
    n = (len(buf) - 1) // T
    x = buf[: n * T].view(n, T)  # (N, T)
    y = buf[1 : n * T + 1].view(n, T)  # (N, T), shifted by one token
    return x.clone(), y.clone()


@DATASETS.register("text")
def _text(arg: str | None, opts: DataOptions) -> Dataset:
    """A text file, or every file under a folder (sorted by path), as bytes."""
    path = _need_arg("text", arg)
    files = list_files(path)  # each real file once, symlinks and hard links included
    if not files:
        raise UsageError(f"folder {path} holds no files")
    total = sum(f.stat().st_size for f in files)
    if total > opts.max_bytes:  # said, never silent: the rest of the corpus is not trained on
        warnings.warn(
            CorpusTruncated(
                f"text corpus {arg} holds {total:,} bytes; only the first {opts.max_bytes:,} "
                f"({opts.max_bytes / total:.1%}) are used (raise the cap with --max-bytes, or max_bytes=)"
            ),
            stacklevel=2,
        )
    corpus, documents = _read_corpus(files, opts.max_bytes)
    return _language(corpus, f"text:{arg}", opts, documents)


@DATASETS.register("docs")
def _docs(arg: str | None, opts: DataOptions) -> Dataset:
    """Documents (``.jsonl``, ``.parquet``, a saved dataset, a folder of them; text in
    ``opts.text_field``) as bytes, joined by newlines: the byte-level model's corpus."""
    path = _need_arg("docs", arg)
    documents, measured = read_documents(path, opts.text_field, max_bytes=opts.max_bytes)
    corpus = "\n".join(documents).encode("utf-8", errors="surrogatepass")[: opts.max_bytes]
    return _language(corpus, f"docs:{arg}", opts, measured.documents or len(documents))


@DATASETS.register("stdlib")
def _stdlib(arg: str | None, opts: DataOptions) -> Dataset:
    """The running Python's own standard-library ``.py`` sources: a real, offline corpus.

    Files are taken in sorted path order (site-packages excluded): the first
    :data:`STDLIB_BYTES` (4 MiB), or ``max_bytes`` if smaller."""
    _no_arg("stdlib", arg)
    files = stdlib_files()
    corpus, documents = _read_corpus(files, min(opts.max_bytes, STDLIB_BYTES))
    return _language(corpus, "stdlib", opts, documents)


def stdlib_files() -> list[Path]:
    """The standard library's ``.py`` files the ``stdlib`` corpus reads, in order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "__pycache__" not in p.parts)


__all__ = ["DATASETS", "CorpusTruncated", "DataOptions", "Dataset", "load_dataset", "stdlib_files", "windows"]
