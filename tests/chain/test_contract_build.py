"""The contracts compile from the sources the package ships, once per source and compiler
(then from the cache), and the Python mirrors of their constants agree with them."""

from __future__ import annotations

import json

import pytest

from aitbc.chain.evm import contracts
from aitbc.errors import AitbcError

pytestmark = pytest.mark.chain


def test_a_contract_compiles_once_then_comes_from_the_cache(tmp_path, monkeypatch):
    import vyper

    calls = []
    compile_code = vyper.compile_code
    monkeypatch.setattr(vyper, "compile_code", lambda *a, **kw: calls.append(a) or compile_code(*a, **kw))
    first = contracts.compiled(contracts.AIT, cache_dir=tmp_path)
    again = contracts.compiled(contracts.AIT, cache_dir=tmp_path)
    assert len(calls) == 1 and [p.name.split("-")[0] for p in tmp_path.glob("*.json")] == ["AIT"]
    assert again == first and first.bytecode and first.runtime and first.compiler == vyper.__version__
    assert contracts.compiled(contracts.RUN_ESCROW).bytecode  # the default cache folder


def test_an_edited_source_is_another_key(tmp_path, monkeypatch):
    before = contracts.compiled(contracts.AIT, cache_dir=tmp_path)
    edited = contracts.source(contracts.AIT).replace('"AIT"', '"XAIT"', 1)
    monkeypatch.setattr(contracts, "source", lambda name: edited)
    after = contracts.compiled(contracts.AIT, cache_dir=tmp_path)
    assert after.key != before.key and after.bytecode != before.bytecode
    assert len(list(tmp_path.glob("AIT-*.json"))) == 2


def test_a_corrupt_cache_file_is_compiled_again(tmp_path):
    c = contracts.compiled(contracts.AIT, cache_dir=tmp_path)
    (path,) = tmp_path.glob("AIT-*.json")
    path.write_text("{not json")
    assert contracts.compiled(contracts.AIT, cache_dir=tmp_path) == c
    assert json.loads(path.read_text())["abi"] == c.abi


def test_an_unknown_contract_is_one_clear_line():
    with pytest.raises(AitbcError, match=r"no contract 'Escrow'; the contracts are AIT, RunEscrow"):
        contracts.source("Escrow")


def test_the_interface_is_what_the_module_docstring_says():
    abi = {e["name"]: e for e in contracts.compiled(contracts.RUN_ESCROW).abi if "name" in e}
    fns = {n for n, e in abi.items() if e["type"] == "function"}
    events = {n for n, e in abi.items() if e["type"] == "event"}
    assert {"deposit", "top_up", "key_of", "post_bond", "settle", "finalize", "withdraw", "refund"} <= fns
    assert {"settled", "deadline", "is_open", "runs", "contracts"} <= fns
    assert events == {
        "Deposited",
        "ToppedUp",
        "Bonded",
        "Settled",
        "Slashed",
        "RoundSettled",
        "Finalized",
        "TimedOut",
        "Withdrawn",
        "Refunded",
    }
    for name in fns | events:
        assert name in (contracts.__doc__ or ""), name
    settle = [i["type"] for i in abi["settle"]["inputs"]]
    assert settle == ["bytes32", "uint256", "address[]", "uint256[]", "bool[]"]


def test_run_ref_is_keccak_256_of_the_run_id():
    assert contracts.run_ref("abc").hex() == "4e03657aea45a94fc7d47ba826c8d667c0d1e6e33a64a036ec44f58fa12d6c45"
    assert contracts.run_ref("").hex() == "c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470"


def test_run_key_is_the_contracts_key_of_the_owner_and_the_ref():
    import boa
    from tests.chain.evm_env import fresh_chain

    owner = "0x" + "ab" * 20
    with fresh_chain() as c:
        for run_id in ("abc", "", "run-\u00e9"):
            assert contracts.run_key(owner, run_id) == c.escrow.key_of(owner, contracts.run_ref(run_id))
        other = str(boa.env.generate_address())
        assert contracts.run_key(other, "abc") == c.escrow.key_of(other, contracts.run_ref("abc"))
    assert contracts.run_key(owner.upper().replace("0X", "0x"), "abc") == contracts.run_key(owner, "abc")
    assert contracts.run_key(owner, "abc") != contracts.run_key(owner, "abd") != contracts.run_key(other, "abd")
    for bad in ("0x12", "ab" * 20 + "zz", "0x" + "g" * 40):
        with pytest.raises(AitbcError, match="bad owner address"):
            contracts.run_key(bad, "abc")
