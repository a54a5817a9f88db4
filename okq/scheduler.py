"""The lease scheduler: the walk over a queue's segments that picks what a lease
takes, the cell changes that lease it, and the long poll.

docs/DESIGN.md, "Lease", says what the walk does and why; the item transitions
it applies, and what a lease object says about its segment, are in okq/leases.py.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from okq import leases as tr
from okq.cell import Cell
from okq.changes import Unchanged
from okq.errors import (
    ObjectNotFound,
)
from okq.leases import IN_FLIGHT, LEASED, ItemState, LeasedItem, LeaseObject, exhausted
from okq.limits import check_lease_timeout, check_wait
from okq.model import (
    Manifest,
    QueueConfig,
    Segment,
    SegmentMeta,
    fresh_due_ms,
    group_of,
    new_request_id,
)
from okq.tokens import TokenSigner

if TYPE_CHECKING:
    from okq.finishers import Finishers
    from okq.runtime import QueueRuntime, RecentGroups, Runtime


#: How deep a fair lease walk that has found candidates looks further for the
#: groups of a queue, in segments by ready time: beyond, a group waits until the
#: ones before it are leased.
FAIR_SCAN = 4096
#: And after how many segments that gave candidates it stops (segments with
#: nothing ready, and those whose groups all have their candidates, passed over
#: by their entries in the manifest, do not count).
FAIR_READS = 256
#: How long a fair walk to the end of a manifest's segments is trusted to have
#: found every group with ready items (ms): another engine's retry, or a lease
#: running out, may make one ready meanwhile, as for lease_state_max_age.
FAIR_EMPTY_MS = 1000
#: The segments a fair lease takes its items from, at most (one lease-object write
#: each, as a plain lease of items from one or two segments costs).
FAIR_SEGMENTS = 2


#: A standard walk's pick: (order, segment id, index, due, segment).
Candidate = tuple[int, str, int, int, SegmentMeta]


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
    # (order_ms, index, due_ms) of every item of the segment as if never leased:
    # fixed by the segment's bytes, so derived once and kept for the next version.
    fresh: list[tuple[int, int, int]] | None = None
    # (group, due_ms) of each item (an ordered queue's walk): fixed by the bytes too,
    # and the groups among them (None: some item has no group).
    layout: list[tuple[str | None, int]] | None = None
    groups: frozenset[str | None] | None = None
    # A fair walk's view of this version (derived from ``ready`` and the layout):
    # the ready entries by group ("" for items without one), and the items in flight
    # by group, counted until ``busy_until`` (the first of their leases to end).
    by_group: dict[str, list[tuple[int, int, int]]] | None = None
    busy: Counter[str] | None = None
    busy_until: int = 0


@dataclass(slots=True)
class _Ordered:
    """An ordered walk's pick: item ``index`` of ``sm``, leasable from ``due``, and
    the (group, due) of every item of its segment."""

    sm: SegmentMeta
    index: int
    due: int
    group: str | None
    layout: list[tuple[str | None, int]]


class Scheduler:
    """The lease walk: which ready items a lease takes, and the long poll."""

    def __init__(self, rt: Runtime, finishers: Finishers, signer: TokenSigner) -> None:
        self.rt = rt
        self.finishers = finishers
        self.signer = signer

    async def lease(
        self,
        queue: str,
        batch: int = 1,
        *,
        lease_timeout: float | None = None,
        wait: float = 0.0,
    ) -> list[LeasedItem]:
        """Lease up to ``batch`` ready items, waiting up to ``wait`` seconds for some.

        ``lease_timeout=0`` is a delivery that is over at once: the item is leasable
        again at once (the SQS API's receive with ``VisibilityTimeout=0``); the
        delivery still counts as an attempt, and its token stays current until the
        item is leased again."""
        self.rt.check_batch(batch, "batch_size")
        if lease_timeout != 0:
            check_lease_timeout(lease_timeout)
        check_wait(wait, self.rt.opts.max_wait)
        q = self.rt.queue(queue)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + wait
        age: float | None = None  # the first look as any lease's; later ones share
        woken = False  # whether a wake-up (``Runtime.wake``) chose this lease
        while True:
            q.wake.clear()
            reads = q.manifest.reads
            try:
                items, next_ready = await self._lease_once(q, batch, lease_timeout, age)
            except BaseException:
                if woken:  # the look it was woken for did not finish: another looks
                    q.wake_one()
                raise
            if woken and len(items) >= batch:
                q.wake_one()  # it took a full batch: there may be more for the next
            woken = False
            q.next_ready_ms = next_ready
            await self.finishers.help_noted(q)
            left = give_up - loop.time()
            if items or self.rt.stopping:
                q.idle_pause = 0.0
                return items
            if left <= 0:
                if q.manifest.reads != reads or self.rt.trusted(q.name):
                    return items
                # An empty answer rests on a fresh manifest: a produce that landed
                # through another node a moment ago is leased now, not 0.2 s later.
                q.manifest.forget()
                continue
            pause = min(left, self._idle_pause(q))
            if next_ready is not None:
                pause = min(pause, max(0.0, (next_ready - self.rt.clock.now_ms()) / 1000))
            # The next look takes a manifest another long poll of this queue read
            # within the pause: many waiters on one queue cost one read per pause.
            age = q.idle_pause
            if q.wake.is_set():  # woken during the look: look again at once
                q.idle_pause = 0.0
                continue
            woken = await self._sleep(q, pause)
            if woken:
                q.idle_pause = 0.0  # woken by a change made through this process

    async def _sleep(self, q: QueueRuntime, pause: float) -> bool:
        """Asleep until a wake-up chooses this long poll (``QueueRuntime.wake_one``)
        or ``pause`` seconds end; whether a wake-up chose it. One chosen and then
        cancelled passes the wake-up on."""
        q.waiters += 1
        sleeper = asyncio.get_running_loop().create_future()
        q.sleepers.append(sleeper)
        try:
            # Not wait_for: its task of its own takes two more turns of the loop
            # to wake this one, and a producer's reply, made ready after the
            # wake-up, went out first (okq/publisher.py wakes long polls first).
            async with asyncio.timeout(pause):
                await sleeper
        except TimeoutError:
            pass
        except BaseException:
            if sleeper.done() and not sleeper.cancelled():
                q.wake_one()
            raise
        finally:
            q.waiters -= 1
            if not sleeper.done():
                sleeper.cancel()
                q.sleepers.remove(sleeper)
        return sleeper.done() and not sleeper.cancelled()

    def _idle_pause(self, q: QueueRuntime) -> float:
        """The pause before a long poll's next look: ``poll_interval`` after a change
        to the queue's manifest, doubling while it stays the same, up to
        ``idle_poll_max`` (docs/DESIGN.md, "Long poll")."""
        o, cell = self.rt.opts, q.manifest
        if cell.etag != q.idle_etag or not q.idle_pause:
            q.idle_pause = o.poll_interval
        elif cell.reads != q.idle_reads:  # a look at the store found nothing new
            q.idle_pause = min(q.idle_pause * 2, o.idle_poll_max)
        q.idle_etag, q.idle_reads = cell.etag, cell.reads
        return q.idle_pause

    async def _lease_once(
        self, q: QueueRuntime, n: int, lease_timeout: float | None, age: float | None = None
    ) -> tuple[list[LeasedItem], int | None]:
        """One look: lease what is ready. ``age``: how old a cached manifest may be
        (a long poll's later looks), at least the lease path's own."""
        async with q.lock:
            max_age = max(self.rt.max_ages(q)[0], age or 0.0)
            m, fresh_cfg = await self.rt.manifest_read(q, max_age)
            lease_ms = (int(lease_timeout * 1000) if lease_timeout is not None
                        else m.config.lease_ms)
            out: list[LeasedItem] = []
            next_ready: int | None = None
            idle = 0
            # Passes until the batch is full. A pass can fall short: items lost to
            # another engine, or out of attempts and dead-lettered instead. Stop
            # after three passes in a row that changed nothing.
            while len(out) < n and idle < 3:
                if m.config.fifo:
                    ordered, next_ready = await self._pick_ordered(q, m, n - len(out))
                    if not ordered:
                        break
                    results = await self._lease_ordered(q, m.config, ordered, lease_ms,
                                                        fresh_cfg)
                else:
                    picks, next_ready = await self._pick(q, m, n - len(out))
                    if not picks:
                        break
                    groups: dict[str, tuple[SegmentMeta, list[tuple[int, int]]]] = \
                        tr.by_segment(picks)
                    if len(groups) == 1:  # one segment: no task to run it beside others
                        [(sm, w)] = groups.values()
                        results = [await self._lease_in(q, m.config, sm, w, lease_ms, fresh_cfg)]
                    else:
                        results = await asyncio.gather(*(
                            self._lease_in(q, m.config, sm, w, lease_ms, fresh_cfg)
                            for sm, w in groups.values()
                        ))
                progress = 0
                for items, dead, _ in results:
                    out.extend(items)
                    progress += len(items) + dead
                if any(held_back for _, _, held_back in results):
                    # Out of attempts by a cached config: dead-letter or drop only on
                    # the queue's settings read now (a raised max_attempts or a new
                    # dead queue must count).
                    m, fresh_cfg = await self.rt.manifest(q, 0), True
                    progress += 1
                idle = 0 if progress else idle + 1
                if lease_ms <= 0:
                    break  # each delivery is over at once: another pass would lease them again
            return out, next_ready

    async def _pick(
        self, q: QueueRuntime, m: Manifest, n: int
    ) -> tuple[list[Candidate], int | None]:
        """Choose up to n ready items, oldest ready time first.

        Returns (sort key, segment id, index, fresh ready time, segment) and the earliest
        future ready time seen, for the long poll.
        """
        now = self.rt.clock.now_ms()
        _forget_dropped(q, m)
        segments, groups = _scan_order(m)
        if _grouped(groups):
            return await self._pick_fair(q, n, segments, groups, now, (m.ver, m.nonce))
        backoff = int(self.rt.opts.contention_backoff * 1000)
        horizon = now + int(2000 * self.rt.opts.max_clock_skew)  # fresh items from clocks ahead
        cands: list[Candidate] = []
        next_ready: int | None = None
        budget = [self.rt.opts.lease_state_reads]
        finished = q.finished
        for sm in itertools.islice(segments, _first_unfinished(q, segments), None):
            if len(cands) >= n:
                cands.sort()
                if cands[n - 1][0] <= sm.first_ready_ms:
                    break  # every item further on becomes ready later than these
            if sm.id in finished:
                continue
            cell = self.rt.lease_cell(q, sm.id)
            try:
                summary = await self._summary(q, sm, cell, now, budget)
            except ObjectNotFound:  # removed by a compactor since this manifest was read
                q.manifest.forget()
                continue
            penalty = backoff if now - cell.conflict_ms < backoff else 0
            # Only a fresh unscheduled entry is due before its order (due 0); every
            # other is due at it. Past the last fresh entry's order, then, the first
            # entry not due yet is the first to come due (its order), and so is every
            # later one after it: the walk stops there rather than pass each item
            # in flight. (Item by item in okq.leases, compiled with the hot path.)
            fresh = summary.fresh
            fresh_until = fresh[-1][0] if fresh else -1
            _, next_ready = tr.take_ready(summary.ready, now, horizon, fresh_until, n,
                                          next_ready, cands, penalty, sm.id, sm)
            self._note_stalled(q, sm, summary, now)
        cands.sort()
        return cands[:n], next_ready

    async def _pick_fair(
        self, q: QueueRuntime, n: int, order: list[SegmentMeta], groups: Groups, now: int,
        version: tuple[int, str],
    ) -> tuple[list[Candidate], int | None]:
        """A standard queue whose items name groups: the walk shares a lease out
        among the groups (docs/DESIGN.md, "Fair sharing"), so that one with a deep
        backlog does not hold the others back. Up to n ready candidates of each
        group are gathered (segments whose groups all have theirs are passed over
        unread, by their entries in the manifest); once some are found the walk
        goes at most FAIR_SCAN segments deep, through FAIR_READS segments that gave
        candidates, and no further once n groups without a share have them (until
        some are found it goes as far as the plain walk would); then one item at a
        time goes to the group with the fewest items in flight in the segments
        walked (those whose items' groups are known here: a segment with nothing
        ready is not read for them) plus handouts among this process's last ones
        (_Fair.share_out).
        Items without a group share as one group. A walk to the end of the list
        notes the groups it found ready items of (the manifest names a group until a
        compactor folds its last segment, and names none of a segment of many):
        walks of the same manifest in the next FAIR_EMPTY_MS stop once those have
        their candidates. Same returns as _pick."""
        backoff = int(self.rt.opts.contention_backoff * 1000)
        fair = _Fair(n, now, now + int(2000 * self.rt.opts.max_clock_skew), q.recent)
        budget = [self.rt.opts.lease_state_reads]
        wanted = _wanted(q, groups, version, now)
        useful = 0  # segments that gave candidates
        for looked, sm in enumerate(order):
            if wanted is not None and fair.full >= wanted:
                break  # every group of the queue has its candidates
            names = ("",) if sm.groups is None else sm.groups
            if names and fair.full.issuperset(names):
                continue  # nothing here is wanted
            if fair.by_group and (looked >= FAIR_SCAN or useful >= FAIR_READS
                                  or len(fair.unshared) >= n):
                break
            if sm.id in q.finished:
                continue  # nothing ready, nothing in flight
            cell = self.rt.lease_cell(q, sm.id)
            try:
                summary = await self._summary(q, sm, cell, now, budget)
                self._note_stalled(q, sm, summary, now)
                layout = summary.layout
                if layout is None:
                    if not summary.ready:
                        continue  # nothing to lease: its groups are not worth a GET
                    layout = await self._layout(q, sm, summary)
            except ObjectNotFound:  # removed by a compactor since this manifest was read
                q.manifest.forget()
                continue
            if summary.inflight:
                fair.in_flight(_busy(summary, cell, layout, now))
            if summary.by_group is None:
                summary.by_group = _by_group(summary.ready, layout)
            if fair.add(sm, summary.by_group, backoff if now - cell.conflict_ms < backoff else 0):
                useful += 1
        else:  # to the end: what was not found has nothing ready, until the next ready time
            until = min(now + FAIR_EMPTY_MS, fair.next_ready or now + FAIR_EMPTY_MS)
            q.fair_found = (version, until, frozenset(fair.by_group))
        return fair.share_out(), fair.next_ready

    async def _pick_ordered(self, q: QueueRuntime, m: Manifest, n: int
                            ) -> tuple[list[_Ordered], int | None]:
        """An ordered (fifo) queue's walk: up to n items, each the head of its group
        or following the head in this same handout, and the earliest future time a
        head becomes leasable (docs/DESIGN.md, "Ordered delivery"). A group with an
        item in flight, or whose first unfinished item is not leasable now (waiting
        for its retry time, scheduled, being dead-lettered, sealed for a merge), is
        blocked: nothing of it is picked. Segments go in sequence order; in each, as
        many items of the first group as it offers come before the next group's (as
        SQS hands out a FIFO queue's messages: other consumers get the other groups),
        and a handout of a group is taken from one segment. Items without a group are
        picked in sequence order and block nothing."""
        now = self.rt.clock.now_ms()
        _forget_dropped(q, m)
        blocked: set[str] = set()
        picks: list[_Ordered] = []
        soonest: list[int] = []
        budget = [self.rt.opts.lease_state_reads]
        for sm in _seq_order(m):
            if sm.id in q.finished:
                continue  # every item done or dead-lettered: blocks no group, offers none
            cell = self.rt.lease_cell(q, sm.id)
            try:
                summary = await self._summary(q, sm, cell, now, budget)
                layout = await self._layout(q, sm, summary)
            except ObjectNotFound:
                # Removed by a compactor since this manifest was read: its items may
                # be in a merged segment this manifest does not list, so nothing
                # after it may be picked before a fresh manifest is read.
                q.manifest.forget()
                break
            self._note_stalled(q, sm, summary, now)
            if summary.groups is None:
                summary.groups = frozenset(g for g, _ in layout)
            if None not in summary.groups and summary.groups <= blocked:
                continue  # every group here is held: nothing here can be picked
            for run in _ordered_runs(sm, cell.view(), layout, now, blocked, n, soonest):
                picks.extend(run[:n - len(picks)])
                if len(picks) == n:
                    return picks, min(soonest, default=None)
        return picks, min(soonest, default=None)

    async def _lease_ordered(self, q: QueueRuntime, cfg: QueueConfig, picks: list[_Ordered],
                             lease_ms: int, fresh_cfg: bool
                             ) -> list[tuple[list[LeasedItem], int, bool]]:
        """Lease an ordered walk's picks segment by segment in sequence order: a group
        whose item could not be leased (taken meanwhile, out of attempts) has none of
        its later items leased in this handout."""
        runs: list[tuple[SegmentMeta, list[_Ordered]]] = []
        for pick in picks:
            if runs and runs[-1][0].id == pick.sm.id:
                runs[-1][1].append(pick)
            else:
                runs.append((pick.sm, [pick]))
        failed: set[str] = set()
        results = []
        for sm, run in runs:
            wanted = [p for p in run if p.group is None or p.group not in failed]
            if wanted:
                results.append(await self._lease_in(
                    q, cfg, sm, [(p.index, p.due) for p in wanted], lease_ms, fresh_cfg,
                    wanted[0].layout, failed))
        return results

    async def _layout(self, q: QueueRuntime, sm: SegmentMeta, summary: _Summary
                      ) -> list[tuple[str | None, int]]:
        """The (group, due) of each item of ``sm``, kept with its summary."""
        if summary.layout is None:
            summary.layout = _layout(sm, await self.rt.segment(q, sm))
        return summary.layout

    def _note_stalled(self, q: QueueRuntime, sm: SegmentMeta, summary: _Summary, now: int) -> None:
        """Remember half-done items older than the grace, to help after the lock."""
        for since, idx in summary.stalled:
            if now - since > self.rt.opts.dead_grace * 1000 and now >= q.help_after.get(
                    (sm.id, idx), 0):
                q.stalled[(sm.id, idx)] = sm

    async def _summary(self, q: QueueRuntime, sm: SegmentMeta, cell: Cell[LeaseObject],
                       now: int, budget: list[int]) -> _Summary:
        """The segment's summary; ``budget`` bounds the re-reads of lease objects
        that hold leases (the first calls re-read the first segments, which are
        then fresh for a while, so later calls re-read the next ones)."""
        cached = q.summaries.get(sm.id)
        aged = (
            cached is not None
            and cached[1].inflight
            and cell.fetched_ms is not None
            and now - cell.fetched_ms > self.rt.max_ages(q)[1] * 1000
            and budget[0] > 0
        )
        stale = cell.fetched_ms is None or aged
        if aged:
            budget[0] -= 1
        if stale:
            await cell.refresh()
        if cached is not None and cached[0] is cell.data and not stale:
            known: _Summary = cached[1]
            return known
        obj = cell.view() or LeaseObject(sm.id)
        fresh = cached[1].fresh if cached is not None else None
        if fresh is None and len(obj.items) < sm.count:
            # Only fresh items need the segment (for their enqueue time).
            fresh = _fresh(sm, await self.rt.segment(q, sm))
        summary = _Summary(*tr.summarise(obj, sm.count, fresh), fresh,
                           *((cached[1].layout, cached[1].groups) if cached is not None
                             else (None, None)))
        q.summaries[sm.id] = (cell.data, summary)
        if not summary.ready and not summary.inflight and tr.all_finished(obj, sm.count):
            q.finished.add(sm.id)
        return summary

    async def _lease_in(
        self,
        q: QueueRuntime,
        cfg: QueueConfig,
        sm: SegmentMeta,
        wanted: list[tuple[int, int]],
        lease_ms: int,
        fresh_cfg: bool,
        layout: list[tuple[str | None, int]] | None = None,
        failed: set[str] | None = None,
    ) -> tuple[list[LeasedItem], int, bool]:
        """Lease what is still available of ``wanted``; returns the items, how many
        were dead-lettered instead (out of attempts), and whether some were left
        alone because only a fresh config may dead-letter them.

        ``layout`` (an ordered queue's lease: the (group, due) of each item of the
        segment, ``wanted`` in sequence order): an item is leased only while no item
        of its group in the segment is in flight and every earlier wanted item of its
        group was; the groups stopped are added to ``failed``."""
        cell = self.rt.lease_cell(q, sm.id)
        rq = new_request_id()
        held_back = False
        stopped: set[str] = set()

        def lease(obj: LeaseObject, now: int) -> object:
            nonlocal held_back, stopped
            # A re-apply after an ambiguous write that another writer overwrote
            # finds this request's own leases: they are answered, not stranded.
            mine, mine_dead, rest = tr.recognise(obj, wanted, rq)
            if layout is not None:
                rest, stopped = _in_order(obj, rest, layout, now, cfg.max_attempts)
            if not fresh_cfg and cfg.max_attempts:
                kept = [w for w in rest if not exhausted(obj, w[0], cfg.max_attempts)]
                held_back = len(kept) < len(rest)
                rest = kept
            leased, dead = tr.lease(obj, rest, now, lease_ms, cfg.max_attempts, rq)
            result = (mine + leased, mine_dead + dead)
            return result if leased or dead else Unchanged(result)

        seg = await self.rt.segment(q, sm)

        def handed_out(result: tuple[list[tr.Leased], list[int]]
                       ) -> tuple[list[LeasedItem], list[int]]:
            """The items to hand out, tokens signed while the lease object is written."""
            leased, dead = result
            if layout is not None:
                leased = sorted(leased, key=lambda x: x.index)  # a re-apply's own come first
            return _leased_items(self.signer, self.rt.ns, q.name, sm, seg, leased), dead

        items, dead = await cell.update(lease, handed_out)
        if failed is not None:
            failed |= stopped
        for idx in dead:
            q.stalled[(sm.id, idx)] = sm  # moved to the dead-letter queue after the lock
        return items, len(dead), held_back


def _leased_items(signer: TokenSigner, ns: str, queue: str, sm: SegmentMeta, seg: Segment,
                  leased: list[tr.Leased]) -> list[LeasedItem]:
    """What a lease hands out for ``leased`` items of one segment, tokens signed."""
    tokens = signer.sign_many(ns, queue, sm.id, tr.deliveries_of(leased))
    return tr.leased_items(queue, sm, seg.items, leased, tokens)


def _first_unfinished(q: QueueRuntime, order: list[SegmentMeta]) -> int:
    """Where the standard walk of ``order`` starts: past the finished segments at its
    front, counted on from where the last walk of the same list found them (a walk
    of a queue drained but not yet compacted no longer passes every segment)."""
    memo = q.walk_start
    start = memo[1] if memo is not None and memo[0] is order else 0
    finished = q.finished
    while start < len(order) and order[start].id in finished:
        start += 1
    q.walk_start = (order, start)
    return start


def _forget_dropped(q: QueueRuntime, m: Manifest) -> None:
    """Forget the lease cells and summaries of segments the manifest dropped."""
    if q.seen_ver == m.ver:
        return
    seen = q.seen_segments
    if q.seen_ver < 0 or not (len(m.segments) >= len(seen)
                              and m.segments[:len(seen)] == seen):
        live = {sm.id for sm in m.segments}  # not only appended to (a compaction)
        for sid in [sid for sid in q.leases if sid not in live]:
            q.leases.pop(sid)
            q.summaries.pop(sid, None)
        q.finished &= live
    q.seen_ver, q.seen_segments = m.ver, list(m.segments)


def _ordered_runs(sm: SegmentMeta, obj: LeaseObject | None,
                  layout: list[tuple[str | None, int]], now: int, blocked: set[str],
                  n: int, soonest: list[int]) -> list[list[_Ordered]]:
    """What an ordered walk may pick in one segment, as runs in the order of their
    first item: each group's leasable items from its head on (up to ``n``), and each
    item without a group alone. Adds the segment's groups to ``blocked`` (those held,
    and those picked: a handout of a group stays in one segment), and the future
    times at which a held head becomes leasable to ``soonest``."""
    states = obj.items if obj is not None else {}
    sealed = obj is not None and obj.sealed
    blocked |= _busy_groups(states, layout, now, soonest)
    runs: list[list[_Ordered]] = []
    by_group: dict[str, list[_Ordered]] = {}
    for idx, (group, due) in enumerate(layout):
        if group is not None and group in blocked:
            continue
        st = states.get(idx)
        if st is not None and st.s in tr.FINISHED:
            continue
        at = None if sealed else tr.ready_at(st, due)
        if at is not None and at <= now:
            pick = _Ordered(sm, idx, due, group, layout)
            if group is None:
                runs.append([pick])
            elif group not in by_group:
                runs.append(by_group.setdefault(group, [pick]))
            elif len(by_group[group]) < n:
                by_group[group].append(pick)
            continue
        if at is not None:
            soonest.append(at)
        if group is not None:
            blocked.add(group)  # held here: nothing after this of it
    blocked.update(by_group)
    return runs


def _busy_groups(states: dict[int, ItemState], layout: list[tuple[str | None, int]],
                 now: int, soonest: list[int] | None = None) -> set[str]:
    """The groups with an item in flight in a segment: leased (the lease not over),
    being dead-lettered, or having its outputs published. All of a group's items in
    flight are in one segment, its head's: a handout of a group is taken from one
    segment, starting at its head, and the head never moves back. Adds the lease
    deadlines of those groups' items to ``soonest`` (a long poll looks again then)."""
    busy: set[str] = set()
    for index, st in states.items():
        if st.s in IN_FLIGHT and (st.s != LEASED or st.t > now) and index < len(layout):
            group = layout[index][0]
            if group is not None:
                busy.add(group)
                if soonest is not None and st.s == LEASED:
                    soonest.append(st.t)
    return busy


@dataclass
class _Fair:
    """A fair walk's findings: up to n ready candidates of each group ("" for the
    items without one), the items in flight of each, and the soonest future ready
    time seen (for the long poll)."""

    n: int
    now: int
    horizon: int  # fresh items from clocks ahead up to this are ready now
    recent: RecentGroups
    by_group: dict[str, list[Candidate]] = field(default_factory=dict)
    full: set[str] = field(default_factory=set)  # the groups with n candidates
    busy: Counter[str] = field(default_factory=Counter)
    # Groups with candidates and no share (nothing in flight seen, no handout among
    # the last ones here): once n have some, no group found further on comes first.
    unshared: set[str] = field(default_factory=set)
    next_ready: int | None = None

    def in_flight(self, busy: Counter[str]) -> None:
        self.busy.update(busy)
        self.unshared.difference_update(busy)

    def add(self, sm: SegmentMeta, ready: dict[str, list[tuple[int, int, int]]],
            penalty: int) -> bool:
        """Take the candidates of a segment's ready items (by group) whose groups want
        more; whether there were any."""
        took = False
        for group, entries in ready.items():
            if group in self.full:
                continue
            got = self.by_group.get(group)
            for at, idx, due in entries:
                if due > self.now or at > self.horizon:
                    soon = max(due, at) if at > self.horizon else due
                    self.next_ready = soon if self.next_ready is None else min(self.next_ready,
                                                                               soon)
                    if at > self.horizon:
                        break
                    continue
                if got is None:
                    got = self.by_group[group] = []
                    if not self.busy[group] and not self.recent.counts[group]:
                        self.unshared.add(group)
                got.append((at + penalty, sm.id, idx, due, sm))
                took = True
                if len(got) == self.n:
                    self.full.add(group)
                    break
        return took

    def share_out(self) -> list[Candidate]:
        """The picks: one candidate at a time to the group with the lowest share (its
        items in flight, and its handouts among the last ones here, counting those
        picked so far); among equals, the group served least lately here, then the
        one waiting longest. From FAIR_SEGMENTS segments at most: a lease writes the
        lease object of each segment it takes from, so a group whose next item is
        in another segment waits for a later lease, where its share puts it first."""
        recent = self.recent
        heap = []
        for group, got in self.by_group.items():
            got.sort()
            heap.append((self.busy[group] + recent.counts[group], recent.last.get(group, -1),
                         got[0][0], group, 0))
        heapq.heapify(heap)
        picks: list[Candidate] = []
        segments: set[str] = set()
        while heap and len(picks) < self.n:
            share, _, _, group, i = heapq.heappop(heap)
            got = self.by_group[group]
            if got[i][1] not in segments:
                if len(segments) == FAIR_SEGMENTS:
                    continue  # its next item would be a third write: its turn comes later
                segments.add(got[i][1])
            picks.append(got[i])
            served = recent.note(group)
            if i + 1 < len(got):
                heapq.heappush(heap, (share + 1, served, got[i + 1][0], group, i + 1))
        return picks


def _wanted(q: QueueRuntime, groups: Groups, version: tuple[int, str], now: int) -> Groups:
    """The groups a fair walk looks for: ``groups`` (None: not known), or those a walk
    of this manifest found ready items of lately (QueueRuntime.fair_found)."""
    found = q.fair_found
    if found is not None and found[0] == version and now < found[1]:
        return found[2]
    return groups


def _busy(summary: _Summary, cell: Cell[LeaseObject], layout: list[tuple[str | None, int]],
          now: int) -> Counter[str]:
    """A segment's items in flight by group, kept with its summary until a lease ends."""
    if summary.busy is None or now >= summary.busy_until:
        obj = cell.view()
        summary.busy, summary.busy_until = _in_flight(obj.items if obj is not None else {},
                                                      layout, now)
    return summary.busy


def _in_flight(states: dict[int, ItemState], layout: list[tuple[str | None, int]],
               now: int) -> tuple[Counter[str], int]:
    """Items in flight in a segment by group ("" for those without one), and until
    when that holds (the first of their leases to end)."""
    out: Counter[str] = Counter()
    until = 1 << 62
    for index, st in states.items():
        if st.s in IN_FLIGHT and (st.s != LEASED or st.t > now) and index < len(layout):
            out[layout[index][0] or ""] += 1
            if st.s == LEASED:
                until = min(until, st.t)
    return out, until


def _by_group(ready: list[tuple[int, int, int]], layout: list[tuple[str | None, int]]
              ) -> dict[str, list[tuple[int, int, int]]]:
    """A summary's ready entries by group, each in the summary's order."""
    out: dict[str, list[tuple[int, int, int]]] = {}
    for entry in ready:
        group = layout[entry[1]][0] or ""
        got = out.get(group)
        if got is None:
            out[group] = [entry]
        else:
            got.append(entry)
    return out


def _in_order(obj: LeaseObject, rest: list[tuple[int, int]],
              layout: list[tuple[str | None, int]], now: int,
              max_attempts: int) -> tuple[list[tuple[int, int]], set[str]]:
    """What an ordered lease may take of ``rest`` (in sequence order): an item of a
    group only while no item of the group here is in flight and each earlier one of
    it here is taken. One not available any more (leased by another, sealed) stops
    its group, and so does one out of attempts (it goes to the dead-letter path, not
    out): returns the groups stopped. Checked on the lease object the change is
    written to, so another engine's handout of the group from this segment, however
    recent, is seen."""
    keep: list[tuple[int, int]] = []
    stopped = _busy_groups(obj.items, layout, now)
    for index, due in rest:
        group = layout[index][0] if index < len(layout) else None
        if group is not None and group in stopped:
            continue
        st = obj.items.get(index)
        if obj.sealed or not tr.is_available(st, due, now):
            if group is not None:
                stopped.add(group)
            continue
        keep.append((index, due))
        if group is not None and max_attempts and exhausted(obj, index, max_attempts):
            stopped.add(group)
    return keep, stopped


def _layout(sm: SegmentMeta, seg: Segment) -> list[tuple[str | None, int]]:
    """(group, due) of each item of a segment, for an ordered walk."""
    return [(group_of(item.meta), fresh_due_ms(sm, item)) for item in seg.items[:sm.count]]


_SEQ_ORDER: dict[tuple[str, int, str], list[SegmentMeta]] = {}


def _seq_order(m: Manifest) -> list[SegmentMeta]:
    """An ordered queue's segments by sequence number (a merged segment is listed
    last but holds the earliest items; one without a number, listed by an okq
    before ordered delivery, goes first in list order)."""
    key = (m.queue, m.ver, m.nonce)
    order = _SEQ_ORDER.get(key)
    if order is None:
        if len(_SEQ_ORDER) > 256:
            _SEQ_ORDER.clear()
        order = _SEQ_ORDER[key] = sorted(m.segments,
                                         key=lambda sm: sm.place)
    return order


#: A segment list's groups: each name of its segments' SegmentMeta.groups, with ""
#: for a segment without (its items name none), or None when a segment has more
#: than GROUPS_LISTED (not named one by one in the manifest).
Groups = frozenset[str] | None

_SCAN_ORDER: dict[tuple[str, int, str], tuple[list[SegmentMeta], Groups]] = {}


@dataclass(slots=True)
class _Sorted:
    """A segment list, and the same segments by ready time (with their times)."""

    listed: list[SegmentMeta]
    order: list[SegmentMeta]
    keys: list[int]
    groups: Groups


def _groups(segments: list[SegmentMeta], known: Groups = frozenset()) -> Groups:
    """``known`` and the groups of ``segments`` (see Groups)."""
    if known is None:
        return None
    names = set(known)
    for sm in segments:
        if sm.groups is None:
            names.add("")
        elif not sm.groups:
            return None
        else:
            names.update(sm.groups)
    return frozenset(names)


def _grouped(groups: Groups) -> bool:
    """Whether some item of a segment list names a group (a fair walk's queue)."""
    return groups is None or len(groups) > 1 or (bool(groups) and "" not in groups)


_LAST_SORTED: dict[str, _Sorted] = {}  # by queue: the last list sorted


def _scan_order(m: Manifest) -> tuple[list[SegmentMeta], Groups]:
    """Segments by the earliest ready time of their items (publish order, unless
    a compactor merge carried older items into a newer segment), and their groups.

    A publish only appends: when the last list sorted for the queue is the front
    of this one (compared in C), the new segments are inserted into its order
    rather than the whole backlog sorted again. Ties keep list order either way.
    """
    key = (m.queue, m.ver, m.nonce)
    known = _SCAN_ORDER.get(key)
    if known is not None:
        return known
    if len(_SCAN_ORDER) > 256:
        _SCAN_ORDER.clear()
    if len(_LAST_SORTED) > 256:
        _LAST_SORTED.clear()
    last = _LAST_SORTED.get(m.queue)
    n = len(last.listed) if last is not None else 0
    if last is not None and len(m.segments) >= n and m.segments[:n] == last.listed:
        order, keys = list(last.order), list(last.keys)
        for sm in m.segments[n:]:
            at = bisect.bisect_right(keys, sm.first_ready_ms)
            keys.insert(at, sm.first_ready_ms)
            order.insert(at, sm)
        groups = _groups(m.segments[n:], last.groups)
    else:
        order = sorted(m.segments, key=lambda sm: sm.first_ready_ms)
        keys = [sm.first_ready_ms for sm in order]
        groups = _groups(m.segments)
    _LAST_SORTED[m.queue] = _Sorted(list(m.segments), order, keys, groups)
    _SCAN_ORDER[key] = order, groups
    return order, groups


def _fresh(sm: SegmentMeta, seg: Segment) -> list[tuple[int, int, int]]:
    """Every item of a segment as a never-leased candidate: (order, index, due), as
    ``fresh_ready_ms`` and ``fresh_due_ms`` tell them (written out here: two calls
    an item were most of the work), sorted (``leases.summarise`` takes them so)."""
    created = sm.created_ms
    out = []
    for idx, item in enumerate(seg.items[:sm.count]):
        born = created if item.born_ms is None else item.born_ms
        at = item.enqueue_at_ms
        out.append((born, idx, 0) if at is None or at <= born else (at, idx, at))
    out.sort()  # once a segment, and in order already unless some item is scheduled
    return out
