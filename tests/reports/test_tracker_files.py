"""The TensorBoard tracker on synthetic rounds: event files read back with TensorBoard's
own EventAccumulator; re-opening the folder writes no step twice; refusals."""

from __future__ import annotations

import pytest
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

from aitbc.errors import UsageError
from aitbc.trackers import SCORE_TAG, TensorBoardLog, parse_log_to, round_values

ROUNDS = [
    {"round": 0, "val_loss": 2.3, "val_accuracy": 0.1},
    {"round": 1, "val_loss": 1.5, "val_accuracy": 0.5, "train_loss": 1.7, "bytes_up": 10, "bytes_down": 20,
     "accepted": 3, "rejected": 0},
    {"round": 2, "val_loss": None, "val_accuracy": None, "train_loss": 1.1, "bytes_up": 11, "bytes_down": 20,
     "accepted": 2, "rejected": 1},
]  # fmt: skip
SCORES = [{"round": 1, "quality": 1.0}, {"round": 1, "quality": 0.5}]


def _scalars(folder) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_round_values_skip_round_zero_and_missing_values():
    vals = round_values(ROUNDS, SCORES)
    assert ("val/loss", 1, 1.5) in vals and (SCORE_TAG, 1, 0.75) in vals
    assert not any(step == 0 for _, step, _ in vals)
    assert not any(tag == "val/loss" and step == 2 for tag, step, _ in vals)


def test_round_trip_and_no_step_written_twice(tmp_path):
    log = TensorBoardLog(tmp_path / "tb")
    assert log.log(round_values(ROUNDS[:2], SCORES)) == 8
    log.close()
    # re-attached: round 1 again (skipped), round 2 and round 2's late evaluation (new)
    log = TensorBoardLog(tmp_path / "tb")
    assert log.log(round_values(ROUNDS, SCORES)) == 5
    late = [dict(ROUNDS[2], val_loss=0.9, val_accuracy=0.7)]
    assert log.log(round_values(late, [])) == 2
    log.close()
    got = _scalars(tmp_path / "tb")
    assert got["val/loss"] == [(1, 1.5), (2, 0.8999999761581421)]
    assert got["train/loss"] == [(1, pytest.approx(1.7)), (2, pytest.approx(1.1))]
    assert got["updates/rejected"] == [(1, 0.0), (2, 1.0)]
    assert got[SCORE_TAG] == [(1, 0.75)]


def test_refusals():
    with pytest.raises(UsageError, match="allowed: tensorboard:DIR"):
        parse_log_to("wandb:x")
    with pytest.raises(UsageError, match="name the folder"):
        parse_log_to("tensorboard:")


def test_a_file_is_not_a_folder(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        TensorBoardLog(f)


def test_one_writer_per_folder(tmp_path):
    # Two `monitor --log-to` on one folder: the second is refused, instead of writing
    # every step again into a second event file; once the first closes, it may open.
    first = TensorBoardLog(tmp_path / "tb", "training_a")
    with pytest.raises(UsageError, match="another aitbc process is writing to this folder"):
        TensorBoardLog(tmp_path / "tb", "training_a")
    first.log(round_values(ROUNDS[:2], SCORES))
    first.close()
    second = TensorBoardLog(tmp_path / "tb", "training_a")
    assert second.log(round_values(ROUNDS[:2], SCORES)) == 0
    second.close()
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 2


def test_a_folder_of_another_run_is_refused(tmp_path):
    # Its steps would hide this run's: every step at or below them skipped, nothing written.
    log = TensorBoardLog(tmp_path / "tb", "training_a")
    log.log(round_values(ROUNDS, SCORES))
    log.close()
    with pytest.raises(UsageError, match="holds run training_a's metrics; choose another folder for training_b"):
        TensorBoardLog(tmp_path / "tb", "training_b")
    assert set(_scalars(tmp_path / "tb")["val/loss"]) == {(1, 1.5)}


def test_a_corrupt_or_foreign_event_file_is_read_past(tmp_path):
    # Random bytes and a text file under an event file's name: no step is read from
    # them (nothing to skip) and the run's steps are written next to them.
    folder = tmp_path / "tb"
    folder.mkdir()
    (folder / "events.out.tfevents.1.host.1.0").write_bytes(bytes(range(256)) * 3)
    (folder / "events.out.tfevents.2.host.1.0").write_text("not an event file\n")
    log = TensorBoardLog(folder, "training_a")
    assert log.log(round_values(ROUNDS, SCORES)) == 13
    log.close()
    assert _scalars(folder)["val/loss"] == [(1, 1.5)]
