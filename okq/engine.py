"""The queue engine: okq's public library API, with no HTTP.

An :class:`Engine` serves any number of queues in one namespace of one store.
Any number of engines, in any number of processes, may share a store: every
change is a compare-and-swap on the object that owns it, so the bucket stays
the only source of truth. See docs/DESIGN.md for the object layout, every state
transition and the failure analysis.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from okq import transitions as tr
from okq.cell import Cell, Unchanged
from okq.clock import MAX_CLOCK_SKEW_MS, Clock, SystemClock
from okq.errors import (
    CASConflict,
    InvalidRequest,
    InvalidToken,
    LeaseLost,
    ObjectNotFound,
    OkqError,
    PublishAborted,
    QueueExists,
    QueueInUse,
    QueueNotFound,
    TooLarge,
)
from okq.keys import (
    check_name,
    item_id,
    lease_key,
    manifest_key,
    manifests_prefix,
    parse_item_id,
    segment_key,
)
from okq.model import (
    DEAD_PENDING,
    DONE,
    LEASED,
    OUTPUTS_PENDING,
    ItemState,
    LeaseObject,
    Manifest,
    QueueConfig,
    Segment,
    SegmentItem,
    SegmentMeta,
    decode_lease,
    decode_manifest,
    decode_segment,
    encode_lease,
    encode_manifest,
    fresh_due_ms,
    fresh_ready_ms,
    new_nonce,
    new_request_id,
)
from okq.publisher import NewItem, Publisher
from okq.store.base import Store, list_all
from okq.store.selfcheck import check_conditional_writes
from okq.tokens import Delivery, TokenSigner

log = logging.getLogger("okq.engine")

MAX_TIME_MS = 221_845_392_000_000  # 9000-01-01: far enough, and every time renders
HELP_BACKOFF_MS = 60_000  # after a failed help (e.g. a dead queue gone), wait this long


@dataclass
class EngineOptions:
    """Tunables. Times in seconds, sizes in bytes."""

    linger: float = 0.005  # produce group-commit window
    publish_timeout: float = 60.0  # a segment must be published within this
    idem_window: float = 300.0  # how long producer idempotency keys are kept
    max_segment_items: int = 10_000
    max_segment_bytes: int = 16 << 20
    max_item_bytes: int = 1 << 20
    max_batch: int = 1000
    max_wait: float = 900.0  # longest long poll
    manifest_max_age: float = 0.2  # lease path: manifest staleness allowed
    config_max_age: float = 30.0  # renew/retry: queue config staleness allowed
    lease_state_max_age: float = 1.0  # re-read lease objects with leases this often
    poll_interval: float = 0.25  # long poll: how often to look at the store
    dead_grace: float = 10.0  # help a stalled dead-letter move after this
    contention_backoff: float = 1.0  # avoid a segment this long after losing a race
    segment_cache_bytes: int = 64 << 20
    max_idem_keys: int = 10_000  # live idempotency keys per queue (they ride in the manifest)
    # The fleet's clock-skew bound: every clock within this of the true time.
    max_clock_skew: float = MAX_CLOCK_SKEW_MS / 1000
    # Lease objects holding leases re-read per lease call at most: long-running
    # jobs in many segments must not make every lease cost a GET per segment.
    lease_state_reads: int = 4


@dataclass
class LeasedItem:
    id: str
    queue: str
    token: str
    attempts: int
    lease_deadline_ms: int
    payload: bytes
    produced_ms: int
    enqueue_at_ms: int | None = None
    meta: dict[str, Any] | None = None


@dataclass
class BrowsedItem:
    id: str
    state: str  # available, scheduled, leased, waiting
    attempts: int
    produced_ms: int
    ready_ms: int | None
    payload: bytes
    meta: dict[str, Any] | None
    error: str | None


@dataclass
class QueueInfo:
    name: str
    config: QueueConfig
    created_ms: int
    segments: int
    produced: int


@dataclass
class QueueStats:
    queue: str
    available: int = 0
    in_flight: int = 0
    scheduled: int = 0
    waiting_retry: int = 0
    dead: int = 0  # items in this queue's dead-letter queue
    dead_lettered: int = 0  # items moved out of this queue, not yet compacted
    completed: int = 0  # tombstones not yet compacted
    redriven: int = 0  # dead letters moved back to their source queue, not yet compacted
    segments: int = 0
    oldest_age_s: float = 0.0


@dataclass
class _Summary:
    """What a lease object says about its segment, derived once per version."""

    # (order_ms, index, due_ms) of items that can be leased, by order: order is
    # the item's place in line (its ready time by the clock that set it); due is
    # when it may be leased (0 for a fresh unscheduled item: at once, whatever
    # the reader's clock says of its producer's time).
    ready: list[tuple[int, int, int]]
    inflight: bool
    stalled: list[tuple[int, int]]  # (since_ms, index) in DEAD_PENDING or OUTPUTS_PENDING


@dataclass
class _Queue:
    name: str
    manifest: Cell[Manifest]
    publisher: Publisher
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    leases: dict[str, Cell[LeaseObject]] = field(default_factory=dict)
    summaries: dict[str, tuple[bytes | None, _Summary]] = field(default_factory=dict)
    seen_ver: int = -1
    # Half-done items (dead-letter moves, outputs) found by a lease walk, helped
    # once the walk has let go of the queue's lock.
    stalled: dict[tuple[str, int], SegmentMeta] = field(default_factory=dict)
    # No help for an item before this time (after a help failed): (segment, index) -> ms
    help_after: dict[tuple[str, int], int] = field(default_factory=dict)


class Engine:
    def __init__(
        self,
        store: Store,
        signer: TokenSigner,
        *,
        namespace: str = "default",
        clock: Clock | None = None,
        options: EngineOptions | None = None,
    ) -> None:
        self.store = store
        self.signer = signer
        self.ns = check_name(namespace, "namespace")
        self.clock = clock or SystemClock()
        self.opts = options or EngineOptions()
        self._queues: dict[str, _Queue] = {}
        self._segments: OrderedDict[str, Segment] = OrderedDict()
        self._segment_bytes = 0
        self._sizes: dict[str, int] = {}
        self._stopping = False
        self.cas_conflicts = 0  # lost CAS races, for metrics

    # -- life cycle --------------------------------------------------------
    async def start(self, *, self_check: bool = True) -> Engine:
        if self_check:
            await check_conditional_writes(self.store)
        return self

    def stop_waiting(self) -> None:
        """Make long polls return now (with what they have): the node is stopping."""
        self._stopping = True
        for q in self._queues.values():
            q.wake.set()

    async def close(self) -> None:
        """Flush pending produce batches and writes; the store stays open."""
        for q in list(self._queues.values()):
            await q.publisher.close()
            await q.manifest.close()
            for cell in q.leases.values():
                await cell.close()

    async def __aenter__(self) -> Engine:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- runtime objects -----------------------------------------------------
    def _q(self, name: str, field_name: str = "queue") -> _Queue:
        q = self._queues.get(name)
        if q is not None:
            return q
        check_name(name, field_name)
        cell: Cell[Manifest] = Cell(
            self.store, manifest_key(self.ns, name), self.clock, encode_manifest, decode_manifest,
            on_conflict=self._conflict,
        )
        o = self.opts
        pub = Publisher(
            self.store,
            self.ns,
            name,
            cell,
            self.clock,
            linger=o.linger,
            publish_timeout_ms=int(o.publish_timeout * 1000),
            idem_window_ms=int(o.idem_window * 1000),
            max_segment_items=o.max_segment_items,
            max_segment_bytes=o.max_segment_bytes,
            max_idem_keys=o.max_idem_keys,
            max_clock_skew_ms=int(o.max_clock_skew * 1000),
        )
        q = self._queues[name] = _Queue(name, cell, pub)
        return q

    def _conflict(self) -> None:
        self.cas_conflicts += 1

    def _lease_cell(self, q: _Queue, segment: str) -> Cell[LeaseObject]:
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
            )
        return cell

    async def _manifest(self, q: _Queue, max_age: float) -> Manifest:
        m = await q.manifest.read(int(max_age * 1000))
        if m is None:
            if not q.publisher.pending_items() and self._queues.get(q.name) is q:
                del self._queues[q.name]  # do not keep runtimes of unknown queues
            raise QueueNotFound(f"queue {q.name!r} does not exist", queue=q.name)
        return m

    async def _segment(self, q: _Queue, sm: SegmentMeta) -> Segment:
        seg = self._segments.get(sm.id)
        if seg is not None:
            self._segments.move_to_end(sm.id)
            return seg
        blob = await self.store.get(segment_key(self.ns, q.name, sm.id))
        seg = decode_segment(blob.data)
        self._segments[sm.id] = seg
        self._sizes[sm.id] = len(blob.data)
        self._segment_bytes += len(blob.data)
        while self._segment_bytes > self.opts.segment_cache_bytes and len(self._segments) > 1:
            old, _ = self._segments.popitem(last=False)
            self._segment_bytes -= self._sizes.pop(old)
        return seg

    # -- queues --------------------------------------------------------------
    async def create_queue(
        self, name: str, config: QueueConfig | None = None, *, exist_ok: bool = False
    ) -> QueueInfo:
        """Create a queue. With ``exist_ok`` an existing queue is left as it is
        (its configuration unchanged) and its info returned."""
        q = self._q(name)
        config = config or QueueConfig()
        await self._check_dead_queue(name, config)
        m = Manifest(name, self.clock.now_ms(), config, ver=1, nonce=new_nonce())
        try:
            await self.store.put(q.manifest.key, encode_manifest(m), if_none_match=True)
        except CASConflict:
            if exist_ok:
                return await self.get_queue(name)
            raise QueueExists(f"queue {name!r} already exists", queue=name) from None
        q.manifest.forget()
        return self._info(m)

    async def get_queue(self, name: str) -> QueueInfo:
        return self._info(await self._manifest(self._q(name), 0))

    async def update_queue(self, name: str, **changes: Any) -> QueueInfo:
        """Change settings; those not named keep their values. A new ``dead_queue`` is
        checked first, as at create (it must exist and must not lead back here)."""
        q = self._q(name)
        current = await self._manifest(q, 0)
        if changes.get("dead_queue") is not None:
            await self._check_dead_queue(name, _merged(current.config, changes))

        def change(m: Manifest, now: int) -> Manifest:
            m.config = _merged(m.config, changes)
            return m

        m: Manifest = await q.manifest.update(change)
        return self._info(m)

    async def delete_queue(self, name: str) -> None:
        """Delete the manifest; the compactor collects the queue's objects.

        Refused with QueueInUse (409) while another queue of the namespace names
        this one as its ``dead_queue``: its dead letters would have nowhere to go.
        The user points those queues' ``dead_queue`` elsewhere (or deletes them)
        first; there is no ``force``. The check costs a listing of the namespace's
        manifests and one GET per queue: deletes are rare, and a dead queue that
        vanishes under its users is worse. A ``dead_queue`` set by an update that
        races this delete is not seen here; the dead-letter path copes with a dead
        queue that is gone.
        """
        q = self._q(name)
        await self._manifest(q, 0)
        users = await self._dead_queue_users(name)
        if users:
            named = ", ".join(repr(u) for u in users)
            raise QueueInUse(
                f"queue {name!r} is the dead_queue of {named}: point their dead_queue "
                f"elsewhere or delete them first; nothing was deleted",
                queue=name, used_by=users,
            )
        await self.store.delete(q.manifest.key)
        self._queues.pop(name, None)

    async def _dead_queue_users(self, name: str) -> list[str]:
        """The queues whose ``dead_queue`` is ``name``, read fresh, 32 GETs at a time."""
        others = [other for other in await self.list_queues() if other != name]
        users: list[str] = []
        for start in range(0, len(others), 32):
            chunk = others[start : start + 32]
            found = await asyncio.gather(*(self._read_manifest(o) for o in chunk))
            users += [o for o, m in zip(chunk, found, strict=True)
                      if m is not None and m.config.dead_queue == name]
        return users

    async def _read_manifest(self, name: str) -> Manifest | None:
        """A queue's manifest read fresh from the store, or None if there is none
        (without creating a runtime for the queue in this engine)."""
        try:
            blob = await self.store.get(manifest_key(self.ns, name))
        except ObjectNotFound:
            return None
        return decode_manifest(blob.data)

    async def list_queues(self) -> list[str]:
        prefix = manifests_prefix(self.ns)
        return [info.key[len(prefix) :] async for info in list_all(self.store, prefix)]

    async def _check_dead_queue(self, name: str, config: QueueConfig) -> None:
        """Refuse a ``dead_queue`` that is the queue itself, does not exist, or leads
        back to the queue (a -> b -> a, or longer) by following each queue's
        ``dead_queue`` through the existing manifests: one GET per hop.

        A loop would send an item round between queues for ever, and nothing may
        follow a chain without end. Two updates racing can still close a loop
        (each checked before the other landed), so nothing else relies on this:
        stats looks one level down only. A queue further down the chain whose dead
        queue is gone ends the walk; that is its own setting's problem, not this one's.
        """
        dead = config.dead_queue
        if dead is None:
            return
        if dead == name:
            raise InvalidRequest("dead_queue cannot be the queue itself", field="dead_queue")
        chain = [name]
        hop: str | None = dead
        while hop is not None:
            if hop in chain:
                loop = " -> ".join([*chain, hop])
                raise InvalidRequest(f"dead_queue {dead!r} would make a loop: {loop}",
                                     field="dead_queue", loop=[*chain, hop])
            m = await self._read_manifest(hop)
            if m is None and hop == dead:
                raise InvalidRequest(f"dead_queue {dead!r} does not exist: create it first",
                                     field="dead_queue")
            chain.append(hop)
            hop = m.config.dead_queue if m is not None else None

    @staticmethod
    def _info(m: Manifest) -> QueueInfo:
        return QueueInfo(m.queue, m.config, m.created_ms, len(m.segments), m.produced)

    # -- produce -------------------------------------------------------------
    async def produce(self, queue: str, items: Sequence[NewItem | bytes]) -> list[str]:
        """Publish items; returns their ids once the manifest CAS has landed."""
        batch = self._new_items(items, "items")
        q = self._q(queue)
        await self._manifest(q, 60)  # a missing queue fails before a segment is written
        try:
            ids = await q.publisher.produce(batch)
        except Exception as exc:
            if _missing(exc):
                raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue) from exc
            raise
        q.wake.set()
        return ids

    def _new_items(self, items: Sequence[NewItem | bytes], field_name: str) -> list[NewItem]:
        """The items of a produce, checked against the limits."""
        batch = [i if isinstance(i, NewItem) else NewItem(i) for i in items]
        self._check_batch(len(batch), field_name)
        for n, item in enumerate(batch):
            if len(item.payload) > self.opts.max_item_bytes:
                raise TooLarge(
                    f"{field_name}[{n}] is {len(item.payload)} bytes; the limit is "
                    f"{self.opts.max_item_bytes}",
                    field=f"{field_name}[{n}]",
                )
            if item.enqueue_at_ms is not None and not 0 <= item.enqueue_at_ms <= MAX_TIME_MS:
                raise InvalidRequest(f"{field_name}[{n}].enqueue_at is out of range",
                                     field=f"{field_name}[{n}].enqueue_at")
        return batch

    def _check_batch(self, n: int, field_name: str) -> None:
        if n > self.opts.max_batch:
            raise TooLarge(
                f"{field_name} holds {n} entries; the limit is {self.opts.max_batch}",
                field=field_name, limit=self.opts.max_batch,
            )
        if n < 1:
            raise InvalidRequest(
                f"{field_name} must hold 1 to {self.opts.max_batch} entries; got {n}",
                field=field_name,
            )

    # -- lease ---------------------------------------------------------------
    async def lease(
        self,
        queue: str,
        batch: int = 1,
        *,
        lease_timeout: float | None = None,
        wait: float = 0.0,
    ) -> list[LeasedItem]:
        """Lease up to ``batch`` ready items, waiting up to ``wait`` seconds for some."""
        self._check_batch(batch, "batch_size")
        if lease_timeout is not None and not 0.1 <= lease_timeout <= 43_200:
            raise InvalidRequest("lease_timeout must be 0.1 to 43200 seconds",
                                 field="lease_timeout")
        if not 0 <= wait <= self.opts.max_wait:
            raise InvalidRequest(f"request_timeout must be 0 to {self.opts.max_wait} seconds",
                                 field="request_timeout")
        q = self._q(queue)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + wait
        while True:
            q.wake.clear()
            reads = q.manifest.reads
            items, next_ready = await self._lease_once(q, batch, lease_timeout)
            await self._help_noted(q)
            left = give_up - loop.time()
            if items or self._stopping:
                return items
            if left <= 0:
                if q.manifest.reads != reads:
                    return items
                # An empty answer rests on a fresh manifest: a produce that landed
                # through another node a moment ago is leased now, not 0.2 s later.
                q.manifest.forget()
                continue
            pause = min(left, self.opts.poll_interval)
            if next_ready is not None:
                pause = min(pause, max(0.0, (next_ready - self.clock.now_ms()) / 1000))
            try:
                await asyncio.wait_for(q.wake.wait(), pause)
            except TimeoutError:
                pass

    async def _lease_once(
        self, q: _Queue, n: int, lease_timeout: float | None
    ) -> tuple[list[LeasedItem], int | None]:
        async with q.lock:
            reads = q.manifest.reads
            m = await self._manifest(q, self.opts.manifest_max_age)
            lease_ms = int(lease_timeout * 1000) if lease_timeout else m.config.lease_ms
            out: list[LeasedItem] = []
            next_ready: int | None = None
            metas = {sm.id: sm for sm in m.segments}
            idle = 0
            # Passes until the batch is full. A pass can fall short: items lost to
            # another engine, or out of attempts and dead-lettered instead. Stop
            # after three passes in a row that changed nothing.
            while len(out) < n and idle < 3:
                picks, next_ready = await self._pick(q, m, n - len(out))
                if not picks:
                    break
                groups: dict[str, list[tuple[int, int]]] = {}
                for _, sid, idx, due in picks:
                    groups.setdefault(sid, []).append((idx, due))
                fresh_cfg = q.manifest.reads != reads
                results = await asyncio.gather(*(
                    self._lease_in(q, m.config, metas[s], w, lease_ms, fresh_cfg)
                    for s, w in groups.items()
                ))
                progress = 0
                for items, dead in results:
                    out.extend(items)
                    progress += len(items) + max(dead, 0)
                if any(dead < 0 for _, dead in results):
                    # Out of attempts by a cached config: dead-letter or drop only on
                    # the queue's settings read now (a raised max_attempts or a new
                    # dead queue must count).
                    m = await self._manifest(q, 0)
                    metas = {sm.id: sm for sm in m.segments}
                    progress += 1
                idle = 0 if progress else idle + 1
            return out, next_ready

    async def _pick(
        self, q: _Queue, m: Manifest, n: int
    ) -> tuple[list[tuple[int, str, int, int]], int | None]:
        """Choose up to n ready items, oldest ready time first.

        Returns (sort key, segment, index, fresh ready time) and the earliest
        future ready time seen, for the long poll.
        """
        now = self.clock.now_ms()
        if q.seen_ver != m.ver:  # forget state of segments the manifest dropped
            live = {sm.id for sm in m.segments}
            for sid in [sid for sid in q.leases if sid not in live]:
                q.leases.pop(sid)
                q.summaries.pop(sid, None)
            q.seen_ver = m.ver
        backoff = int(self.opts.contention_backoff * 1000)
        horizon = now + int(2000 * self.opts.max_clock_skew)  # fresh items from clocks ahead
        cands: list[tuple[int, str, int, int]] = []
        next_ready: int | None = None
        budget = [self.opts.lease_state_reads]
        for sm in _scan_order(m):
            if len(cands) >= n:
                cands.sort()
                if cands[n - 1][0] <= sm.first_ready_ms:
                    break  # every item further on becomes ready later than these
            cell = self._lease_cell(q, sm.id)
            try:
                summary = await self._summary(q, sm, cell, now, budget)
            except ObjectNotFound:  # removed by a compactor since this manifest was read
                q.manifest.forget()
                continue
            penalty = backoff if now - cell.conflict_ms < backoff else 0
            for order, idx, due in summary.ready:
                if due > now or order > horizon:
                    soon = max(due, order) if order > horizon else due
                    next_ready = soon if next_ready is None else min(next_ready, soon)
                    if order > horizon:
                        break
                    continue
                cands.append((order + penalty, sm.id, idx, due))
            self._note_stalled(q, sm, summary, now)
        cands.sort()
        return cands[:n], next_ready

    def _note_stalled(self, q: _Queue, sm: SegmentMeta, summary: _Summary, now: int) -> None:
        """Remember half-done items older than the grace, to help after the lock."""
        for since, idx in summary.stalled:
            if now - since > self.opts.dead_grace * 1000 and now >= q.help_after.get(
                    (sm.id, idx), 0):
                q.stalled[(sm.id, idx)] = sm

    async def _summary(self, q: _Queue, sm: SegmentMeta, cell: Cell[LeaseObject],
                       now: int, budget: list[int]) -> _Summary:
        """The segment's summary; ``budget`` bounds the re-reads of lease objects
        that hold leases (the first calls re-read the first segments, which are
        then fresh for a while, so later calls re-read the next ones)."""
        cached = q.summaries.get(sm.id)
        aged = (
            cached is not None
            and cached[1].inflight
            and cell.fetched_ms is not None
            and now - cell.fetched_ms > self.opts.lease_state_max_age * 1000
            and budget[0] > 0
        )
        stale = cell.fetched_ms is None or aged
        if aged:
            budget[0] -= 1
        if stale:
            await cell.refresh()
        if cached is not None and cached[0] is cell.data and not stale:
            return cached[1]
        obj = cell.cached() or LeaseObject(sm.id)
        # Only fresh items need the segment (for their enqueue time).
        seg = await self._segment(q, sm) if len(obj.items) < sm.count else None
        summary = _summarise(sm, seg, obj)
        q.summaries[sm.id] = (cell.data, summary)
        return summary

    async def _lease_in(
        self,
        q: _Queue,
        cfg: QueueConfig,
        sm: SegmentMeta,
        wanted: list[tuple[int, int]],
        lease_ms: int,
        fresh_cfg: bool,
    ) -> tuple[list[LeasedItem], int]:
        """Lease what is still available of ``wanted``; returns the items and how
        many were dead-lettered instead (out of attempts), or -1 when some were
        left alone because only a fresh config may dead-letter them."""
        cell = self._lease_cell(q, sm.id)
        rq = new_request_id()
        held_back = False

        def lease(obj: LeaseObject, now: int) -> object:
            nonlocal held_back
            # A re-apply after an ambiguous write that another writer overwrote
            # finds this request's own leases: they are answered, not stranded.
            mine, mine_dead, rest = tr.recognise(obj, wanted, rq)
            if not fresh_cfg and cfg.max_attempts:
                kept = [w for w in rest if not _exhausted(obj, w[0], cfg.max_attempts)]
                held_back = len(kept) < len(rest)
                rest = kept
            leased, dead = tr.lease(obj, rest, now, lease_ms, cfg.max_attempts, rq)
            result = (mine + leased, mine_dead + dead)
            return result if leased or dead else Unchanged(result)

        leased, dead = await cell.update(lease)
        seg = await self._segment(q, sm)
        for idx in dead:
            q.stalled[(sm.id, idx)] = sm  # moved to the dead-letter queue after the lock
        items = [self._leased_item(q.name, sm, seg, x) for x in leased]
        return items, -1 if held_back and not dead else len(dead)

    def _leased_item(self, queue: str, sm: SegmentMeta, seg: Segment, x: tr.Leased) -> LeasedItem:
        item = seg.items[x.index]
        token = self.signer.sign(Delivery(self.ns, queue, sm.id, x.index, x.v))
        return LeasedItem(
            id=item_id(sm.id, x.index),
            queue=queue,
            token=token,
            attempts=x.attempts,
            lease_deadline_ms=x.deadline_ms,
            payload=item.payload,
            produced_ms=item.born_ms or sm.created_ms,
            enqueue_at_ms=item.enqueue_at_ms,
            meta=item.meta,
        )

    # -- dead letters ----------------------------------------------------------
    async def _help_noted(self, q: _Queue) -> None:
        """Help the half-done items a lease walk noted, outside the queue's lock:
        a dead-letter move produces into another queue and must not hold up
        other lease calls on this one."""
        while q.stalled:
            (_, idx), sm = q.stalled.popitem()
            await self._help_stalled(q, sm, idx)

    async def _help_dead(self, q: _Queue, sm: SegmentMeta, idx: int) -> None:
        """Finish moving a DEAD_PENDING item: produce it to the dead-letter queue
        (idempotently, keyed by its delivery), then mark it DEAD. Where it goes
        (or whether it is dropped: no dead queue) follows the queue's settings
        read now, never a cached copy."""
        cell = self._lease_cell(q, sm.id)
        obj = cell.cached()
        st = obj.items.get(idx) if obj else None
        if st is None or st.s != DEAD_PENDING:
            return
        dead_queue = (await self._manifest(q, 0)).config.dead_queue
        iid = item_id(sm.id, idx)
        if dead_queue:
            try:
                await self._dead_letter(q, sm, idx, st, dead_queue)
            except OkqError as exc:
                log.error("cannot dead-letter %s of %s into %s: %s; trying again later",
                          iid, q.name, dead_queue, exc)
                q.help_after[(sm.id, idx)] = self.clock.now_ms() + HELP_BACKOFF_MS
                return
        v = st.v
        await cell.update(lambda o, now: tr.finish_dead(o, idx, v))
        q.help_after.pop((sm.id, idx), None)

    async def _dead_letter(self, q: _Queue, sm: SegmentMeta, idx: int, st: ItemState,
                           dead_queue: str) -> None:
        seg = await self._segment(q, sm)
        iid = item_id(sm.id, idx)
        meta = {"source_queue": q.name, "source_id": iid, "attempts": st.attempts,
                "error": st.err}
        key = f"dlq:{self.ns}:{q.name}:{iid}:{st.v}"
        await self.produce(dead_queue, [NewItem(seg.items[idx].payload, None, key, meta)])

    async def _help_stalled(self, q: _Queue, sm: SegmentMeta, idx: int) -> None:
        """Finish what a crashed node left half done on an item."""
        obj = self._lease_cell(q, sm.id).cached()
        st = obj.items.get(idx) if obj else None
        if st is not None and st.s == DEAD_PENDING:
            await self._help_dead(q, sm, idx)
        elif st is not None and st.s == OUTPUTS_PENDING and st.out is not None:
            try:
                await self._finish_outputs(q, sm, idx, st.v, st.out)
            except OkqError as exc:
                log.error("outputs of %s of %s: %s", item_id(sm.id, idx), q.name, exc)

    async def _finish_outputs(self, q: _Queue, sm: SegmentMeta, idx: int, v: int,
                              out: list[Any]) -> None:
        """Publish a completion's outputs segment, then mark the item DONE.

        Outputs that can never be published (their queue was deleted, or their
        segment fell behind its GC floor) abandon the completion: the item is
        dead-lettered with the reason, and the error is raised. A transient store
        failure leaves the item P, to be finished by a retry or a helper.
        """
        outq = self._q(out[0])
        try:
            await outq.publisher.publish_written(SegmentMeta(*out[1:]))
        except (QueueNotFound, ObjectNotFound, PublishAborted) as exc:
            reason = f"outputs could not be published to queue {out[0]!r}: {exc.message}"
            # A dead letter on its way back to its source queue waits in the dead
            # queue again; any other item is dead-lettered with the reason.
            meta = (await self._segment(q, sm)).items[idx].meta or {}
            back = meta.get("source_queue") == out[0]
            cell = self._lease_cell(q, sm.id)
            moved = await cell.update(
                lambda o, now: tr.abandon_outputs(o, idx, v, now, reason, back=back))
            if moved and not back:
                await self._help_dead(q, sm, idx)
            if isinstance(exc, PublishAborted):
                raise PublishAborted(f"the completion did not take: {reason}; the item was "
                                     "dead-lettered") from exc
            raise QueueNotFound(f"the completion did not take: {reason}; the item was "
                                "dead-lettered", queue=out[0], field="outputs.queue_name"
                                ) from exc
        outq.wake.set()
        await self._lease_cell(q, sm.id).update(
            lambda o, now: tr.finish_outputs(o, idx, v)
        )

    async def complete_and_produce(
        self, token: str, out_queue: str, items: Sequence[NewItem | bytes], *,
        queue: str | None = None,
    ) -> list[str]:
        """Complete one delivery and produce ``items`` to ``out_queue`` in one step:
        the outputs become visible if and only if the completion commits.

        The outputs are written first as an unpublished segment; the completion
        CAS records it in the item's tombstone (state P); then it is published and
        the item becomes D. A crash after the completion is finished by any node
        or compactor that walks past the P item. Returns the outputs' ids; a
        retried call returns the ids of the first one's outputs.
        """
        d, q = self._delivery(token, queue=queue)
        batch = self._new_items(items, "outputs.items")
        outq = self._q(out_queue, "outputs.queue_name")
        await self._manifest(outq, 60)
        sm = await outq.publisher.write_segment(batch)
        out = [out_queue, sm.id, sm.count, sm.created_ms, sm.size]
        cell = self._lease_cell(q, d.segment)
        recorded: list[Any] | None = await cell.update(
            lambda o, now: tr.complete(o, d.index, d.v, now, out)
        )
        if recorded is None:
            return []  # completed earlier without outputs
        await self._finish_outputs(q, await self._segment_meta(q, d.segment), d.index, d.v,
                                   recorded)
        return [item_id(recorded[1], n) for n in range(recorded[2])]

    async def _gone(self, q: _Queue, segment: str) -> bool:
        """Whether a segment is no longer listed: a token naming it outlived it."""
        try:
            await self._segment_meta(q, segment)
        except (LeaseLost, QueueNotFound):
            return True
        return False

    async def _segment_meta(self, q: _Queue, segment: str) -> SegmentMeta:
        """A listed segment's entry; one whose item is in flight is always listed."""
        for max_age in (self.opts.config_max_age, 0):
            m = await self._manifest(q, max_age)
            sm = next((s for s in m.segments if s.id == segment), None)
            if sm is not None:
                return sm
        raise LeaseLost(f"segment {segment} is no longer in queue {q.name!r} (purged or "
                        "compacted)", state="gone")

    # -- token operations ------------------------------------------------------
    def _delivery(
        self, token: str, field_name: str = "token", queue: str | None = None
    ) -> tuple[Delivery, _Queue]:
        if not isinstance(token, str):
            raise InvalidRequest(f"{field_name} must be a string", field=field_name)
        d = self.signer.verify(token, self.ns, field_name)
        if queue is not None and d.queue != queue:
            raise InvalidToken(
                f"{field_name} belongs to queue {d.queue!r}, not {queue!r}", field=field_name
            )
        return d, self._q(d.queue)

    def pending_produce(self, queue: str) -> int:
        """Items waiting in this engine to be published to ``queue``."""
        q = self._queues.get(queue)
        return q.publisher.pending_items() if q is not None else 0

    def check_tokens(self, tokens: Sequence[str], queue: str, field_pattern: str) -> None:
        """Verify every token before acting on any (``field_pattern`` has ``{n}``)."""
        for n, token in enumerate(tokens):
            self._delivery(token, field_pattern.format(n=n), queue)

    async def renew(
        self, token: str, lease_timeout: float | None = None, *, queue: str | None = None
    ) -> int:
        """Extend a lease from now; returns the new deadline (ms)."""
        d, q = self._delivery(token, queue=queue)
        if lease_timeout is not None and not 0.1 <= lease_timeout <= 43_200:
            raise InvalidRequest("lease_timeout must be 0.1 to 43200 seconds",
                                 field="lease_timeout")
        lease_ms = (
            int(lease_timeout * 1000)
            if lease_timeout
            else (await self._manifest(q, self.opts.config_max_age)).config.lease_ms
        )
        cell = self._lease_cell(q, d.segment)
        deadline: int = await cell.update(
            lambda o, now: tr.renew(o, d.index, d.v, now, lease_ms)
        )
        return deadline

    async def complete(self, tokens: Sequence[str], *, queue: str | None = None) -> None:
        """Complete deliveries. Each token is applied on its own; if any lease was
        lost, LeaseLost is raised after the others landed, naming the failures."""
        self._check_batch(len(tokens), "tokens")
        parsed = [self._delivery(t, f"tokens[{n}]", queue) for n, t in enumerate(tokens)]
        calls = [self._lease_cell(q, d.segment).update(_completion(d)) for d, q in parsed]
        results = await asyncio.gather(*calls, return_exceptions=True)
        failed: list[dict[str, Any]] = []
        for n, ((d, q), r) in enumerate(zip(parsed, results, strict=True)):
            if isinstance(r, LeaseLost):
                reason = r.message
                if r.details.get("state") == "never leased" and await self._gone(q, d.segment):
                    reason = ("the item is no longer in the queue: its segment was compacted "
                              "away (completed or dropped earlier) or purged")
                failed.append({"index": n, "id": item_id(d.segment, d.index), "reason": reason})
            elif isinstance(r, BaseException):
                raise r
        if failed:
            raise LeaseLost(
                f"{len(failed)} of {len(tokens)} completions refused: the lease was lost",
                failed=failed,
            )

    async def retry(
        self,
        token: str,
        *,
        retry_at_ms: int | None = None,
        dead: bool = False,
        error: str | None = None,
        queue: str | None = None,
        field_name: str = "token",
        count_attempt: bool = True,
    ) -> None:
        """Release a delivery: ready again at ``retry_at`` (now by default), at the
        back of the line; or dead-lettered when ``dead`` or out of attempts."""
        d, q = self._delivery(token, field_name, queue)
        if retry_at_ms is not None and not 0 <= retry_at_ms <= MAX_TIME_MS:
            raise InvalidRequest("retry_at is out of range", field="retry_at")
        err = error[:4096] if error else None
        cell = self._lease_cell(q, d.segment)
        rq = new_request_id()
        reads = q.manifest.reads
        cfg = (await self._manifest(q, self.opts.config_max_age)).config
        fresh = q.manifest.reads != reads

        def release(o: LeaseObject, now: int) -> object:
            st = o.items.get(d.index)
            if not fresh and not dead and cfg.max_attempts and st is not None and st.rq != rq:
                attempts = tr.retry_attempts(tr.current(o, d.index, d.v), count_attempt)
                if attempts >= cfg.max_attempts:
                    raise _StaleConfig("out of attempts by a cached config")
            return tr.retry(o, d.index, d.v, now, retry_at_ms, dead, err, cfg.max_attempts,
                            count_attempt, rq)

        try:
            to_dead: bool = await cell.update(release)
        except _StaleConfig:
            # Dropping or dead-lettering the item is decided on settings read now.
            cfg, fresh = (await self._manifest(q, 0)).config, True
            to_dead = await cell.update(release)
        if to_dead:
            await self._help_dead(q, await self._segment_meta(q, d.segment), d.index)
        q.wake.set()

    # -- for the compactor, which shares this engine's cells and caches -----------
    def manifest_cell(self, queue: str) -> Cell[Manifest]:
        return self._q(queue).manifest

    def lease_cell(self, queue: str, segment: str) -> Cell[LeaseObject]:
        return self._lease_cell(self._q(queue), segment)

    async def segment(self, queue: str, sm: SegmentMeta) -> Segment:
        return await self._segment(self._q(queue), sm)

    async def help_stalled(self, queue: str, config: QueueConfig, sm: SegmentMeta,
                           index: int) -> None:
        """Finish an item's half-done step: a dead-letter move (X -> Z) or the
        publication of a completion's outputs (P -> D). ``config`` is not used:
        where an item goes is decided on the queue's settings read now."""
        await self._help_stalled(self._q(queue), sm, index)

    def forget_segments(self, queue: str, segments: Sequence[str]) -> None:
        """Drop cached state of segments no longer in the manifest."""
        q = self._q(queue)
        for sid in segments:
            q.leases.pop(sid, None)
            q.summaries.pop(sid, None)
            if sid in self._segments:
                del self._segments[sid]
                self._segment_bytes -= self._sizes.pop(sid)

    # -- purge, browse, redrive ---------------------------------------------------
    async def purge(self, queue: str) -> None:
        """Drop every item: the manifest stops referencing the queue's segments, so
        nothing in them is leased again (the compactor deletes them). A late
        completion or renewal of an item leased before the purge still lands on its
        lease object and changes nothing visible."""
        q = self._q(queue)
        await self._manifest(q, 0)
        rq = new_request_id()
        o = self.opts
        # Segments young enough that a publisher may still be re-applying their
        # publish (its deadline, plus the clocks' skew both ways, with room).
        young_ms = int((o.publish_timeout + 4 * o.max_clock_skew) * 1000)

        def purge(m: Manifest, now: int) -> Unchanged | None:
            if m.purge_rq == rq:
                return Unchanged()  # our earlier, ambiguous write landed
            keep = {sid: c for sid, c in m.purged.items() if c >= now - young_ms}
            keep.update({sm.id: sm.created_ms for sm in m.segments
                         if sm.created_ms >= now - young_ms})
            m.segments, m.purge_rq, m.purged = [], rq, keep
            return None

        await q.manifest.update(purge)
        q.summaries.clear()

    async def browse(
        self, queue: str, *, start_after: str | None = None, limit: int = 100
    ) -> tuple[list[BrowsedItem], str | None]:
        """Live items in delivery-log order, without leasing them."""
        q = self._q(queue)
        m = await self._manifest(q, 0)
        after = parse_item_id(start_after, "start_after") if start_after else None
        now = self.clock.now_ms()
        out: list[BrowsedItem] = []
        for sm in m.segments:
            if after is not None and sm.id < after[0]:
                continue
            cell = self._lease_cell(q, sm.id)
            await cell.refresh()
            obj = cell.cached() or LeaseObject(sm.id)
            seg = await self._segment(q, sm)
            first = after[1] + 1 if after is not None and sm.id == after[0] else 0
            for idx in range(first, sm.count):
                item = _browsed(sm, seg, obj, idx, now)
                if item is None:
                    continue
                if len(out) == limit:
                    return out, out[-1].id
                out.append(item)
        return out, None

    async def redrive(self, dead_queue: str, limit: int = 1000) -> int:
        """Move dead letters back to the queues they came from, as fresh items;
        returns how many moved.

        Exactly once, however a redrive is interrupted and whenever it is re-run.
        A dead letter goes back the way a completion with outputs does: its copy
        is written to the source queue as an unpublished segment; one CAS on the
        dead letter's lease object completes it and records that segment (``P``);
        then the segment is published and the dead letter becomes ``D``. The copy
        is visible if and only if that completion committed, and a completion is
        fenced by the delivery counter, so two redrives, or a re-run after a
        crash, never both move one dead letter. Killed before the completion: the
        segment is an orphan the compactor collects, and the dead letter is leased
        again once its redrive lease (``REDRIVE_LEASE_S``) ends. Killed after it:
        the ``P`` item names its segment, and the next lease walk of the dead queue
        or compactor pass publishes it (once, however late: ``publish_written``).

        No producer idempotency key is involved, on purpose. A re-run can come any
        time after the redrive lease ends (an hour later, say), long after any key
        has expired, so a key, even a stable one such as ``redrive:{id}``, would
        only stop duplicates for re-runs that happen to come soon enough. The lease
        length only decides how soon a crashed redrive's dead letters can be
        moved again; a redrive slower than its lease loses those completions
        (``LeaseLost``) and moves nothing twice.

        Items of the dead queue that are not dead letters stay, out of the way
        for an hour. Dead letters whose source queue does not exist stay too, and
        the redrive then ends with QueueNotFound saying how many moved.
        """
        dq = self._q(dead_queue)
        moved = 0
        missing: dict[str, int] = {}
        while moved < limit and not missing:
            items = await self.lease(dead_queue, min(limit - moved, self.opts.max_batch),
                                     lease_timeout=REDRIVE_LEASE_S)
            if not items:
                break
            groups, others = self._redrive_groups(items)
            for i in others:  # not a dead letter: leave it where it is
                await self.retry(i.token, retry_at_ms=self.clock.now_ms() + 3_600_000,
                                 count_attempt=False)
            for (segment, source), group in groups.items():
                if await self._queue_exists(source):
                    moved += await self._redrive_group(dq, segment, source, group)
                    continue
                for i, _ in group:  # give them back at once, uncounted
                    await self.retry(i.token, count_attempt=False)
                missing[source] = missing.get(source, 0) + len(group)
            if others:
                break
        if missing:
            raise _sources_missing(dead_queue, moved, missing)
        return moved

    def _redrive_groups(
        self, items: list[LeasedItem]
    ) -> tuple[dict[tuple[str, str], list[tuple[LeasedItem, Delivery]]], list[LeasedItem]]:
        """Leased dead letters grouped by (their segment, their source queue), and
        the items that are not dead letters."""
        groups: dict[tuple[str, str], list[tuple[LeasedItem, Delivery]]] = {}
        others: list[LeasedItem] = []
        for i in items:
            source = _source_queue(i)
            if source is None:
                others.append(i)
                continue
            d, _ = self._delivery(i.token)
            groups.setdefault((d.segment, source), []).append((i, d))
        return groups, others

    async def _queue_exists(self, name: str) -> bool:
        """Whether the queue exists now (a fresh manifest read)."""
        try:
            await self._manifest(self._q(name), 0)
        except QueueNotFound:
            return False
        return True

    async def _redrive_group(self, dq: _Queue, segment: str, source: str,
                             group: list[tuple[LeasedItem, Delivery]]) -> int:
        """Move dead letters of one segment back to ``source`` with one completion
        CAS; returns how many moved. Those whose redrive lease was lost meanwhile
        (another redrive leased them after it ran out) are left to that one."""
        outq = self._q(source)
        cell = self._lease_cell(dq, segment)
        while group:
            sm = await outq.publisher.write_segment([
                NewItem(i.payload, None, None, {"redriven_from": dq.name, "dead_id": i.id})
                for i, _ in group
            ])
            out = [source, sm.id, sm.count, sm.created_ms, sm.size]
            try:
                recorded = await cell.update(_redrive_change([d for _, d in group], out))
            except LeaseLost as exc:
                lost = set(exc.details.get("lost", ()))
                if not lost:
                    raise
                group = [(i, d) for i, d in group if i.id not in lost]
                continue  # the segment just written is an orphan: never published
            dsm = await self._segment_meta(dq, segment)
            await asyncio.gather(*(self._finish_outputs(dq, dsm, d.index, d.v, recorded)
                                   for _, d in group))
            return _finished(cell.cached(), [d for _, d in group])
        return 0

    # -- stats -----------------------------------------------------------------
    async def stats(self, queue: str) -> QueueStats:
        """Counts by state, read fresh from the store (one GET per segment), and
        the live items in the queue's dead queue.

        The dead queue is counted one level down only, never its own dead queue:
        a chain of dead queues costs one more queue, and a loop that two racing
        updates closed cannot make this recurse."""
        q = self._q(queue)
        m = await self._manifest(q, 0)
        s = await self._count(q, m)
        dead = m.config.dead_queue
        if dead == queue:
            s.dead = _live(s)
        elif dead:
            s.dead = await self._live_in(dead)
        return s

    async def _live_in(self, queue: str) -> int:
        """Live items (available, in flight, scheduled, waiting) of a queue; 0 if
        it does not exist. Does not look at that queue's own dead queue."""
        q = self._q(queue, "dead_queue")
        try:
            m = await self._manifest(q, 0)
        except QueueNotFound:
            return 0
        return _live(await self._count(q, m))

    async def _count(self, q: _Queue, m: Manifest) -> QueueStats:
        """A queue's items counted by state (``dead`` left at 0)."""
        now = self.clock.now_ms()
        s = QueueStats(q.name, segments=len(m.segments))
        oldest: int | None = None
        for sm in m.segments:
            cell = self._lease_cell(q, sm.id)
            await cell.refresh()
            obj = cell.cached() or LeaseObject(sm.id)
            seg = await self._segment(q, sm)
            for idx in range(sm.count):
                st = obj.items.get(idx)
                state, _ = _classify(st, fresh_ready_ms(sm, seg.items[idx]), now,
                                     fresh_due_ms(sm, seg.items[idx]))
                if state == "completed" and _redriven(st, seg.items[idx]):
                    state = "redriven"
                setattr(s, state, getattr(s, state) + 1)
                if state == "available":
                    born = seg.items[idx].born_ms or sm.created_ms
                    oldest = born if oldest is None else min(oldest, born)
        s.oldest_age_s = 0.0 if oldest is None else max(0, now - oldest) / 1000
        return s


