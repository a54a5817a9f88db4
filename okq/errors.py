"""okq's exception tree, written out in one place.

::

    OkqError                       root of everything okq raises on purpose
    ├── StorageError               the object store failed or answered oddly;
    │   │                          a failed write may still have landed
    │   ├── CASConflict            a conditional write lost (412, or 404 on If-Match)
    │   ├── OutcomeUnknown         an ambiguous write could not be confirmed in time
    │   ├── ObjectNotFound         the key does not exist
    │   └── ConditionalWritesUnsupported
    │                              the start-up self-check found a store that
    │                              ignores If-Match / If-None-Match
    ├── InvalidRequest             bad input; ``field`` names the culprit     (HTTP 400)
    │   └── UnsupportedMediaType   a body that is neither JSON nor msgpack    (HTTP 415)
    ├── QueueNotFound              no manifest for that queue                 (HTTP 404)
    ├── QueueExists                create of a queue that exists              (HTTP 409)
    ├── QueueInUse                 delete of a queue another queue names as its
    │                              dead_queue; ``used_by`` names them         (HTTP 409)
    ├── LeaseLost                  stale, expired-and-released or finished lease (HTTP 409)
    ├── TaskLost                   a message move task is not in a state that allows
    │                              the change (ended, or run by another node) (HTTP 409)
    ├── PurgeInProgress            a purge asked not to run within some time of the
    │                              last one, which was later than that     (HTTP 409)
    ├── InvalidToken               forged, tampered or foreign lease token    (HTTP 400)
    ├── Unauthorized               missing or wrong API key                   (HTTP 401)
    ├── TooLarge                   payload, batch or body over a limit        (HTTP 413)
    ├── Overloaded                 shed: retry after ``retry_after`` seconds  (HTTP 429)
    ├── PublishAborted             a produce missed its publish deadline or was fenced
    │                              by the garbage-collection floor; nothing was
    │                              published, retrying is safe               (HTTP 503)
    ├── Unavailable                (client side) no okq node answered: the connection
    │                              was refused, reset or timed out, or a proxy said
    │                              502 / 503 / 504; ``sent`` says whether the request
    │                              may have reached a node
    └── FormatError                an object's bytes do not decode; keeps the bytes

The HTTP status of each class is its ``status`` attribute; one middleware maps
errors to responses and the client maps them back by ``code``.
"""

from __future__ import annotations

from typing import Any, ClassVar


class OkqError(Exception):
    """Root of every error okq raises on purpose."""

    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details


class StorageError(OkqError):
    """The object store failed. A failed write may still have landed."""

    code = "storage_error"
    status = 503


class CASConflict(StorageError):
    """A conditional write or delete lost: the object changed, exists, or is gone."""

    code = "cas_conflict"
    status = 409


class OutcomeUnknown(StorageError):
    """A write failed ambiguously and okq cannot tell whether it took effect: a
    produce whose manifest write may have landed but could not be confirmed
    before its publish deadline. Retry with an idempotency key to be safe."""

    code = "outcome_unknown"
    status = 503


class ObjectNotFound(StorageError):
    """The key does not exist."""

    code = "object_not_found"
    status = 404


class ConditionalWritesUnsupported(StorageError):
    """The store accepted a write that its condition should have refused."""

    code = "conditional_writes_unsupported"
    status = 500


class InvalidRequest(OkqError):
    """Bad input. ``field`` names the offending field."""

    code = "invalid_request"
    status = 400

    def __init__(self, message: str, *, field: str | None = None, **details: Any) -> None:
        if field is not None:
            details["field"] = field
        super().__init__(message, **details)
        self.field = field


class UnsupportedMediaType(InvalidRequest):
    code = "unsupported_media_type"
    status = 415


class QueueNotFound(OkqError):
    code = "queue_not_found"
    status = 404


class QueueExists(OkqError):
    code = "queue_exists"
    status = 409


class QueueInUse(OkqError):
    """The queue is another queue's ``dead_queue``; ``used_by`` names those queues."""

    code = "queue_in_use"
    status = 409


class LeaseLost(OkqError):
    """The lease behind a token is no longer the current delivery of its item."""

    code = "lease_lost"
    status = 409


class TaskLost(OkqError):
    """A change of a message move task that its state does not allow."""

    code = "task_lost"
    status = 409


class PurgeInProgress(OkqError):
    """The queue was purged too lately for a purge that asked for an interval."""

    code = "purge_in_progress"
    status = 409


class InvalidToken(OkqError):
    code = "invalid_token"
    status = 400


class Unauthorized(OkqError):
    code = "unauthorized"
    status = 401


class RequestTimeout(InvalidRequest):
    """The client took too long to send its request."""

    code = "request_timeout"
    status = 408


class Forbidden(OkqError):
    """The caller's key does not allow this: its role, namespace or queue prefixes."""

    code = "forbidden"
    status = 403


class TooLarge(OkqError):
    code = "too_large"
    status = 413


class Overloaded(OkqError):
    code = "overloaded"
    status = 429

    def __init__(self, message: str, *, retry_after: float = 1.0, **details: Any) -> None:
        super().__init__(message, retry_after=retry_after, **details)
        self.retry_after = retry_after


class PublishAborted(OkqError):
    """A produce was not published (deadline missed or fenced); retrying is safe."""

    code = "publish_aborted"
    status = 503


class Unavailable(OkqError):
    """No okq node answered (raised by the client, never by a node): the connection
    was refused, reset or timed out, or a load balancer answered 502, 503 or 504.
    ``sent`` is False only when the request surely reached no node (a refused
    connection): then nothing was done; otherwise it may have been."""

    code = "unavailable"
    status = 503

    def __init__(self, message: str, *, sent: bool = True, **details: Any) -> None:
        super().__init__(message, sent=sent, **details)
        self.sent = sent


class FormatError(OkqError):
    """Stored bytes do not decode as the expected object; ``data`` keeps them."""

    code = "format_error"
    status = 500

    def __init__(self, message: str, *, data: bytes = b"", **details: Any) -> None:
        super().__init__(message, **details)
        self.data = data


ALL_ERRORS: tuple[type[OkqError], ...] = (
    OkqError,
    StorageError,
    CASConflict,
    OutcomeUnknown,
    ObjectNotFound,
    ConditionalWritesUnsupported,
    InvalidRequest,
    UnsupportedMediaType,
    QueueNotFound,
    QueueExists,
    QueueInUse,
    LeaseLost,
    TaskLost,
    PurgeInProgress,
    InvalidToken,
    Unauthorized,
    TooLarge,
    Overloaded,
    PublishAborted,
    Unavailable,
    FormatError,
)
BY_CODE: dict[str, type[OkqError]] = {cls.code: cls for cls in ALL_ERRORS}
