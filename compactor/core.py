"""The compactor: folds tombstones, merges narrow segments, enforces retention
and collects garbage, using the same engine code as the nodes.

One pass over a queue, in this order (see docs/DESIGN.md, "Compaction"):

1. **Walk**: read the manifest and every lease object fresh, and finish what
   nodes left half done (dead-letter moves, completions' outputs).
2. **Retention**: live items older than the queue's retention are dropped
   (state Z) or, when the queue says so, dead-lettered (X, then moved).
3. **Seal** the segments to merge: a lease-object CAS that succeeds only when
   none of its items is leased or being dead-lettered; from then on nothing in
   it can change, and no engine leases from it.
4. **Write** one merged segment per group of sealed segments (create-only),
   carrying every live item with its ready time, attempts and last error, and
   its lease object when some items were retried.
5. **Commit**: one manifest CAS drops finished segments (folding their
   tombstones), replaces each sealed group by its merged segment, and raises
   the GC floor.
6. **Collect**: delete objects no manifest references, only when they are older
   than the safety age (and below the floor); a lease object only after its
   segment object is gone and the lease grace has passed.

A crash anywhere leaves work to do, never damage: a sealed segment stays in the
manifest, unleasable, until any later pass merges it; an unpublished merged
segment is an orphan for step 6. Two compactors at once are fenced by the same
CASes: a segment sealed by one is merged by whichever commits first, and the
other's commit finds its sources gone and drops its group.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field

from okq import leases as tr
from okq.admin import Admin
from okq.clock import Clock, SystemClock
from okq.engine import Engine
from okq.errors import ObjectNotFound
from okq.finishers import Finishers
from okq.keys import (
    chunks_prefix,
    lease_key,
    leases_prefix,
    manifests_prefix,
    new_segment_id,
    segment_created_ms,
    segment_key,
    segments_prefix,
)
from okq.leases import HALF_DONE, IN_FLIGHT, WAITING, ItemState, LeaseObject, encode_lease
from okq.manifest_ops import CompactionCommit
from okq.model import (
    QueueConfig,
    Segment,
    SegmentItem,
    SegmentMeta,
    encode_segment,
    fresh_due_ms,
    fresh_ready_ms,
    groups_of,
    new_nonce,
)
from okq.runtime import Runtime
from okq.store import Store, list_all

log = logging.getLogger("okq.compactor")


@dataclass
class CompactorOptions:
    safety_age: float = 3600.0  # seconds; must exceed any writer's publish deadline
    # Seconds a removed segment's lease object outlives the segment object: longer
    # than any engine operation that may still work from an older manifest.
    lease_grace: float = 60.0
    merge_below: int = 500  # segments with fewer live items are merge candidates
    # Most items in one merged segment: as many as a produce may put in one
    # (EngineOptions.max_segment_items), since a lease's work grows with its segment.
    merge_target: int = 1_000
    merge_target_bytes: int = 16 << 20
    # Seconds a segment must have existed before a pass folds, merges or seals
    # it. None: the engine's publish timeout plus twice its clock-skew bound, so
    # that a publisher re-applying an ambiguous publish within its deadline
    # always finds its segment listed (docs/DESIGN.md, "Ambiguous writes").
    # Lower it only in tests that do not exercise ambiguous publishes.
    min_age: float | None = None
    # Passes between garbage sweeps (the LISTs of each queue's segments and lease
    # objects, and of deleted queues' objects). Garbage waits ``safety_age``
    # anyway; listings are billed like PUTs, so an idle queue is cheaper when
    # they are not repeated every pass.
    gc_every: int = 1

    def __post_init__(self) -> None:
        """Refuse ages no pass can honour: negative, NaN or infinite seconds (an
        infinite age never collects; a negative one would date objects in the
        future). Zero is allowed, for passes on a manual clock (``okq-compactor``
        refuses a safety age below the nodes' publish deadline); whatever the
        options, ``_commit`` never sets the GC floor above the compactor's now."""
        for name in ("safety_age", "lease_grace", "min_age"):
            value = getattr(self, name)
            # NaN fails every comparison, so this also refuses it.
            if value is not None and not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, "
                                 f"not {value!r}")
        if not (isinstance(self.gc_every, int) and self.gc_every >= 1):
            raise ValueError(f"gc_every must be a whole number of passes >= 1, "
                             f"not {self.gc_every!r}")


