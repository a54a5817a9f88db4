"""The state objects okq keeps in the store, and their msgpack codec: queue
configs, manifests, segments, message move tasks, and the framing every object
shares (lease objects, the hot path, are okq/leases.py's).

Every object is a msgpack map with ``f`` (its kind) and ``v`` (its format
version); decoders refuse other kinds and versions with a FormatError that
keeps the bytes. Every mutable object also carries ``ver`` (a counter bumped
on each write) and ``nonce`` (random per write): ETags are content hashes, so
without them A -> B -> A would pass an If-Match, and an ambiguous write could
not be told from another writer's.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import msgpack
from pydantic import BaseModel, ConfigDict, Field, field_validator

from okq.errors import FormatError, OkqError
from okq.keys import check_name
from okq.limits import (
    LEASE_TIMEOUT_MAX,
    LEASE_TIMEOUT_MIN,
    MAX_ATTEMPTS_MAX,
    MAX_ATTEMPTS_MIN,
    RETENTION_MAX,
    RETENTION_MIN,
)

FORMAT_VERSION = 1


def new_nonce() -> str:
    return secrets.token_hex(8)


def new_request_id() -> str:
    """A short id for one lease or retry request, recorded in the states it writes."""
    return secrets.token_hex(4)


class QueueConfig(BaseModel):
    """A queue's configuration, kept in its manifest. Times are in seconds."""

    model_config = ConfigDict(extra="forbid")

    lease_timeout: float = Field(30.0, ge=LEASE_TIMEOUT_MIN, le=LEASE_TIMEOUT_MAX,
                                 description="seconds a lease lasts")
    retention: float = Field(
        345_600, ge=RETENTION_MIN, le=RETENTION_MAX,
        description="seconds an item is kept (default 4 days)",
    )
    max_attempts: int = Field(
        0, ge=MAX_ATTEMPTS_MIN, le=MAX_ATTEMPTS_MAX,
        description="deliveries before dead-lettering; 0 = unlimited",
    )
    dead_queue: str | None = Field(None, description="queue that receives dead items")
    retention_dead_letter: bool = Field(
        False, description="move items past retention to the dead-letter queue, not drop them"
    )
    attributes: dict[str, str] = Field(
        default_factory=dict,
        description="front ends' own settings of the queue (the SQS API's attributes and "
        "tags), kept with it and not read by the engine",
    )

    @field_validator("dead_queue")
    @classmethod
    def _dead_queue_name(cls, value: str | None) -> str | None:
        return None if value is None else check_name(value, "dead_queue")

    @property
    def lease_ms(self) -> int:
        return int(self.lease_timeout * 1000)


@dataclass(slots=True)
class SegmentMeta:
    id: str
    count: int
    created_ms: int
    size: int
    # A lower bound of every item's ready time, when it is earlier than
    # created_ms: segments written by a compactor merge carry older items.
    min_ready_ms: int | None = None
    # The latest time a fresh item of the segment may first be leased (the
    # largest fresh_due_ms of its items: 0 when none is scheduled for later than
    # its produce), so that stats can count a segment without reading it. None:
    # not known (listed by an older okq, or an outputs segment): read the segment.
    last_due_ms: int | None = None

    @property
    def first_ready_ms(self) -> int:
        return self.created_ms if self.min_ready_ms is None else self.min_ready_ms

    def pack(self) -> list[Any]:
        out = [self.id, self.count, self.created_ms, self.size]
        if self.last_due_ms is not None:  # trailing: older readers ignore it
            return [*out, self.min_ready_ms, self.last_due_ms]
        return out if self.min_ready_ms is None else [*out, self.min_ready_ms]

    @classmethod
    def unpack(cls, raw: list[Any]) -> SegmentMeta:
        return cls(raw[0], raw[1], raw[2], raw[3], raw[4] if len(raw) > 4 else None,
                   raw[5] if len(raw) > 5 else None)


@dataclass(slots=True)
class Manifest:
    queue: str
    created_ms: int
    config: QueueConfig
    segments: list[SegmentMeta] = field(default_factory=list)
    idem: dict[str, list[Any]] = field(default_factory=dict)  # key -> [item id, expires_ms]
    produced: int = 0  # items ever published
    gc_floor_ms: int = 0  # segments created before this are never published
    ver: int = 0
    nonce: str = ""
    # The last purge: its request id (so that a purge re-applied after an
    # ambiguous write does not purge again), and the young segments it dropped
    # (id -> created_ms), so that a publisher re-applying an ambiguous publish
    # of one of them learns it was published and then purged.
    purge_rq: str = ""
    purged: dict[str, int] = field(default_factory=dict)
    purged_ms: int = 0  # when the last purge landed (0: never), by its writer's clock


