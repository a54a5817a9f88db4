"""The ranges okq accepts, defined once for every front end and the engine.

Times are seconds unless a name says ``_MS``.
"""

from __future__ import annotations

from okq.errors import InvalidRequest, TooLarge

#: A lease lasts 0.1 s to 12 h (a queue's default, or a lease's or renewal's own).
LEASE_TIMEOUT_MIN = 0.1
LEASE_TIMEOUT_MAX = 43_200
#: A queue keeps an item 1 s to 14 days.
RETENTION_MIN = 1
RETENTION_MAX = 1_209_600
#: Deliveries before dead-lettering: 0 (unlimited) to 10,000.
MAX_ATTEMPTS_MIN = 0
MAX_ATTEMPTS_MAX = 10_000
#: The most partitions a queue may have (okq.partitions).
PARTITIONS_MAX = 64
#: The longest long poll a node may allow (its --max-wait, and a lease's request_timeout).
REQUEST_TIMEOUT_MAX = 3600
#: The largest batch a node may allow (its --max-batch).
MAX_BATCH_MAX = 10_000
#: The latest time okq accepts for ``enqueue_at`` or ``retry_at``: 9000-01-01,
#: far enough, and every time renders.
MAX_TIME_MS = 221_845_392_000_000
#: An item carries at most 10 headers (as SQS allows 10 message attributes), of at
#: most 8 KiB of names and values in all (UTF-8); okq/headers.py has their rules.
MAX_HEADERS = 10
MAX_HEADERS_BYTES = 8192
#: A produce's ``delay`` (seconds from the node's now) is at most 14 days.
DELAY_MAX = 1_209_600
#: A message group's name (okq.model.GROUP_KEY): as SQS's MessageGroupId allows, 1 to
#: 128 letters, digits and ASCII punctuation.
GROUP_MAX = 128
GROUP_PATTERN = r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]+$"


def check_lease_timeout(value: float | None, field: str = "lease_timeout") -> None:
    """Refuse a lease timeout out of range (None: the queue's default)."""
    if value is not None and not LEASE_TIMEOUT_MIN <= value <= LEASE_TIMEOUT_MAX:
        raise InvalidRequest(
            f"{field} must be {LEASE_TIMEOUT_MIN:g} to {LEASE_TIMEOUT_MAX:g} seconds", field=field
        )


def check_wait(value: float, max_wait: float, field: str = "request_timeout") -> None:
    """Refuse a long poll shorter than 0 or longer than the node allows (its
    ``--max-wait``, itself at most ``REQUEST_TIMEOUT_MAX``): the one wording of this
    limit, wherever a long poll is checked; ``details.limit`` gives it."""
    if not 0 <= value <= max_wait:
        raise InvalidRequest(f"{field} must be 0 to {max_wait:g} seconds (the node's "
                             "--max-wait)", field=field, limit=max_wait)


def check_time_ms(value: int | None, field: str) -> None:
    """Refuse an absolute time (ms since the epoch) out of range (None: unset)."""
    if value is not None and not 0 <= value <= MAX_TIME_MS:
        raise InvalidRequest(f"{field} is out of range", field=field)


def check_batch(n: int, limit: int, field: str) -> None:
    """Refuse a batch of ``n`` entries unless 1 to ``limit`` (a node's --max-batch):
    over it is TooLarge (413), as for any other size limit."""
    if n > limit:
        raise TooLarge(f"{field} holds {n} entries; the limit is {limit}", field=field,
                       limit=limit)
    if n < 1:
        raise InvalidRequest(f"{field} must hold 1 to {limit} entries; got {n}", field=field)