#: How long a redrive holds the dead letters it moves (seconds): long enough for
#: one batch (a segment write and two CASes per segment of dead letters), short
#: so that the dead letters of a crashed redrive can soon be redriven again.
REDRIVE_LEASE_S = 60.0


def _source_queue(item: LeasedItem) -> str | None:
    """The queue a dead letter came from, or None if the item is not a dead letter."""
    source = item.meta.get("source_queue") if item.meta else None
    if not isinstance(source, str):
        return None
    try:
        return check_name(source, "source_queue")
    except InvalidRequest:
        return None


def _redrive_change(ds: list[Delivery], out: list[Any]) -> Callable[[LeaseObject, int], object]:
    """One lease-object change for a group of dead letters: every L(v) -> P(out),
    or none (their copies share one segment, so a dead letter whose lease was
    lost must not go back with the others: its new holder may move it too).

    Re-applied after its own ambiguous write landed, it finds them all completed
    by these deliveries and answers the segment recorded then."""

    def change(obj: LeaseObject, now: int) -> object:
        states = [obj.items.get(d.index) for d in ds]
        done = [st for d, st in zip(ds, states, strict=True)
                if st is not None and st.v == d.v and st.s in (DONE, OUTPUTS_PENDING)]
        if len(done) == len(ds):
            return Unchanged(done[0].out)
        lost = [item_id(d.segment, d.index) for d, st in zip(ds, states, strict=True)
                if st is None or st.s != LEASED or st.v != d.v]
        if lost:
            raise LeaseLost(f"{len(lost)} dead letters were leased again since this "
                            "redrive's lease ran out", lost=lost)
        for d in ds:
            tr.complete(obj, d.index, d.v, now, out)
        return out

    return change


