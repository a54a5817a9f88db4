"""The lease-object hot path: item states, the transitions on them, their coding.

A segment's lease object holds the state of each of its items ever leased (an
item with no entry is fresh). Every lease, renewal, completion, retry, expiry
and dead-letter step is a pure function of (lease object, now, request), applied
by a cell's CAS (okq/cell.py). It changes the ``LeaseObject`` it is given (each
attempt gets a copy of its own) by putting new item states in its slots, never
by changing a state in place (copies share their states), and raises
:class:`~okq.errors.LeaseLost` when the request names a delivery that is no
longer current. No I/O and no clock reads here. An item's lifecycle::

    fresh ──lease──▶ L(v+1) ──complete──▶ D
      │               │  ├──complete with outputs──▶ P ──outputs published──▶ D
      ▲               │  ├──retry──────▶ W(ready=retry_at) ──lease──▶ L(v+2) ...
      │               │  ├──expiry (t passes) ≡ W(ready=deadline)
      │               │  └──retry dead / max attempts──▶ X ──moved to DLQ──▶ Z
      └ scheduled items are fresh but not ready before enqueue_at

A delivery is current while the item is L with the token's ``v``; an expired
lease that nobody has re-leased is still current (no other delivery exists).
Completing a delivery that this same delivery already completed succeeds again
without a change, so a client may safely retry a completion.

This is the pure-Python implementation and the source of the compiled one:
callers reach either through okq/leases.py (its docstring tells how).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeVar

import msgpack
import msgspec

from okq.changes import Unchanged
from okq.errors import FormatError, LeaseLost, OkqError
from okq.headers import headers_of, split_meta
from okq.model import (
    FORMAT_VERSION,
    SegmentItem,
    SegmentMeta,
    as_msgpack_writes,
    unpack_object,
)

__all__ = [
    "DEAD", "DEAD_PENDING", "DONE", "FINISHED", "GONE_STATES", "HALF_DONE", "IN_FLIGHT", "LEASED",
    "OUTPUTS_PENDING", "READY_STATES", "WAITING", "ItemState", "LeaseObject", "Leased",
    "LeasedItem", "SealRefused", "abandon_outputs", "all_finished", "by_segment", "carried",
    "classify",
    "complete", "complete_many", "current", "decode_lease", "deliveries_of", "encode_lease",
    "exhausted", "expire", "finish_dead", "finish_outputs", "is_available", "is_finished",
    "is_idle", "lease",
    "leased_items", "left_queue", "ready_at", "recognise", "renew", "reply_rows", "retry",
    "retry_attempts",
    "seal", "summarise", "take_ready",
]

# -- states ----------------------------------------------------------------------

# Item states in a lease object. An item with no entry is fresh: never leased.
# Module constants are ``Final``: compiled code reads them from C statics (any other
# global is a lookup in the module's dict each time it is read).
LEASED: Final = "L"  # t = lease deadline; expired leases are as good as WAITING at t
WAITING: Final = "W"  # t = ready time (retried)
DONE: Final = "D"  # completed: a tombstone
DEAD_PENDING: Final = "X"  # being moved to the dead-letter queue; t = when that began
DEAD: Final = "Z"  # moved to the dead-letter queue (or dropped: no dead queue)
OUTPUTS_PENDING: Final = "P"  # completed; its outputs segment is being published; t = since

#: States with a step still to take by whoever holds the item or walks past it.
HALF_DONE: Final = frozenset({DEAD_PENDING, OUTPUTS_PENDING})
#: States that keep a segment busy: not sealed, merged or expired meanwhile.
IN_FLIGHT: Final = frozenset({LEASED, *HALF_DONE})
#: Terminal states in a segment: tombstones the compactor folds away.
FINISHED: Final = frozenset({DONE, DEAD})
#: States whose item is leasable at its ``t``: a lease once it expires, a retry once due.
READY_STATES: Final = frozenset({LEASED, WAITING})


@dataclass(slots=True, init=False)  # __init__ written out: a compiled build makes it native
class ItemState:
    """One item's state in a lease object. Never changed in place once it is in a
    lease object: a transition puts a new one in its slot, so a copy of the object
    that shares its states (:meth:`LeaseObject.copy`) is a copy all the same."""

    s: str
    v: int  # delivery counter: bumped by every lease, fences stale tokens
    attempts: int
    t: int
    err: str | None = None
    # For a completion that produced outputs: [queue, segment id, count, created_ms, size]
    out: list[Any] | None = None
    # The request that made this state (a lease or a retry): a writer whose write
    # was ambiguous and then overwritten recognises its own change by it.
    rq: str | None = None
    # When the item was first leased (ms), kept by the states of an item that may
    # be leased again (L, W): the SQS front end's ApproximateFirstReceiveTimestamp.
    # A trailing field: older readers ignore it (and drop it when they rewrite).
    first: int | None = None
    # (index, its msgpack map entry) once encoded: a state is never changed in
    # place, so a lease object re-encodes only the states new since its last write.
    packed: tuple[int, bytes] | None = field(init=False, repr=False, compare=False)

    def __init__(self, s: str, v: int, attempts: int, t: int, err: str | None = None,
                 out: list[Any] | None = None, rq: str | None = None,
                 first: int | None = None) -> None:
        self.s, self.v, self.attempts, self.t = s, v, attempts, t
        self.err, self.out, self.rq, self.first = err, out, rq, first
        self.packed = None

    def pack(self) -> list[Any]:
        packed = [self.s, self.v, self.attempts, self.t, self.err]
        if self.first is not None:
            return [*packed, self.out, self.rq, self.first]
        if self.rq is not None:
            return [*packed, self.out, self.rq]
        return packed if self.out is None else [*packed, self.out]

    @classmethod
    def unpack(cls, raw: list[Any]) -> ItemState:
        n = len(raw)
        return cls(raw[0], raw[1], raw[2], raw[3], raw[4], raw[5] if n > 5 else None,
                   raw[6] if n > 6 else None, raw[7] if n > 7 else None)


@dataclass(slots=True)
class LeaseObject:
    segment: str
    items: dict[int, ItemState] = field(default_factory=dict)
    ver: int = 0
    nonce: str = ""
    # Set by the compactor before it merges the segment's items elsewhere: no
    # item of a sealed segment is leased again. Only set when none is leased.
    sealed: bool = False

    def copy(self) -> LeaseObject:
        """A copy to change: its own slots, the states shared (they are replaced,
        never changed in place), so it costs a dict copy and no decode."""
        return LeaseObject(self.segment, dict(self.items), self.ver, self.nonce, self.sealed)


@dataclass(slots=True, init=False)  # as ItemState; one per item leased, read once
class Leased:
    index: int
    v: int
    attempts: int
    deadline_ms: int
    first_ms: int  # when the item was first leased

    def __init__(self, index: int, v: int, attempts: int, deadline_ms: int, first_ms: int) -> None:
        self.index, self.v, self.attempts = index, v, attempts
        self.deadline_ms, self.first_ms = deadline_ms, first_ms


@dataclass(slots=True, init=False)  # as ItemState: a lease of 100 makes 100 of these
class LeasedItem:
    """One item a lease hands out: what every front end shows of it."""

    id: str
    queue: str
    token: str
    attempts: int
    lease_deadline_ms: int
    payload: bytes
    produced_ms: int
    enqueue_at_ms: int | None
    meta: dict[str, Any] | None
    first_leased_ms: int | None  # when the item was first leased
    seq: int | None  # its sequence number in its queue (SegmentMeta.seq)

    def __init__(self, id: str, queue: str, token: str, attempts: int,
                 lease_deadline_ms: int, payload: bytes, produced_ms: int,
                 enqueue_at_ms: int | None = None, meta: dict[str, Any] | None = None,
                 first_leased_ms: int | None = None, seq: int | None = None) -> None:
        self.id, self.queue, self.token, self.attempts = id, queue, token, attempts
        self.lease_deadline_ms, self.payload, self.produced_ms = \
            lease_deadline_ms, payload, produced_ms
        self.enqueue_at_ms, self.meta, self.first_leased_ms, self.seq = \
            enqueue_at_ms, meta, first_leased_ms, seq

    @property
    def headers(self) -> dict[str, str]:
        """Its headers (okq/headers.py): those in its meta, and its SQS String attributes."""
        return headers_of(self.meta)


def leased_items(queue: str, sm: SegmentMeta, items: list[SegmentItem], leased: list[Leased],
                 tokens: list[str]) -> list[LeasedItem]:
    """What a lease hands out for ``leased`` items of segment ``sm`` (whose items
    are ``items``), with their ``tokens`` (one each, in order)."""
    if len(tokens) != len(leased):
        raise ValueError(f"{len(leased)} items leased, {len(tokens)} tokens")
    out: list[LeasedItem] = []
    segment, created, first_seq = sm.id, sm.created_ms, sm.seq
    dotted = segment + "."
    for n, x in enumerate(leased):
        index = x.index
        item = items[index]
        born = item.born_ms
        seq = item.seq  # SegmentMeta.item_seq, inlined
        if seq is None and first_seq is not None:
            seq = first_seq + index
        out.append(LeasedItem(dotted + str(index),  # okq.keys.item_id, inlined
                              queue, tokens[n], x.attempts, x.deadline_ms, item.payload,
                              born if born else created, item.enqueue_at_ms, item.meta,
                              x.first_ms, seq))
    return out


_Row = TypeVar("_Row")


def reply_rows(items: list[LeasedItem], spell: Callable[[int], str],
               row: Callable[..., _Row]) -> list[_Row]:
    """Each leased item as a lease reply's row (okq.wire.LeasedItemPlain):
    ``row(id, token, attempts, deadline, produced, enqueue_at, payload, meta,
    headers)``, times spelt by ``spell``, the headers split from the meta
    (okq.headers.split_meta; None when there are none). A batch shares its
    deadline and a segment's items their produce time, so a time is spelt again
    only when it changes. Here rather than beside the row: compiled, each of an
    item's fields is read straight from it (an interpreted read of an int field
    makes a new int)."""
    rows: list[_Row] = []
    deadline_ms = produced_ms = -1
    deadline = produced = ""
    for i in items:
        if i.lease_deadline_ms != deadline_ms:
            deadline_ms = i.lease_deadline_ms
            deadline = spell(deadline_ms)
        if i.produced_ms != produced_ms:
            produced_ms = i.produced_ms
            produced = spell(produced_ms)
        meta = i.meta
        headers: dict[str, str] | None = None
        if meta:
            meta, headers = split_meta(meta)
        at = i.enqueue_at_ms
        rows.append(row(i.id, i.token, i.attempts, deadline, produced,
                        None if at is None else spell(at), i.payload, meta, headers or None))
    return rows


def all_finished(obj: LeaseObject, count: int) -> bool:
    """Whether every one of a segment's ``count`` items is done or dead-lettered:
    terminal states, so no later version of its lease object can make one leasable.
    (A sealed object's summary is empty too, but its items are not all finished.)"""
    if obj.sealed:
        return False
    states = obj.items
    for index in range(count):
        st = states.get(index)
        if st is None or st.s not in FINISHED:
            return False
    return True


def deliveries_of(leased: list[Leased]) -> list[tuple[int, int]]:
    """(index, v) of each leased item: what its token names of it."""
    return [(x.index, x.v) for x in leased]


class SealRefused(OkqError):
    """A segment holds an item in flight: it cannot be sealed now."""


# -- coding ----------------------------------------------------------------------


def encode_lease(o: LeaseObject) -> bytes:
    """The lease object as ``okq.model.pack_object`` would write it, its item map
    joined from each state's cached bytes: a write packs only the states that are
    new since the last one (a segment's tombstones pile up until compaction). The
    new states of one request are mostly alike (a lease's: L, the same deadline,
    request and first lease time; a completion's: D at one time), so a state whose
    fields are those of the last one packed reuses its encoding."""
    parts: list[bytes] = []
    last: ItemState | None = None
    last_state = b""
    for index, st in o.items.items():
        p = st.packed
        if p is not None and p[0] == index:
            parts.append(p[1])
            continue
        if last is None or not _alike(st, last):
            last, last_state = st, _STATE_ENCODER.encode(st.pack())
        key = _INDEX_BYTES[index] if index < len(_INDEX_BYTES) else _packb(index)
        packed = key + last_state
        st.packed = (index, packed)
        parts.append(packed)
    items = b"".join(parts)
    return b"".join([
        _LEASE_HEAD, _packb(o.segment), b"\xa5items", _map_header(len(o.items)), items,
        b"\xa3ver", _packb(o.ver), b"\xa5nonce", _packb(o.nonce), b"\xa6sealed", _packb(o.sealed),
    ])


def _alike(a: ItemState, b: ItemState) -> bool:
    """Whether two states encode alike (``out``, a list, only when neither has one)."""
    return a.s == b.s and a.v == b.v and a.attempts == b.attempts and a.t == b.t \
        and a.err == b.err and a.out is None and b.out is None and a.rq == b.rq \
        and a.first == b.first


def _packb(value: Any) -> bytes:
    return _PACKER.pack(value)  # type: ignore[no-any-return]


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x80 | n])
    if n < 0x10000:
        return b"\xde" + n.to_bytes(2, "big")
    return b"\xdf" + n.to_bytes(4, "big")


