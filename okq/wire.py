"""The wire models: request and response bodies of the HTTP API, as pydantic models.

They sit below both ends: the node (``okq.server``) parses and answers with
them; the client, the shell worker and the CLI send and read them, so nothing
on the client side imports the server. They validate input (unknown fields are
refused, so a typo names its field); a ``Reply`` ignores fields it does not know,
so a client reads the replies of a newer node. The OpenAPI document is made from
them. Payloads are ``bytes``: base64 in JSON, raw binary in msgpack; ``utf8`` is
the convenient alternative for text. Times are RFC 3339 strings (or epoch
seconds); durations are seconds. The ranges come from ``okq.limits``.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import functools
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal, Protocol, TypeVar

import msgspec
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    model_validator,
)

from okq.clock import assume_utc
from okq.headers import check_headers, split_meta
from okq.limits import (
    DELAY_MAX,
    GROUP_MAX,
    GROUP_PATTERN,
    LEASE_TIMEOUT_MAX,
    LEASE_TIMEOUT_MIN,
    MAX_ATTEMPTS_MAX,
    MAX_ATTEMPTS_MIN,
    MAX_HEADERS,
    MAX_TIME_MS,
    PARTITIONS_MAX,
    REQUEST_TIMEOUT_MAX,
    RETENTION_MAX,
    RETENTION_MIN,
)


def _payload(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError("must be base64") from exc
    raise ValueError("must be base64 text (JSON) or binary (msgpack)")


Payload = Annotated[
    bytes,
    BeforeValidator(_payload),
    PlainSerializer(lambda b: base64.b64encode(b).decode(), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "byte", "description": "base64 in JSON"}),
]
QUEUE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
QueueName = Annotated[str, Field(pattern=QUEUE_NAME_PATTERN, description="a queue's name")]
Seconds = Annotated[
    float, Field(ge=LEASE_TIMEOUT_MIN, le=LEASE_TIMEOUT_MAX, description="seconds")
]


MIN_TIME = datetime(1970, 1, 1, tzinfo=UTC)
MAX_TIME = datetime.fromtimestamp(MAX_TIME_MS / 1000, UTC)  # 9000-01-01


def _time(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    value = assume_utc(value)
    if not MIN_TIME <= value <= MAX_TIME:
        raise ValueError("must be between 1970-01-01 and 9000-01-01")
    return value


def _text(value: str | None) -> str | None:
    if value is not None:
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ValueError("must be valid Unicode text (no lone surrogates)") from None
    return value


Time = Annotated[datetime, AfterValidator(_time)]
Text = Annotated[str, AfterValidator(_text)]
Headers = Annotated[
    dict[str, str] | None,
    BeforeValidator(lambda v: check_headers(v) or None),
    WithJsonSchema({"type": "object", "additionalProperties": {"type": "string"},
                    "maxProperties": MAX_HEADERS, "description": "string headers (docs/API.md)"}),
]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, defer_build=True)


class Reply(Body):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, defer_build=True)


class ErrorBody(Reply):
    code: str
    message: str
    details: dict[str, Any] = {}


_GROUP = re.compile(GROUP_PATTERN)


def check_group(value: str) -> str:
    """A message group's name, as the wire takes it; ValueError saying what is wrong."""
    if not 1 <= len(value) <= GROUP_MAX or not _GROUP.fullmatch(value):
        raise ValueError(f"a message group is 1 to {GROUP_MAX} letters, digits and ASCII "
                         f"punctuation; got {value[:40]!r}")
    return value


Group = Annotated[str, AfterValidator(check_group),
                  WithJsonSchema({"type": "string", "minLength": 1, "maxLength": GROUP_MAX,
                                  "pattern": GROUP_PATTERN})]


class ProduceItem(Body):
    bytes: Payload | None = Field(None, description="the payload (base64 in JSON)")
    utf8: Text | None = Field(None, description="the payload as text, instead of bytes")
    enqueue_at: Time | None = Field(None, description="deliver no earlier than this")
    key: str | None = Field(
        None, min_length=1, max_length=256,
        description="producer idempotency key: a retried produce with the same key "
        "returns the first id instead of a duplicate (kept for 5 minutes)")
    headers: Headers = Field(None, description="string headers, kept with the item")
    delay: float | None = Field(None, ge=0, le=DELAY_MAX, description="deliver no "
                                "earlier than this many seconds from now (the node's clock)")
    group: Group | None = Field(
        None,
        description="message group: on an ordered (fifo) queue, the items of a group are "
        "handed out in the order they were produced, one handout at a time; the item's "
        "meta shows it as 'group'")

    @model_validator(mode="after")
    def _one_payload(self) -> ProduceItem:
        if (self.bytes is None) == (self.utf8 is None):
            raise ValueError("give exactly one of 'bytes' and 'utf8'")
        if self.delay is not None and self.enqueue_at is not None:
            raise ValueError("give at most one of 'enqueue_at' and 'delay'")
        return self

    def payload(self) -> builtins.bytes:
        return self.bytes if self.bytes is not None else (self.utf8 or "").encode()