def _finished(obj: LeaseObject | None, ds: list[Delivery]) -> int:
    """How many of these deliveries are completed (D), outputs published."""
    if obj is None:
        return 0
    return sum(1 for d in ds if (st := obj.items.get(d.index)) is not None
               and st.s == DONE and st.v == d.v)


def _sources_missing(dead_queue: str, moved: int, missing: dict[str, int]) -> QueueNotFound:
    kept = sum(missing.values())
    names = ", ".join(repr(n) for n in sorted(missing))
    return QueueNotFound(
        f"moved {moved} dead letter(s) back; {kept} stay in {dead_queue!r} because the "
        f"queue they came from does not exist: {names}",
        queue=sorted(missing)[0], missing=sorted(missing), moved=moved,
    )


def _redriven(st: ItemState | None, item: SegmentItem) -> bool:
    """Whether a completed item is a dead letter that went back to the queue it
    came from (a redrive): neither work done nor a dead letter any more."""
    source = item.meta.get("source_queue") if item.meta else None
    return st is not None and st.out is not None and source is not None and st.out[0] == source


def _live(s: QueueStats) -> int:
    return s.available + s.in_flight + s.scheduled + s.waiting_retry


def _classify(st: ItemState | None, fresh_ready: int, now: int,
              fresh_due: int = 0) -> tuple[str, int | None]:
    """An item's state as stats counts it (a QueueStats field), and its ready time.
    A fresh item is available once due (``fresh_due``, 0 when not scheduled),
    whatever its producer's clock said of its ready time."""
    ready = tr.ready_at(st, fresh_ready)
    if st is not None and st.s == LEASED and st.t > now:
        return "in_flight", st.t
    if ready is not None:
        if ready <= now or (st is None and fresh_due <= now):
            return "available", ready
        return ("scheduled" if st is None else "waiting_retry"), ready
    if st is not None and st.s in (DONE, OUTPUTS_PENDING):
        return "completed", None
    return "dead_lettered", None


