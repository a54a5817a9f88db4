"""What a client may try again, and how long it waits first: one policy for the
``Client``, the ``Worker`` and ``okq work`` (docs/API.md, "Failures and retries").

An error is *retryable* when trying again later may succeed: no node answered
(``Unavailable``), the node shed the call (``Overloaded``), the store failed
(``StorageError``, not a lost condition or a missing object), a produce was not
published (``PublishAborted``) or its outcome is unknown (``OutcomeUnknown``).
Whether it is *safe* to try again depends on the call too: every error but two
says nothing was done, so any call may be repeated; ``OutcomeUnknown`` and an
``Unavailable`` whose request may have reached a node leave the call perhaps
done, and only a call that is harmless to repeat (a lease, a fenced completion, a
produce whose items all carry idempotency keys) is sent again then.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from okq.errors import (
    CASConflict,
    ObjectNotFound,
    OkqError,
    OutcomeUnknown,
    Overloaded,
    PublishAborted,
    StorageError,
    Unavailable,
)


def jittered(base: float, cap: float, n: int) -> float:
    """The wait before the ``n``-th try again (1, 2, ...): ``base * 2**(n-1)`` seconds,
    capped at ``cap``, then 50-100 % of that at random."""
    return float(min(cap, base * 2.0 ** max(n - 1, 0)) * (0.5 + random.random() / 2))


@dataclass(frozen=True)
class Backoff:
    """How a client tries a call again: at most ``attempts`` tries in all, waiting
    ``jittered(base, cap, n)`` seconds before the ``n``-th repeat (at least an
    ``Overloaded`` answer's ``retry_after``)."""

    attempts: int = 5
    base: float = 0.1
    cap: float = 2.0

    def delay(self, n: int, exc: OkqError) -> float:
        wait = jittered(self.base, self.cap, n)
        if isinstance(exc, Overloaded):
            wait = max(wait, min(exc.retry_after, self.cap))
        return wait


#: The client's default: 5 tries, 0.1 s doubling to 2 s between them.
DEFAULT_BACKOFF = Backoff()
#: Tries once: no retries.
NO_RETRIES = Backoff(attempts=1)


def retryable(exc: BaseException) -> bool:
    """Whether trying the same call again later may succeed."""
    if isinstance(exc, CASConflict | ObjectNotFound):
        return False
    return isinstance(exc, Unavailable | Overloaded | StorageError | PublishAborted)


def maybe_done(exc: BaseException) -> bool:
    """Whether a call that failed with ``exc`` may have taken effect all the same."""
    if isinstance(exc, Unavailable):
        return exc.sent
    return isinstance(exc, OutcomeUnknown)
