"""What a change to a stored object is, and what it answers when it finds
nothing to do: below the pure transitions (okq/leases.py, okq/manifest_ops.py)
that return it, and below okq/cell.py, which applies them.

A change is a function ``fn(obj, now) -> result`` that mutates the copy of the
object it is given, or returns :class:`Unchanged` when there is nothing to do;
it may raise an :class:`~okq.errors.OkqError` to refuse itself, before it
mutates anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Change = Callable[[Any, int], Any]
#: A change's follow-up: work on its result done while its write is on its way
#: (okq/cell.py).
Then = Callable[[Any], Any]


@dataclass(frozen=True)
class Unchanged:
    """What a change returns when it found nothing to do: the cell then writes
    nothing for it (after confirming on a fresh read), and answers ``value``."""

    value: Any = None