@dataclass(slots=True)
class SegmentItem:
    payload: bytes
    enqueue_at_ms: int | None = None
    meta: dict[str, Any] | None = None
    born_ms: int | None = None  # first produce time, kept when a merge moves the item


def fresh_ready_ms(sm: SegmentMeta, item: SegmentItem) -> int:
    """When a never-leased item becomes ready: produced, and not before enqueue_at."""
    born = sm.created_ms if item.born_ms is None else item.born_ms
    return max(born, item.enqueue_at_ms or 0)


#: What dead-lettering adds to an item's meta (a redrive takes them off again).
DEAD_LETTER_KEYS = ("source_queue", "source_id", "attempts", "error")


def dead_letter_meta(meta: dict[str, Any] | None, queue: str, iid: str, produced_ms: int,
                     attempts: int, error: str | None) -> dict[str, Any]:
    """A dead letter's meta: the item's own, where it came from and why, and its
    ``origin`` (first id and produce time), kept through every later move so that a
    front end can name the message as it was first sent (SQS's MessageId)."""
    out = {**(meta or {}), "source_queue": queue, "source_id": iid, "attempts": attempts,
           "error": error}
    out.setdefault("origin", [iid, produced_ms])
    return out


def redriven_meta(meta: dict[str, Any] | None, dead_queue: str, dead_id: str) -> dict[str, Any]:
    """A redriven item's meta: its own and ``origin`` again, and where it was."""
    out = {k: v for k, v in (meta or {}).items() if k not in DEAD_LETTER_KEYS}
    return {**out, "redriven_from": dead_queue, "dead_id": dead_id}


def item_origin(meta: dict[str, Any] | None) -> tuple[str, int] | None:
    """The first id and produce time of an item that was moved (``origin``)."""
    origin = meta.get("origin") if meta else None
    if isinstance(origin, list) and len(origin) == 2 and isinstance(origin[0], str) \
            and isinstance(origin[1], int):
        return origin[0], origin[1]
    return None


def dead_letter_source(meta: dict[str, Any] | None) -> str | None:
    """The queue a dead letter came from (its ``source_queue`` meta), or None if
    the item is not a dead letter."""
    source = meta.get("source_queue") if meta else None
    return source if isinstance(source, str) else None


def fresh_due_ms(sm: SegmentMeta, item: SegmentItem) -> int:
    """When a never-leased item may be leased: its enqueue time if it was scheduled
    for later than its produce, else 0 (at once). Its produce time, read off the
    producer's clock, orders it but never holds it back: a reader whose clock is
    behind must not see a fresh item as "not yet"."""
    born = sm.created_ms if item.born_ms is None else item.born_ms
    at = item.enqueue_at_ms
    return at if at is not None and at > born else 0


@dataclass(slots=True)
class Segment:
    id: str
    queue: str
    created_ms: int
    publish_by_ms: int
    items: list[SegmentItem]


# -- codec ---------------------------------------------------------------


def pack_object(kind: str, body: dict[str, Any]) -> bytes:
    """An object of ``kind`` as the store keeps it: ``f``, ``v``, then its fields."""
    out: bytes = msgpack.packb({"f": kind, "v": FORMAT_VERSION, **body}, use_bin_type=True)
    return out


def unpack_object(kind: str, data: bytes) -> dict[str, Any]:
    """The fields of an object of ``kind``; FormatError (keeping the bytes) for
    anything else: undecodable, another kind, another format version."""
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:
        raise FormatError(f"undecodable {kind} object: {exc}", data=data) from exc
    if not isinstance(raw, dict) or raw.get("f") != kind:
        raise FormatError(f"expected a {kind} object", data=data)
    if type(raw.get("v")) is not int or raw.get("v") != FORMAT_VERSION:
        raise FormatError(f"unsupported {kind} format version {raw.get('v')!r}", data=data)
    return raw


def _config_dump(config: QueueConfig) -> dict[str, Any]:
    """The config as a manifest keeps it: without ``attributes`` while there are
    none, so that okq versions that know no such field still read the queue."""
    dump = config.model_dump()
    if not dump["attributes"]:
        del dump["attributes"]
    return dump