class ProduceRequest(Body):
    queue_name: QueueName
    items: list[ProduceItem] = Field(min_length=1)


_QUEUE_NAME = re.compile(QUEUE_NAME_PATTERN)


class _PlainBody(msgspec.Struct, forbid_unknown_fields=True):
    """A body read without a model: these keys and no other."""

    queue_name: str


class _PlainItem(msgspec.Struct, forbid_unknown_fields=True):
    bytes: builtins.bytes


class _PlainProduce(_PlainBody, forbid_unknown_fields=True):
    items: list[_PlainItem]


class _PlainComplete(_PlainBody, forbid_unknown_fields=True):
    tokens: list[str]


_PLAIN_PRODUCE = msgspec.msgpack.Decoder(_PlainProduce)
_PLAIN_COMPLETE = msgspec.msgpack.Decoder(_PlainComplete)
_B = TypeVar("_B", bound=_PlainBody)


def _plain_body(decoder: msgspec.msgpack.Decoder[_B], data: builtins.bytes) -> _B | None:
    """``data`` decoded by msgspec straight from the bytes when it is such a body of
    a valid queue name; None for any other (not msgpack, another key, another
    type), which the models then read (and explain, when it is wrong)."""
    try:
        body = decoder.decode(data)
    except msgspec.DecodeError:  # its ValidationError too
        return None
    return body if _QUEUE_NAME.fullmatch(body.queue_name) else None


def plain_produce(data: builtins.bytes) -> tuple[str, list[builtins.bytes]] | None:
    """The queue and payloads of the commonest produce, a msgpack body of binary
    payloads and nothing else (what msgpack clients send), without a model per
    item; None for any other body (a text payload, no items: ``_plain_body``)."""
    body = _plain_body(_PLAIN_PRODUCE, data)
    if body is None or not body.items:
        return None
    return body.queue_name, [item.bytes for item in body.items]


def plain_tokens(data: builtins.bytes) -> tuple[str, list[str]] | None:
    """The queue and tokens of a complete without outputs; None for any other body
    (no tokens, a token that is not a string: ``_plain_body``)."""
    body = _plain_body(_PLAIN_COMPLETE, data)
    if body is None or not body.tokens:
        return None
    return body.queue_name, body.tokens


def complete_reply_plain(queue: str, completed: int,
                         output_ids: list[str] | None) -> builtins.bytes:
    """A complete's msgpack reply: the bytes ``CompleteResponse`` makes through
    ``okq.server.codec.respond``, without the model."""
    return _PLAIN_ENCODER.encode({"queue_name": queue, "completed": completed,
                                  "output_ids": output_ids})


class ProduceResponse(Reply):
    queue_name: str
    ids: list[str]
    duplicates: int | None = Field(None, description="items already there: their idempotency "
                                   "key was taken, so their ids are the first items'")


class LeaseRequest(Body):
    queue_name: QueueName
    batch_size: int = Field(1, ge=1, description="most items to lease")
    lease_timeout: Seconds | None = Field(None, description="default: the queue's")
    # 0 to the node's --max-wait, checked by okq.limits.check_wait; the schema's is the widest
    request_timeout: float = Field(
        0, json_schema_extra={"minimum": 0, "maximum": REQUEST_TIMEOUT_MAX},
        description="long poll: seconds to wait for items when none are ready (0 to the "
        "node's --max-wait, 900 by default)",
    )
    client_id: str | None = Field(None, max_length=256, description="for logs only")


class LeasedItemOut(Reply):
    id: str
    token: str = Field(description="proof of this delivery: renew, complete or retry with it")
    attempts: int
    lease_deadline: datetime
    produced_at: datetime
    enqueue_at: datetime | None = None
    bytes: Payload
    utf8: str | None = Field(None, description="the payload, when it is valid UTF-8 (JSON "
                             "replies only: msgpack carries the payload once, as binary)")
    meta: dict[str, Any] | None = None
    headers: dict[str, str] = Field(default_factory=dict, description="the item's headers")


class Leased(Protocol):
    """What the engine says of a leased item (``okq.leases.LeasedItem``)."""

    id: str
    token: str
    attempts: int
    lease_deadline_ms: int
    produced_ms: int
    enqueue_at_ms: int | None
    payload: builtins.bytes
    meta: dict[str, Any] | None


def to_datetime(value_ms: int) -> datetime:
    """A time in ms since the epoch as the wire shows it (UTC)."""
    return datetime.fromtimestamp(value_ms / 1000, UTC)