#: One packer for every call (msgpack.packb makes one per call; ``pack`` holds the GIL).
_PACKER: Final = msgpack.Packer(use_bin_type=True)
#: An item state's list, as msgpack's packer writes it, in half the time (the
#: same bytes: tests/unit/test_stored_bytes.py).
_STATE_ENCODER: Final = msgspec.msgpack.Encoder(enc_hook=as_msgpack_writes)
#: Item indexes as msgpack map keys, for the common sizes of a segment.
_INDEX_BYTES: Final = [msgpack.packb(i) for i in range(4096)]
#: {"f": "lease", "v": FORMAT_VERSION, "segment": ...}: a map of 7, its first keys.
_LEASE_HEAD: Final = b"\x87" + _packb("f") + _packb("lease") + _packb("v") \
    + _packb(FORMAT_VERSION) + _packb("segment")


def _index(raw: Any) -> int:
    """An item index as a lease object keeps it: an integer, 0 or more."""
    index = int(raw)
    if index < 0:
        raise ValueError(f"negative item index {index}")
    return index


def decode_lease(data: bytes) -> LeaseObject:
    raw = unpack_object("lease", data)
    try:
        items = {_index(i): ItemState.unpack(st) for i, st in raw["items"].items()}
        return LeaseObject(raw["segment"], items, raw["ver"], raw["nonce"],
                           bool(raw.get("sealed", False)))
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as exc:
        raise FormatError(f"malformed lease object: {exc}", data=data) from exc