@dataclass
class Report:
    queues: int = 0
    segments_folded: int = 0
    segments_merged: int = 0
    merged_into: int = 0
    items_moved: int = 0
    items_expired: int = 0
    items_expired_to_dead: int = 0
    objects_deleted: int = 0
    bytes_reclaimed: int = 0
    seconds: float = 0.0
    lag: dict[str, float] = field(default_factory=dict)  # queue -> seconds since last pass

    def add(self, other: Report) -> None:
        for name in ("queues", "segments_folded", "segments_merged", "merged_into",
                     "items_moved", "items_expired", "items_expired_to_dead",
                     "objects_deleted", "bytes_reclaimed"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.lag.update(other.lag)


@dataclass
class _Seg:
    meta: SegmentMeta
    obj: LeaseObject
    seg: Segment | None = None

    def states(self) -> Iterable[tuple[int, ItemState | None]]:
        return ((i, self.obj.items.get(i)) for i in range(self.meta.count))

    def live(self) -> int:
        return sum(1 for _, st in self.states() if not tr.is_finished(st))

    def finished(self) -> bool:
        return all(tr.is_finished(st) for _, st in self.states())

    def busy(self) -> bool:
        return any(st is not None and st.s in IN_FLIGHT for _, st in self.states())

    def stalled(self) -> list[int]:
        return [i for i, st in self.states() if st is not None and st.s in HALF_DONE]


class Compactor:
    def __init__(self, runtime: Runtime | Engine, *, clock: Clock | None = None,
                 options: CompactorOptions | None = None) -> None:
        """``runtime``: the queues' runtime to work through (an engine's will do: a
        compactor and a node in one process then share cells and caches)."""
        self.rt = runtime.runtime if isinstance(runtime, Engine) else runtime
        self.finishers = Finishers(self.rt)
        self.admin = Admin(self.rt)
        self.store: Store = self.rt.store
        self.ns = self.rt.ns
        self.clock = clock or self.rt.clock or SystemClock()
        self.opts = options or CompactorOptions()
        self._last_pass: dict[str, float] = {}
        self.passes = 0
        # Queues whose manifest listed no segment after a pass, by that manifest's
        # ETag: until it changes (a produce) a pass has nothing to do there and
        # skips even the GET, except on sweeping passes (the GC floor moves then).
        self._quiet: dict[str, str] = {}
        self.sweeping = True  # whether this pass lists and deletes garbage

    # -- a whole namespace ---------------------------------------------------------
    async def run_once(self) -> Report:
        report = Report()
        began = time.monotonic()
        self.sweeping = self.passes % self.opts.gc_every == 0
        self.passes += 1
        prefix = manifests_prefix(self.ns)
        async for info in list_all(self.store, prefix):
            queue = info.key[len(prefix):]
            if not self.sweeping and self._quiet.get(queue) == info.etag:
                continue  # empty and unchanged since a pass: nothing to fold or expire
            try:
                report.add(await self.compact_queue(queue))  # .seconds is set below
            except ObjectNotFound:
                continue  # deleted meanwhile
        if self.sweeping:
            report.add(await self.collect_deleted_queues())
        report.seconds = time.monotonic() - began
        return report

    # -- one queue -------------------------------------------------------------------
    async def compact_queue(self, queue: str) -> Report:
        report = Report(queues=1)
        now_wall = began = time.monotonic()
        if queue in self._last_pass:
            report.lag[queue] = now_wall - self._last_pass[queue]
        cell = self.rt.manifest_cell(queue)
        m = await cell.read(0)
        if m is None:
            return report
        segs = [await self._walk(queue, sm) for sm in m.segments]
        await self._help(queue, m.config, segs)
        await self._retention(queue, m.config, segs, report)
        # Young segments are left alone: see CompactorOptions.min_age.
        settled = [s for s in segs if s.obj.sealed or not self._young(s.meta)]
        ordered = m.config.fifo
        groups = await self._seal_groups(queue, settled, segs if ordered else None)
        merged = [await self._write_merged(queue, g, ordered) for g in groups]
        finished = {s.meta.id for s in settled if s.finished()}
        replaced = await self._commit(queue, finished, merged)
        report.segments_folded += len(finished)
        for (new, sources, moved) in merged:
            if new.id in replaced:
                report.segments_merged += len(sources)
                report.merged_into += 1
                report.items_moved += moved
        self.rt.forget_segments(queue, [*finished, *(s for _, g, _ in merged for s in g)])
        if self.sweeping:
            await self._collect(queue, report)
        after = self.rt.manifest_cell(queue)
        left = after.view()
        if left is not None and not left.segments and after.etag is not None:
            self._quiet[queue] = after.etag
        else:
            self._quiet.pop(queue, None)
        self._last_pass[queue] = now_wall
        report.seconds = time.monotonic() - began
        return report

    def _young(self, sm: SegmentMeta) -> bool:
        min_age = self.opts.min_age
        if min_age is None:
            o = self.rt.opts
            min_age = o.publish_timeout + 2 * o.max_clock_skew
        return self.clock.now_ms() - sm.created_ms < min_age * 1000

    async def _walk(self, queue: str, sm: SegmentMeta) -> _Seg:
        cell = self.rt.lease_cell(queue, sm.id)
        await cell.refresh()
        return _Seg(sm, cell.cached() or LeaseObject(sm.id))

    async def _segment(self, queue: str, s: _Seg) -> Segment:
        if s.seg is None:
            s.seg = await self.rt.segment(queue, s.meta)
        return s.seg

    async def _help(self, queue: str, cfg: QueueConfig, segs: list[_Seg]) -> None:
        """Finish dead-letter moves and output publications that a node left half
        done (a node helps too, but only on segments it walks)."""
        for s in segs:
            stalled = s.stalled()
            for i in stalled:
                await self.finishers.help_stalled(self.rt.queue(queue), s.meta, i, cfg)
            if stalled:
                s.obj = self.rt.lease_cell(queue, s.meta.id).cached() or s.obj

    # -- retention -------------------------------------------------------------------
    async def _retention(self, queue: str, cfg: QueueConfig, segs: list[_Seg],
                         report: Report) -> None:
        now = self.clock.now_ms()
        cutoff = now - int(cfg.retention * 1000)
        to_dead = cfg.retention_dead_letter and cfg.dead_queue is not None
        for s in segs:
            # A merged segment carries items older than itself: look at each.
            oldest = s.meta.created_ms if s.meta.min_ready_ms is None else 0
            if oldest >= cutoff or s.finished() or s.obj.sealed:
                continue
            seg = await self._segment(queue, s)
            old = [i for i, st in s.states() if tr.is_idle(st, now)
                   and (seg.items[i].born_ms or s.meta.created_ms) < cutoff]
            if not old:
                continue
            cell = self.rt.lease_cell(queue, s.meta.id)
            expired: list[int] = await cell.update(_expire(old, to_dead))
            s.obj = cell.cached() or s.obj
            report.items_expired += len(expired)
            if to_dead:
                for i in expired:
                    await self.finishers.help_stalled(self.rt.queue(queue), s.meta, i, cfg)
                report.items_expired_to_dead += len(expired)
                s.obj = cell.cached() or s.obj

    # -- merging ---------------------------------------------------------------------
    def _candidates(self, segs: list[_Seg], ordered: list[_Seg] | None = None
                    ) -> list[list[_Seg]]:
        """Groups to merge: every sealed segment (a crashed pass's leftovers) and
        runs of narrow idle segments, in scan order, up to the target size.

        ``ordered`` (an ordered queue: every segment of its manifest): a group is a
        run of segments next to each other in sequence order among those with live
        items, so that its merged segment takes their place in the order and no item
        of another segment comes between its items (docs/DESIGN.md, "Ordered
        delivery")."""
        def mergeable(s: _Seg) -> bool:
            return not s.finished() and (s.obj.sealed or (
                not s.busy() and s.live() < self.opts.merge_below))

        groups: list[list[_Seg]] = []
        current: list[_Seg] = []
        items = size = 0
        if ordered is None:
            by_ready = sorted(segs, key=lambda s: s.meta.first_ready_ms)
            line: list[_Seg | None] = list(by_ready)
        else:  # a segment that is not a candidate breaks the run (None)
            settled = {s.meta.id for s in segs}
            line = [s if s.meta.id in settled and mergeable(s) else None
                    for s in sorted(ordered, key=lambda s: s.meta.place) if not s.finished()]
        for s in line:
            if s is None or not mergeable(s):
                if s is None and current:
                    groups.append(current)
                    current, items, size = [], 0, 0
                continue
            live = s.live()
            if current and (items + live > self.opts.merge_target
                            or size + s.meta.size > self.opts.merge_target_bytes):
                groups.append(current)
                current, items, size = [], 0, 0
            current.append(s)
            items += live
            size += s.meta.size
        if current:
            groups.append(current)
        # A lone segment is worth rewriting only if it is sealed or mostly tombstones.
        return [g for g in groups if len(g) > 1 or g[0].obj.sealed
                or g[0].live() * 2 < g[0].meta.count]

    async def _seal_groups(self, queue: str, segs: list[_Seg],
                           ordered: list[_Seg] | None = None) -> list[list[_Seg]]:
        sealed_groups = []
        for group in self._candidates(segs, ordered):
            sealed = [s for s in group if await self._seal(queue, s)]
            if ordered is not None and len(sealed) < len(group):
                # A segment that could not be sealed (leased meanwhile) splits the
                # run: merge only the sealed ones next to each other.
                sealed_groups.extend(_runs(group, sealed))
            elif sealed:
                sealed_groups.append(sealed)
        return sealed_groups

    async def _seal(self, queue: str, s: _Seg) -> bool:
        if s.obj.sealed:
            return True

        cell = self.rt.lease_cell(queue, s.meta.id)
        try:
            await cell.update(lambda obj, now: tr.seal(obj))
        except tr.SealRefused:
            return False
        s.obj = cell.cached() or s.obj
        return s.obj.sealed

    async def _write_merged(
        self, queue: str, group: list[_Seg], ordered: bool = False
    ) -> tuple[SegmentMeta, list[str], int]:
        """Write the merged segment (and its lease object); unpublished until the commit.
        Its items go by ready time, or, for an ordered queue, by sequence number, which
        each item carries with it."""
        now = self.clock.now_ms()
        moved: list[tuple[int, SegmentItem, ItemState | None]] = []
        readies: list[int] = []
        for s in group:
            seg = await self._segment(queue, s)
            for i, st in s.states():
                if st is not None and st.s != WAITING:
                    continue  # finished: its tombstone is folded away here
                item = seg.items[i]
                born = item.born_ms or s.meta.created_ms
                seq = s.meta.item_seq(i, item) if ordered else None
                carried = SegmentItem(item.payload, item.enqueue_at_ms, item.meta, born, seq)
                ready = st.t if st is not None else fresh_ready_ms(s.meta, carried)
                moved.append((ready if seq is None else seq, carried, st))
                readies.append(ready)
        moved.sort(key=lambda m: m[0])
        sid = new_segment_id(now)
        segment = Segment(sid, queue, now, now, [item for _, item, _ in moved])
        data = encode_segment(segment)
        await self.store.put(segment_key(self.ns, queue, sid), data, if_none_match=True)
        waiting = {n: tr.carried(st) for n, (_, _, st) in enumerate(moved) if st is not None}
        if waiting:
            obj = LeaseObject(sid, waiting, ver=1, nonce=new_nonce())
            await self.store.put(lease_key(self.ns, queue, sid), encode_lease(obj),
                                 if_none_match=True)
        min_ready = min(readies, default=now)
        meta = SegmentMeta(sid, len(moved), now, len(data), min(min_ready, now),
                           seq=moved[0][1].seq if moved else None,
                           groups=groups_of(item.meta for _, item, _ in moved))
        meta.last_due_ms = max((fresh_due_ms(meta, item) for _, item, st in moved if st is None),
                               default=0)
        return meta, [s.meta.id for s in group], len(moved)

    async def _commit(
        self, queue: str, finished: set[str], merged: list[tuple[SegmentMeta, list[str], int]]
    ) -> set[str]:
        """One manifest CAS: fold finished segments, swap in merged ones, raise the
        GC floor. Returns the ids of the merged segments it published."""
        # Never above now - publish_timeout, whatever the options say: a floor in the
        # future aborts every produce until the clock catches up (it never goes down).
        # max() keeps its first argument when the second is NaN.
        age = self.opts.safety_age
        if not (math.isfinite(age) and age >= 0):  # options changed after validation
            age = self.rt.opts.publish_timeout
        floor = self.clock.now_ms() - int(age * 1000)  # never above this clock's now

        commit = CompactionCommit(frozenset(finished),
                                  tuple((new, tuple(src)) for new, src, _ in merged), floor)

        if not finished and not merged:
            floor_only = self.rt.manifest_cell(queue).cached()
            if floor_only is not None and floor_only.gc_floor_ms >= floor - 60_000:
                return set()  # nothing to change; the floor is recent enough
        published: set[str] = await self.rt.manifest_cell(queue).update(commit.apply)
        return published

    # -- garbage collection ----------------------------------------------------------------
    async def _collect(self, queue: str, report: Report) -> None:
        m = self.rt.manifest_cell(queue).cached()
        if m is None:
            return
        live = {sm.id for sm in m.segments}

        def orphan(sid: str) -> bool:
            return sid not in live and _id_ms(sid) < m.gc_floor_ms

        await self._delete_old(segments_prefix(self.ns, queue), orphan, report)
        await self._delete_leases(queue, orphan, report)
        # A chunk its manifest no longer references (a compaction rewrote it, or the
        # head that would have referenced it lost its race). A node still reading
        # an older head that references it finds it gone and reads the head again.
        chunks = {c.id for c in m.chunks}
        await self._delete_old(chunks_prefix(self.ns, queue),
                               lambda cid: cid not in chunks and _id_ms(cid) < m.gc_floor_ms,
                               report)

    async def _delete_leases(self, queue: str, orphan: Callable[[str], bool],
                             report: Report) -> None:
        """A lease object goes only after its segment object is gone and it has aged
        ``lease_grace``: an engine working from a manifest read just before the
        segment was dropped must still find it (sealed, or all finished) rather
        than nothing, which would read as 'never leased'."""
        segments = {info.key.rsplit("/", 1)[-1]
                    async for info in list_all(self.store, segments_prefix(self.ns, queue))}
        grace = max(self.opts.safety_age, self.opts.lease_grace)
        await self._delete_old(leases_prefix(self.ns, queue),
                               lambda sid: orphan(sid) and sid not in segments, report,
                               min_age=grace)

    async def collect_deleted_queues(self) -> Report:
        """Objects of queues whose manifest is gone, once older than the safety age."""
        report = Report()
        queues = set(await self.admin.list_queues())
        grace = max(self.opts.safety_age, self.opts.lease_grace)
        for prefix, min_age in ((segments_prefix, self.opts.safety_age), (leases_prefix, grace),
                                (chunks_prefix, self.opts.safety_age)):
            async for name in children(self.store, prefix(self.ns)):
                if name not in queues:
                    await self._delete_old(prefix(self.ns, name), lambda sid: True,
                                           report, min_age=min_age)
        return report

    async def _delete_old(self, prefix: str, eligible: Callable[[str], bool],
                          report: Report, min_age: float | None = None) -> None:
        """Delete what ``eligible`` selects under ``prefix`` once it is older than
        ``min_age`` (default: the safety age) by the store's LastModified."""
        cutoff = time.time() - (self.opts.safety_age if min_age is None else min_age)
        async for info in list_all(self.store, prefix):
            sid = info.key.rsplit("/", 1)[-1]
            if info.last_modified > cutoff or not eligible(sid):
                continue
            await self.store.delete(info.key)
            report.objects_deleted += 1
            report.bytes_reclaimed += info.size


def _runs(group: list[_Seg], sealed: list[_Seg]) -> list[list[_Seg]]:
    """The runs of ``group`` (in order) that are wholly in ``sealed``."""
    ids = {s.meta.id for s in sealed}
    runs: list[list[_Seg]] = [[]]
    for s in group:
        if s.meta.id in ids:
            runs[-1].append(s)
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def _expire(indexes: list[int], to_dead: bool) -> Callable[[LeaseObject, int], object]:
    return lambda obj, now: tr.expire(obj, indexes, now, to_dead)


def _id_ms(segment_id: str) -> int:
    try:
        return segment_created_ms(segment_id)
    except ValueError:
        return 0


async def children(store: Store, prefix: str) -> AsyncIterator[str]:
    """Distinct next path components under ``prefix``, one LIST per child (skip scan).

    Stores that list in directory order rather than byte order (SeaweedFS) may
    make the scan stop early; it never repeats a name.
    """
    start: str | None = None
    seen: set[str] = set()
    while True:
        page = await store.list(prefix, start_after=start, limit=1)
        if not page.items:
            return
        name = page.items[0].key[len(prefix):].split("/", 1)[0]
        if name in seen:
            return
        seen.add(name)
        yield name
        start = f"{prefix}{name}/\U0010ffff"
