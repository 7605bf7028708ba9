"""The report module on synthetic data: files written, valid PNGs, the page embeds them,
shows the numbers and escapes what the run supplies; same input, same bytes."""

from __future__ import annotations

import base64
import io
import math
import re

import pytest
from PIL import Image

from aitbc.errors import UsageError
from aitbc.reports import (
    HTML_NAME,
    PLOTS,
    Heatmap,
    ReportData,
    RoundPoint,
    WorkerRow,
    _series,
    from_run,
    from_simulation,
    write_report,
)

HOSTILE = '<script>alert("x")</script>$\\frac{a'  # HTML and matplotlib's mathtext both


def _data(rounds: int = 5) -> ReportData:
    points = [
        RoundPoint(
            round=k,
            val_loss=2.0 / k,
            val_accuracy=1 - 1 / (k + 1),
            train_loss=2.5 / k,
            bytes_up=1000 * k,
            bytes_down=5000,
            accepted=3,
            rejected=k % 2,
        )
        for k in range(1, rounds + 1)
    ]
    cells = {("alice", k): 0.5 for k in range(1, rounds + 1)} | {(HOSTILE, 2): 1.0}
    return ReportData(
        title="Training report: synthetic",
        rounds=points,
        heatmap=Heatmap(title="scores", label="quality", cells=cells, vmin=0, vmax=1),
        summary=[("final validation loss", "0.4000"), ("error", HOSTILE)],
        workers=[WorkerRow(worker_id=HOSTILE, status="ejected", score=0.25, paid="1.5", flags=("sign-flip",))],
        notes=[f"error: {HOSTILE}"],
    )


def _png_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as im:
        im.verify()
    with Image.open(io.BytesIO(data)) as im:
        return im.size