#: Whether a byte can begin no UTF-8 text: a continuation byte (0x80-0xBF), 0xC0 and
#: 0xC1 (overlong), or 0xF5 and over (past U+10FFFF). msgpack's and CBOR's maps and
#: arrays begin with one, as okq's race payloads do (0xFF).
NEVER_FIRST: Final = tuple(0x80 <= b < 0xC2 or b >= 0xF5 for b in range(256))


def utf8_or_none(payload: builtins.bytes) -> str | None:
    """The payload as text, when it is valid UTF-8. A payload whose first byte no
    UTF-8 text begins with is answered without a decode: a failed one raises, and
    costs five times a successful one."""
    if payload and NEVER_FIRST[payload[0]]:
        return None
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return None


def leased_item_out(i: Leased) -> LeasedItemOut:
    """A leased item as the wire shows it: what HTTP clients and workers get."""
    meta, headers = split_meta(i.meta)
    return LeasedItemOut(
        id=i.id, token=i.token, attempts=i.attempts,
        lease_deadline=to_datetime(i.lease_deadline_ms), produced_at=to_datetime(i.produced_ms),
        enqueue_at=None if i.enqueue_at_ms is None else to_datetime(i.enqueue_at_ms),
        bytes=i.payload, utf8=utf8_or_none(i.payload), meta=meta, headers=headers,
    )


@functools.lru_cache(maxsize=4096)
def iso_time(value_ms: int) -> str:
    """A time as msgpack replies spell it. Cached: a batch shares its deadline and
    the items of a segment their produce time."""
    return to_datetime(value_ms).isoformat()


class LeasedItemPlain(msgspec.Struct, omit_defaults=True):
    """A leased item as a msgpack reply carries it, built without a model: the
    payload is binary there, so it is not repeated as ``utf8`` (a client that
    wants text decodes ``bytes``; okq's client fills ``utf8`` in itself), and
    ``headers`` only when there are some. The fields' order is the keys' order on
    the wire."""

    id: str
    token: str
    attempts: int
    lease_deadline: str
    produced_at: str
    enqueue_at: str | None
    bytes: builtins.bytes
    meta: dict[str, Any] | None
    headers: dict[str, str] | None = None


class LeaseReplyPlain(msgspec.Struct):
    queue_name: str
    items: list[LeasedItemPlain]


_PLAIN_ENCODER = msgspec.msgpack.Encoder()


def produce_reply_plain(queue: str, ids: list[str], duplicates: int | None) -> builtins.bytes:
    """A produce's msgpack reply (the hot path): the bytes ``ProduceResponse`` makes
    through ``okq.server.codec.respond``, without a model dump of every id."""
    return _PLAIN_ENCODER.encode({"queue_name": queue, "ids": ids, "duplicates": duplicates})


class LeaseResponse(Reply):
    queue_name: str
    items: list[LeasedItemOut]


class RenewRequest(Body):
    queue_name: QueueName
    token: str
    lease_timeout: Seconds | None = None


class RenewResponse(Reply):
    queue_name: str
    lease_deadline: datetime


class Outputs(Body):
    queue_name: QueueName = Field(description="the queue that receives the outputs")
    items: list[ProduceItem] = Field(min_length=1)


class CompleteRequest(Body):
    queue_name: QueueName
    tokens: list[str] = Field(min_length=1)
    outputs: Outputs | None = Field(
        None, description="items to produce in the same step as the completion: they are "
        "published if and only if the completion commits (one token only)")

    @model_validator(mode="after")
    def _one_token_with_outputs(self) -> CompleteRequest:
        if self.outputs is not None and len(self.tokens) != 1:
            raise ValueError("outputs need exactly one token")
        return self


class CompleteResponse(Reply):
    queue_name: str
    completed: int
    output_ids: list[str] | None = None


class RetryItem(Body):
    token: str
    retry_at: Time | None = Field(None, description="ready again at this time (default now)")
    dead: bool = Field(False, description="move to the dead-letter queue instead")
    error: Text | None = Field(None, max_length=4096, description="kept as the last error")
    count_attempt: bool = Field(
        True, description="false gives the delivery back without counting it as an "
        "attempt (e.g. a worker stopping before it ran the item)")


class RetryRequest(Body):
    queue_name: QueueName
    items: list[RetryItem] = Field(min_length=1)


class RetryResponse(Reply):
    queue_name: str
    retried: int
    dead_lettered: int = Field(0, description="of those retried, how many were dead-lettered "
                               "(retried with dead, or out of attempts): moved to the "
                               "dead-letter queue, or dropped when the queue has none")


class QueueRequest(Body):
    queue_name: QueueName


