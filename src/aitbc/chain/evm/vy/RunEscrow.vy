# pragma version ~=0.4.1
# pragma evm-version cancun
"""
@title RunEscrow
@notice A training run's money on chain: the owner's escrow, each hired provider's bond,
        and each round's settlement, with the coordinator's ledger's rules.
@dev One contract per (run, provider address): its bond and what it earned. A round is
     settled once, by the settlement key, in one transaction for all its contracts: each
     gets at most the run's price (price x quality, quality <= 1) out of the escrow left,
     and a slash burns the provider's bond (the token's totalSupply falls; nobody is paid
     it: not the owner, who can make honest work look bad, nor another provider, who could
     frame a rival). Earnings are paid out by `withdraw` (pull), at any time; bonds and the
     escrow left come back once the run is closed.
     A run closes when the settlement key finalizes it, or by itself when the key has
     posted nothing for `timeout` seconds since the deposit or the last settlement: then
     the owner refunds and each provider withdraws its bond with nobody else's signature,
     and the key can settle or finalize that run no more.
     A run is known by its key, keccak256(abi_encode(owner, run_id)) (`key_of`): the
     owner names it (`run_id`) at its deposit and every other function takes the key.
     The owner may top the escrow up while the run is open.
     Every movement is logged, so every balance can be rebuilt from the events alone.
"""

interface Token:
    def transfer(receiver: address, amount: uint256) -> bool: nonpayable
    def transferFrom(sender: address, receiver: address, amount: uint256) -> bool: nonpayable
    def burn(amount: uint256): nonpayable

# The most contracts one `settle` takes: bounds its gas. About 26,000 gas a contract
# (tests/chain/test_escrow_gas.py): 128 take under 4M, well inside a 30M block.
MAX_SETTLE: public(constant(uint256)) = 128
# The longest `timeout` (ten years in seconds): the deadline stays a sane timestamp.
MAX_TIMEOUT: public(constant(uint256)) = 315_360_000

struct Run:
    owner: address
    price: uint256  # the most one contract is paid for one round
    timeout: uint256  # seconds without a post after which the run closes by itself
    escrow: uint256  # deposited, not yet settled to a provider or refunded
    deposited: uint256  # every deposit and top-up together (never falls)
    last_post: uint256  # when the escrow was deposited or the last round settled
    finalized: bool
    timed_out: bool  # TimedOut has been logged

struct Contract:
    bonded: bool
    bond: uint256  # held: 0 once burned or withdrawn
    earned: uint256  # settled to it, not yet withdrawn
    slashed: bool

event Deposited:
    key: indexed(bytes32)  # the run's key: key_of(owner, run_id)
    owner: indexed(address)
    run_id: indexed(bytes32)  # the owner's name for the run (the coordinator's: run_ref)
    amount: uint256
    price: uint256
    timeout: uint256

event ToppedUp:
    key: indexed(bytes32)
    owner: indexed(address)
    amount: uint256
    deposited: uint256  # the run's deposits so far, this one included

event Bonded:
    key: indexed(bytes32)
    provider: indexed(address)
    amount: uint256

event Settled:
    key: indexed(bytes32)
    round: indexed(uint256)
    provider: indexed(address)
    amount: uint256

event Slashed:
    key: indexed(bytes32)
    round: indexed(uint256)
    provider: indexed(address)
    amount: uint256  # burned

event RoundSettled:
    key: indexed(bytes32)
    round: indexed(uint256)
    paid: uint256
    burned: uint256

event Finalized:
    key: indexed(bytes32)

event TimedOut:
    key: indexed(bytes32)

event Withdrawn:
    key: indexed(bytes32)
    provider: indexed(address)
    earned: uint256
    bond: uint256

event Refunded:
    key: indexed(bytes32)
    owner: indexed(address)
    amount: uint256

token: public(immutable(Token))
settlement_key: public(immutable(address))
runs: public(HashMap[bytes32, Run])
contracts: public(HashMap[bytes32, HashMap[address, Contract]])
settled: public(HashMap[bytes32, HashMap[uint256, bool]])
burned: public(uint256)


@deploy
def __init__(token_address: address, key: address):
    """
    @notice An escrow paid in the token at `token_address`, settled by `key` alone.
    @param token_address An ERC-20 with `burn(amount)` (AIT).
    @param key The coordinator's settlement key: the only address that settles and finalizes.
    """
    assert token_address != empty(address), "RunEscrow: no token"
    assert key != empty(address), "RunEscrow: no settlement key"
    token = Token(token_address)
    settlement_key = key


