"""The SQS API's parameters and errors, shared by its actions: one request's
``Call``, okq's errors as SQS's (``as_sqs``, ``sqs_errors``), and the checks of
integers, strings, name lists, pages and batch entries as SQS makes them."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from okq.errors import (
    Forbidden,
    InvalidRequest,
    InvalidToken,
    LeaseLost,
    OkqError,
    Overloaded,
    PurgeInProgress,
    QueueInUse,
    QueueNotFound,
    StorageError,
    TooLarge,
)
from okq.service import QueueService
from okq.sqs.errors import SqsError, invalid, invalid_value, missing, no_queue
from okq.sqs.queues import Names

MAX_BATCH = 10
#: The longest a message stays invisible in all, counted from its first receive.
MAX_VISIBILITY_MS = 43_200_000
#: The shortest time between two purges of a queue.
PURGE_INTERVAL_MS = 60_000
MAX_BATCH_BYTES = 1_048_576
_ENTRY_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
#: Seconds a receive or send may take the queue's settings from the manifest cache.
SETTINGS_MAX_AGE = 1.0
SYSTEM_ATTRIBUTES = ("ApproximateReceiveCount", "SentTimestamp",
                     "ApproximateFirstReceiveTimestamp", "SenderId", "AWSTraceHeader",
                     "MessageGroupId", "MessageDeduplicationId", "DeadLetterQueueSourceArn")


@dataclass
class Call:
    """One request: who asked, how its queues are named, and the service it acts on."""

    service: QueueService
    names: Names
    access_key: str | None
    stale_deletes: int = 0  # deletes answered with success although the lease was lost
    trace: str | None = None  # the request's X-Amzn-Trace-Id: a send's AWSTraceHeader


def as_sqs(exc: OkqError) -> SqsError:
    """An okq error as SQS answers it."""
    if isinstance(exc, QueueNotFound):
        return no_queue()
    if isinstance(exc, Overloaded):
        return SqsError("RequestThrottled", exc.message)
    if isinstance(exc, TooLarge | InvalidRequest | QueueInUse):
        return invalid(exc.message)
    if isinstance(exc, InvalidToken):
        return SqsError("ReceiptHandleIsInvalid", f"The receipt handle is not valid: "
                        f"{exc.message}")
    if isinstance(exc, Forbidden):
        return SqsError("AccessDenied", f"Access to the resource is denied: {exc.message}")
    if isinstance(exc, StorageError):
        return SqsError("ServiceUnavailable", exc.message)
    return SqsError("InternalFailure", exc.message)


@contextmanager
def sqs_errors() -> Iterator[None]:
    """okq's errors as SQS's (but LeaseLost and PurgeInProgress: each action decides
    what these answer)."""
    try:
        yield
    except (LeaseLost, PurgeInProgress):
        raise
    except OkqError as exc:
        raise as_sqs(exc) from None


def int_param(params: dict[str, Any], name: str, low: int, high: int,
         default: int | None = None) -> int:
    value = params.get(name)
    if value is None:
        if default is None:
            raise missing(name)
        return default
    try:
        n = int(value)
        if isinstance(value, float | bool) or (isinstance(value, str) and n != float(value)):
            raise ValueError
    except (TypeError, ValueError):
        raise invalid_value(name, value, "it must be an integer") from None
    if not low <= n <= high:
        raise invalid_value(name, value, f"it must be from {low} to {high}")
    return n


def str_param(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if value is None or value == "":
        raise missing(name)
    if not isinstance(value, str):
        raise invalid_value(name, value, "it must be a string")
    return value


def names_param(params: dict[str, Any], name: str) -> list[str]:
    value = params.get(name) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid_value(name, value, "it must be a list of names")
    return value


def page_of(names: list[str], params: dict[str, Any]) -> tuple[list[str], str | None]:
    """A page of sorted ``names`` after ``NextToken``, ``MaxResults`` long."""
    limit = int_param(params, "MaxResults", 1, 1000) if params.get("MaxResults") is not None \
        else None
    token = params.get("NextToken")
    if token:
        try:
            after = base64.urlsafe_b64decode(str(token).encode()).decode()
        except (ValueError, UnicodeDecodeError):
            raise invalid_value("NextToken", token, "it is not a token this API gave") from None
        names = [n for n in names if n > after]
    if limit is None:
        return names[:1000], None
    page = names[:limit]
    more = len(names) > limit
    return page, base64.urlsafe_b64encode(page[-1].encode()).decode() if more else None


def batch_entries(params: dict[str, Any], what: str) -> list[dict[str, Any]]:
    """A batch's entries, checked as SQS checks them before acting on any."""
    entries = params.get("Entries")
    if not entries:
        raise SqsError("EmptyBatchRequest", f"There should be at least one {what} in the "
                       "request.")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise invalid("Entries must be a list of entries")
    if len(entries) > MAX_BATCH:
        raise SqsError("TooManyEntriesInBatchRequest", f"Maximum number of entries per "
                       f"request are {MAX_BATCH}. You have sent {len(entries)}.")
    seen: set[str] = set()
    for entry in entries:
        entry_id = entry.get("Id")
        if not isinstance(entry_id, str) or not _ENTRY_ID.fullmatch(entry_id):
            raise SqsError("InvalidBatchEntryId", "A batch entry id can only contain "
                           "alphanumeric characters, hyphens and underscores. It can be at "
                           "most 80 letters long.")
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def failure(entry_id: str, err: SqsError) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": err.sender_fault, "Code": err.code,
            "Message": err.message}
