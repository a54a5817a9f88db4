"""okq: a durable message queue whose whole state lives in an S3-compatible bucket."""

from okq.clock import Clock, ManualClock, SystemClock
from okq.engine import Engine, EngineOptions, LeasedItem, QueueInfo, QueueStats, generate_key
from okq.errors import OkqError
from okq.model import QueueConfig
from okq.publisher import NewItem
from okq.store import open_store
from okq.tokens import TokenSigner

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