class StatsResponse(Reply):
    queue_name: str
    available: int
    in_flight: int
    scheduled: int
    waiting_retry: int
    dead: int
    dead_lettered: int
    completed: int
    redriven: int = Field(0, description="dead letters moved back to their source queues, "
                                         "not yet compacted")
    segments: int
    oldest_age: float


class PurgeResponse(Reply):
    queue_name: str


class QueueSettings(Body):
    lease_timeout: Seconds | None = None
    retention: float | None = Field(None, ge=RETENTION_MIN, le=RETENTION_MAX)
    max_attempts: int | None = Field(None, ge=MAX_ATTEMPTS_MIN, le=MAX_ATTEMPTS_MAX)
    dead_queue: QueueName | None = None
    retention_dead_letter: bool | None = Field(
        None, description="move items past retention to the dead-letter queue")
    partitions: int | None = Field(
        None, ge=1, le=PARTITIONS_MAX,
        description="partitions the queue is spread over, so that several nodes serve it "
        "(default 1); raised by an update, never lowered")
    read_only: list[Annotated[int, Field(ge=0, lt=PARTITIONS_MAX)]] | None = Field(
        None, max_length=PARTITIONS_MAX - 1,
        description="partitions that take no new items and are drained by leases (to "
        "shrink the queue, or move its work off a node); [] takes items in every partition")


class QueueCreate(QueueSettings):
    name: QueueName
    fifo: bool | None = Field(
        None, description="ordered delivery: the items of a message group are handed out "
        "in the order they were produced, one handout of a group at a time (default "
        "false); set here, never changed")


class QueueUpdate(QueueSettings):
    name: QueueName
    dead_queue: str | None = Field(
        None, pattern=f"^$|{QUEUE_NAME_PATTERN}",
        description='a queue\'s name, or "" to clear it (no dead-letter queue); '
        "null or absent: unchanged")


class QueueNameRequest(Body):
    name: QueueName


class QueuesListRequest(Body):
    pass


class QueueInfoOut(Reply):
    name: str
    lease_timeout: float
    retention: float
    max_attempts: int
    dead_queue: str | None
    retention_dead_letter: bool
    partitions: int = 1  # absent from the replies of okq before partitions
    read_only: list[int] = Field(default_factory=list)
    fifo: bool = False  # absent from the replies of okq before ordered delivery
    created_at: datetime
    segments: int
    produced: int


class QueuesListResponse(Reply):
    queues: list[QueueInfoOut]


# -- API keys ------------------------------------------------------------------------

KeyPrefix = Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,128}$",
                                 description="a queue-name prefix the key acts on")]


class KeyCreate(Body):
    role: Literal["admin", "producer", "consumer", "read-only"]
    prefixes: list[KeyPrefix] = Field(
        default_factory=list, max_length=20,
        description="queue-name prefixes the key acts on; none: every queue of the namespace")
    name: str = Field("", max_length=200, description="a label: who or what holds the key")


class KeyOut(Reply):
    id: str
    namespace: str
    role: str
    prefixes: list[str]
    name: str
    created_at: datetime


class KeyCreated(KeyOut):
    key: str = Field(description="the key itself: shown once, kept only as a hash")


class KeysListRequest(Body):
    pass


class KeysListResponse(Reply):
    keys: list[KeyOut]


class KeyDelete(Body):
    id: str = Field(pattern=r"^[0-9a-f]{16}$", description="the key's id")


class KeyDeleteResponse(Reply):
    id: str
    deleted: bool


class DeleteResponse(Reply):
    name: str


class ItemsListRequest(Body):
    queue_name: QueueName
    limit: int = Field(100, ge=1, le=1000)
    start_after: str | None = Field(None, description="an item id: list the items after it")


class ItemOut(Reply):
    id: str
    state: str = Field(description="available, scheduled, leased or waiting")
    attempts: int
    produced_at: datetime
    ready_at: datetime | None
    bytes: Payload
    utf8: str | None = None
    meta: dict[str, Any] | None = None
    error: str | None = None
    headers: dict[str, str] = Field(default_factory=dict, description="the item's headers")


class ItemsListResponse(Reply):
    queue_name: str
    items: list[ItemOut]
    next_start_after: str | None


class RedriveRequest(Body):
    queue_name: QueueName = Field(description="the dead-letter queue")
    limit: int = Field(1000, ge=1, le=100_000)
    destination: QueueName | None = Field(
        None, description="move every dead letter to this queue instead of its source")


class RedriveResponse(Reply):
    queue_name: str
    moved: int


class HealthResponse(Reply):
    status: str
    store: str = Field(description="the store's kind: s3, file or memory")
    store_heard: float | None = Field(
        None, description="seconds since the store last answered this node (null: never)")
    node: str | None = Field(None, description="this node's id in sequencer mode")
    roles: list[int] = Field(default_factory=list,
                             description="sequencer shards this node holds now")
