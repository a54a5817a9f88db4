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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from okq.errors import FormatError, OkqError
from okq.keys import check_name, new_segment_id
from okq.limits import (
    LEASE_TIMEOUT_MAX,
    LEASE_TIMEOUT_MIN,
    MAX_ATTEMPTS_MAX,
    MAX_ATTEMPTS_MIN,
    PARTITIONS_MAX,
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
    partitions: int = Field(
        1, ge=1, le=PARTITIONS_MAX,
        description="partitions the queue is spread over (okq.partitions); raised, never "
        "lowered",
    )
    read_only: list[int] = Field(
        default_factory=list,
        description="partitions that take no new items (okq.partitions): they are "
        "drained by leases, and a key goes to one of the others",
    )
    attributes: dict[str, str] = Field(
        default_factory=dict,
        description="front ends' own settings of the queue (the SQS API's attributes and "
        "tags), kept with it and not read by the engine",
    )
    fifo: bool = Field(
        False,
        description="ordered delivery (docs/DESIGN.md, \"Ordered delivery\"): the items of "
        "a group are handed out in the order they were acknowledged, one handout of a group "
        "at a time; set when the queue is created, never changed",
    )

    @field_validator("dead_queue")
    @classmethod
    def _dead_queue_name(cls, value: str | None) -> str | None:
        return None if value is None else check_name(value, "dead_queue")

    @field_validator("read_only")
    @classmethod
    def _read_only_partitions(cls, ro: list[int], info: ValidationInfo) -> list[int]:
        partitions = info.data.get("partitions", 1)  # declared before: checked first
        if any(not 0 <= p < partitions for p in ro):
            raise ValueError(f"read_only names partitions 0 to {partitions - 1} only; "
                             f"got {ro}")
        if len(set(ro)) != len(ro) or len(ro) >= partitions:
            raise ValueError("read_only names each partition once, and leaves at least one "
                             f"of the {partitions} taking items; got {ro}")
        return sorted(ro)

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
    # The queue's sequence number of the segment's first item: the manifest's
    # ``produced`` when the segment was published (its items are seq, seq + 1, ...),
    # or, for a merged segment, the first of its items' own (SegmentItem.seq). The
    # order of an ordered queue (docs/DESIGN.md, "Ordered delivery"). None: listed
    # by an okq before ordered delivery.
    seq: int | None = None
    # The message groups its items name, so that a fair lease walk passes over a
    # segment without reading it (docs/DESIGN.md, "Fair sharing"): the names,
    # sorted, "" standing for items without one, when there are at most
    # GROUPS_LISTED; () when there are more. None: no item names a group (or not
    # known: listed by an okq before fair sharing, or an outputs segment).
    groups: tuple[str, ...] | None = None

    @property
    def first_ready_ms(self) -> int:
        return self.created_ms if self.min_ready_ms is None else self.min_ready_ms

    @property
    def place(self) -> int:
        """Its place in an ordered queue: its seq (one without goes first)."""
        return -1 if self.seq is None else self.seq

    def pack(self) -> list[Any]:
        out = [self.id, self.count, self.created_ms, self.size]
        if self.groups is not None:  # trailing fields: older readers ignore them
            return [*out, self.min_ready_ms, self.last_due_ms, self.seq, list(self.groups)]
        if self.seq is not None:
            return [*out, self.min_ready_ms, self.last_due_ms, self.seq]
        if self.last_due_ms is not None:
            return [*out, self.min_ready_ms, self.last_due_ms]
        return out if self.min_ready_ms is None else [*out, self.min_ready_ms]

    @classmethod
    def unpack(cls, raw: list[Any]) -> SegmentMeta:
        n = len(raw)
        return cls(raw[0], raw[1], raw[2], raw[3], raw[4] if n > 4 else None,
                   raw[5] if n > 5 else None, raw[6] if n > 6 else None,
                   tuple(raw[7]) if n > 7 else None)

    def item_seq(self, index: int, item: SegmentItem) -> int | None:
        """The sequence number of item ``index`` (None when the segment has none)."""
        if item.seq is not None:
            return item.seq
        return None if self.seq is None else self.seq + index


#: Segments per manifest chunk (EngineOptions.manifest_chunk): the tail a publish
#: rewrites holds fewer, and older segments ride in chunks of this many.
CHUNK_SEGMENTS = 128


@dataclass(slots=True)
class Chunk:
    """A run of a manifest's segment list kept as an object of its own
    (``f=mchunk``), immutable once written: a manifest references it by id, so a
    publish rewrites only the head, whatever the backlog."""

    id: str  # new_segment_id(created_ms): an orphan's age shows in its name
    segments: list[SegmentMeta]  # never changed: a change makes a new chunk
    ids: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.ids = frozenset(sm.id for sm in self.segments)


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
    # The front of ``segments`` kept in chunk objects, in order: segments ==
    # chunk 1's + chunk 2's + ... + the tail the manifest itself lists. Appending
    # keeps that true; drop_segments and clear_segments keep it true for the rest.
    chunks: list[Chunk] = field(default_factory=list)
    # How many segments the chunks hold (computed when made, kept by the methods
    # below, which are the only ones to change the chunks).
    n_chunked: int = field(default=-1, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.n_chunked < 0:
            self.n_chunked = sum(len(c.segments) for c in self.chunks)

    def copy(self) -> Manifest:
        """A copy a change may mutate (segments and chunks are shared, never changed)."""
        return Manifest(self.queue, self.created_ms, self.config, list(self.segments),
                        dict(self.idem), self.produced, self.gc_floor_ms, self.ver, self.nonce,
                        self.purge_rq, dict(self.purged), self.purged_ms, list(self.chunks),
                        self.n_chunked)

    def _set_chunks(self, chunks: list[Chunk]) -> None:
        self.chunks, self.n_chunked = chunks, sum(len(c.segments) for c in chunks)

    def listed(self, segment_id: str) -> bool:
        """Whether ``segment_id`` is listed: a set lookup per chunk, a scan of the tail."""
        return any(segment_id in c.ids for c in self.chunks) or any(
            sm.id == segment_id for sm in self.segments[self.n_chunked:])

    def drop_segments(self, ids: set[str] | frozenset[str], now_ms: int) -> None:
        """Unlist ``ids``: a chunk holding one is replaced by a new chunk of the
        rest (written with the manifest), or by nothing when none is left."""
        if not ids:
            return
        tail = self.segments[self.n_chunked:]
        chunks: list[Chunk] = []
        for c in self.chunks:
            if c.ids.isdisjoint(ids):
                chunks.append(c)
                continue
            kept = [sm for sm in c.segments if sm.id not in ids]
            if kept:
                chunks.append(Chunk(new_segment_id(now_ms), kept))
        self._set_chunks(chunks)
        self.segments = [sm for c in chunks for sm in c.segments]
        self.segments += [sm for sm in tail if sm.id not in ids]

    def clear_segments(self) -> None:
        self.segments = []
        self._set_chunks([])

    def pack_chunks(self, per_chunk: int, now_ms: int,
                    written: Callable[[str], bool]) -> list[Chunk]:
        """Arrange the chunks before a write, and return those to write first (the
        ones ``written`` does not know). Full chunks of ``per_chunk`` segments are
        cut from the tail (0: none are, and a manifest without chunks stays in
        format 1), and neighbours that fit in one chunk are joined when one of
        them is to be written anyway (what a compaction left of its chunks)."""
        n = self.n_chunked
        if per_chunk > 0:
            while len(self.segments) - n >= per_chunk:
                self.chunks.append(Chunk(new_segment_id(now_ms), self.segments[n:n + per_chunk]))
                n += per_chunk
            self.n_chunked = n
        new = [c for c in self.chunks if not written(c.id)]
        if not new or (len(new) == 1 and new[0] is self.chunks[-1] and
                       len(self.chunks[-1].segments) == per_chunk):
            return new  # a chunk cut off the tail, or none: nothing to join
        limit = per_chunk or CHUNK_SEGMENTS
        joined: list[Chunk] = []
        for c in self.chunks:
            last = joined[-1] if joined else None
            if last is not None and len(last.segments) + len(c.segments) <= limit and (
                    not written(last.id) or not written(c.id)):
                joined[-1] = Chunk(new_segment_id(now_ms), last.segments + c.segments)
            else:
                joined.append(c)
        self._set_chunks(joined)
        return [c for c in joined if not written(c.id)]


class SegmentItem(msgspec.Struct):
    """An item as its segment keeps it. A msgspec Struct rather than a dataclass:
    one is made per produced item, and a Struct's ``__init__`` is C (80 ns against
    a dataclass's interpreted 180)."""

    payload: bytes
    enqueue_at_ms: int | None = None
    meta: dict[str, Any] | None = None
    born_ms: int | None = None  # first produce time, kept when a merge moves the item
    # Its sequence number (SegmentMeta.seq), kept when a merge of an ordered queue
    # moves the item; None in a published segment (its meta's seq + index)
    seq: int | None = None


#: Where an item's meta keeps its message group (docs/DESIGN.md, "Ordered delivery").
GROUP_KEY = "group"


def with_group(meta: dict[str, Any] | None, group: str | None) -> dict[str, Any] | None:
    """``meta`` with the item's message group kept in it (unchanged without one)."""
    return meta if group is None else {**(meta or {}), GROUP_KEY: group}


def group_of(meta: Mapping[str, Any] | None) -> str | None:
    """An item's message group, if it has one."""
    if not meta:
        return None
    group = meta.get(GROUP_KEY)
    return group if isinstance(group, str) else None


#: The most message groups a segment's entry in the manifest names (SegmentMeta.groups).
GROUPS_LISTED = 8


def groups_of(metas: Iterable[Mapping[str, Any] | None]) -> tuple[str, ...] | None:
    """SegmentMeta.groups of a segment of items with these metas."""
    metas = list(metas)
    # (most items have no meta at all)
    names = {g for meta in metas if meta and (g := group_of(meta)) is not None}
    if not names:
        return None
    if len(names) < len(metas) and any(group_of(meta) is None for meta in metas):
        names.add("")  # the items without a group
    return () if len(names) > GROUPS_LISTED else tuple(sorted(names))


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


def pack_object(kind: str, body: dict[str, Any], version: int = FORMAT_VERSION) -> bytes:
    """An object of ``kind`` as the store keeps it: ``f``, ``v``, then its fields.

    The bytes are msgpack's (``msgpack.packb(..., use_bin_type=True)``; pinned by
    tests/unit/test_stored_bytes.py), written by msgspec's encoder: ``packb``
    starts a new packer on a small buffer and grows it by copying, 480 us for a
    segment of 400 items of 1 KiB against 22."""
    return _OBJECT_ENCODER.encode({"f": kind, "v": version, **body})


def as_msgpack_writes(value: Any) -> Any:
    """What msgspec is to write for a value it does not know, to write msgpack's
    bytes: a subclass of str, int, float or bytes as its base type, a msgpack
    ``Timestamp`` (which a stored object may hold: decoding keeps it) as its
    extension; anything else msgpack refuses too. (msgspec also writes datetimes
    and sets, which ``packb`` refuses: okq stores neither.)"""
    if isinstance(value, msgpack.Timestamp):
        return msgspec.msgpack.Ext(-1, value.to_bytes())
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, bytes):
        return bytes(value)
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


_OBJECT_ENCODER = msgspec.msgpack.Encoder(enc_hook=as_msgpack_writes)


def unpack_object(kind: str, data: bytes,
                  versions: tuple[int, ...] = (FORMAT_VERSION,)) -> dict[str, Any]:
    """The fields of an object of ``kind``; FormatError (keeping the bytes) for
    anything else: undecodable, another kind, a format version not in ``versions``."""
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_no_extension)
    except Exception as exc:
        raise FormatError(f"undecodable {kind} object: {exc}", data=data) from exc
    if not isinstance(raw, dict) or raw.get("f") != kind:
        raise FormatError(f"expected a {kind} object", data=data)
    if type(raw.get("v")) is not int or raw.get("v") not in versions:
        raise FormatError(f"unsupported {kind} format version {raw.get('v')!r}", data=data)
    return raw