@external
@nonreentrant
def deposit(run_id: bytes32, amount: uint256, price: uint256, timeout: uint256):
    """
    @notice Open the caller's run `run_id` with `amount` of its tokens as the escrow (the
            caller approves this contract first); the caller is the run's owner, and the
            run is `key_of(caller, run_id)` from then on.
    @dev The key is derived from the caller, so whoever sees a run id first cannot take
         it: another depositing under the same id opens a run of its own.
    @param price The most one contract is paid for one round.
    @param timeout Seconds without a settlement after which the run closes by itself
           (1 to MAX_TIMEOUT).
    """
    key: bytes32 = keccak256(abi_encode(msg.sender, run_id))
    assert self.runs[key].owner == empty(address), "RunEscrow: run already deposited"
    assert amount > 0, "RunEscrow: deposit must be more than 0"
    assert timeout > 0 and timeout <= MAX_TIMEOUT, "RunEscrow: timeout must be 1 to MAX_TIMEOUT seconds"
    self.runs[key] = Run(
        owner=msg.sender,
        price=price,
        timeout=timeout,
        escrow=amount,
        deposited=amount,
        last_post=block.timestamp,
        finalized=False,
        timed_out=False,
    )
    assert extcall token.transferFrom(msg.sender, self, amount), "RunEscrow: transfer failed"
    log Deposited(key=key, owner=msg.sender, run_id=run_id, amount=amount, price=price, timeout=timeout)


@external
@nonreentrant
def top_up(key: bytes32, amount: uint256):
    """
    @notice Add `amount` of the caller's tokens to the escrow of its open run `key` (the
            caller approves this contract first).
    @dev The owner only: money for a run comes from the one it is refunded to. A top-up
         does not move the deadline: only the settlement key's posts keep a run open.
    """
    assert msg.sender == self.runs[key].owner, "RunEscrow: only the run's owner tops up"
    self._require_open(key)
    assert amount > 0, "RunEscrow: top-up must be more than 0"
    self.runs[key].escrow += amount
    self.runs[key].deposited += amount
    assert extcall token.transferFrom(msg.sender, self, amount), "RunEscrow: transfer failed"
    log ToppedUp(key=key, owner=msg.sender, amount=amount, deposited=self.runs[key].deposited)


@external
@nonreentrant
def post_bond(key: bytes32, amount: uint256):
    """
    @notice Lock `amount` of the caller's tokens as its bond in open run `key` (once per
            run; 0 is a contract with no bond). Only a bonded provider can be settled.
    """
    self._require_open(key)
    assert not self.contracts[key][msg.sender].bonded, "RunEscrow: bond already posted"
    self.contracts[key][msg.sender].bonded = True
    self.contracts[key][msg.sender].bond = amount
    if amount > 0:
        assert extcall token.transferFrom(msg.sender, self, amount), "RunEscrow: transfer failed"
    log Bonded(key=key, provider=msg.sender, amount=amount)


@external
@nonreentrant
def settle(
    key: bytes32,
    round: uint256,
    providers: DynArray[address, MAX_SETTLE],
    amounts: DynArray[uint256, MAX_SETTLE],
    slashes: DynArray[bool, MAX_SETTLE],
):
    """
    @notice Settle round `round` of open run `key`, once: provider i earns amounts[i]
            (at most the run's price) from the escrow, and its bond is burned if slashes[i].
    @dev The settlement key only. `providers` strictly increasing (no contract twice), each
         one bonded; the amounts together at most the escrow left. A second settle of the
         same round reverts, so a resend after a crash cannot pay twice.
    """
    assert msg.sender == settlement_key, "RunEscrow: only the settlement key settles"
    self._require_open(key)
    assert not self.settled[key][round], "RunEscrow: round already settled"
    n: uint256 = len(providers)
    assert len(amounts) == n and len(slashes) == n, "RunEscrow: providers, amounts, slashes differ in length"
    price: uint256 = self.runs[key].price
    paid: uint256 = 0
    burned: uint256 = 0
    previous: uint256 = 0
    for i: uint256 in range(n, bound=MAX_SETTLE):
        provider: address = providers[i]
        assert convert(provider, uint256) > previous, "RunEscrow: providers not strictly increasing"
        previous = convert(provider, uint256)
        paid += self._pay(key, round, provider, amounts[i], price)
        if slashes[i]:
            burned += self._slash(key, round, provider)
    assert paid <= self.runs[key].escrow, "RunEscrow: settlement above the escrow left"
    self.runs[key].escrow -= paid
    self.runs[key].last_post = block.timestamp
    self.settled[key][round] = True
    self.burned += burned
    if burned > 0:
        extcall token.burn(burned)
    log RoundSettled(key=key, round=round, paid=paid, burned=burned)