def test_writes_four_valid_pngs_and_a_page_that_embeds_them(tmp_path):
    paths = write_report(_data(), tmp_path / "out")
    assert set(paths) == {*PLOTS, "html"}
    page = (tmp_path / "out" / HTML_NAME).read_text()
    embedded = dict(re.findall(r'<img id="(\w+)" alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page))
    assert set(embedded) == set(PLOTS)
    for name in PLOTS:
        raw = paths[name].read_bytes()
        assert len(raw) > 5000  # a drawn plot, not an empty image
        w, h = _png_size(raw)
        assert w >= 400 and h >= 200
        assert base64.b64decode(embedded[name]) == raw  # the page holds exactly the file


def test_every_string_from_the_run_is_escaped(tmp_path):
    page = (write_report(_data(), tmp_path)["html"]).read_text()
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "0.4000" in page and "sign-flip" in page and "ejected" in page


def test_same_input_same_bytes(tmp_path):
    a = write_report(_data(), tmp_path / "a")
    b = write_report(_data(), tmp_path / "b")
    assert all(a[k].read_bytes() == b[k].read_bytes() for k in a)
    assert b"Software" not in a["loss"].read_bytes()  # no matplotlib version stamped in


def test_no_rounds_yet_still_draws_every_file(tmp_path):
    empty = ReportData(title="t", rounds=[], heatmap=Heatmap(title="s", label="q", cells={}))
    paths = write_report(empty, tmp_path)
    for name in PLOTS:
        assert _png_size(paths[name].read_bytes())[0] > 0
    assert '<table id="rounds">' in paths["html"].read_text()


def test_refuses_a_file_or_a_folder_it_cannot_make(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        write_report(_data(), f)
    with pytest.raises(UsageError, match="cannot write there"):
        write_report(_data(), f / "below")  # a folder under a file cannot be made
    dangling = tmp_path / "link"
    dangling.symlink_to(tmp_path / "gone")
    with pytest.raises(UsageError, match="is a link to .*gone, which does not exist"):
        write_report(_data(), dangling)
    assert not (tmp_path / "gone").exists()
    assert f.read_text() == "x"


def test_from_run_uses_per_round_bytes_scores_and_payments():
    results = {
        "training_id": "training_x",
        "status": "complete",
        "rounds_completed": 2,
        "rounds": 2,
        "initial_val_loss": 2.3,
        "final_val_loss": 0.5,
        "final_val_accuracy": 0.9,
        "bytes_up": 10,
        "bytes_down": 20,
        "updates_accepted": 4,
        "updates_rejected": 0,
        "model_cid": "bafy",
        "error": None,
        "workers": [
            {"worker_id": "w1", "contract_id": "c1", "status": "completed", "score": 0.8, "score_flags": []},
            {"worker_id": "w2", "contract_id": "c2", "status": "ejected", "score": 0.0, "score_flags": ["replay"]},
        ],
    }
    rounds = [
        {"round": 0, "val_loss": 2.3},
        {"round": 1, "val_loss": 1.0, "train_loss": 1.2, "bytes_up": 4, "bytes_down": 8},
        {"round": 2, "val_loss": 0.5, "train_loss": 0.7, "bytes_up": None, "bytes_down": None},
    ]
    scores = [
        {"round": 1, "worker_id": "w1", "quality": 0.8},
        {"round": 1, "worker_id": "w2", "quality": 0.0},
        {"round": 2, "worker_id": "w1", "quality": 0.8},
    ]
    payments = {"escrowed": "10", "escrow_balance": "2", "data": [{"contract_id": "c1", "paid": "1.6", "flags": []}]}
    d = from_run(results=results, rounds=rounds, scores=scores, payments=payments)
    assert [p.round for p in d.rounds] == [1, 2]  # round 0 is the initial model
    assert d.rounds[1].bytes_up is None
    assert d.heatmap.cells == {("w1", 1): 0.8, ("w2", 1): 0.0, ("w1", 2): 0.8}  # w2 round 2: blank
    assert list(d.heatmap.workers) == ["w1", "w2"]
    assert [(w.worker_id, w.paid, w.flags) for w in d.workers] == [("w1", "1.6", ()), ("w2", "", ("replay",))]
    assert ("final validation loss", "0.5000") in d.summary
    assert not [v for _, v in d.summary if "bafy" in v]  # a shared report names no CID of the owner's model


def test_a_language_run_reports_its_perplexity_and_tokens_seen_and_a_classifier_neither():
    base = {"training_id": "training_x", "status": "complete", "final_val_loss": 2.0, "workers": []}
    lm = from_run(
        results=base | {"tokens_seen": 1_234_567, "final_val_perplexity": 7.389056}, rounds=[], scores=[], payments=None
    )
    assert ("final validation perplexity", "7.39") in lm.summary and ("tokens seen", "1,234,567") in lm.summary
    clf = from_run(
        results=base | {"tokens_seen": None, "final_val_perplexity": None}, rounds=[], scores=[], payments=None
    )
    older = from_run(results=base, rounds=[], scores=[], payments=None)  # a coordinator that does not send them
    for d in (clf, older):
        assert not [k for k, _ in d.summary if k in ("tokens seen", "final validation perplexity")]


def test_from_simulation_turns_running_totals_into_per_round_bytes():
    rows = [
        {"round": 1, "val_loss": 1.0, "val_accuracy": 0.5, "train_loss": 1.1, "bytes_up": 100, "bytes_down": 1000},
        {"round": 2, "val_loss": 0.8, "val_accuracy": 0.6, "train_loss": 0.9, "bytes_up": 250, "bytes_down": 2000},
    ]
    result = {"workers": 2, "byzantine_workers": [1], "rounds": 2, "config": {"model": "mlp", "dataset": "digits"}}
    d = from_simulation(result=result, rows=rows, update_norms=[{0: 1.0, 1: 9.0}, {0: 0.5}])
    assert [(p.bytes_up, p.bytes_down) for p in d.rounds] == [(100, 1000), (150, 1000)]
    assert d.heatmap.cells == {("worker 0", 1): 1.0, ("worker 1 (byzantine)", 1): 9.0, ("worker 0", 2): 0.5}
    assert "does not score" in d.heatmap.title


def test_a_link_planted_in_the_folder_is_replaced_never_followed(tmp_path):
    # A shared folder (under /tmp, say) where someone else made report.html and loss.png
    # links to a file of the user's: the report replaces the links, the file is untouched.
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("keep me")
    (out / HTML_NAME).symlink_to(victim)
    (out / "loss.png").symlink_to(victim)
    (out / "notes.txt").write_text("mine")
    paths = write_report(_data(), out)
    assert victim.read_text() == "keep me"
    assert not paths["html"].is_symlink() and "<h1>" in paths["html"].read_text()
    assert not paths["loss"].is_symlink() and _png_size(paths["loss"].read_bytes())[0] >= 400
    # a second report replaces the first's files whole and leaves other files alone
    again = write_report(_data(1), out)
    assert again["html"].read_text() != write_report(_data(), tmp_path / "b")["html"].read_text()
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == sorted(["notes.txt", HTML_NAME, *(f"{n}.png" for n in PLOTS)])


def test_one_round_and_a_diverged_runs_non_finite_values(tmp_path):
    nan, inf = float("nan"), float("inf")
    points = [
        RoundPoint(round=1, val_loss=2.0, train_loss=2.5, bytes_up=10, bytes_down=20),
        RoundPoint(round=2, val_loss=nan, val_accuracy=nan, train_loss=inf, bytes_up=10, bytes_down=20),
        RoundPoint(round=3, val_loss=1e300, val_accuracy=None, train_loss=-inf, bytes_up=None, bytes_down=None),
    ]
    cells = {("w", 1): 0.5, ("w", 2): nan, ("v", 3): inf}
    for name, rounds in (("one", points[:1]), ("diverged", points)):
        data = ReportData(title=name, rounds=rounds, heatmap=Heatmap(title="s", label="q", cells=cells, vmin=0, vmax=1))
        paths = write_report(data, tmp_path / name)
        for plot in PLOTS:
            assert _png_size(paths[plot].read_bytes())[0] >= 400
        page = paths["html"].read_text()
        assert page.count("<tr><td") == len(rounds)


def test_evaluations_pending_when_written_are_a_gap_and_a_note_not_a_straight_line():
    """A report written right after a run: rounds 4-9 closed, their evaluations not landed."""
    rounds = [
        {"round": r, "val_loss": 3.0 - 0.1 * r if r <= 3 or r == 10 else None, "eval_pending": 3 < r < 10}
        for r in range(0, 11)
    ]
    d = from_run(results={"training_id": "t"}, rounds=rounds, scores=[], payments=None)
    assert d.notes == [
        "evaluation pending for rounds 4-9 when this report was written: a gap in the validation curves "
        "(write the report again to fill it)"
    ]
    xs, ys = _series(d.rounds, "val_loss")
    assert xs == list(range(1, 11)) and all(math.isnan(y) for y in ys[3:9]) and ys[9] == pytest.approx(2.0)
    # rounds evaluated less often (not due) are joined across, with no note
    sparse = [{"round": r, "val_loss": 1.0 / r if r % 5 == 0 else None} for r in range(1, 11)]
    d = from_run(results={"training_id": "t"}, rounds=sparse, scores=[], payments=None)
    assert d.notes == [] and _series(d.rounds, "val_loss") == ([5, 10], [0.2, 0.1])
