"""The AITBC agent SDK: drive distributed trainings on an ``aitbc`` coordinator from
Python, blocking (:class:`Agent`) or with asyncio (:class:`AsyncAgent`); both have the
same methods, generated from one table of sans-IO operations.

    from aitbc_agent_sdk import Agent, AgentConfig
    agent = Agent(AgentConfig(name="distributed-training", blockchain_network="local",
                              wallet_name="training-wallet"))
    agent.start()
"""

from aitbc_agent_sdk.clients import Agent, AsyncAgent
from aitbc_agent_sdk.config import AgentConfig
from aitbc_agent_sdk.errors import (
    AgentError,
    AmbiguousRun,
    BadRequest,
    Conflict,
    CoordinatorUnreachable,
    Forbidden,
    HttpsRequired,
    IntegrityFailure,
    InvalidArgument,
    NotFound,
    SettlementTimeout,
    TrainingFailed,
    Unauthorized,
    Unprocessable,
    WaitTimeout,
)
from aitbc_agent_sdk.operations import OPERATIONS
from aitbc_agent_sdk.protocol import Progress

__all__ = [
    "Agent",
    "AsyncAgent",
    "AgentConfig",
    "OPERATIONS",
    "Progress",
    "AgentError",
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "Unprocessable",
    "CoordinatorUnreachable",
    "InvalidArgument",
    "HttpsRequired",
    "AmbiguousRun",
    "TrainingFailed",
    "WaitTimeout",
    "SettlementTimeout",
    "IntegrityFailure",
]
