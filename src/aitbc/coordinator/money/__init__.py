"""The run's money: escrow, bonds, hire holds and payments (``escrow``), and the local network's
faucet and transfers (``wallets``). Every movement is one ledger entry. Imports ``context``,
``schemas`` and ``store``."""