# -- reading states ----------------------------------------------------------------


def ready_at(st: ItemState | None, fresh_ready_ms: int) -> int | None:
    """When the item can next be leased, or None if it never can (finished or moving)."""
    if st is None:
        return fresh_ready_ms
    if st.s in (LEASED, WAITING):
        return st.t
    return None


def is_available(st: ItemState | None, fresh_ready_ms: int, now: int) -> bool:
    r = ready_at(st, fresh_ready_ms)
    return r is not None and r <= now


def is_finished(st: ItemState | None) -> bool:
    return st is not None and st.s in FINISHED


def is_idle(st: ItemState | None, now: int) -> bool:
    """Live and held by nobody: fresh, waiting, or leased with the lease over (an
    expired lease that nobody re-leased is as good as waiting)."""
    return st is None or st.s == WAITING or (st.s == LEASED and st.t <= now)


def exhausted(obj: LeaseObject, index: int, max_attempts: int) -> bool:
    """Whether the item has had ``max_attempts`` deliveries already."""
    st = obj.items.get(index)
    return st is not None and st.attempts >= max_attempts


def current(obj: LeaseObject, index: int, v: int) -> ItemState:
    """The item's state if delivery ``v`` is its current lease; else LeaseLost."""
    st = obj.items.get(index)
    if st is None or st.s != LEASED or st.v != v:
        raise _lost(st, v)
    return st


