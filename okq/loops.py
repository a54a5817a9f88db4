"""The event loop a node runs on (``--event-loop``).

``auto`` (the default) takes uvloop's loop where uvloop is installed (it is a
dependency of okq on Linux and macOS) and asyncio's otherwise; ``uvloop`` insists
on it, ``asyncio`` keeps the standard library's. uvloop runs the loop's own work
(the ready queue, timers, the selector, socket reads and writes) in C where
asyncio runs it in Python: a node spends about 5 % fewer instructions per
lease+complete message on it, and about as many per produced one as on asyncio's
(docs/PERFORMANCE.md, "Ninth round"). okq's code is the same on both; the suite's
``okq serve`` processes run on the default.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["CHOICES", "Loop", "choose"]

Choice = Literal["auto", "uvloop", "asyncio"]
CHOICES: tuple[Choice, ...] = ("auto", "uvloop", "asyncio")


@dataclass(frozen=True)
class Loop:
    """An event loop to run on: how to make one, and what to call it in the log."""

    name: str  # "uvloop 0.23.0" or "asyncio"
    factory: Callable[[], asyncio.AbstractEventLoop]


def choose(choice: Choice) -> Loop:
    """The loop ``choice`` names. ``uvloop`` without uvloop installed is a
    ``ValueError`` that says so; ``auto`` then falls back to asyncio's loop."""
    if choice not in CHOICES:
        raise ValueError(f"--event-loop must be one of {', '.join(CHOICES)}, not {choice!r}")
    if choice != "asyncio":
        try:
            uvloop = importlib.import_module("uvloop")
        except ImportError as exc:
            if choice == "uvloop":
                raise ValueError(
                    f"--event-loop uvloop: uvloop is not installed ({exc}); install it "
                    "(pip install uvloop) or choose --event-loop asyncio") from None
        else:
            return Loop(f"uvloop {getattr(uvloop, '__version__', '')}".strip(),
                        uvloop.new_event_loop)
    return Loop("asyncio", asyncio.new_event_loop)