#: What browsing calls the live states; the others are gone from the user's view.
_BROWSE_STATES = {"in_flight": "leased", "available": "available",
                  "scheduled": "scheduled", "waiting_retry": "waiting"}


def _browsed(
    sm: SegmentMeta, seg: Segment, obj: LeaseObject, idx: int, now: int
) -> BrowsedItem | None:
    st = obj.items.get(idx)
    item = seg.items[idx]
    state, when = _classify(st, fresh_ready_ms(sm, item), now, fresh_due_ms(sm, item))
    if state not in _BROWSE_STATES:
        return None  # completed or dead-lettered: gone
    return BrowsedItem(
        item_id(sm.id, idx),
        _BROWSE_STATES[state],
        st.attempts if st else 0,
        item.born_ms or sm.created_ms,
        when,
        item.payload,
        item.meta,
        st.err if st else None,
    )


_SCAN_ORDER: dict[tuple[str, int, str], list[SegmentMeta]] = {}


def _scan_order(m: Manifest) -> list[SegmentMeta]:
    """Segments by the earliest ready time of their items (publish order, unless
    a compactor merge carried older items into a newer segment)."""
    key = (m.queue, m.ver, m.nonce)
    order = _SCAN_ORDER.get(key)
    if order is None:
        if len(_SCAN_ORDER) > 256:
            _SCAN_ORDER.clear()
        order = _SCAN_ORDER[key] = sorted(m.segments, key=lambda sm: sm.first_ready_ms)
    return order