def _lost(st: ItemState | None, v: int) -> LeaseLost:
    """What refuses delivery ``v`` of an item in state ``st`` (None: never leased)."""
    state = "never leased" if st is None else _describe(st, v)
    return LeaseLost(f"the lease is no longer held: the item is {state}", state=state)


#: How a lost lease describes an item that has left its queue (by whichever delivery).
GONE_STATES: Final = {DONE: "already completed", OUTPUTS_PENDING: "already completed",
               DEAD_PENDING: "being dead-lettered", DEAD: "dead-lettered"}


def _describe(st: ItemState, v: int) -> str:
    if st.s in GONE_STATES:  # whichever delivery took it out of the queue
        return GONE_STATES[st.s]
    if st.s == LEASED:
        return "leased again by another delivery"
    if st.v != v:
        return "released and leased again since"
    return "waiting for a retry" if st.s == WAITING else st.s


def left_queue(state: str) -> bool:
    """Whether a lost lease's ``state`` (LeaseLost's detail) says the item is no longer
    in its queue at all (completed, dead-lettered, compacted away or purged), rather
    than back in it or held by another delivery."""
    return state in GONE_STATES.values() or state in ("never leased", "gone")


def classify(st: ItemState, now: int) -> tuple[str, int | None]:
    """A leased-before item as the queue's stats count it (a field of
    ``okq.views.QueueStats``: in_flight, available, waiting_retry, completed,
    dead_lettered), and its ready time: its lease object's entry alone tells them."""
    if st.s == LEASED and st.t > now:
        return "in_flight", st.t
    ready = ready_at(st, 0)
    if ready is not None:
        return ("available" if ready <= now else "waiting_retry"), ready
    if st.s in (DONE, OUTPUTS_PENDING):
        return "completed", None
    return "dead_lettered", None


