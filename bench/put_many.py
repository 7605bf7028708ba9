"""What storing a folder of many small blobs costs (``LocalBlobStore.put_many``, the store
``aitbc ipfs add -r`` writes into): the time for ``n`` distinct 8-byte blobs into a new
store, at each size. Its check for a blob already taken in the same call was a scan of the
list of pending blobs (quadratic: 20k blobs took 48 s; it is a set now).

    .venv/bin/python bench/put_many.py [--sizes 1000,5000,20000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_json
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.storage.cid import cid_of_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,5000,20000", help="blobs stored in one put_many call")
    args = ap.parse_args()
    rows, results = [], []
    for n in (int(x) for x in args.sizes.split(",")):
        blobs = [(cid_of_bytes(b), b) for b in (i.to_bytes(8, "big") for i in range(n))]
        with tempfile.TemporaryDirectory() as d:
            store = LocalBlobStore(Path(d))
            t0 = time.perf_counter()
            stored = store.put_many(blobs)
            seconds = time.perf_counter() - t0
        assert len(stored) == n
        rows.append((n, f"{seconds:.2f}", f"{n / seconds:.0f}"))
        results.append({"blobs": n, "seconds": seconds})
    print_table("put_many: n distinct 8-byte blobs into a new store", ["blobs", "seconds", "blobs/s"], rows)
    write_json("put_many", {"results": results})


if __name__ == "__main__":
    main()
