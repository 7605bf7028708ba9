"""What ``monitor`` prints of a run's evaluations: each with its round (a round's evaluation
lands a moment after it closes, every eval_every rounds), and the header's loss from the
initial model's evaluation to the latest, never ``x -> x`` before a round was evaluated."""

from __future__ import annotations

from typing import Any

from aitbc.cli.training.view import changes, ended_line, loss_span, span


def snapshot(*, closed: int, val_loss: float | None, val_round: int | None, **extra: Any) -> dict[str, Any]:
    return {
        "training_id": "training_x",
        "status": "training",
        "round": closed + 1,
        "rounds_completed": closed,
        "config": {"rounds": 10},
        "workers": [],
        "initial_val_loss": 5.5602,
        "val_loss": val_loss,
        "val_accuracy": None,
        "val_round": val_round,
        "tokens_seen": 1000,
        "val_perplexity": None,
        "global_model_cid": "bafy",
        **extra,
    }


def test_an_evaluation_that_lands_after_its_round_closed_names_its_round():
    start = snapshot(closed=2, val_loss=5.5602, val_round=0)
    closed = snapshot(closed=3, val_loss=5.5602, val_round=0)
    assert changes(start, closed) == ["round 3/10 closed"]
    evaluated = snapshot(closed=3, val_loss=2.3373, val_round=3, val_perplexity=10.35)
    assert changes(closed, evaluated) == ["round 3/10 evaluated: val loss 2.3373, perplexity 10.35, 1,000 tokens seen"]


def test_an_evaluation_that_lands_with_its_round_is_on_its_line():
    before = snapshot(closed=2, val_loss=4.0, val_round=2)
    after = snapshot(closed=4, val_loss=3.0, val_round=4, val_perplexity=20.09)
    assert changes(before, after) == [
        "round 3/10 closed",
        "round 4/10 closed: val loss 3.0000, perplexity 20.09, 1,000 tokens seen",
    ]


def test_the_header_spans_the_first_evaluation_to_the_latest():
    assert loss_span(snapshot(closed=2, val_loss=5.5602, val_round=0)) == "val loss 5.5602 (initial model)"
    assert loss_span(snapshot(closed=2, val_loss=4.1, val_round=1)) == "val loss 5.5602 -> 4.1000 (round 1)"
    done = snapshot(closed=10, val_loss=3.2, val_round=10, status="complete")
    assert ended_line(done) == "Run training_x complete: val loss 5.5602 -> 3.2000 (round 10), model bafy"


def test_results_spans_the_loss_the_same_way():
    """``results`` right after a run read ``8.3535 -> 8.3535`` while only the initial model was
    evaluated; it says which round its final loss is of, as the header does."""
    assert span(8.3535, 8.3535, 0) == "8.3535 (initial model)"
    assert span(8.3535, 6.1, 3) == "8.3535 -> 6.1000 (round 3)"
    assert span(None, None, None) == "-"
