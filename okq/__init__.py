"""okq: a durable message queue whose whole state lives in an S3-compatible bucket."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from okq.clock import Clock, ManualClock, SystemClock
    from okq.engine import Engine, EngineOptions, LeasedItem, QueueInfo, QueueStats, generate_key
    from okq.errors import OkqError
    from okq.model import QueueConfig
    from okq.publisher import NewItem
    from okq.store import open_store
    from okq.tokens import TokenSigner

#: Where each public name lives: loaded on first use, so that ``import okq.cli`` (every
#: ``okq`` command) does not load the engine it may never use.
_HOMES = {
    "Clock": "okq.clock", "ManualClock": "okq.clock", "SystemClock": "okq.clock",
    "Engine": "okq.engine", "EngineOptions": "okq.engine", "LeasedItem": "okq.engine",
    "QueueInfo": "okq.engine", "QueueStats": "okq.engine", "generate_key": "okq.engine",
    "OkqError": "okq.errors", "QueueConfig": "okq.model", "NewItem": "okq.publisher",
    "open_store": "okq.store", "TokenSigner": "okq.tokens",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Clock",
    "Engine",
    "EngineOptions",
    "LeasedItem",
    "ManualClock",
    "NewItem",
    "OkqError",
    "QueueConfig",
    "QueueInfo",
    "QueueStats",
    "SystemClock",
    "TokenSigner",
    "generate_key",
    "open_store",
]

__version__ = "0.1.0"