def _completion(d: Delivery) -> Callable[[LeaseObject, int], object]:
    return lambda obj, now: tr.complete(obj, d.index, d.v)


def _summarise(sm: SegmentMeta, seg: Segment | None, obj: LeaseObject) -> _Summary:
    ready: list[tuple[int, int, int]] = []
    stalled: list[tuple[int, int]] = []
    inflight = False
    if obj.sealed:  # a compactor is merging it: nothing in it is leasable
        return _Summary(ready, inflight, stalled)
    for idx in range(sm.count):
        st = obj.items.get(idx)
        if st is not None and st.s in (LEASED, DEAD_PENDING, OUTPUTS_PENDING):
            inflight = True
            if st.s != LEASED:
                stalled.append((st.t, idx))
        if st is None and seg is not None:
            item = seg.items[idx]
            ready.append((fresh_ready_ms(sm, item), idx, fresh_due_ms(sm, item)))
            continue
        r = tr.ready_at(st, 0)
        if r is not None:
            ready.append((r, idx, r))
    ready.sort()
    return _Summary(ready, inflight, stalled)


class _StaleConfig(OkqError):
    """A change that would drop or dead-letter an item by a cached config: the
    caller reads the config afresh and applies the change again."""


def _exhausted(obj: LeaseObject, index: int, max_attempts: int) -> bool:
    st = obj.items.get(index)
    return st is not None and st.attempts >= max_attempts


def _missing(exc: BaseException) -> bool:
    return isinstance(exc, ObjectNotFound)


def _invalid(exc: ValidationError) -> InvalidRequest:
    first = exc.errors()[0]
    name = ".".join(str(p) for p in first["loc"]) or "config"
    return InvalidRequest(f"{name}: {first['msg']}", field=name)


def _merged(config: QueueConfig, changes: dict[str, Any]) -> QueueConfig:
    """``config`` with ``changes`` applied and validated (an InvalidRequest names the field)."""
    try:
        return QueueConfig.model_validate({**config.model_dump(), **changes})
    except ValidationError as exc:
        raise _invalid(exc) from None


def generate_key() -> bytes:
    """A fresh random signing key."""
    return secrets.token_bytes(32)