def _no_extension(code: int, data: bytes) -> Any:
    """okq writes no msgpack extension but timestamps (which msgpack decodes itself):
    an object holding one is not okq's. (Kept, an ``ExtType`` would be written back
    as an array by msgspec, a tuple subclass.)"""
    raise ValueError(f"a msgpack extension of type {code}")


def _config_dump(config: QueueConfig) -> dict[str, Any]:
    """The config as a manifest keeps it: without ``attributes`` or ``read_only``
    while there are none and without ``partitions`` while there is one, so that okq
    versions that know no such field still read the queue."""
    dump = config.model_dump()
    if not dump["attributes"]:
        del dump["attributes"]
    if dump["partitions"] == 1:
        del dump["partitions"]
    if not dump["read_only"]:
        del dump["read_only"]
    if not dump["fifo"]:
        del dump["fifo"]
    return dump


#: Manifest format versions: 1 lists every segment; 2 (written only when some are
#: in chunks) lists the tail and references its chunks, and okq before it refuses it.
MANIFEST_VERSIONS = (1, 2)


def encode_manifest(m: Manifest) -> bytes:
    """The manifest's head: its chunks by reference (each written before it), and
    the segments after them. Refuses (ValueError) chunks that are not the front of
    ``m.segments``: a change that broke that would lose segments."""
    n = m.n_chunked
    # The chunks' first and last segments where the list has them, in O(1): unlisting
    # a segment without drop_segments moves the last one.
    if m.chunks and (n > len(m.segments) or m.segments[0] is not m.chunks[0].segments[0]
                     or m.segments[n - 1] is not m.chunks[-1].segments[-1]):
        raise ValueError(f"manifest of {m.queue!r}: its chunks are not the front of its "
                         "segments")
    return pack_object(
        "manifest",
        {
            "queue": m.queue,
            "created": m.created_ms,
            "config": _config_dump(m.config),
            **({"chunks": [[c.id, len(c.segments)] for c in m.chunks]} if m.chunks else {}),
            "segments": [s.pack() for s in m.segments[n:]],
            "idem": m.idem,
            "produced": m.produced,
            "gc_floor": m.gc_floor_ms,
            "ver": m.ver,
            "nonce": m.nonce,
            **({"purge": [m.purge_rq, m.purged]} if m.purge_rq or m.purged else {}),
            **({"purged_at": m.purged_ms} if m.purged_ms else {}),
        },
        2 if m.chunks else 1,
    )


