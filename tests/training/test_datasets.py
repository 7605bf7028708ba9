"""Dataset registry: digits, text:PATH, stdlib, npz:PATH."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aitbc.errors import NotFoundError, UsageError
from aitbc.training.data_spec import DataSpec
from aitbc.training.datasets import DATASETS, DataOptions, load_dataset


def as_bytes(t: torch.Tensor) -> bytes:
    return t.flatten().numpy().tobytes()


def test_registry_names():
    assert DATASETS.names() == ["digits", "docs", "npz", "stdlib", "text"]


# --- digits ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_digits_shapes_and_split_sizes(digits):
    # 1797 samples, 20% held out: round(359.4) = 359
    assert digits.spec == DataSpec("classification", (1, 8, 8), 10)
    assert digits.train_x.shape == (1438, 1, 8, 8) and digits.val_x.shape == (359, 1, 8, 8)
    assert digits.train_y.shape == (1438,) and digits.val_y.shape == (359,)
    assert digits.train_x.dtype == torch.float32 and digits.train_y.dtype == torch.int64
    assert digits.train_x.min() >= 0 and digits.train_x.max() <= 1


def test_digits_split_keeps_every_sample(digits):
    from sklearn.datasets import load_digits

    counts = torch.bincount(torch.cat([digits.train_y, digits.val_y]), minlength=10)

    assert counts.tolist() == np.bincount(load_digits().target).tolist()


def test_digits_labels_are_train_labels(digits):
    assert digits.labels is digits.train_y


def test_digits_split_is_fixed_by_seed(digits):
    again = load_dataset("digits", DataOptions(seed=0))
    other = load_dataset("digits", DataOptions(seed=1))

    assert torch.equal(again.val_x, digits.val_x) and torch.equal(again.val_y, digits.val_y)
    assert not torch.equal(other.val_x, digits.val_x)


def test_digits_takes_no_argument():
    with pytest.raises(UsageError, match="dataset 'digits' takes no argument, got digits:foo"):
        load_dataset("digits:foo")


# --- text ------------------------------------------------------------------------------------


def random_bytes(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_text_file_windows_are_contiguous_and_val_is_the_tail(tmp_path):
    corpus = random_bytes(1000)
    (tmp_path / "c.txt").write_bytes(corpus)

    ds = load_dataset(f"text:{tmp_path / 'c.txt'}", DataOptions(seq_len=9))

    # 10% held out: train = corpus[:900], val = corpus[900:]
    # train windows: (900 - 1) // 9 = 99; val windows: (100 - 1) // 9 = 11
    assert ds.spec == DataSpec("language", (9,), 256)
    assert ds.train_x.shape == ds.train_y.shape == (99, 9)
    assert ds.val_x.shape == ds.val_y.shape == (11, 9)
    assert ds.train_x.dtype == ds.train_y.dtype == torch.uint8
    assert as_bytes(ds.train_x) == corpus[:891]
    assert as_bytes(ds.train_y) == corpus[1:892]  # y is x shifted by one byte
    assert as_bytes(ds.val_x) == corpus[900:999]
    assert as_bytes(ds.val_y) == corpus[901:1000]
    assert ds.labels is None


def test_text_folder_reads_files_in_path_order_joined_by_newlines(tmp_path):
    a, b, c = random_bytes(400, 1), random_bytes(400, 2), random_bytes(400, 3)
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_bytes(b)
    (tmp_path / "sub" / "c.txt").write_bytes(c)
    (tmp_path / "a.txt").write_bytes(a)
    corpus = a + b"\n" + b + b"\n" + c  # 1202 bytes: train 1082, val 120

    ds = load_dataset(f"text:{tmp_path}", DataOptions(seq_len=9))

    assert as_bytes(ds.train_x) == corpus[: 120 * 9]
    assert as_bytes(ds.val_x) == corpus[1082 : 1082 + 13 * 9]
    assert as_bytes(ds.val_y) == corpus[1083 : 1083 + 13 * 9]


def test_text_max_bytes_caps_the_corpus(tmp_path):
    corpus = random_bytes(5000)
    (tmp_path / "c.txt").write_bytes(corpus)

    ds = load_dataset(f"text:{tmp_path / 'c.txt'}", DataOptions(seq_len=9, max_bytes=1000))

    assert as_bytes(ds.train_x) == corpus[:891]
    assert as_bytes(ds.val_y) == corpus[901:1000]


def test_text_corpus_too_small(tmp_path):
    (tmp_path / "c.txt").write_bytes(b"tiny")

    with pytest.raises(UsageError, match="has 4 bytes"):
        load_dataset(f"text:{tmp_path / 'c.txt'}", DataOptions(seq_len=9))


def test_text_empty_folder(tmp_path):
    with pytest.raises(UsageError, match="holds no files"):
        load_dataset(f"text:{tmp_path}")


@pytest.mark.parametrize("name", ["text", "npz"])
def test_missing_path_is_not_found(tmp_path, name):
    with pytest.raises(NotFoundError, match="no such file or directory"):
        load_dataset(f"{name}:{tmp_path / 'missing'}")


@pytest.mark.parametrize("spec", ["text", "text:", "npz"])
def test_path_datasets_need_a_path(spec):
    with pytest.raises(UsageError, match="needs a path"):
        load_dataset(spec)


# --- stdlib ----------------------------------------------------------------------------------


def test_stdlib_small_corpus():
    ds = load_dataset("stdlib", DataOptions(seq_len=32, max_bytes=20_000))

    assert ds.spec == DataSpec("language", (32,), 256)
    assert ds.train_x.shape[1:] == (32,) and ds.val_x.shape[1:] == (32,)
    # about 18,000 train bytes and 2,000 val bytes, in windows of 32
    assert 500 <= ds.train_x.shape[0] <= 20_000 // 32 and 50 <= ds.val_x.shape[0] <= 2_000 // 32
    assert torch.equal(ds.train_y[:, :-1], ds.train_x[:, 1:])
    assert torch.equal(ds.train_y[:-1, -1], ds.train_x[1:, 0])
    assert b"import" in as_bytes(ds.train_x)  # it really is Python source


def test_stdlib_takes_no_argument():
    with pytest.raises(UsageError, match="takes no argument"):
        load_dataset("stdlib:foo")


# --- npz -------------------------------------------------------------------------------------


def save_npz(tmp_path, **arrays) -> str:
    path = tmp_path / "d.npz"
    np.savez(path, **arrays)
    return f"npz:{path}"


def test_npz_good_file(tmp_path):
    x = np.random.default_rng(0).normal(size=(10, 3))
    spec = save_npz(tmp_path, x=x, y=np.arange(10) % 3)

    ds = load_dataset(spec, DataOptions(seed=0))

    assert ds.spec == DataSpec("classification", (3,), 3)
    assert ds.train_x.shape == (8, 3) and ds.val_x.shape == (2, 3)
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    all_x = torch.cat([ds.train_x, ds.val_x])
    assert sorted(all_x[:, 0].tolist()) == sorted(x[:, 0].astype(np.float32).tolist())


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.zeros((4, 2))}, "must hold arrays 'x' and 'y'; it holds: x"),
        ({"a": np.zeros((4, 2)), "b": np.arange(4)}, "must hold arrays 'x' and 'y'; it holds: a, b"),
        ({"x": np.zeros(4), "y": np.arange(4)}, "need x of shape (N, ...)"),
        ({"x": np.zeros((4, 2)), "y": np.arange(3)}, "need x of shape (N, ...)"),
        ({"x": np.zeros((4, 2)), "y": np.zeros(4)}, "non-negative integer class labels"),
        ({"x": np.zeros((4, 2)), "y": np.array([0, 1, -1, 0])}, "non-negative integer class labels"),
        ({"x": np.array([[0.0, np.nan]] * 4), "y": np.arange(4)}, "x contains NaN or Inf"),
        ({"x": np.array([[0.0, np.inf]] * 4), "y": np.arange(4)}, "x contains NaN or Inf"),
        ({"x": np.zeros((1, 2)), "y": np.arange(1)}, "has 1 samples"),
    ],
    ids=["no-y", "wrong-names", "x-1d", "length-mismatch", "float-y", "negative-y", "nan", "inf", "one-sample"],
)
def test_npz_bad_contents(tmp_path, arrays, message):
    spec = save_npz(tmp_path, **arrays)

    with pytest.raises(UsageError) as exc:
        load_dataset(spec)

    assert message in str(exc.value)


class _Boom:
    """Unpickling this would run code: the loader must never get that far."""

    def __reduce__(self):
        return (print, ("unpickled!",))


def test_npz_refuses_pickled_object_arrays(tmp_path, capsys):
    x = np.empty((4, 1), dtype=object)
    x[:] = _Boom()
    spec = save_npz(tmp_path, x=x, y=np.arange(4))

    with pytest.raises(UsageError, match="allow_pickle=False"):
        load_dataset(spec)

    assert "unpickled!" not in capsys.readouterr().out


def test_npz_not_an_archive(tmp_path):
    (tmp_path / "d.npz").write_text("hello, not a zip")

    with pytest.raises(UsageError, match="cannot read"):
        load_dataset(f"npz:{tmp_path / 'd.npz'}")


def test_npz_given_a_npy_file(tmp_path):
    np.save(tmp_path / "d.npy", np.zeros((4, 2)))

    with pytest.raises(UsageError, match="needs an .npz archive"):
        load_dataset(f"npz:{tmp_path / 'd.npy'}")


def test_npz_non_numeric_x(tmp_path):
    spec = save_npz(tmp_path, x=np.array([["a", "b"]] * 4), y=np.arange(4))

    with pytest.raises(UsageError, match="x must be numeric"):
        load_dataset(spec)


def test_npz_bool_x_is_numeric_enough(tmp_path):
    spec = save_npz(tmp_path, x=np.eye(4, dtype=bool), y=np.arange(4))

    ds = load_dataset(spec)

    assert ds.train_x.dtype == torch.float32
    assert sorted(torch.cat([ds.train_x, ds.val_x]).sum(dim=1).tolist()) == [1.0] * 4


# --- names and options -----------------------------------------------------------------------


def test_unknown_dataset_lists_names():
    with pytest.raises(UsageError, match="unknown dataset 'mnist'; allowed: digits, docs, npz, stdlib, text"):
        load_dataset("mnist")


@pytest.mark.parametrize("opts", [DataOptions(seq_len=0), DataOptions(max_bytes=-1)])
def test_non_positive_lengths(opts):
    with pytest.raises(UsageError, match="seq_len and max_bytes must be positive"):
        load_dataset("stdlib", opts)


def test_text_too_small_message_names_the_real_minimum(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"a" * 50)
    with pytest.raises(UsageError) as exc:
        load_dataset(f"text:{path}", DataOptions(seq_len=10))
    asked = int(str(exc.value).split("need at least ")[1].split()[0])

    path.write_bytes(b"a" * (asked - 1))

    with pytest.raises(UsageError):  # one byte less than asked must not load
        load_dataset(f"text:{path}", DataOptions(seq_len=10))
