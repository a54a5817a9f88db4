"""The runtime below the engine's parts: per-queue cells, publishers and caches.

A :class:`Runtime` holds what one process knows of the queues of one namespace:
for each queue a :class:`QueueRuntime` (its manifest cell, its publisher, the
cells of its lease objects, the lease walk's lock and summaries), and the
segment cache. Every part of the engine (the lease scheduler, the finishers,
the deliveries, the views, the admin) and the compactor work through it, so a
process never races itself on an object.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from okq.cell import Cell
from okq.clock import MAX_CLOCK_SKEW_MS, Clock
from okq.errors import (
    InvalidRequest,
    LeaseLost,
    ObjectNotFound,
    QueueNotFound,
    TooLarge,
)
from okq.headers import HEADERS_KEY, check_headers
from okq.keys import (
    check_name,
    check_queue,
    lease_key,
    manifest_key,
    segment_key,
)
from okq.leases import LeaseObject, decode_lease, encode_lease
from okq.limits import check_batch, check_time_ms
from okq.manifests import ManifestCodec
from okq.model import (
    CHUNK_SEGMENTS,
    Manifest,
    Segment,
    SegmentMeta,
    decode_segment,
    encode_manifest,
)
from okq.publisher import NewItem, Produced, Publisher
from okq.store.base import Store

log = logging.getLogger("okq.engine")


@dataclass
class EngineOptions:
    """Tunables. Times in seconds, sizes in bytes."""

    linger: float = 0.005  # produce group-commit window
    publish_timeout: float = 60.0  # a segment must be published within this
    idem_window: float = 300.0  # how long producer idempotency keys are kept
    # A lease costs time in proportion to its segment's items (the lease object is
    # copied, summarised and written whole), so a segment holds at most one full
    # produce call (--max-batch): backlog growth does not slow leases.
    max_segment_items: int = 1_000
    max_segment_bytes: int = 16 << 20
    max_item_bytes: int = 1 << 20
    max_batch: int = 1000
    max_wait: float = 900.0  # longest long poll
    manifest_max_age: float = 0.2  # lease path: manifest staleness allowed
    config_max_age: float = 30.0  # renew/retry: queue config staleness allowed
    lease_state_max_age: float = 1.0  # re-read lease objects with leases this often
    poll_interval: float = 0.25  # long poll: how often to look at the store
    # Long poll on a queue whose manifest did not change since the last look: the
    # pause between looks doubles from poll_interval up to this (a produce through
    # this process wakes its long polls at once whatever the pause).
    idle_poll_max: float = 5.0
    dead_grace: float = 10.0  # help a stalled dead-letter move after this
    contention_backoff: float = 1.0  # avoid a segment this long after losing a race
    segment_cache_bytes: int = 64 << 20
    max_idem_keys: int = 10_000  # live idempotency keys per queue (they ride in the manifest)
    # The fleet's clock-skew bound: every clock within this of the true time.
    max_clock_skew: float = MAX_CLOCK_SKEW_MS / 1000
    # Lease objects holding leases re-read per lease call at most: long-running
    # jobs in many segments must not make every lease cost a GET per segment.
    lease_state_reads: int = 4
    # How old a cached manifest or lease object may be on the lease path of a
    # queue whose writes all come through this process (it holds the queue's
    # sequencer role): others' writes are rare (the compactor, a node that could
    # not reach the holder), so an idle long poll re-reads only this often.
    trusted_max_age: float = 15.0
    # Segments per manifest chunk: a publish rewrites a head of fewer segments than
    # this plus a reference per chunk, whatever the backlog. 0 writes no chunks, so
    # a manifest stays in format 1, readable by okq before chunks (rolling upgrades).
    manifest_chunk: int = CHUNK_SEGMENTS


class QueueRuntime:
    """One queue's state in this process: its manifest cell and publisher, its
    lease cells, the lease walk's lock, wake-up event and summaries."""

    def __init__(self, name: str, manifest: Cell[Manifest], publisher: Publisher) -> None:
        self.name = name
        self.manifest = manifest
        self.publisher = publisher
        self.lock = asyncio.Lock()
        # Set by every wake-up, cleared by a lease's look: one made during a look
        # makes that lease look again rather than sleep.
        self.wake = asyncio.Event()
        # The long polls asleep, oldest first: a wake-up wakes the first
        # (okq/scheduler.py: a look that took a full batch wakes the next).
        self.sleepers: deque[asyncio.Future[None]] = deque()
        self.leases: dict[str, Cell[LeaseObject]] = {}
        self.summaries: dict[str, tuple[bytes | None, Any]] = {}
        # Segments every item of which a lease walk here found done or dead-lettered
        # (terminal states): the standard walk passes over them without a look
        # until a compactor drops them from the manifest.
        self.finished: set[str] = set()
        # Where the standard walk of a scan order starts: past the finished segments
        # at its front (the order list itself, and the count; a finished segment
        # stays finished, and a change of the list starts the count again).
        self.walk_start: tuple[list[SegmentMeta], int] | None = None
        self.seen_ver = -1
        self.seen_segments: list[SegmentMeta] = []  # the list of that version
        self.waiters = 0  # long polls of this process waiting for the queue's items
        # When the next item not yet due becomes leasable (ms), as the last lease
        # walk here saw it; None: none seen (okq.partitions' long polls wake for it).
        self.next_ready_ms: int | None = None
        # The long polls' pause between looks at the store (it grows while the
        # manifest stays as it was: see Scheduler.lease), and the manifest's ETag
        # at the last look.
        self.idle_pause = 0.0
        self.idle_etag: str | None = None
        self.idle_reads = 0  # the manifest cell's reads at the last look
        # Half-done items (dead-letter moves, outputs) found by a lease walk, helped
        # once the walk has let go of the queue's lock.
        self.stalled: dict[tuple[str, int], SegmentMeta] = {}
        # No help for an item before this time (after a help failed): (segment, index) -> ms
        self.help_after: dict[tuple[str, int], int] = {}
        self.recent = RecentGroups()  # the groups this process handed out last (fair sharing)
        # The groups a fair walk to the end of the segments found ready items of:
        # ((manifest ver, nonce), until ms, groups), for the walks after it.
        self.fair_found: tuple[tuple[int, str], int, frozenset[str]] | None = None

    def wake_one(self) -> None:
        """The longest-waiting long poll of this queue looks now, if one is asleep."""
        while self.sleepers:
            sleeper = self.sleepers.popleft()
            if not sleeper.done():
                sleeper.set_result(None)
                return

    def wake_all(self) -> None:
        """Every long poll of this queue looks now."""
        self.wake.set()
        while self.sleepers:
            self.wake_one()