def encode_manifest(m: Manifest) -> bytes:
    return pack_object(
        "manifest",
        {
            "queue": m.queue,
            "created": m.created_ms,
            "config": _config_dump(m.config),
            "segments": [s.pack() for s in m.segments],
            "idem": m.idem,
            "produced": m.produced,
            "gc_floor": m.gc_floor_ms,
            "ver": m.ver,
            "nonce": m.nonce,
            **({"purge": [m.purge_rq, m.purged]} if m.purge_rq or m.purged else {}),
            **({"purged_at": m.purged_ms} if m.purged_ms else {}),
        },
    )


def decode_manifest(data: bytes) -> Manifest:
    raw = unpack_object("manifest", data)
    try:
        purge_rq, purged = raw.get("purge") or ("", {})
        return Manifest(
            queue=raw["queue"],
            created_ms=raw["created"],
            config=QueueConfig.model_validate(raw["config"]),
            segments=[SegmentMeta.unpack(s) for s in raw["segments"]],
            idem=raw["idem"],
            produced=raw["produced"],
            gc_floor_ms=raw["gc_floor"],
            ver=raw["ver"],
            nonce=raw["nonce"],
            purge_rq=str(purge_rq),
            purged=dict(purged),
            purged_ms=int(raw.get("purged_at", 0)),
        )
    except (KeyError, TypeError, ValueError, IndexError, OkqError) as exc:
        raise FormatError(f"malformed manifest: {exc}", data=data) from exc


def encode_segment(s: Segment) -> bytes:
    return pack_object(
        "segment",
        {
            "id": s.id,
            "queue": s.queue,
            "created": s.created_ms,
            "publish_by": s.publish_by_ms,
            "items": [
                [i.payload, i.enqueue_at_ms, i.meta]
                if i.born_ms is None
                else [i.payload, i.enqueue_at_ms, i.meta, i.born_ms]
                for i in s.items
            ],
        },
    )


def decode_segment(data: bytes) -> Segment:
    raw = unpack_object("segment", data)
    try:
        items = [_segment_item(fields) for fields in raw["items"]]
        return Segment(raw["id"], raw["queue"], raw["created"], raw["publish_by"], items)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise FormatError(f"malformed segment: {exc}", data=data) from exc


def _segment_item(fields: Any) -> SegmentItem:
    if not isinstance(fields, list) or not 3 <= len(fields) <= 4:
        raise ValueError(f"a segment item is a list of 3 or 4 fields, not {fields!r:.40}")
    if not isinstance(fields[0], bytes):
        raise TypeError("a segment item's payload must be bytes")
    return SegmentItem(*fields)


@dataclass(slots=True)
class MoveTask:
    """A message move task of the SQS API (``f=movetask``): dead letters of ``dead``
    moved back to their source queues, or to ``target``, by whichever node holds its
    claim (``owner`` until ``beat_ms``)."""

    dead: str  # the dead-letter queue it moves from
    seq: int  # its number among the queue's tasks (its key)
    source_arn: str
    destination_arn: str | None
    target: str | None  # the queue DestinationArn names (None: each to its source)
    rate: int | None  # messages per second at most (None: as fast as it goes)
    to_move: int  # dead letters ready when it started
    started_ms: int
    status: str = "RUNNING"  # RUNNING, CANCELLING, CANCELLED, COMPLETED, FAILED
    moved: int = 0
    failure: str | None = None
    owner: str = ""  # the runner holding the claim (a random id per node process)
    beat_ms: int = 0  # the claim holds until then; a runner renews it as it goes
    hold_ms: int = 0  # dead letters its runners leased may be held until then
    ver: int = 0
    nonce: str = ""


_MOVE_TASK_FIELDS = ("dead", "seq", "source_arn", "destination_arn", "target", "rate",
                     "to_move", "started_ms", "status", "moved", "failure", "owner",
                     "beat_ms", "hold_ms", "ver", "nonce")


def encode_move_task(t: MoveTask) -> bytes:
    return pack_object("movetask", {f: getattr(t, f) for f in _MOVE_TASK_FIELDS})


def decode_move_task(data: bytes) -> MoveTask:
    raw = unpack_object("movetask", data)
    try:
        return MoveTask(**{f: raw[f] for f in _MOVE_TASK_FIELDS})
    except (KeyError, TypeError) as exc:
        raise FormatError(f"malformed movetask: {exc}", data=data) from exc
