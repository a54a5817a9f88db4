"""Group commit for produce: many produce calls, one segment, one manifest CAS.

Produce calls on one engine and queue are gathered for ``linger`` seconds (none
while a lease of this engine waits for the queue's items) and while the
previous publish is in flight, into one segment. The segment is
written create-only under a fresh id, then published by one manifest CAS; every
call waits for that CAS. A crash between the two leaves an unreferenced
segment that nobody reads and the garbage collector removes.

Publish deadline: a segment records ``publish_by``; the manifest change refuses
to publish it after that time, or when the manifest's ``gc_floor`` has passed
its creation time (a collector may already consider it an orphan). Either way
the produce fails with PublishAborted and nothing is visible.

Producer idempotency: an item with a ``key`` is recorded in the manifest's
``idem`` map for the queue's idempotency window; a later produce with the same
key returns the first item's id instead of publishing again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final, cast

import msgspec

from okq.batcher import CALLER, Batcher
from okq.cell import Cell
from okq.changes import Unchanged
from okq.clock import MAX_CLOCK_SKEW_MS, Clock
from okq.errors import CASConflict, ObjectNotFound, PublishAborted, StorageError
from okq.keys import (
    item_id,
    item_ids,
    lease_key,
    new_segment_id,
    parse_item_id,
    segment_key,
    split_partition,
)
from okq.manifest_ops import KeysTaken, Publish, PublishWritten, live_key
from okq.model import Manifest, Segment, SegmentItem, SegmentMeta, encode_segment, groups_of
from okq.store.base import Store


class NewItem(msgspec.Struct):
    """An item to produce. A msgspec Struct, as ``okq.model.SegmentItem`` is: one
    is made per produced item."""

    payload: bytes
    enqueue_at_ms: int | None = None
    key: str | None = None  # producer idempotency key
    meta: dict[str, Any] | None = None


#: The fewest items a produce call has for its caller to end a linger early (see
#: ``Publisher.produce``): a segment of these costs at most 2 / 100 PUTs per
#: message, as a lease and its completion do at a batch of 100.
CLOSED_LOOP_ITEMS: Final = 100

#: An item's place in its queue: (partition, sequence number in that partition).
Place = tuple[int, int]


class Produced(list[str]):
    """A produce's ids, in the order of its items, and how many of them were already
    there (``duplicates``): items whose idempotency key an earlier item (of an earlier
    produce, or of this one) holds, answered with that item's id and not published
    again. A list of ids to every caller; ``duplicates`` for those who ask, and
    ``sequence``, each item's (partition, sequence number in it) as its manifest
    numbered it (None where not known: a duplicate whose segment a compactor merged
    away since)."""

    def __init__(self, ids: list[str], duplicates: int,
                 sequence: list[Place | None] | None = None) -> None:
        super().__init__(ids)
        self.duplicates = duplicates
        self._sequence = sequence
        self._numbers: tuple[int, list[int | None]] | None = None

    @classmethod
    def numbered(cls, ids: list[str], duplicates: int, partition: int,
                 numbers: list[int | None]) -> Produced:
        """A publish's answer: the items' sequence numbers in ``partition``, made
        into places only when asked for (an SQS FIFO send; most callers never do)."""
        produced = cls(ids, duplicates)
        produced._numbers = (partition, numbers)
        return produced

    @property
    def sequence(self) -> list[Place | None] | None:
        if self._sequence is None and self._numbers is not None:
            partition, numbers = self._numbers
            self._sequence = [None if n is None else (partition, n) for n in numbers]
        return self._sequence


def _size(items: list[NewItem]) -> int:
    return sum([len(i.payload) for i in items])  # a list is built faster than a generator runs


class Publisher:
    def __init__(
        self,
        store: Store,
        namespace: str,
        queue: str,
        manifest: Cell[Manifest],
        clock: Clock,
        *,
        linger: float,
        publish_timeout_ms: int,
        idem_window_ms: int,
        max_segment_items: int,
        max_segment_bytes: int,
        max_idem_keys: int = 10_000,
        max_clock_skew_ms: int = MAX_CLOCK_SKEW_MS,
    ) -> None:
        self.store = store
        self.ns = namespace
        self.queue = queue
        self.manifest = manifest
        self.clock = clock
        self.publish_timeout_ms = publish_timeout_ms
        self.idem_window_ms = idem_window_ms
        # Keys are kept for the window plus twice the skew bound, so that the
        # window holds for a reader whose clock is ahead of the writer's.
        self.idem_keep_ms = idem_window_ms + 2 * max_clock_skew_ms
        self.max_idem_keys = max_idem_keys
        self.max_items = max_segment_items
        self.max_bytes = max_segment_bytes
        # While a long poll waits, the producers are answered a turn later: the long
        # poll a publish woke takes its items and hands its lease object's write to
        # the store first (the producers' replies would run ahead of that write's
        # task, which the long poll makes after they were made ready).
        self._batcher: Batcher[list[NewItem], Produced] = Batcher(
            self._publish_calls, name=f"publish {queue}", linger=self._linger, take=self._take,
            answer_later=lambda: self.waiting() > 0)
        self.linger = linger
        # How many lease requests wait for this queue's items in this process: while
        # any does, a produce is published at once (no linger): a consumer is idle,
        # so the queue is not busy enough for a wait to gather more.
        self.waiting: Callable[[], int] = lambda: 0
        self.segments_written = 0
        self.on_written: Callable[[Segment, int], None] | None = None
        self.on_published: Callable[[], None] | None = None  # new items are visible

    def pending_items(self) -> int:
        return sum(len(items) for items in self._batcher.waiting())

    async def produce(self, items: list[NewItem]) -> Produced:
        """Publish ``items`` in the next group commit; their ids once it landed.

        A call of at least ``CLOSED_LOOP_ITEMS`` items names its caller (its
        connection) to the group commit, whose linger then ends as soon as every
        caller of the last publish has called again: callers in a closed loop are
        not kept waiting for nobody. Smaller calls always get the whole linger, so
        a segment published early holds at least that many items (its PUTs per
        message stay at most 2 / ``CLOSED_LOOP_ITEMS``)."""
        source = CALLER.get() if len(items) >= CLOSED_LOOP_ITEMS else None
        return await self._batcher.submit(items, source)

    async def _publish_calls(self, calls: list[list[NewItem]]) -> list[Produced | BaseException]:
        ids, fresh, seqs = await self._publish([i for items in calls for i in items])
        if fresh and self.on_published is not None:
            # Before the callers are answered: a long poll waiting for these items
            # looks first, and the producers' replies go out while it writes.
            self.on_published()
        # Commonly every item is new: then nothing is counted item by item.
        taken = None if len(fresh) == len(ids) else set(range(len(ids))) - set(fresh)
        partition = split_partition(self.queue)[1]
        out: list[Produced | BaseException] = []
        pos = 0
        for items in calls:
            end = pos + len(items)
            out.append(Produced.numbered(ids[pos:end], sum(pos <= i < end for i in taken)
                                         if taken else 0, partition, seqs[pos:end]))
            pos = end
        return out

    def _linger(self) -> float:
        return 0.0 if self.waiting() else self.linger

    def _take(self, waiting: list[list[NewItem]]) -> int:
        """How many waiting calls fit one segment (at least one)."""
        n = items = size = 0
        for call in waiting:
            more = _size(call)
            if n and (items + len(call) > self.max_items or size + more > self.max_bytes):
                break
            n, items, size = n + 1, items + len(call), size + more
        return n

    async def _publish(self, items: list[NewItem]
                       ) -> tuple[list[str], list[int], list[int | None]]:
        """The items' ids, the indexes of those published now (the others were
        answered by their idempotency keys), and each item's sequence number."""
        # Commonly no item has an idempotency key: then none is looked for item by item.
        keyed = [i.key for i in items].count(None) != len(items)
        for _ in range(5):
            manifest = await self._manifest_for(items, keyed)
            if keyed:
                fresh, ids, twins = _dedupe(items, manifest, self.clock.now_ms())
            else:
                fresh, ids, twins = list(range(len(items))), [None] * len(items), {}
            seqs: list[int | None] = [None] * len(items)
            if len(fresh) < len(items) and manifest is not None:
                for i, known in enumerate(ids):  # answered by a key: the first's number
                    if known is not None:
                        seg, index = parse_item_id(known)
                        first = _seq_of(manifest, seg)
                        seqs[i] = None if first is None else first + index
            try:
                if fresh:
                    first = await self._publish_segment(items, fresh, ids, keyed)
                    if first is not None and len(fresh) == len(items):
                        seqs = list(range(first, first + len(items)))
                    elif first is not None:
                        for n, i in enumerate(fresh):
                            seqs[i] = first + n
            except KeysTaken:
                self.manifest.forget()
                continue
            for dup, first_of in twins.items():
                ids[dup], seqs[dup] = ids[first_of], seqs[first_of]
            # Every item fresh: every id is set (a scan for None costs a compare each).
            complete = len(fresh) == len(items) or None not in ids
            return cast(list[str], ids) if complete else [i or "" for i in ids], fresh, seqs
        raise PublishAborted("idempotency keys kept changing under this produce; retry it")

    async def _manifest_for(self, items: list[NewItem], keyed: bool) -> Manifest | None:
        """The manifest to look the items' idempotency keys up in: the cached copy,
        unless a key is found in it. A key found answers the produce without a
        write, so that answer never rests on a cached copy: the queue may have
        been deleted and made again since (a key missing from a stale copy is
        harmless: the publishing CAS checks the keys on the current manifest)."""
        reads = self.manifest.reads
        manifest = await self.manifest.read(max_age_ms=60_000)
        now = self.clock.now_ms()
        if self.manifest.reads == reads and (manifest is None or (keyed and any(
                i.key is not None and live_key(manifest, i.key, now) for i in items))):
            manifest = await self.manifest.read(0)
        return manifest

    async def write_segment(self, items: list[NewItem]) -> SegmentMeta:
        """Write a segment of ``items``, create-only; it is invisible until published."""
        now = self.clock.now_ms()
        seg_id = new_segment_id(now)
        segment = Segment(
            seg_id,
            self.queue,
            now,
            now + self.publish_timeout_ms,
            [SegmentItem(i.payload, i.enqueue_at_ms, i.meta) for i in items],
        )
        data = encode_segment(segment)
        await self._write_segment(segment_key(self.ns, self.queue, seg_id), data)
        n = len(items)
        self.segments_written += 1
        if self.on_written is not None:  # the first lease of it needs no GET here
            self.on_written(segment, len(data))
        # The latest due time rides in the manifest: stats count the segment unread.
        # (commonly no item is scheduled and none has a meta: nothing to look for)
        scheduled = [i.enqueue_at_ms for i in items].count(None) != n
        last_due = max((i.enqueue_at_ms for i in items
                        if i.enqueue_at_ms is not None and i.enqueue_at_ms > now),
                       default=0) if scheduled else 0
        metas = [i.meta for i in items]
        return SegmentMeta(seg_id, n, now, len(data), None, last_due,
                           groups=groups_of(metas) if metas.count(None) != n else None)

    async def _publish_segment(
        self, items: list[NewItem], fresh: list[int], ids: list[str | None], keyed: bool
    ) -> int | None:
        """Write one segment of the ``fresh`` items and publish it; fills in ``ids``.
        The sequence number of its first item, as the manifest it landed in numbered
        it (None if a compactor has merged it away already)."""
        every = len(fresh) == len(items)  # fresh is then 0, 1, ...: no key answered any
        meta = await self.write_segment(items if every else [items[i] for i in fresh])
        if every:
            ids[:] = item_ids(meta.id, len(items))
        else:
            for n, i in enumerate(fresh):
                ids[i] = item_id(meta.id, n)
        keys: dict[str, str] = {}
        for i in fresh if keyed else ():
            k, iid = items[i].key, ids[i]
            if k is not None and iid is not None:
                keys[k] = iid
        op = Publish(meta, meta.created_ms + self.publish_timeout_ms, keys, self.idem_keep_ms,
                     self.max_idem_keys)
        ambiguous = self.manifest.ambiguous
        tried = False  # whether a write carrying this publish was attempted

        def publish(m: Manifest, now: int) -> Unchanged | None:
            nonlocal tried
            result = op.apply(m, now, may_have_landed=tried and
                              self.manifest.ambiguous != ambiguous)
            tried = tried or result is None
            return result

        await self.manifest.update(publish)
        landed = self.manifest.view()
        return None if landed is None else _seq_of(landed, meta.id)

    async def publish_written(self, meta: SegmentMeta) -> None:
        """Publish a segment written earlier whose publication is already decided
        (a completion's outputs). Idempotent however late it comes: a segment is
        published once if it is listed, recorded by its marker, or has a lease
        object (its items were leased or sealed, so it was published and a
        compactor has since folded or merged it away)."""
        if self.clock.now_ms() - meta.created_ms > self.publish_timeout_ms:
            # Late: the marker may have expired and a compactor may have folded
            # or merged the segment away (it never does so sooner than this).
            try:
                await self.store.head(lease_key(self.ns, self.queue, meta.id))
            except ObjectNotFound:
                pass
            else:
                return  # published earlier, and compacted away since
        await self.manifest.update(PublishWritten(meta, self.idem_keep_ms).apply)

    async def _write_segment(self, key: str, data: bytes) -> None:
        """Create-only write; an ambiguous failure is resolved by writing again."""
        for attempt in range(4):
            try:
                await self.store.put(key, data, if_none_match=True, want_etag=False)
                return
            except CASConflict:
                if attempt == 0:  # a fresh random id cannot exist yet
                    raise StorageError(f"new segment {key!r} already exists") from None
                return  # our earlier, ambiguous attempt landed
            except StorageError:
                if attempt == 3:
                    raise
                await asyncio.sleep(0.05 * 2**attempt)

    async def close(self) -> None:
        await self._batcher.close()


def _seq_of(m: Manifest, segment: str) -> int | None:
    """The sequence number of the first item of a segment listed in ``m`` (looked for
    from the end: the segments just published are there). Its items follow it in
    order: the ids looked up here are those a publish gave, never a merged
    segment's (whose items keep numbers of their own)."""
    for sm in reversed(m.segments):
        if sm.id == segment:
            return sm.seq
    return None


def _dedupe(
    items: list[NewItem], m: Manifest | None, now_ms: int
) -> tuple[list[int], list[str | None], dict[int, int]]:
    """Indexes of items to publish, ids already known, and in-batch twins (dup -> first)."""
    fresh: list[int] = []
    ids: list[str | None] = [None] * len(items)
    first: dict[str, int] = {}
    twins: dict[int, int] = {}
    for i, item in enumerate(items):
        if item.key is not None and m is not None and live_key(m, item.key, now_ms):
            ids[i] = m.idem[item.key][0]
        elif item.key is not None and item.key in first:
            twins[i] = first[item.key]
        else:
            if item.key is not None:
                first[item.key] = i
            fresh.append(i)
    return fresh, ids, twins
