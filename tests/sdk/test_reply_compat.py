"""A client reads a newer coordinator's replies: keys it does not know, at any depth, are left
out (a worker or an SDK one release behind keeps working), while every key it does know is
still checked; the coordinator's own views still refuse a key their model lacks."""

import pytest
from pydantic import ValidationError

from aitbc.replies.base import Page, parse
from aitbc.replies.blobs import Holders
from aitbc.replies.gossip import Witnessed
from aitbc.replies.money import Balance

BALANCE = {"address": "aitbc1x", "network": "local", "balance": "1.000000", "balance_micro": 1_000_000}


def test_an_unknown_top_level_key_is_left_out_by_a_client_and_refused_by_the_coordinator():
    answer = {**BALANCE, "added_later": 7}
    assert parse(Balance, answer) == Balance.model_validate(BALANCE)
    with pytest.raises(ValidationError, match="added_later"):
        Balance.model_validate(answer)


def test_unknown_keys_inside_nested_replies_are_left_out_too():
    holders = {"cid": "b", "data": [{"worker": "a", "url": "http://127.0.0.1:1", "zone": "new"}], "count": 1, "more": 1}
    parsed = parse(Holders, holders)
    assert [(p.worker, p.url) for p in parsed.data] == [("a", "http://127.0.0.1:1")]
    with pytest.raises(ValidationError):
        Holders.model_validate(holders)


def test_a_known_key_of_the_wrong_type_or_a_missing_one_is_still_refused():
    with pytest.raises(ValidationError):
        parse(Page[Witnessed], {"data": "not a list", "count": 1})
    with pytest.raises(ValidationError, match="balance_micro"):
        parse(Balance, {k: v for k, v in BALANCE.items() if k != "balance_micro"})