_READY: Final = 1
_IN_FLIGHT: Final = 2
_HALF_DONE: Final = 4
#: Each state in READY_STATES, IN_FLIGHT and HALF_DONE, as bits of one number.
_SUMMARY_KIND: Final[dict[str, int]] = {
    code: (_READY if code in READY_STATES else 0) | (_IN_FLIGHT if code in IN_FLIGHT else 0)
    | (_HALF_DONE if code in HALF_DONE else 0)
    for code in (LEASED, WAITING, DONE, DEAD_PENDING, DEAD, OUTPUTS_PENDING)
}


def summarise(obj: LeaseObject, count: int, fresh: list[tuple[int, int, int]] | None
              ) -> tuple[list[tuple[int, int, int]], bool, list[tuple[int, int]]]:
    """What a lease walk needs of a segment of ``count`` items: its candidates by
    order, (order, index, due): its leased and waiting items at their time, and
    the items of ``fresh`` (every item as if never leased, sorted; needed when some
    item has no state) that have no state; whether an item is in flight; and its
    half-done items (since, index) by index. A sealed segment has none of them.

    The two kinds of candidates are sorted apart and joined: a segment's fresh
    items were produced before any of its leases ends, so the join is commonly
    one after the other, and a sort of the whole (every candidate compared, its
    order mostly equal: a tuple compare each) is left for when they interleave."""
    # Entries are read and made as Python objects (``Any``): compiled, a typed
    # tuple or int is unboxed when read and boxed again (a new object each, for a
    # time in ms or an index past 256) when put in a list.
    ready: list[Any] = []
    stalled: list[tuple[int, int]] = []
    inflight = False
    if obj.sealed:  # a compactor is merging it: nothing in it is leasable
        return ready, inflight, stalled
    states: dict[Any, ItemState] = obj.items
    for key, st in states.items():
        index: int = key  # compared unboxed; the entry keeps the key itself
        if index >= count:
            continue
        kind = _SUMMARY_KIND.get(st.s, 0)  # one lookup for the three sets
        if kind & _READY:
            t: object = st.t  # boxed once for both places
            ready.append((t, key, t))
        if kind & _IN_FLIGHT:
            inflight = True
            if kind & _HALF_DONE:
                stalled.append((st.t, index))
    ready.sort()
    if fresh is not None and len(states) < count:
        every: list[Any] = fresh
        rest = [c for c in every if c[1] not in states]  # sorted, as fresh is
        if rest and (not ready or rest[-1] <= ready[0]):
            rest.extend(ready)
            ready = rest
        elif rest:
            interleaved = rest[0] < ready[-1]
            ready.extend(rest)
            if interleaved:
                ready.sort()
    stalled.sort(key=lambda s: s[1])
    return ready, inflight, stalled