def unpack_manifest(data: bytes) -> dict[str, Any]:
    """A manifest's fields, undecoded (FormatError as unpack_object)."""
    return unpack_object("manifest", data, MANIFEST_VERSIONS)


def manifest_chunk_ids(raw: dict[str, Any]) -> list[str]:
    """The chunks an unpacked manifest references (FormatError if malformed)."""
    try:
        return [str(ref[0]) for ref in raw.get("chunks") or ()]
    except (TypeError, IndexError, KeyError) as exc:
        raise FormatError(f"malformed manifest chunks: {exc}") from exc


def decode_manifest(data: bytes, chunks: Mapping[str, Chunk] | None = None) -> Manifest:
    """The manifest in ``data``, its chunks taken from ``chunks`` (by id): a
    FormatError if one it references is not there (read them first:
    okq/manifests.py does)."""
    return manifest_from(unpack_manifest(data), chunks or {}, data)


def manifest_from(raw: dict[str, Any], chunks: Mapping[str, Chunk], data: bytes = b"") -> Manifest:
    try:
        purge_rq, purged = raw.get("purge") or ("", {})
        refs: list[Chunk] = []
        for cid, count in raw.get("chunks") or ():
            c = chunks.get(cid)
            if c is None:
                raise FormatError(f"manifest of {raw['queue']!r} references chunk {cid!r}, "
                                  "which was not read", data=data)
            if len(c.segments) != count:
                raise ValueError(f"chunk {cid} holds {len(c.segments)} segments, not {count}")
            refs.append(c)
        segments: list[SegmentMeta] = []
        for c in refs:
            segments += c.segments
        segments += [SegmentMeta.unpack(s) for s in raw["segments"]]
        return Manifest(
            queue=raw["queue"],
            created_ms=raw["created"],
            config=QueueConfig.model_validate(raw["config"]),
            segments=segments,
            idem=raw["idem"],
            produced=raw["produced"],
            gc_floor_ms=raw["gc_floor"],
            ver=raw["ver"],
            nonce=raw["nonce"],
            purge_rq=str(purge_rq),
            purged=dict(purged),
            purged_ms=int(raw.get("purged_at", 0)),
            chunks=refs,
        )
    except FormatError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, OkqError) as exc:
        raise FormatError(f"malformed manifest: {exc}", data=data) from exc