LAST_KEPT = 4096  # groups whose last handout RecentGroups remembers, at most


class RecentGroups:
    """The groups of a queue's last ``size`` handouts by this process, counted: a
    fair lease walk (docs/DESIGN.md, "Fair sharing") puts the groups served most
    lately last, so that a lease of one item at a time goes round them too."""

    def __init__(self, size: int = 64) -> None:
        self.order: deque[str] = deque(maxlen=size)
        self.counts: Counter[str] = Counter()
        self.last: dict[str, int] = {}  # group -> the number of its last handout here
        self.served = 0  # handouts noted

    def note(self, group: str) -> int:
        """Count a handout of ``group``; returns its number."""
        if len(self.order) == self.order.maxlen:
            gone = self.order[0]
            self.counts[gone] -= 1
            if not self.counts[gone]:
                del self.counts[gone]
        self.order.append(group)
        self.counts[group] += 1
        self.served += 1
        self.last[group] = self.served
        if len(self.last) > LAST_KEPT:  # those served long ago: as if never
            self.last = {g: self.last[g] for g in self.counts}
        return self.served


class SegmentCache:
    """Decoded segments (immutable) by id, least recently used dropped past a size."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._segments: OrderedDict[str, Segment] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._bytes = 0

    def get(self, sid: str) -> Segment | None:
        seg = self._segments.get(sid)
        if seg is not None:
            self._segments.move_to_end(sid)
        return seg

    def put(self, seg: Segment, size: int) -> None:
        self._segments[seg.id] = seg
        self._bytes += size - self._sizes.get(seg.id, 0)
        self._sizes[seg.id] = size
        while self._bytes > self.max_bytes and len(self._segments) > 1:
            old, _ = self._segments.popitem(last=False)
            self._bytes -= self._sizes.pop(old)

    def drop(self, sid: str) -> None:
        if self._segments.pop(sid, None) is not None:
            self._bytes -= self._sizes.pop(sid)


class Runtime:
    """The queues of one namespace of one store, as this process holds them: the
    cells that write their objects, the publishers, the segment cache. The
    engine's parts and the compactor work through it."""

    def __init__(self, store: Store, namespace: str, clock: Clock,
                 options: EngineOptions) -> None:
        self.store = store
        self.ns = check_name(namespace, "namespace")
        self.clock = clock
        self.opts = options
        self.queues: dict[str, QueueRuntime] = {}
        self.segments = SegmentCache(options.segment_cache_bytes)
        self.stopping = False
        self.cas_conflicts = 0  # lost CAS races, for metrics
        # Whether this process writes all of a queue's changes (sequencer mode):
        # its caches of that queue may then be trusted for longer.
        self.trusted: Callable[[str], bool] = lambda queue: False
        # Called with a queue's name whenever this process made items of it
        # leasable (okq.partitions wakes its long polls of the whole queue).
        self.on_wake: list[Callable[[str], None]] = []
        # Where an item moved into a queue by the engine itself (a redrive) goes: the
        # queue's name and the item's meta -> the engine queue to write to
        # (okq.partitions puts a message group's item in its group's partition).
        self.route: Callable[[str, dict[str, Any] | None], Awaitable[str]] | None = None

    def queue(self, name: str, field_name: str = "queue") -> QueueRuntime:
        """The queue's runtime, made on first use (the name is checked)."""
        q = self.queues.get(name)
        if q is not None:
            return q
        check_queue(name, field_name)
        codec = ManifestCodec(self.store, self.ns, name, self.clock, self.opts.manifest_chunk)
        cell: Cell[Manifest] = Cell(
            self.store, manifest_key(self.ns, name), self.clock, encode_manifest, codec.decode,
            on_conflict=self._conflict, copy=Manifest.copy, load=codec.load,
            prepare=codec.prepare,
        )
        o = self.opts
        pub = Publisher(
            self.store, self.ns, name, cell, self.clock,
            linger=o.linger,
            publish_timeout_ms=int(o.publish_timeout * 1000),
            idem_window_ms=int(o.idem_window * 1000),
            max_segment_items=o.max_segment_items,
            max_segment_bytes=o.max_segment_bytes,
            max_idem_keys=o.max_idem_keys,
            max_clock_skew_ms=int(o.max_clock_skew * 1000),
        )
        pub.on_written = self.segments.put
        q = self.queues[name] = QueueRuntime(name, cell, pub)
        pub.on_published = lambda: self.wake(q)
        pub.waiting = lambda: q.waiters
        return q

    def max_ages(self, q: QueueRuntime) -> tuple[float, float]:
        """How old the lease path may take the queue's manifest and its lease
        objects holding leases (seconds): longer while this process is trusted
        to write all of the queue's changes."""
        o = self.opts
        if self.trusted(q.name):
            return o.trusted_max_age, o.trusted_max_age
        return o.manifest_max_age, o.lease_state_max_age

    def forget_cached(self, which: Callable[[str], bool]) -> None:
        """Re-read before trusting anything cached of the queues ``which`` picks."""
        for q in self.queues.values():
            if which(q.name):
                q.manifest.forget()
                for cell in q.leases.values():
                    cell.forget()

    def _conflict(self) -> None:
        self.cas_conflicts += 1

    def manifest_cell(self, queue: str) -> Cell[Manifest]:
        return self.queue(queue).manifest

    def lease_cell(self, q: QueueRuntime | str, segment: str) -> Cell[LeaseObject]:
        """The cell of a segment's lease object (a missing one reads as all fresh)."""
        q = self.queue(q) if isinstance(q, str) else q
        cell = q.leases.get(segment)
        if cell is None:
            cell = q.leases[segment] = Cell(
                self.store,
                lease_key(self.ns, q.name, segment),
                self.clock,
                encode_lease,
                decode_lease,
                initial=lambda: LeaseObject(segment),
                on_conflict=self._conflict,
                copy=LeaseObject.copy,
            )
        return cell

    async def manifest(self, q: QueueRuntime, max_age: float) -> Manifest:
        """The queue's manifest, no older than ``max_age`` seconds; QueueNotFound."""
        m = await q.manifest.read(int(max_age * 1000))
        if m is None:
            if not q.publisher.pending_items() and self.queues.get(q.name) is q:
                del self.queues[q.name]  # do not keep runtimes of unknown queues
            raise QueueNotFound(f"queue {q.name!r} does not exist", queue=q.name)
        return m

    async def manifest_read(self, q: QueueRuntime, max_age: float) -> tuple[Manifest, bool]:
        """The manifest as :meth:`manifest` gives it, and whether it was read from
        the store by this call (fresh) rather than taken from the cache."""
        reads = q.manifest.reads
        m = await self.manifest(q, max_age)
        return m, q.manifest.reads != reads

    async def segment(self, q: QueueRuntime | str, sm: SegmentMeta) -> Segment:
        """A listed segment, from the cache or the store."""
        q = self.queue(q) if isinstance(q, str) else q
        seg = self.segments.get(sm.id)
        if seg is None:
            blob = await self.store.get(segment_key(self.ns, q.name, sm.id))
            seg = decode_segment(blob.data)
            self.segments.put(seg, len(blob.data))
        return seg

    def forget_segments(self, queue: str, segments: Sequence[str]) -> None:
        """Drop cached state of segments no longer in the manifest."""
        q = self.queue(queue)
        for sid in segments:
            q.leases.pop(sid, None)
            q.summaries.pop(sid, None)
            self.segments.drop(sid)

    async def gone(self, q: QueueRuntime, segment: str) -> bool:
        """Whether a segment is no longer listed: a token naming it outlived it."""
        try:
            await self.segment_meta(q, segment)
        except (LeaseLost, QueueNotFound):
            return True
        return False

    async def segment_meta(self, q: QueueRuntime, segment: str) -> SegmentMeta:
        """A listed segment's entry; one whose item is in flight is always listed."""
        for max_age in (self.opts.config_max_age, 0):
            m = await self.manifest(q, max_age)
            sm = next((s for s in m.segments if s.id == segment), None)
            if sm is not None:
                return sm
        raise LeaseLost(f"segment {segment} is no longer in queue {q.name!r} (purged or "
                        "compacted)", state="gone")

    async def produce(self, queue: str, items: Sequence[NewItem | bytes]) -> Produced:
        """Publish items; returns their ids once the manifest CAS has landed (and how
        many were duplicates of items already there: ``Produced``)."""
        batch = self.new_items(items, "items")
        q = self.queue(queue)
        await self.manifest(q, 60)  # a missing queue fails before a segment is written
        try:
            return await q.publisher.produce(batch)  # wakes q's long polls (on_published)
        except Exception as exc:
            if isinstance(exc, ObjectNotFound):
                raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue) from exc
            raise

    def wake(self, q: QueueRuntime) -> None:
        """Items of ``q`` may be leasable now: its longest-waiting long poll looks
        at once (and wakes the next if it took a full batch: there may be more)."""
        q.wake.set()
        q.wake_one()
        for fn in self.on_wake:
            fn(q.name)

    def new_items(self, items: Sequence[NewItem | bytes], field_name: str) -> list[NewItem]:
        """The items of a produce, checked against the limits."""
        batch = [i if isinstance(i, NewItem) else NewItem(i) for i in items]
        self.check_batch(len(batch), field_name)
        limit = self.opts.max_item_bytes
        # Commonly every item is a payload within the limit and nothing else: then
        # three list passes say so, and no item is looked at field by field.
        if (not batch or (max([len(i.payload) for i in batch]) <= limit
                          and [i.enqueue_at_ms for i in batch].count(None) == len(batch)
                          and [i.meta for i in batch].count(None) == len(batch))):
            return batch
        for n, item in enumerate(batch):  # a field's name is spelt only for an error
            if len(item.payload) > limit:
                raise TooLarge(
                    f"{field_name}[{n}] is {len(item.payload)} bytes; the limit is {limit}",
                    field=f"{field_name}[{n}]", limit=limit,
                )
            if item.enqueue_at_ms is not None:
                check_time_ms(item.enqueue_at_ms, f"{field_name}[{n}].enqueue_at")
            if item.meta and HEADERS_KEY in item.meta:
                _check_headers(item.meta[HEADERS_KEY], f"{field_name}[{n}].headers")
        return batch

    def check_batch(self, n: int, field_name: str) -> None:
        check_batch(n, self.opts.max_batch, field_name)

    async def close(self) -> None:
        """Flush pending produce batches and writes; the store stays open."""
        for q in list(self.queues.values()):
            await q.publisher.close()
            await q.manifest.close()
            for cell in q.leases.values():
                await cell.close()


def _check_headers(headers: Any, field_name: str) -> None:
    """Refuse headers that break okq/headers.py's rules (the wire checked them already:
    this is for library mode, whose items carry them in ``meta``)."""
    try:
        check_headers(headers)
    except ValueError as exc:
        raise InvalidRequest(f"{field_name}: {exc}", field=field_name) from None