def take_ready(ready: list[tuple[Any, Any, Any]], now: int, horizon: int, fresh_until: int,
               n: int, next_ready: int | None, into: list[Any], penalty: int,
               segment: str, sm: object) -> tuple[int, int | None]:
    """The standard lease walk through one segment's summary ``ready``, (order,
    index, due) by order (okq/scheduler.py ``_pick``, which explains it): up to
    ``n`` entries due by ``now`` and ordered by ``horizon`` are put in ``into`` as
    candidates ``(order + penalty, segment, index, due, sm)``; returns how many,
    and ``next_ready``, lowered to the first time an entry passed comes due. The
    walk stops at the first entry not due past ``fresh_until`` (the latest order
    of a fresh entry) and ``now``: every later one comes due after it."""
    taken = 0
    for e in ready:  # a tuple of objects: compiled, its items are taken out once
        order: int = e[0]
        due: int = e[2]
        if due > now or order > horizon:
            if order > fresh_until and order > now:
                if next_ready is None or order < next_ready:
                    next_ready = order
                break
            soon = (due if due > order else order) if order > horizon else due
            if next_ready is None or soon < next_ready:
                next_ready = soon
            if order > horizon:
                break
            continue
        into.append((order + penalty, segment, e[1], e[2], sm))
        taken += 1
        if taken == n:  # the rest of this segment comes later in line
            break
    return taken, next_ready


def by_segment(picks: list[tuple[Any, str, Any, Any, Any]]
               ) -> dict[str, tuple[Any, list[Any]]]:
    """``take_ready``'s candidates by segment, in the order each segment first
    comes: segment id -> (its SegmentMeta, [(index, due), ...])."""
    groups: dict[str, tuple[Any, list[Any]]] = {}
    for p in picks:
        segment = p[1]
        group = groups.get(segment)
        if group is None:
            group = (p[4], [])
            groups[segment] = group
        group[1].append((p[2], p[3]))
    return groups


def carried(st: ItemState) -> ItemState:
    """A waiting item's state as a merge carries it into its new segment: its
    delivery count, attempts, ready time, last error and first lease."""
    return ItemState(st.s, st.v, st.attempts, st.t, st.err, first=st.first)


# -- transitions -------------------------------------------------------------------


