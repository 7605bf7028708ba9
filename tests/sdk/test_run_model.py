"""Fetching a run's model for sample, evaluate and download-model format hf: every blob is
re-hashed against the CID the run recorded, so a coordinator that answers with other bytes
is refused; a round the run does not have, or no model yet, is said in one line. The
operations are sans-IO generators: these drive them with the coordinator's answers given
here, and run their local steps (``Offload``) in place."""

from __future__ import annotations

from typing import Any

import pytest

from aitbc.replies.results import Checkpoint, Results
from aitbc.storage.cid import cid_of_bytes
from aitbc_agent_sdk.errors import Conflict, IntegrityFailure, NotFound
from aitbc_agent_sdk.protocol import Http, Offload
from aitbc_agent_sdk.run_model import download_blob, model_cid


def _drive(op, blobs: dict[str, bytes]) -> Any:
    """Run ``op``, answering each ``GET /blobs/{cid}`` from ``blobs``."""
    answer: Any = None
    try:
        while True:
            req = op.send(answer)
            if isinstance(req, Offload):
                answer = req.fn(*req.args)
            elif isinstance(req, Http) and req.path.startswith("/blobs/"):
                answer = blobs[req.path.removeprefix("/blobs/")]
            else:
                raise AssertionError(f"unexpected request {req}")
    except StopIteration as done:
        return done.value


def test_a_blob_is_taken_only_when_it_hashes_to_its_cid():
    data = b"the checkpoint's bytes"
    cid = cid_of_bytes(data)
    assert _drive(download_blob(cid), {cid: data}) == data
    with pytest.raises(IntegrityFailure, match=f"blob {cid} from the coordinator does not hash to its CID"):
        _drive(download_blob(cid), {cid: b"other bytes a coordinator made up"})


def _results(model: str | None, rounds: int) -> Results:
    return Results(
        training_id="training_x",
        status="complete" if model else "training",
        error=None,
        model_cid=model,
        metrics={},
        rounds_completed=rounds,
        rounds=rounds,
        initial_val_loss=None,
        final_val_loss=None,
        final_val_accuracy=None,
        bytes_up=0,
        bytes_down=0,
        updates_accepted=0,
        updates_rejected=0,
        wall_seconds=None,
        settled_round=0,
        checkpoints=[Checkpoint(round=r, cid=f"cid{r}") for r in range(rounds + 1)],
        workers=[],
    )


def test_the_model_of_a_round_the_latest_and_the_refusals():
    res = _results("cid2", 2)
    assert model_cid(res, "training_x", None) == "cid2"
    assert model_cid(res, "training_x", 1) == "cid1"
    with pytest.raises(NotFound, match=r"run training_x has no checkpoint for round 7 \(it has 0..2\)"):
        model_cid(res, "training_x", 7)
    with pytest.raises(Conflict, match=r"run training_x has no model yet \(status training\)"):
        model_cid(_results(None, 0), "training_x", None)
