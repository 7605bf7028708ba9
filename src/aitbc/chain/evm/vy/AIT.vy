# pragma version ~=0.4.1
# pragma evm-version cancun
"""
@title AIT
@notice The ERC-20 token that runs are paid in. 6 decimals: one unit is one micro-AIT,
        the integer the coordinator's ledger counts in (aitbc.units.MICRO), so an amount
        means the same number on both sides.
@dev A minter (the deployer at first) mints: the local network's faucet. `set_minter`
     hands the role on, or drops it for good (the empty address), fixing the supply.
     Anyone may burn their own tokens; RunEscrow burns slashed bonds this way, so a
     slash lowers `totalSupply` and is paid to no one.
"""

from ethereum.ercs import IERC20

implements: IERC20

event Transfer:
    sender: indexed(address)
    receiver: indexed(address)
    value: uint256

event Approval:
    owner: indexed(address)
    spender: indexed(address)
    value: uint256

event MinterChanged:
    previous: indexed(address)
    minter: indexed(address)

name: public(constant(String[32])) = "AIT"
symbol: public(constant(String[8])) = "AIT"
decimals: public(constant(uint8)) = 6

balanceOf: public(HashMap[address, uint256])
allowance: public(HashMap[address, HashMap[address, uint256]])
totalSupply: public(uint256)
minter: public(address)


@deploy
def __init__():
    """
    @notice The deployer is the first minter. The supply starts at 0.
    """
    self.minter = msg.sender
    log MinterChanged(previous=empty(address), minter=msg.sender)


@external
def transfer(receiver: address, amount: uint256) -> bool:
    """
    @notice Move `amount` of the caller's tokens to `receiver`.
    """
    self._transfer(msg.sender, receiver, amount)
    return True


@external
def transferFrom(sender: address, receiver: address, amount: uint256) -> bool:
    """
    @notice Move `amount` from `sender` to `receiver` within the caller's allowance.
    @dev An allowance of max(uint256) is unlimited and never spent down.
    """
    allowed: uint256 = self.allowance[sender][msg.sender]
    assert allowed >= amount, "AIT: allowance too low"
    if allowed != max_value(uint256):
        self.allowance[sender][msg.sender] = allowed - amount
    self._transfer(sender, receiver, amount)
    return True


@external
def approve(spender: address, amount: uint256) -> bool:
    """
    @notice Let `spender` move up to `amount` of the caller's tokens.
    """
    self.allowance[msg.sender][spender] = amount
    log Approval(owner=msg.sender, spender=spender, value=amount)
    return True


@external
def mint(receiver: address, amount: uint256):
    """
    @notice Create `amount` new tokens for `receiver` (the minter only: the faucet).
    """
    assert msg.sender == self.minter, "AIT: only the minter mints"
    assert receiver != empty(address), "AIT: mint to the zero address"
    self.totalSupply += amount
    self.balanceOf[receiver] += amount
    log Transfer(sender=empty(address), receiver=receiver, value=amount)


@external
def burn(amount: uint256):
    """
    @notice Destroy `amount` of the caller's tokens: `totalSupply` falls by as much.
    """
    assert self.balanceOf[msg.sender] >= amount, "AIT: burn above balance"
    self.balanceOf[msg.sender] -= amount
    self.totalSupply -= amount
    log Transfer(sender=msg.sender, receiver=empty(address), value=amount)


@external
def set_minter(minter: address):
    """
    @notice Hand the minter role to `minter` (the current minter only); the empty
            address ends minting for good.
    """
    assert msg.sender == self.minter, "AIT: only the minter hands the role on"
    log MinterChanged(previous=self.minter, minter=minter)
    self.minter = minter


@internal
def _transfer(sender: address, receiver: address, amount: uint256):
    # The zero address is where burned tokens go in the events; sending there would
    # hide a burn that did not lower the supply.
    assert receiver != empty(address), "AIT: transfer to the zero address"
    assert self.balanceOf[sender] >= amount, "AIT: transfer above balance"
    self.balanceOf[sender] -= amount
    self.balanceOf[receiver] += amount
    log Transfer(sender=sender, receiver=receiver, value=amount)