def manifest_config(data: bytes) -> QueueConfig:
    """A manifest's queue config alone (its chunks unread)."""
    raw = unpack_manifest(data)
    try:
        return QueueConfig.model_validate(raw["config"])
    except (KeyError, ValueError) as exc:
        raise FormatError(f"malformed manifest: {exc}", data=data) from exc


def encode_chunk(queue: str, c: Chunk) -> bytes:
    return pack_object("mchunk", {"queue": queue, "id": c.id,
                                  "segments": [sm.pack() for sm in c.segments]})


def decode_chunk(data: bytes) -> Chunk:
    raw = unpack_object("mchunk", data)
    try:
        return Chunk(str(raw["id"]), [SegmentMeta.unpack(s) for s in raw["segments"]])
    except (KeyError, TypeError, IndexError) as exc:
        raise FormatError(f"malformed manifest chunk: {exc}", data=data) from exc


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
                if i.born_ms is None and i.seq is None
                else [i.payload, i.enqueue_at_ms, i.meta, i.born_ms]
                if i.seq is None
                else [i.payload, i.enqueue_at_ms, i.meta, i.born_ms, i.seq]
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
    if not isinstance(fields, list) or not 3 <= len(fields) <= 5:
        raise ValueError(f"a segment item is a list of 3 to 5 fields, not {fields!r:.40}")
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