def lease(
    obj: LeaseObject,
    wanted: list[tuple[int, int]],
    now: int,
    lease_ms: int,
    max_attempts: int,
    rq: str | None = None,
) -> tuple[list[Leased], list[int]]:
    """Lease each (index, fresh_ready_ms) still available at ``now``.

    Items that already had ``max_attempts`` deliveries are not leased but move to
    DEAD_PENDING; their indexes are returned second. ``rq`` (the request's id) is
    recorded in every state written, so that a request re-applied after an
    ambiguous write finds its own earlier lease: see :func:`recognise`.
    """
    leased: list[Leased] = []
    dead: list[int] = []
    if obj.sealed:  # the compactor is moving these items elsewhere
        return leased, dead
    for index, fresh_ready in wanted:
        st = obj.items.get(index)
        if not is_available(st, fresh_ready, now):
            continue
        v = st.v if st else 0
        attempts = st.attempts if st else 0
        if max_attempts and attempts >= max_attempts:
            err = st.err if st else None
            obj.items[index] = ItemState(DEAD_PENDING, v + 1, attempts, now, err, rq=rq)
            dead.append(index)
            continue
        first = st.first if st is not None and st.first is not None else now
        obj.items[index] = ItemState(LEASED, v + 1, attempts + 1, now + lease_ms, None, rq=rq,
                                     first=first)
        leased.append(Leased(index, v + 1, attempts + 1, now + lease_ms, first))
    return leased, dead


def recognise(
    obj: LeaseObject, wanted: list[tuple[int, int]], rq: str
) -> tuple[list[Leased], list[int], list[tuple[int, int]]]:
    """Split ``wanted`` into what request ``rq`` already leased (an earlier write
    of it landed although its writer saw an error), what it already moved to
    the dead-letter path, and the rest, still to try."""
    leased: list[Leased] = []
    dead: list[int] = []
    rest: list[tuple[int, int]] = []
    for index, fresh_ready in wanted:
        st = obj.items.get(index)
        if st is not None and st.rq == rq and st.s == LEASED:
            leased.append(Leased(index, st.v, st.attempts, st.t, st.first or st.t))
        elif st is not None and st.rq == rq and st.s in (DEAD_PENDING, DEAD):
            dead.append(index)
        else:
            rest.append((index, fresh_ready))
    return leased, dead, rest


def renew(obj: LeaseObject, index: int, v: int, now: int, lease_ms: int) -> int:
    st = current(obj, index, v)
    obj.items[index] = replace(st, t=now + lease_ms)
    return now + lease_ms


def complete(
    obj: LeaseObject, index: int, v: int, now: int = 0, out: list[Any] | None = None
) -> list[Any] | Unchanged | None:
    """L(v) -> D, or -> P (outputs pending) when the completion produces ``out``.

    Completing the same delivery again is a no-op (a retried request); the
    outputs recorded by the first completion are returned.
    """
    done = obj.items.get(index)
    if done is not None and done.s in (DONE, OUTPUTS_PENDING) and done.v == v:
        return Unchanged(done.out)
    st = current(obj, index, v)
    if out is None:
        obj.items[index] = ItemState(DONE, v, st.attempts, st.t, None)
    else:
        obj.items[index] = ItemState(OUTPUTS_PENDING, v, st.attempts, now, None, out)
    return out


def complete_many(obj: LeaseObject, deliveries: Sequence[Any]) -> list[Any] | Unchanged:
    """:func:`complete` without outputs for each of ``deliveries`` (objects with
    ``index`` and ``v``) of one lease object: the answers in their order, None or
    the refusal (an OkqError, not raised). Unchanged when none was completed now,
    so that refusals are decided again on a fresh read."""
    answers: list[Any] = []
    changed = False
    states = obj.items
    for d in deliveries:  # complete(), written out: one lookup of the item each
        index: int = d.index
        v: int = d.v
        st = states.get(index)
        if st is not None and st.v == v:
            code = st.s
            if code == LEASED:
                states[index] = ItemState(DONE, v, st.attempts, st.t, None)
                changed = True
                answers.append(None)
                continue
            if code == DONE or code == OUTPUTS_PENDING:  # completed by it before
                answers.append(None)
                continue
        answers.append(_lost(st, v))
    return answers if changed else Unchanged(answers)


