"""A run's tokenizer: a byte-level BPE trained on the owner's corpus, or the owner's own
``tokenizer.json``; either way the ``tokenizers`` library's JSON, parsed as data (never
code), stored as one blob that the manifest names (``"tokenizer": {"cid", "vocab_size"}``).

Training is deterministic: the same documents and vocabulary size give the same JSON bytes.
Documents are separated in the token stream by the tokenizer's end-of-text token.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aitbc.errors import NotFoundError, UsageError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

DEFAULT_VOCAB = 8192
MIN_VOCAB = 256
MAX_VOCAB = 65536  # a BPE trained on the owner's corpus (--vocab-size)
# A user's own tokenizer.json (a pretrained model's: Llama 3's 128,256, Qwen's 151,646) may
# be larger, up to the models' own bound on the vocabulary.
MAX_USER_VOCAB = 262144
EOT = "<|endoftext|>"  # the trained tokenizer's end-of-text token
# what a user's tokenizer may call its end-of-text token (GPT-2/Qwen, Llama 1-2/Mistral, Llama 3, Gemma)
EOT_NAMES = (EOT, "</s>", "<|end_of_text|>", "<eos>")
MAX_TOKENIZER_BYTES = 64 << 20
ENCODE_BATCH = 1024
MIN_FREQUENCY = 2  # a merge must occur at least twice: a pair seen once is no pattern


class VocabCapped(UserWarning):
    """The corpus supports fewer tokens than the vocabulary size asked for."""


@dataclass(frozen=True, slots=True)
class RunTokenizer:
    """A tokenizer as the run stores it: its JSON bytes, vocabulary size (the model's
    ``vocab_size``: one more than its largest id) and end-of-text id."""

    data: bytes
    vocab_size: int
    eot_id: int


def check_vocab_size(n: int, what: str = "--vocab-size", *, most: int = MAX_VOCAB) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not MIN_VOCAB <= n <= most:
        raise UsageError(f"{what} must be an integer from {MIN_VOCAB} to {most}, got {n!r}")
    return n


def train_tokenizer(documents: list[str], vocab_size: int = DEFAULT_VOCAB) -> RunTokenizer:
    """A byte-level BPE of at most ``vocab_size`` tokens (the 256 bytes, :data:`EOT`, and
    merges seen at least twice), trained on ``documents``; fewer when the corpus supports
    fewer merges (a :class:`VocabCapped` warning says so)."""
    check_vocab_size(vocab_size)
    if vocab_size < MIN_VOCAB + 1:
        raise UsageError(
            f"--vocab-size {vocab_size}: a trained byte-level BPE holds the {MIN_VOCAB} bytes and {EOT}, "
            f"so at least {MIN_VOCAB + 1}"
        )
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=MIN_FREQUENCY,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(documents, trainer, length=len(documents))
    got = _vocab_size(tok)
    if got < vocab_size:
        warnings.warn(
            VocabCapped(
                f"the corpus supports {got} tokens (merges seen at least {MIN_FREQUENCY} times); "
                f"the tokenizer has {got}, not the {vocab_size} asked for"
            ),
            stacklevel=2,
        )
    return RunTokenizer(tok.to_str().encode(), got, _eot_id(tok, "the trained tokenizer"))


def read_tokenizer(path: str | Path) -> RunTokenizer:
    """The user's ``tokenizer.json`` at ``path``, checked: the ``tokenizers`` library's JSON
    format (parsed as data), a vocabulary of :data:`MIN_VOCAB`..:data:`MAX_USER_VOCAB` ids, an
    end-of-text token (one of :data:`EOT_NAMES`). Anything else: a one-line
    :class:`UsageError` naming the file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise NotFoundError(f"--tokenizer {path}: no such file")
    if p.stat().st_size > MAX_TOKENIZER_BYTES:
        raise UsageError(f"--tokenizer {p}: {p.stat().st_size:,} bytes; at most {MAX_TOKENIZER_BYTES:,}")
    return tokenizer_from_bytes(p.read_bytes(), f"--tokenizer {p}")


