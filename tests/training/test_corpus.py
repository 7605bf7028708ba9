"""Corpus readers: text files, .jsonl, .parquet, folders of them, save_to_disk directories;
each real file read once; bad records refused in one line naming file, record and field."""

from __future__ import annotations

import json
import os
import warnings

import pytest

from aitbc.errors import NotFoundError, UsageError
from aitbc.training.corpus import (
    CorpusTruncated,
    SkippedFiles,
    is_document_corpus,
    list_files,
    read_documents,
)
from aitbc.training.datasets import DataOptions, load_dataset
from aitbc.training.packaging import resolve_source


def write_jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def write_parquet(path, column: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(column), path)


# --- formats ---------------------------------------------------------------------------------


def test_jsonl_reads_the_text_field_of_every_line(tmp_path):
    f = tmp_path / "c.jsonl"
    write_jsonl(f, [{"text": "héllo", "id": 1}, {"text": "world"}])

    docs, measured = read_documents(f)

    assert docs == ["héllo", "world"]
    assert (measured.bytes, measured.documents) == (len("héllo".encode()) + 5, 2)


def test_jsonl_other_text_field_and_blank_lines(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text('{"body": "a"}\n\n{"body": "b"}\n')

    assert read_documents(f, "body")[0] == ["a", "b"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"content": "x"}', "c.jsonl:2: no text field 'text' (it has: content); choose it with --text-field"),
        ('{"text": 3}', "c.jsonl:2: field 'text' is int, not a string"),
        ('{"text": null}', "c.jsonl:2: field 'text' is NoneType, not a string"),
        ("[1, 2]", "c.jsonl:2: no text field 'text' (it has: list)"),
        ("{not json", "c.jsonl:2: not a JSON object"),
    ],
    ids=["missing", "int", "null", "array", "not-json"],
)
def test_jsonl_bad_record_is_one_line_naming_file_line_and_field(tmp_path, line, message):
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "fine"}\n' + line + "\n")

    with pytest.raises(UsageError) as exc:
        read_documents(f)

    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert str(f) in str(exc.value)


def test_parquet_reads_the_text_column(tmp_path):
    f = tmp_path / "c.parquet"
    write_parquet(f, {"text": ["one", "two", "three"], "n": [1, 2, 3]})

    docs, measured = read_documents(f)

    assert docs == ["one", "two", "three"] and measured.documents == 3 and measured.bytes == 11


@pytest.mark.parametrize(
    ("column", "message"),
    [
        ({"body": ["x"]}, "no text column 'text' (it has: body)"),
        ({"text": [1, 2]}, "column 'text' is int64, not a string"),
        ({"text": ["a", None]}, "row 2: column 'text' is null"),
    ],
    ids=["missing", "int", "null"],
)
def test_parquet_bad_column(tmp_path, column, message):
    f = tmp_path / "c.parquet"
    write_parquet(f, column)

    with pytest.raises(UsageError) as exc:
        read_documents(f)

    assert message in str(exc.value) and str(f) in str(exc.value)


def test_not_parquet(tmp_path):
    f = tmp_path / "c.parquet"
    f.write_text("nope")

    with pytest.raises(UsageError, match="not a parquet file"):
        read_documents(f)


def test_saved_dataset_directory_is_read_with_load_from_disk(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": ["a b", "c d e"], "label": [0, 1]}).save_to_disk(str(tmp_path / "ds"))

    assert is_document_corpus(tmp_path / "ds") and resolve_source(str(tmp_path / "ds")) == f"docs:{tmp_path / 'ds'}"
    docs, measured = read_documents(tmp_path / "ds")

    assert docs == ["a b", "c d e"] and measured.documents == 2


def test_saved_dataset_dict_uses_train_or_names_the_splits(tmp_path):
    import datasets

    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"text": ["t"]}), "test": datasets.Dataset.from_dict({"text": ["v"]})}
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    no_train = datasets.DatasetDict({"a": datasets.Dataset.from_dict({"text": ["x"]})})
    no_train.save_to_disk(str(tmp_path / "nt"))

    assert read_documents(tmp_path / "dd")[0] == ["t"]
    with pytest.raises(UsageError, match="without a 'train' split \\(it has: a\\)"):
        read_documents(tmp_path / "nt")


def test_saved_dataset_inside_a_folder_is_read_once(tmp_path):
    import datasets

    dd = datasets.DatasetDict(
        {"a": datasets.Dataset.from_dict({"text": ["skip"]}), "train": datasets.Dataset.from_dict({"text": ["t"]})}
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    write_jsonl(tmp_path / "z.jsonl", [{"text": "z"}])

    assert read_documents(tmp_path)[0] == ["t", "z"]


def test_saved_dataset_missing_column(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"body": ["x"]}).save_to_disk(str(tmp_path / "ds"))

    with pytest.raises(UsageError, match="no text column 'text' \\(it has: body\\)"):
        read_documents(tmp_path / "ds")


