"""Content-addressed storage: every shard, checkpoint and update is a blob named by its
IPFS CIDv1, and every read checks the bytes against that name."""

from aitbc.storage.blobstore import BlobCache, BlobInfo, BlobStore, LocalBlobStore
from aitbc.storage.cid import (
    Cid,
    CidHasher,
    cid_of_bytes,
    cid_of_chunks,
    cid_of_file,
    cid_of_stream,
    is_cid,
    parse_cid,
)

__all__ = [
    "BlobCache",
    "BlobInfo",
    "BlobStore",
    "Cid",
    "CidHasher",
    "LocalBlobStore",
    "cid_of_bytes",
    "cid_of_chunks",
    "cid_of_file",
    "cid_of_stream",
    "is_cid",
    "parse_cid",
]
