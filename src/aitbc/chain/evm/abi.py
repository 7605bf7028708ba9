"""A contract's ABI as data: encode calls and constructor arguments, decode results and logs.

Built on ``eth_abi`` (the encoding) and ``eth_utils.keccak`` (selectors and event topics)
from a compiler's ABI JSON, so any compiled contract (Vyper or Solidity) is read the same
way. Indexed event arguments of dynamic types (strings, arrays) are stored by the chain
as their hash only: they decode to that 32-byte hash, as every client shows them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eth_abi import decode, encode
from eth_utils import keccak, to_checksum_address

from aitbc.errors import UsageError

_DYNAMIC = ("string", "bytes")


def _canonical(param: dict[str, Any]) -> str:
    """An ABI parameter's canonical type (``(uint256,address)[]`` for a tuple array)."""
    kind = str(param["type"])
    if kind.startswith("tuple"):
        inner = ",".join(_canonical(c) for c in param.get("components", []))
        return f"({inner}){kind[len('tuple') :]}"
    return kind


def _checksummed(kind: str, value: Any) -> Any:
    """Addresses as their checksummed strings (what a user compares with), the rest as decoded."""
    if kind == "address":
        return to_checksum_address(value)
    if kind == "address[]" or (kind.startswith("address[") and isinstance(value, tuple | list)):
        return [to_checksum_address(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    selector: bytes

    @property
    def signature(self) -> str:
        return f"{self.name}({','.join(self.inputs)})"


@dataclass(frozen=True, slots=True)
class EventSpec:
    name: str
    names: tuple[str, ...]
    types: tuple[str, ...]
    indexed: tuple[bool, ...]
    topic: str  # 0x + keccak of the signature: the log's first topic

    @property
    def signature(self) -> str:
        return f"{self.name}({','.join(self.types)})"


@dataclass(frozen=True, slots=True)
class Event:
    """One decoded log: the event's name and arguments, and where the chain holds it."""

    name: str
    args: dict[str, Any]
    address: str
    block_number: int
    tx_hash: str
    log_index: int


class Abi:
    """A contract's functions and events by name (an overloaded name: its first entry)."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.functions: dict[str, Function] = {}
        self.events: dict[str, EventSpec] = {}
        self.constructor_inputs: tuple[str, ...] = ()
        for entry in entries:
            kind = entry.get("type")
            inputs = tuple(_canonical(p) for p in entry.get("inputs", []))
            if kind == "function":
                name = str(entry["name"])
                outputs = tuple(_canonical(p) for p in entry.get("outputs", []))
                selector = keccak(text=f"{name}({','.join(inputs)})")[:4]
                self.functions.setdefault(name, Function(name, inputs, outputs, selector))
            elif kind == "event":
                name = str(entry["name"])
                topic = "0x" + keccak(text=f"{name}({','.join(inputs)})").hex()
                names = tuple(str(p["name"]) for p in entry["inputs"])
                indexed = tuple(bool(p.get("indexed")) for p in entry["inputs"])
                self.events.setdefault(name, EventSpec(name, names, inputs, indexed, topic))
            elif kind == "constructor":
                self.constructor_inputs = inputs

    def function(self, name: str) -> Function:
        try:
            return self.functions[name]
        except KeyError:
            raise UsageError(
                f"the contract has no function {name!r}; it has {', '.join(sorted(self.functions))}"
            ) from None

    def event(self, name: str) -> EventSpec:
        try:
            return self.events[name]
        except KeyError:
            raise UsageError(f"the contract has no event {name!r}; it has {', '.join(sorted(self.events))}") from None

    def encode_call(self, name: str, *args: Any) -> bytes:
        fn = self.function(name)
        if len(args) != len(fn.inputs):
            raise UsageError(f"{fn.signature} takes {len(fn.inputs)} arguments, got {len(args)}")
        return fn.selector + encode(list(fn.inputs), list(args))

    def encode_constructor(self, *args: Any) -> bytes:
        if len(args) != len(self.constructor_inputs):
            raise UsageError(f"the constructor takes {len(self.constructor_inputs)} arguments, got {len(args)}")
        return encode(list(self.constructor_inputs), list(args)) if args else b""

    def decode_result(self, name: str, data: bytes) -> Any:
        """A call's result: the value for one output, a tuple for several, None for none."""
        fn = self.function(name)
        values = [_checksummed(t, v) for t, v in zip(fn.outputs, decode(list(fn.outputs), data))]
        if len(values) == 1:
            return values[0]
        return tuple(values) if values else None

    def decode_log(self, log: dict[str, Any]) -> Event | None:
        """The event a log (``eth_getLogs``'s shape) is, or None for an event not in this ABI."""
        topics = [str(t) for t in log.get("topics", [])]
        spec = next((e for e in self.events.values() if topics and e.topic == topics[0].lower()), None)
        if spec is None:
            return None
        plain = [t for t, ix in zip(spec.types, spec.indexed) if not ix]
        data = bytes.fromhex(str(log.get("data", "0x"))[2:])
        unindexed = iter(decode(plain, data)) if plain else iter(())
        indexed_topics = iter(topics[1:])
        args: dict[str, Any] = {}
        for name, kind, ix in zip(spec.names, spec.types, spec.indexed):
            if not ix:
                args[name] = _checksummed(kind, next(unindexed))
                continue
            raw = bytes.fromhex(next(indexed_topics)[2:])
            dynamic = kind in _DYNAMIC or kind.endswith("]") or kind.startswith("(")
            args[name] = raw if dynamic else _checksummed(kind, decode([kind], raw)[0])
        return Event(
            name=spec.name,
            args=args,
            address=to_checksum_address(str(log["address"])),
            block_number=int(str(log["blockNumber"]), 16),
            tx_hash=str(log["transactionHash"]),
            log_index=int(str(log["logIndex"]), 16),
        )