def test_folder_of_records_sorted_recursive_other_files_skipped_and_said(tmp_path):
    (tmp_path / "sub").mkdir()
    write_jsonl(tmp_path / "b.jsonl", [{"text": "b1"}, {"text": "b2"}])
    write_parquet(tmp_path / "sub" / "c.parquet", {"text": ["c1"]})
    write_jsonl(tmp_path / "a.jsonl", [{"text": "a1"}])
    (tmp_path / "README.md").write_text("not data")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        docs, measured = read_documents(tmp_path)

    assert docs == ["a1", "b1", "b2", "c1"] and measured.documents == 4
    assert [type(w.message) for w in caught] == [SkippedFiles] and "README.md" in str(caught[0].message)


def test_folder_of_text_files_is_one_document_per_file(tmp_path):
    (tmp_path / "a.txt").write_text("first")
    (tmp_path / "b.txt").write_text("second")

    assert not is_document_corpus(tmp_path)
    assert read_documents(tmp_path)[0] == ["first", "second"]


def test_max_bytes_cuts_the_corpus_and_warns(tmp_path):
    write_jsonl(tmp_path / "c.jsonl", [{"text": "x" * 10} for _ in range(5)])

    with pytest.warns(CorpusTruncated, match="only the first 25"):
        docs, measured = read_documents(tmp_path / "c.jsonl", max_bytes=25)

    assert docs == ["x" * 10, "x" * 10, "x" * 5] and measured.bytes == 25


def test_missing_and_empty(tmp_path):
    with pytest.raises(NotFoundError):
        read_documents(tmp_path / "missing.jsonl")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(UsageError, match="holds no text"):
        read_documents(tmp_path / "e.jsonl")


# --- each real file once ---------------------------------------------------------------------


def test_symlinks_and_hard_links_are_read_once(tmp_path):
    (tmp_path / "real").mkdir()
    write_jsonl(tmp_path / "real" / "a.jsonl", [{"text": "a"}])
    os.symlink(tmp_path / "real" / "a.jsonl", tmp_path / "link.jsonl")
    os.link(tmp_path / "real" / "a.jsonl", tmp_path / "hard.jsonl")
    os.symlink(tmp_path / "real", tmp_path / "again")  # the whole folder a second time

    assert len(list_files(tmp_path)) == 1
    assert read_documents(tmp_path)[0] == ["a"]


def test_text_folder_with_a_symlinked_duplicate_is_read_once(tmp_path):
    """A folder of text files with a symlink to one of them: its bytes were read twice."""
    (tmp_path / "a.txt").write_bytes(b"A" * 400)
    (tmp_path / "b.txt").write_bytes(b"B" * 400)
    os.symlink(tmp_path / "a.txt", tmp_path / "c.txt")

    ds = load_dataset(f"text:{tmp_path}", DataOptions(seq_len=9))

    assert ds.measured is not None and ds.measured.bytes == 801 and ds.measured.documents == 2


def test_symlink_loop_ends(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("a")
    os.symlink(tmp_path, tmp_path / "d" / "up")  # d/up -> the root: a cycle
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")

    assert list_files(tmp_path) == [tmp_path / "d" / "a.txt"]


# --- the byte-level path ---------------------------------------------------------------------


def test_docs_for_the_byte_model_are_documents_joined_by_newlines(tmp_path):
    docs = [f"document number {i} " * 5 for i in range(20)]
    write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    corpus = "\n".join(docs).encode()

    spec = resolve_source(str(tmp_path / "c.jsonl"))
    ds = load_dataset(spec, DataOptions(seq_len=9))

    assert spec.startswith("docs:")
    n_val = int(len(corpus) * 0.1)
    train = corpus[: len(corpus) - n_val]
    assert ds.train_x.flatten().numpy().tobytes() == train[: ((len(train) - 1) // 9) * 9]
    assert ds.measured is not None
    assert (ds.measured.documents, ds.measured.tokens, ds.measured.samples) == (20, len(corpus), len(ds.train_x))


def test_resolve_source_kinds(tmp_path):
    (tmp_path / "t.txt").write_text("x")
    write_parquet(tmp_path / "p.parquet", {"text": ["y"]})

    assert resolve_source(str(tmp_path / "t.txt")).startswith("text:")
    assert resolve_source(str(tmp_path / "p.parquet")).startswith("docs:")
    assert resolve_source(str(tmp_path)).startswith("docs:")  # a folder holding a parquet file