def tokenizer_from_bytes(data: bytes, what: str) -> RunTokenizer:
    """``data`` (a ``tokenizer.json``) checked as :func:`read_tokenizer` checks a file;
    ``what`` names it in an error."""
    if len(data) > MAX_TOKENIZER_BYTES:
        raise UsageError(f"{what}: {len(data):,} bytes; at most {MAX_TOKENIZER_BYTES:,}")
    tok = parse_tokenizer(data, what)
    n = check_vocab_size(_vocab_size(tok), f"{what}: its vocabulary size", most=MAX_USER_VOCAB)
    return RunTokenizer(data, n, _eot_id(tok, what))


def parse_tokenizer(data: bytes, what: str = "tokenizer") -> Tokenizer:
    """``data`` as a ``tokenizers`` JSON, or a one-line :class:`UsageError` saying what is wrong."""
    try:
        text = data.decode("utf-8")
        doc = json.loads(text)
    except (UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"{what}: not JSON ({_one_line(e)})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise UsageError(f"{what}: not a tokenizer.json (a JSON object with a 'model' object)")
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(text)
    except Exception as e:  # noqa: BLE001 - the library raises a bare Exception for a bad document
        raise UsageError(f"{what}: not a tokenizer the tokenizers library reads ({_one_line(e)})") from None


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]


def _vocab_size(tok: Tokenizer) -> int:
    """One more than the largest id (ids need not be dense), at least the library's count."""
    ids = tok.get_vocab(with_added_tokens=True).values()
    return max(max(ids, default=-1) + 1, tok.get_vocab_size(with_added_tokens=True))


def _eot_id(tok: Tokenizer, what: str) -> int:
    for name in EOT_NAMES:
        i = tok.token_to_id(name)
        if i is not None:
            return int(i)
    raise UsageError(f"{what}: has no end-of-text token to separate documents (one of: {', '.join(EOT_NAMES)})")


# --- a run's tokenizer, for the helpers that sample and evaluate ----------------------------


def tokenizer_cid(manifest: dict[str, Any]) -> str | None:
    """The CID of the tokenizer blob a manifest names; None for byte-level data."""
    t = manifest.get("tokenizer")
    return str(t["cid"]) if isinstance(t, dict) and t.get("cid") else None


def load_tokenizer(data: bytes) -> Tokenizer:
    """A tokenizer blob's bytes as a ``tokenizers.Tokenizer`` (parsed as data)."""
    return parse_tokenizer(data)


def eot_id(tok: Tokenizer) -> int:
    """The id that separates documents in ``tok``'s token stream."""
    return _eot_id(tok, "tokenizer")


def encode_text(tok: Tokenizer, text: str) -> list[int]:
    """``text``'s token ids (no special tokens added)."""
    return list(tok.encode(text, add_special_tokens=False).ids)


def decode(tok: Tokenizer, ids: list[int]) -> str:
    """Token ids back to text (special tokens dropped)."""
    return str(tok.decode(list(ids), skip_special_tokens=True))


def encode_documents(tok: Tokenizer, documents: list[str], eot: int) -> list[int]:
    """One token stream: each document's ids followed by ``eot`` (its boundary)."""
    stream: list[int] = []
    for i in range(0, len(documents), ENCODE_BATCH):  # in batches: an encoding holds offsets, masks too
        for enc in tok.encode_batch(documents[i : i + ENCODE_BATCH], add_special_tokens=False):
            stream.extend(enc.ids)
            stream.append(eot)
    return stream


__all__ = [
    "DEFAULT_VOCAB",
    "EOT",
    "MAX_USER_VOCAB",
    "MAX_VOCAB",
    "MIN_VOCAB",
    "RunTokenizer",
    "VocabCapped",
    "check_vocab_size",
    "decode",
    "encode_documents",
    "encode_text",
    "eot_id",
    "load_tokenizer",
    "parse_tokenizer",
    "read_tokenizer",
    "tokenizer_cid",
    "tokenizer_from_bytes",
]
