"""Reading a user's corpus as documents: text files, ``.jsonl``, ``.parquet``, a folder of
them, or a directory written by ``datasets.Dataset.save_to_disk``.

A *document* is one unit of text: a text file, one JSON line's text field, one parquet row's
text column, one row of a saved dataset. Documents keep their boundaries: the byte-level path
joins them with ``"\\n"``, the tokenized path with the tokenizer's end-of-text token.

Folders are walked recursively in sorted path order, following symlinks; a file reached twice
(through a symlink or a hard link) is read once, and a symlinked folder loop is walked once.
Nothing here runs code from the data: no loading script, no pickle.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aitbc.errors import NotFoundError, UsageError

RECORD_SUFFIXES = (".jsonl", ".parquet")
SAVED_DATASET_FILES = ("state.json", "dataset_info.json")  # what save_to_disk writes beside its arrow files
DATASET_DICT_FILE = "dataset_dict.json"  # a DatasetDict's save_to_disk: one folder per split
DEFAULT_TEXT_FIELD = "text"


class CorpusTruncated(UserWarning):
    """A corpus was longer than ``max_bytes`` and was read only up to it."""


class SkippedFiles(UserWarning):
    """A folder of records also held other files, which were not read."""


@dataclass(frozen=True, slots=True)
class Measured:
    """What a dataset measured when it was read: UTF-8 ``bytes`` of its text (a classifier's:
    its arrays'), ``documents`` (None for arrays), ``tokens`` in the packed stream (bytes for
    the byte-level path; None for arrays), training ``samples`` and ``val_samples``."""

    bytes: int
    documents: int | None = None
    tokens: int | None = None
    samples: int | None = None
    val_samples: int | None = None

    def as_dict(self) -> dict[str, int | None]:
        return {
            "bytes": self.bytes,
            "documents": self.documents,
            "tokens": self.tokens,
            "samples": self.samples,
            "val_samples": self.val_samples,
        }


@dataclass(slots=True)
class _Reader:
    """Documents read so far, within ``max_bytes`` of UTF-8 text."""

    max_bytes: int
    documents: list[str] = field(default_factory=list)
    size: int = 0
    full: bool = False

    def add(self, text: str) -> bool:
        """Keep ``text`` (cut at the cap); False once the cap is reached."""
        data = text.encode("utf-8", errors="surrogatepass")
        room = self.max_bytes - self.size
        if len(data) > room:
            data = data[:room]
            text = data.decode("utf-8", errors="ignore")  # a character cut at the cap is dropped
            self.full = True
        self.documents.append(text)
        self.size += len(data)
        self.full |= self.size >= self.max_bytes
        return not self.full


def is_saved_dataset(path: Path) -> bool:
    """A directory ``save_to_disk`` wrote (a Dataset's, or a DatasetDict's)."""
    return path.is_dir() and (
        all((path / f).is_file() for f in SAVED_DATASET_FILES) or (path / DATASET_DICT_FILE).is_file()
    )


def list_files(root: Path) -> list[Path]:
    """Every file under ``root`` (or ``root`` itself), in sorted path order, each real file
    once: symlinked folders are followed, each real folder walked once (a loop ends), and a
    file reached again by another path (a symlink, a hard link) is dropped after its first."""
    if not root.is_dir():
        return [root]
    found: list[Path] = []
    seen_dirs: set[tuple[int, int]] = set()
    stack = [root]
    while stack:
        d = stack.pop()
        st = d.stat()
        if (st.st_dev, st.st_ino) in seen_dirs:
            continue
        seen_dirs.add((st.st_dev, st.st_ino))
        try:
            entries = sorted(d.iterdir())
        except OSError as e:
            raise UsageError(f"cannot list folder {d}: {e.strerror}") from None
        for p in entries:
            if p.is_dir():  # follows a symlink; a dangling one is neither dir nor file
                stack.append(p)
            elif p.is_file():
                found.append(p)
    files: list[Path] = []
    seen_files: set[tuple[int, int]] = set()
    for p in sorted(found):
        st = p.stat()
        if (st.st_dev, st.st_ino) not in seen_files:
            seen_files.add((st.st_dev, st.st_ino))
            files.append(p)
    return files


def is_document_corpus(path: Path) -> bool:
    """Whether ``path`` holds records (``.jsonl``, ``.parquet``, a saved dataset) rather
    than plain text files only: those are read as documents, not as raw bytes."""
    if is_saved_dataset(path):
        return True
    if path.is_file():
        return path.suffix in RECORD_SUFFIXES
    return path.is_dir() and any(p.suffix in RECORD_SUFFIXES or _saved_root(p, path) for p in list_files(path))


def read_documents(
    path: str | Path, text_field: str = DEFAULT_TEXT_FIELD, *, max_bytes: int | None = None
) -> tuple[list[str], Measured]:
    """The documents at ``path`` (a text file, ``.jsonl``, ``.parquet``, a folder of them,
    or a ``save_to_disk`` directory) and what was measured (bytes, documents). Records take
    their text from ``text_field``; a record without it, or not a string, is a
    :class:`UsageError` naming the file, the record and the field. ``max_bytes``: UTF-8
    bytes read at most (a :class:`CorpusTruncated` warning says when the cap cut the corpus)."""
    root = Path(path).expanduser()
    if not root.exists():
        raise NotFoundError(f"no such file or folder: {path}")
    if not text_field:
        raise UsageError("--text-field must not be empty")
    reader = _Reader(max_bytes if max_bytes is not None else 1 << 62)
    for text in _documents(root, text_field):
        if not reader.add(text):
            warnings.warn(
                CorpusTruncated(
                    f"corpus {path} holds more than {reader.max_bytes:,} bytes; only the first {reader.max_bytes:,} "
                    f"are used ({len(reader.documents):,} documents; raise the cap with --max-bytes, or max_bytes=)"
                ),
                stacklevel=2,
            )
            break
    if not reader.documents or not reader.size:
        raise UsageError(f"corpus {path} holds no text (no documents, or only empty ones)")
    return reader.documents, Measured(bytes=reader.size, documents=len(reader.documents))


def _documents(root: Path, text_field: str) -> Iterator[str]:
    """A plain text file is one document; a folder holding records is read for its records
    (other files in it are skipped, and said so); a folder of plain text files has one
    document per file."""
    if is_saved_dataset(root):
        yield from _saved_dataset(root, text_field)
        return
    files = list_files(root)
    records = root.is_file() or any(p.suffix in RECORD_SUFFIXES or _saved_root(p, root) for p in files)
    done: set[Path] = set()
    skipped: list[Path] = []
    for f in files:
        saved = _saved_root(f, root)
        if saved is not None:
            if saved not in done:
                done.add(saved)
                yield from _saved_dataset(saved, text_field)
        elif f.suffix == ".jsonl":
            yield from _jsonl(f, text_field)
        elif f.suffix == ".parquet":
            yield from _parquet(f, text_field)
        elif records and f != root:
            skipped.append(f)
        else:
            yield _text_file(f)
    if skipped:
        warnings.warn(
            SkippedFiles(
                f"{len(skipped)} file(s) in {root} are not .jsonl, .parquet or a saved dataset and were not read "
                f"(first: {skipped[0].relative_to(root)})"
            ),
            stacklevel=3,
        )


def _saved_root(f: Path, root: Path) -> Path | None:
    """The outermost ``save_to_disk`` directory holding ``f`` below ``root``, if any."""
    if not root.is_dir():
        return None
    for parent in reversed(f.relative_to(root).parents[:-1]):  # shallowest first; "." (root itself) excluded
        if is_saved_dataset(root / parent):
            return root / parent
    return None


def _text_file(f: Path) -> str:
    return f.read_bytes().decode("utf-8", errors="replace")


def _jsonl(f: Path, text_field: str) -> Iterator[str]:
    with f.open("rb") as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue  # a blank line (the last one, often) is no record
            try:
                rec = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as e:
                raise UsageError(f"{f}:{n}: not a JSON object ({e})") from None
            yield _field(rec, text_field, f"{f}:{n}")


def _field(rec: object, text_field: str, where: str) -> str:
    if not isinstance(rec, dict) or text_field not in rec:
        keys = ", ".join(sorted(map(str, rec))[:8]) if isinstance(rec, dict) else type(rec).__name__
        raise UsageError(
            f"{where}: no text field {text_field!r} (it has: {keys or 'nothing'}); choose it with --text-field"
        )
    value = rec[text_field]
    if not isinstance(value, str):
        raise UsageError(f"{where}: field {text_field!r} is {type(value).__name__}, not a string")
    return value


def _parquet(f: Path, text_field: str) -> Iterator[str]:
    import pyarrow as pa  # type: ignore[import-untyped]  # imported on use: the CLI stays fast to start
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    try:
        pf = pq.ParquetFile(f)
    except (pa.ArrowException, OSError) as e:
        raise UsageError(f"{f}: not a parquet file ({e})") from None
    names = pf.schema_arrow.names
    if text_field not in names:
        raise UsageError(
            f"{f}: no text column {text_field!r} (it has: {', '.join(names) or 'nothing'}); choose it with --text-field"
        )
    kind = pf.schema_arrow.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise UsageError(f"{f}: column {text_field!r} is {kind}, not a string")
    row = 0
    for batch in pf.iter_batches(columns=[text_field]):
        for value in batch.column(0).to_pylist():
            row += 1
            if value is None:
                raise UsageError(f"{f}: row {row}: column {text_field!r} is null, not a string")
            yield value


def _saved_dataset(d: Path, text_field: str) -> Iterator[str]:
    """Rows of a ``save_to_disk`` directory, read with ``datasets.load_from_disk`` (arrow
    files and JSON metadata only; no loading script exists on this path)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched while reading local data
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets  # type: ignore[import-untyped]  # imported on use: heavy

    try:
        ds = datasets.load_from_disk(str(d))
    except (OSError, ValueError, KeyError, FileNotFoundError) as e:
        raise UsageError(f"{d}: not a dataset saved with save_to_disk ({e})") from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise UsageError(f"{d}: a DatasetDict without a 'train' split (it has: {', '.join(sorted(ds))})")
        ds = ds["train"]
    if text_field not in ds.column_names:
        raise UsageError(
            f"{d}: no text column {text_field!r} (it has: {', '.join(ds.column_names) or 'nothing'}); "
            f"choose it with --text-field"
        )
    n = 0
    for batch in ds.select_columns([text_field]).iter(batch_size=1024):
        for value in batch[text_field]:
            n += 1
            if not isinstance(value, str):
                raise UsageError(f"{d}: row {n}: column {text_field!r} is {type(value).__name__}, not a string")
            yield value


__all__ = ["CorpusTruncated", "Measured", "SkippedFiles", "is_document_corpus", "list_files", "read_documents"]
