"""Clocks. Every piece of okq that needs the time takes one of these.

Times are integer milliseconds since the epoch throughout okq's state objects;
a time given without a zone (the API's, the command line's) is UTC.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol

#: The documented clock-skew bound: every node's and compactor's clock is within
#: this many milliseconds of the true time, so two clocks differ by at most twice
#: it. Within the bound okq keeps every promise (docs/DESIGN.md, "Clocks").
MAX_CLOCK_SKEW_MS = 60_000


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to; for tests."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.t = start_ms

    def now_ms(self) -> int:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += round(seconds * 1000)


class OffsetClock:
    """Another clock shifted by a fixed offset: a node whose clock is wrong."""

    def __init__(self, base: Clock, offset_s: float) -> None:
        self.base = base
        self.offset_ms = int(offset_s * 1000)

    def now_ms(self) -> int:
        return self.base.now_ms() + self.offset_ms


def assume_utc(value: datetime) -> datetime:
    """``value``, read as UTC when it has no zone (an aware time keeps its own)."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