def finish_outputs(obj: LeaseObject, index: int, v: int) -> Unchanged | None:
    """P(v) -> D once the outputs segment is published."""
    st = obj.items.get(index)
    if st is not None and st.s == OUTPUTS_PENDING and st.v == v:
        obj.items[index] = replace(st, s=DONE)
        return None
    return Unchanged()


def abandon_outputs(
    obj: LeaseObject, index: int, v: int, now: int, reason: str, back: bool = False
) -> bool | Unchanged:
    """P(v) -> X when its outputs can never be published: the completion did not
    take, and the item goes the way of a dead letter with ``reason``; or, with
    ``back``, P(v) -> W (ready now), the item waiting in its queue again."""
    st = obj.items.get(index)
    if st is not None and st.s == OUTPUTS_PENDING and st.v == v:
        state = WAITING if back else DEAD_PENDING
        obj.items[index] = ItemState(state, v, st.attempts, now, reason, first=st.first)
        return True
    return Unchanged(False)


def retry(
    obj: LeaseObject,
    index: int,
    v: int,
    now: int,
    retry_at_ms: int | None,
    dead: bool,
    error: str | None,
    max_attempts: int,
    count_attempt: bool = True,
    rq: str | None = None,
) -> bool | Unchanged:
    """Release the delivery. Returns True when the item must go to the dead-letter queue.

    With ``count_attempt=False`` the delivery is given back uncounted (a worker
    that is stopping and never ran it). A retry re-applied after its own
    ambiguous write landed (the state carries its ``rq``) changes nothing and
    answers as the first time.
    """
    st = obj.items.get(index)
    if rq is not None and st is not None and st.rq == rq and st.v == v:
        if st.s in (WAITING, DEAD_PENDING, DEAD):
            return Unchanged(st.s != WAITING)
    st = current(obj, index, v)
    attempts = retry_attempts(st, count_attempt)
    if dead or (max_attempts and attempts >= max_attempts):
        obj.items[index] = ItemState(DEAD_PENDING, v, attempts, now, error, rq=rq)
        return True
    ready = max(now, retry_at_ms or now)
    obj.items[index] = ItemState(WAITING, v, attempts, ready, error, rq=rq, first=st.first)
    return False


def retry_attempts(st: ItemState, count_attempt: bool) -> int:
    """The attempts an item has after its current delivery is released."""
    return st.attempts if count_attempt else max(0, st.attempts - 1)


def finish_dead(obj: LeaseObject, index: int, v: int) -> Unchanged | None:
    """DEAD_PENDING(v) -> DEAD once the item is in the dead-letter queue."""
    st = obj.items.get(index)
    if st is not None and st.s == DEAD_PENDING and st.v == v:
        obj.items[index] = replace(st, s=DEAD)
        return None
    return Unchanged()


def expire(obj: LeaseObject, indexes: list[int], now: int, to_dead: bool) -> list[int] | Unchanged:
    """Retention: each idle item of ``indexes`` -> Z (dropped) or, ``to_dead``, -> X
    (to be moved to the dead-letter queue). Returns the indexes expired; items
    leased or finished since they were chosen are left alone."""
    done = []
    for i in indexes:
        st = obj.items.get(i)
        if not is_idle(st, now):
            continue
        v, attempts = (st.v, st.attempts) if st else (0, 0)
        state = DEAD_PENDING if to_dead else DEAD
        obj.items[i] = ItemState(state, v + 1, attempts, now, "retention expired")
        done.append(i)
    return done if done else Unchanged([])


def seal(obj: LeaseObject) -> None:
    """Mark a segment to be merged elsewhere: refused while an item is in flight, so
    sealing is serialised with every lease (no token can then name a current
    delivery in it, and nothing in it is leased again)."""
    if any(st.s in IN_FLIGHT for st in obj.items.values()):
        raise SealRefused("an item is in flight")
    obj.sealed = True
