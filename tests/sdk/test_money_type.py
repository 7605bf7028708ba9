"""Money is one type in every reply, the SDK's results and the CLI's ``--json``: an amount of
AIT is :data:`~aitbc.replies.base.Money` (an exact ``Decimal`` in Python, a decimal string
in JSON), and the integer beside some amounts says its unit in its name (``*_micro``)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import typing
from decimal import Decimal

import pytest

import aitbc.replies
from aitbc.cli.common import json_text
from aitbc.replies.base import Money, Reply, parse
from aitbc.replies.money import Balance, Payments
from aitbc.replies.runs import ContractView
from aitbc.units import AIT
from aitbc_agent_sdk import results, use
from aitbc_agent_sdk.operations import _amount

# Field names that hold money, in AIT or (with _micro) in micro-AIT.
MONEY = re.compile(
    r"^(price|paid|due|bond|slashed|escrowed|escrow_balance|escrow_left|balance|amount|amount_ait|budget|"
    r"max_bond|max_cost|cost|refunded|earned)(_micro)?$"
)
# The ledger's own record: an entry's amount is the integer it was signed and hashed with
# (amount_ait beside it is the Money); clients of every release audit the chain with it.
LEDGER_RECORD = {("EntryView", "amount")}


def _models() -> list[type[Reply]]:
    mods = [importlib.import_module(f"aitbc.replies.{m.name}") for m in pkgutil.iter_modules(aitbc.replies.__path__)]
    found = {
        obj
        for m in [*mods, results, use]
        for obj in vars(m).values()
        if isinstance(obj, type) and issubclass(obj, Reply) and obj is not Reply
    }
    return sorted(found, key=lambda c: c.__name__)


def _is_money(ann: object) -> bool:
    """``Money`` or ``Money | None``."""
    args = [a for a in typing.get_args(ann) if a is not type(None)] if typing.get_origin(ann) else [ann]
    return len(args) == 1 and (args[0] is AIT or args[0] == Money)


def test_every_money_field_of_every_reply_is_money_or_says_micro_in_its_name():
    wrong, seen = [], 0
    for model in _models():
        for name, f in model.model_fields.items():
            if not MONEY.match(name):
                continue
            seen += 1
            micro = name.endswith("_micro") or (model.__name__, name) in LEDGER_RECORD
            ok = f.annotation is int if micro else _is_money(f.annotation)
            if not ok:
                wrong.append(f"{model.__name__}.{name}: {f.annotation}")
    assert seen > 40, seen  # the walk found the money
    assert not wrong, "money fields not of the one type:\n" + "\n".join(wrong)


def test_a_ledger_balances_map_is_micro_ait():
    from aitbc.replies.money import Balances

    value = typing.get_args(Balances.model_fields["data"].annotation)[1]
    assert typing.get_args(value)[0] is int  # MicroAIT: Annotated[int, ...]


CONTRACT = {
    "contract_id": "c",
    "worker_id": "w",
    "training_id": "t",
    "price": "1.5",
    "price_micro": 1_500_000,
    "status": "hired",
    "score": 0.5,
}


@pytest.mark.parametrize("sent", ["1.5", "1.500000", 1.5])  # a float: a coordinator of an earlier release
def test_an_amount_reads_as_an_exact_decimal_and_writes_as_the_decimal_string(sent):
    c = parse(ContractView, {**CONTRACT, "price": sent})
    assert isinstance(c.price, Decimal) and c.price == Decimal("1.5") and str(c.price) == "1.5"
    assert c.model_dump(mode="json")["price"] == "1.5"
    assert json.loads(c.model_dump_json())["price"] == "1.5"


def test_amounts_add_exactly_and_mix_with_floats_as_ints_do():
    pay = parse(Balance, {"address": "a", "network": "local", "balance": "0.1", "balance_micro": 100_000})
    three = pay.balance + pay.balance + pay.balance
    assert three == Decimal("0.3") and isinstance(three, AIT)  # exact, where floats give 0.30000000000000004
    # the users' documentation scores an offer with floats: 1 / (price + 1) * 0.3
    assert 1 / (parse(ContractView, CONTRACT).price + 1) * 0.3 == pytest.approx(0.12)
    # and an amount read off a reply is passed back as the string it came as
    assert _amount(parse(ContractView, CONTRACT).price, "price") == "1.5"


def test_the_cli_json_writes_every_amount_as_a_decimal_string():
    payments = {
        "training_id": "t",
        "network": "local",
        "control": "automatic",
        "escrowed": "32.8",
        "escrow_balance": "0.000001",
        "settled_round": 3,
        "rounds_closed": 3,
        "finalized": False,
        "status": "complete",
        "settled": False,
        "data": [
            {
                **{k: CONTRACT[k] for k in ("worker_id", "contract_id", "price", "price_micro", "status")},
                "rounds_accepted": 3,
                "rounds_scored": 3,
                "score": 1.0,
                "flags": [],
                "paid": "4.5",
                "paid_micro": 4_500_000,
                "due": "4.5",
                "due_micro": 4_500_000,
                "bond": "0",
                "slashed": "0",
                "slashed_micro": 0,
                "reputation": 2.5,
            }
        ],
        "count": 1,
    }
    res = parse(Payments, payments)
    out = json.loads(json_text(res))
    assert (out["escrowed"], out["escrow_balance"]) == ("32.8", "0.000001")
    row = out["data"][0]
    assert (row["price"], row["paid"], row["due"], row["bond"]) == ("1.5", "4.5", "4.5", "0")
    # a command that adds its own keys to a reply read by key (wallet balance --json)
    bal = parse(Balance, {"address": "a", "network": "local", "balance": "88.000001", "balance_micro": 88_000_001})
    assert json.loads(json_text({**bal, "name": "alice"}))["balance"] == "88.000001"


def test_the_api_schema_says_an_amount_is_a_string():
    for model in (ContractView, Payments, Balance):
        props = model.model_json_schema()["properties"]
        money = [k for k in props if MONEY.match(k) and not k.endswith("_micro")]
        assert money and all(props[k]["type"] == "string" for k in money), (model.__name__, props)
