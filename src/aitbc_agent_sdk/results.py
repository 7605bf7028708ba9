"""Result dicts that are truthy exactly when their verdict is, so the documented
``if not await agent.ping_worker(w):`` and ``if not await agent.verify_checkpoint(c):``
read as they say, while every detail stays readable as a key (``r["alive"]``,
``r["detail"]``). They are plain ``dict`` subclasses: ``json.dumps`` and ``==`` treat
them as the dicts they are."""

from __future__ import annotations

from typing import Any, ClassVar


class Verdict(dict[str, Any]):
    """A result dict whose truth is its ``verdict`` key (a bool)."""

    verdict: ClassVar[str]

    def __bool__(self) -> bool:
        return bool(self.get(self.verdict))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict.__repr__(self)})"


class Liveness(Verdict):
    """``ping_worker``: truthy exactly when the worker is ``alive``."""

    verdict = "alive"


class Validity(Verdict):
    """``verify_checkpoint``: truthy exactly when the checkpoint is ``valid``."""

    verdict = "valid"


class Outcome(Verdict):
    """A fault-tolerance action that may find nothing to do (no free worker, no active
    job): truthy exactly when it was ``done``; ``detail`` says what happened."""

    verdict = "done"