@external
def finalize(key: bytes32):
    """
    @notice Close open run `key` (the settlement key only, after its last settlement):
            bonds and the escrow left may then be taken back.
    """
    assert msg.sender == settlement_key, "RunEscrow: only the settlement key finalizes"
    self._require_open(key)
    self.runs[key].finalized = True
    log Finalized(key=key)


@external
@nonreentrant
def withdraw(key: bytes32):
    """
    @notice Pay the caller what it earned in run `key` and not yet withdrawn, and its
            unslashed bond once the run is closed (finalized or timed out).
    @dev Reverts when there is nothing to pay, so a second withdraw pays nothing.
    """
    c: Contract = self.contracts[key][msg.sender]
    bond: uint256 = 0
    if self._close(key):
        bond = c.bond
    assert c.earned + bond > 0, "RunEscrow: nothing to withdraw"
    self.contracts[key][msg.sender].earned = 0
    self.contracts[key][msg.sender].bond = c.bond - bond
    assert extcall token.transfer(msg.sender, c.earned + bond), "RunEscrow: transfer failed"
    log Withdrawn(key=key, provider=msg.sender, earned=c.earned, bond=bond)


@external
@nonreentrant
def refund(key: bytes32):
    """
    @notice Pay the owner of run `key` the escrow left, once the run is closed
            (finalized, or timed out: the owner's way out when no settlement comes).
    """
    assert msg.sender == self.runs[key].owner, "RunEscrow: only the run's owner is refunded"
    assert self._close(key), "RunEscrow: run still open: refund after it is finalized or timed out"
    amount: uint256 = self.runs[key].escrow
    assert amount > 0, "RunEscrow: nothing to refund"
    self.runs[key].escrow = 0
    assert extcall token.transfer(msg.sender, amount), "RunEscrow: transfer failed"
    log Refunded(key=key, owner=msg.sender, amount=amount)


@pure
@external
def key_of(owner: address, run_id: bytes32) -> bytes32:
    """
    @notice The key of the run `owner` deposited as `run_id`: keccak256(abi_encode(owner, run_id)).
    """
    return keccak256(abi_encode(owner, run_id))


@view
@external
def deadline(key: bytes32) -> uint256:
    """
    @notice When run `key` times out unless the settlement key posts before (0: no run).
    """
    r: Run = self.runs[key]
    if r.owner == empty(address):
        return 0
    return r.last_post + r.timeout


@view
@external
def is_open(key: bytes32) -> bool:
    """
    @notice Whether run `key` exists and is neither finalized nor timed out.
    """
    r: Run = self.runs[key]
    return r.owner != empty(address) and not r.finalized and not self._expired(r)


@view
@internal
def _expired(r: Run) -> bool:
    """
    @dev Whether the settlement key has posted nothing for `r.timeout` seconds.
    """
    return block.timestamp >= r.last_post + r.timeout


@internal
def _require_open(key: bytes32):
    """
    @dev Revert unless run `key` was deposited and is neither finalized nor timed out.
    """
    r: Run = self.runs[key]
    assert r.owner != empty(address), "RunEscrow: no such run"
    assert not r.finalized, "RunEscrow: run finalized"
    assert not self._expired(r), "RunEscrow: run timed out"


@internal
def _close(key: bytes32) -> bool:
    """
    @dev Whether run `key` is closed; the first call after its timeout logs TimedOut.
    """
    r: Run = self.runs[key]
    if r.owner == empty(address):
        return False
    if r.finalized or r.timed_out:
        return True
    if not self._expired(r):
        return False
    self.runs[key].timed_out = True
    log TimedOut(key=key)
    return True


@internal
def _pay(key: bytes32, round: uint256, provider: address, amount: uint256, price: uint256) -> uint256:
    """
    @dev Credit a bonded provider `amount` (at most `price`) for round `round`.
    """
    assert self.contracts[key][provider].bonded, "RunEscrow: provider has no contract in this run"
    assert amount <= price, "RunEscrow: amount above the run's price"
    self.contracts[key][provider].earned += amount
    log Settled(key=key, round=round, provider=provider, amount=amount)
    return amount


@internal
def _slash(key: bytes32, round: uint256, provider: address) -> uint256:
    """
    @dev Burn the provider's bond; a contract slashed before has nothing left to burn.
    """
    c: Contract = self.contracts[key][provider]
    if c.slashed:
        return 0
    self.contracts[key][provider].slashed = True
    self.contracts[key][provider].bond = 0
    log Slashed(key=key, round=round, provider=provider, amount=c.bond)
    return c.bond
