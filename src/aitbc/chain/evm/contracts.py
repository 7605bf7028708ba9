"""The EVM contracts: their Vyper sources, compiled to ABI and bytecode, and their interface.

The sources live beside this module (``vy/AIT.vy``, ``vy/RunEscrow.vy``), inside the
package, so an installed ``aitbc`` deploys the contracts it ships. :func:`compiled`
compiles one with the installed ``vyper`` (the ``chain`` extra: ``pip install
'aitbc[chain]'``; ``make install`` installs it) and keeps the result in a cache folder,
keyed by a hash of the source and the compiler's version: a compile takes seconds, and a
stale artifact can never be deployed, because an edited source or another compiler is
another key. Nothing compiled is committed, so there is no artifact to keep in step.

Money is integers of micro-AIT on both sides: the token has 6 decimals
(``aitbc.units.MICRO``), so 1 token unit is 1 micro-AIT. The owner deposits a run under
:func:`run_ref` of the coordinator's run id; on chain the run is then known by its key,
:func:`run_key` (the owner's address and that ref), and a contract is (run key, provider
address).

AIT (ERC-20, 6 decimals)
    constructor()                                     the deployer is the minter
    name() -> "AIT", symbol() -> "AIT", decimals() -> 6, totalSupply(), balanceOf(a),
    allowance(owner, spender), minter() -> address
    transfer(to, amount) -> bool, transferFrom(from, to, amount) -> bool,
    approve(spender, amount) -> bool                  standard; max allowance is unlimited
    mint(to, amount)                                  the minter only (the local faucet)
    burn(amount)                                      the caller's own tokens; supply falls
    set_minter(minter)                                the minter only; empty address: no more minting
    events Transfer(sender, receiver, value) (burn/mint: the zero address),
           Approval(owner, spender, value), MinterChanged(previous, minter)

RunEscrow
    constructor(token_address, key)                   key: the settlement key, fixed for good
    token() -> address, settlement_key() -> address, burned() -> uint256 (all slashes)
    MAX_SETTLE() -> 128                               most contracts in one settle (gas bound)
    MAX_TIMEOUT() -> 315360000                        longest timeout, seconds
    deposit(run_id: bytes32, amount, price, timeout)  owner: approve first; opens the run
                                                      key_of(caller, run_id); once per key
    top_up(key, amount)                               owner, open run: approve first; more escrow
    key_of(owner, run_id) -> bytes32                  keccak256(abi_encode(owner, run_id))
    post_bond(key, amount)                            provider: approve first; once a run;
                                                      0 allowed; only bonded providers are paid
    settle(key, round, providers: address[], amounts: uint256[], slashes: bool[])
                                                      settlement key only, once per (run, round);
                                                      providers strictly increasing (sorted by
                                                      address, no duplicates), each bonded;
                                                      each amount <= price; their sum <= escrow left;
                                                      slashes[i]: burn that provider's bond
    finalize(key)                                     settlement key only: closes the run
    withdraw(key)                                     provider: its earnings (any time) and its
                                                      unslashed bond (once closed); nothing: reverts
    refund(key)                                       owner, once closed: the escrow left
    runs(key) -> (owner, price, timeout, escrow, deposited, last_post, finalized, timed_out)
                                                      deposited: every deposit and top-up together
    contracts(key, provider) -> (bonded, bond, earned, slashed)
    settled(key, round) -> bool                       check before resending a settlement
    deadline(key) -> uint256                          timestamp it times out at (0: no run)
    is_open(key) -> bool
    A run is closed once finalized, or once ``timeout`` seconds passed since its deposit or
    its last settle: then settle, finalize and post_bond revert, the owner may refund and
    each provider withdraw its bond, with no other signature.
    events Deposited(key, owner, run_id, amount, price, timeout) (the three first indexed),
           ToppedUp(key, owner, amount, deposited), Bonded(key, provider, amount),
           Settled(key, round, provider, amount), Slashed(key, round, provider, amount),
           RoundSettled(key, round, paid, burned), Finalized(key), TimedOut(key),
           Withdrawn(key, provider, earned, bond), Refunded(key, owner, amount)
    Every revert's reason starts with "RunEscrow: " (the token's with "AIT: ").

What the rules leave to the settlement key, as the coordinator's ledger does: who is paid
how much for a round (within the price and the escrow left) and whom to slash. What it
cannot do: pay itself or anyone without a contract, pay a round twice, pay more than the
escrow, give a slashed bond to anyone, move money after the run closes, or hold the money
once it stops posting. Nobody can take or block another owner's run: its key is derived
from the depositor's address, so a deposit under the same run id by anyone else is a run
of its own, under another key. Left open: a key that keeps posting (even empty rounds)
keeps a run open.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from aitbc.errors import AitbcError

AIT = "AIT"
RUN_ESCROW = "RunEscrow"
NAMES = (AIT, RUN_ESCROW)
# Mirrors of the escrow's constants (a test holds them equal to the compiled contract's).
MAX_SETTLE = 128
MAX_TIMEOUT = 315_360_000
DEFAULT_CACHE = Path.home() / ".cache" / "aitbc" / "evm"
_FORMATS = ["abi", "bytecode", "bytecode_runtime"]


@dataclass(frozen=True, slots=True)
class Compiled:
    """One compiled contract: ``bytecode`` deploys it (constructor arguments appended,
    ABI-encoded), ``runtime`` is what the chain then holds at its address."""

    name: str
    abi: list[dict[str, Any]]
    bytecode: bytes
    runtime: bytes
    compiler: str  # the vyper version that compiled it
    key: str  # the cache key: sha256 of the compiler version and the source


def source(name: str) -> str:
    """The Vyper source of contract ``name`` (one of :data:`NAMES`)."""
    if name not in NAMES:
        raise AitbcError(f"no contract {name!r}; the contracts are {', '.join(NAMES)}")
    return resources.files(__package__).joinpath("vy", f"{name}.vy").read_text(encoding="utf-8")


def compiled(name: str, *, cache_dir: Path | None = None) -> Compiled:
    """Contract ``name`` compiled by the installed vyper, from ``cache_dir`` (default
    ``~/.cache/aitbc/evm``) when this source was compiled by this compiler before."""
    vyper = _vyper()
    text = source(name)
    key = hashlib.sha256(f"{vyper.__version__}\0{text}".encode()).hexdigest()
    path = (cache_dir or DEFAULT_CACHE) / f"{name}-{key[:16]}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = vyper.compile_code(text, contract_path=f"{name}.vy", output_formats=_FORMATS)
        _write_atomic(path, json.dumps(data))
    return Compiled(
        name=name,
        abi=data["abi"],
        bytecode=bytes.fromhex(data["bytecode"].removeprefix("0x")),
        runtime=bytes.fromhex(data["bytecode_runtime"].removeprefix("0x")),
        compiler=vyper.__version__,
        key=key,
    )


def run_ref(run_id: str) -> bytes:
    """A coordinator run id as the escrow's ``run_id`` (what the owner deposits under):
    keccak-256 of its UTF-8 bytes."""
    return _keccak(run_id.encode("utf-8"))


def run_key(owner: str, run_id: str) -> bytes:
    """The escrow's key of run ``run_id`` deposited by ``owner`` (an EVM address), as the
    contract derives it (``key_of``): keccak-256 of ``abi.encode(owner, run_ref(run_id))``."""
    text = owner.removeprefix("0x").removeprefix("0X")
    if len(text) != 40 or any(ch not in "0123456789abcdefABCDEF" for ch in text):
        raise AitbcError(f"bad owner address {owner!r}: want an EVM address, 0x and 40 hex digits")
    return _keccak(bytes(12) + bytes.fromhex(text) + run_ref(run_id))


def _keccak(data: bytes) -> bytes:
    from Crypto.Hash import keccak  # pycryptodome, a dependency of vyper and of the chain extra

    return keccak.new(digest_bits=256, data=data).digest()


def _vyper() -> Any:
    try:
        import vyper
    except ImportError:
        raise AitbcError(
            "compiling the EVM contracts needs the Vyper compiler: pip install 'aitbc[chain]' (make install does)"
        ) from None
    return vyper


def _write_atomic(path: Path, text: str) -> None:
    """Concurrent compiles (test workers) each write a whole file; the last rename wins."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
