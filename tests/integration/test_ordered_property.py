"""Stateful property tests of ordered (fifo) queues: two engines on one store.

Hypothesis drives random sequences of produce (1 to 4 items, each in one of three
message groups or in none, some scheduled for later), lease (on either engine, 1 to
5 items), complete, retry (now, later, or to the dead-letter queue), clock moves
(past lease deadlines and retry times) and compactor passes (``min_age=0``: every
segment may be merged) against two engines sharing a MemoryStore and one
ManualClock. The queue dead-letters an item after three attempts.

Every lease call's list is checked by tests/integration/test_ordered.py's
:class:`OrderRules`, on the store's truth for what is finished (the completions the
engines accepted, and the dead-letter queue read from the store before the lease):

* order: an item of a group is handed out only when every item of its group produced
  before it is finished or earlier in the same list;
* one handout of a group in flight: nothing of a group is handed out while items of
  it that another lease call handed out are neither completed nor retried and their
  lease deadline is not passed;
* no item is handed out twice at once, or after it finished; attempts count up by one
  a handout; complete and retry are honoured exactly while the delivery is current.

Consumers complete and retry single deliveries, in any order: a head retried while
later items of its handout stay leased must wait for them (the case of
``test_a_released_head_waits_for_the_rest_of_its_handout`` in test_ordered.py).

At the end everything is drained (an hour later: past every deadline and schedule,
and past the dead-letter queue's idempotency window): each item produced is
completed exactly once or is in the dead-letter queue exactly once, the manifest
counts each item once, and each group's items were first handed out in produce
order.

Configurations: no faults; and writes that are sometimes ambiguous (they land and
their writer sees an error) or *overtaken* (FaultyStore, as in
tests/integration/test_engine_property.py: between the landing and the error the
other engine produces, or completes another delivery of the same segment, or a
writer outside the model rewrites the object unchanged).

Example counts are short by default; ``OKQ_PROPERTY_EXAMPLES=long`` (or a number)
runs more, as for test_engine_property.py.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import Coroutine
from typing import Any, ClassVar, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

import compactor.core
from compactor import Compactor, CompactorOptions
from okq import Engine, ManualClock, NewItem, QueueConfig, publisher
from okq.errors import LeaseLost
from okq.keys import lease_key, manifest_key, segment_key
from okq.manifests import read_manifest
from okq.model import decode_segment, with_group
from okq.store import FaultyStore, MemoryStore, Store
from tests.engines import make_engine
from tests.integration.test_engine_property import (
    _examples,
    close_loop,
    guarded,
    rewrite_unchanged,
)
from tests.integration.test_ordered import Delivery, OrderRules

T = TypeVar("T")

NS = "default"
QUEUE, DLQ = "q", "dlq"
LEASE_TIMEOUT = 10.0
MAX_ATTEMPTS = 3
GROUP = st.sampled_from(["a", "b", "c", None])
ENGINE = st.integers(0, 1)
#: A produce's items: (group, delay in ms or None), mostly not scheduled.
SPECS = st.lists(
    st.tuples(GROUP, st.one_of(st.none(), st.none(), st.none(), st.integers(1, 15_000))),
    min_size=1, max_size=4)


class OrderedMachine(RuleBasedStateMachine):
    #: Writes are sometimes ambiguous or overtaken (see the module docstring).
    FAULTS: ClassVar[bool] = False
    tally: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.tally["examples"] += 1
        self.failed = False
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.store: Store = MemoryStore()
        self.faulty = [FaultyStore(self.store) for _ in range(2 if self.FAULTS else 0)]
        self.engines = [make_engine(self.faulty[n] if self.FAULTS else self.store, self.clock)
                        for n in range(2)]
        self.compactor_engine = make_engine(self.store, self.clock)
        self.order = OrderRules()
        self.held: list[Delivery] = []  # deliveries handed out and not released
        self.spent: list[Delivery] = []  # the last deliveries completed or retried
        self.ids: dict[str, str] = {}  # token -> item id (segment.index) when leased
        self.busy: set[str] = set()  # tokens an operation in flight is using
        self.dead_retried: set[str] = set()  # items retried with dead=True
        self.dlq_items: dict[str, list[str]] = {}  # dead-letter segment id -> its payloads
        self.in_hook = False
        self.payloads = 0
        self.run(self._setup())

    async def _setup(self) -> None:
        await self.engines[0].start()
        await self.engines[0].create_queue(DLQ)
        await self.engines[0].create_queue(QUEUE, QueueConfig(
            fifo=True, lease_timeout=LEASE_TIMEOUT, max_attempts=MAX_ATTEMPTS, dead_queue=DLQ))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    # -- produce ------------------------------------------------------------------
    @initialize(calls=st.lists(st.tuples(ENGINE, SPECS, st.booleans()), max_size=5))
    @guarded
    def backlog(self, calls: list[tuple[int, list[tuple[str | None, int | None]], bool]]
                ) -> None:
        """Some produces first, so that most examples lease from a backlog."""
        for e, specs, mixed in calls:
            self.produce(e, specs, mixed)

    @rule(e=ENGINE, specs=SPECS, mixed=st.booleans())
    @guarded
    def produce(self, e: int, specs: list[tuple[str | None, int | None]], mixed: bool) -> None:
        """A produce of 1 to 4 items; unless ``mixed``, all in the first one's group
        (runs of a group make handouts of several of its items)."""
        if not mixed:
            specs = [(specs[0][0], delay) for _, delay in specs]
        self.run(self._produce(self.engines[e], specs))

    async def _produce(self, engine: Engine, specs: list[tuple[str | None, int | None]]) -> None:
        batch: list[tuple[str, str | None]] = []
        items: list[NewItem] = []
        now = engine.clock.now_ms()
        for group, delay in specs:
            self.payloads += 1
            name = f"{group or '-'}{self.payloads}"
            batch.append((name, group))
            items.append(NewItem(name.encode(), None if delay is None else now + delay,
                                 meta=with_group(None, group)))
        began = self.order.begin()
        ids = await engine.produce(QUEUE, items)
        assert len(set(ids)) == len(items)
        self.order.produced(batch, began)
        self.tally["produced"] += len(items)

    # -- lease --------------------------------------------------------------------
    @rule(e=ENGINE, n=st.integers(1, 5), timeout=st.sampled_from([None, None, 3.0]))
    @guarded
    def lease(self, e: int, n: int, timeout: float | None) -> None:
        self.run(self._lease(self.engines[e], n, timeout))

    async def _lease(self, engine: Engine, n: int, timeout: float | None) -> list[Delivery]:
        await self._sync_dead()  # what is finished, from the store, before the lease
        now = engine.clock.now_ms()
        got = await engine.lease(QUEUE, n, lease_timeout=timeout)
        assert len(got) <= n
        out = self.order.leased(got, now)
        want = now + int((timeout or LEASE_TIMEOUT) * 1000)
        assert all(x.lease_deadline_ms == want for x in got), (now, got)
        for x in got:
            self.ids[x.token] = x.id
        self.held += out
        self.tally["leased"] += len(out)
        self.tally["lease calls"] += 1
        self.tally["empty lease calls"] += not out
        self.tally["lists with several items of a group"] += any(
            a.group is not None and a.group == b.group for a, b in itertools.pairwise(out))
        return out

    async def _sync_dead(self) -> None:
        """Mark the items found in the dead-letter queue (read from the store) dead."""
        for item in await self._dead_letters():
            if item not in self.order.finished:
                assert item in self.dead_retried or (
                    self.order.attempts.get(item, 0) >= MAX_ATTEMPTS), (
                    f"{item} dead-lettered after {self.order.attempts.get(item, 0)} attempts")
                self.order.dead(item)
                self.tally["dead-lettered"] += 1

    async def _dead_letters(self) -> list[str]:
        """The payloads in the dead-letter queue, as often as each is there."""
        m = await read_manifest(self.store, NS, DLQ)
        out: list[str] = []
        for sm in m.segments:
            if sm.id not in self.dlq_items:
                seg = decode_segment((await self.store.get(segment_key(NS, DLQ, sm.id))).data)
                self.dlq_items[sm.id] = [i.payload.decode() for i in seg.items[:sm.count]]
            out += self.dlq_items[sm.id]
        return out

    # -- complete and retry ----------------------------------------------------------
    def _pick(self, data: st.DataObject, current: bool) -> Delivery | None:
        """A delivery handed out: mostly a current one; sometimes any, maybe stale
        (its item handed out again, or the delivery completed or retried already).
        The draws have the same shape whatever the state (hypothesis replays them)."""
        kind = data.draw(st.sampled_from(["current", "current", "current", "any"]),
                         label="kind")
        pick = data.draw(st.integers(0, 1 << 16), label="delivery")
        live = [d for d in self.held if self.order.current(d)]
        pool = live if kind == "current" or current else self.held + self.spent
        return pool[pick % len(pool)] if pool else None

    @precondition(lambda self: self.held)
    @rule(e=ENGINE, data=st.data())
    @guarded
    def complete(self, e: int, data: st.DataObject) -> None:
        how_many = data.draw(st.integers(1, 3), label="how many")
        picked = [self._pick(data, False) for _ in range(how_many)]
        deliveries = list(dict.fromkeys(d for d in picked if d is not None))
        if deliveries:
            self.run(self._complete(self.engines[e], deliveries))

    async def _complete(self, engine: Engine, deliveries: list[Delivery]) -> None:
        await self._sync_dead()
        # Completing a delivery that completed its item is a no-op; any other stale
        # delivery is refused.
        expect_fail = [n for n, d in enumerate(deliveries) if not self.order.current(d)
                       and self.order.completed.get(d.item) is not d]
        fresh = [d for d in deliveries if self.order.current(d)]
        self.busy |= {d.token for d in deliveries}
        try:
            await engine.complete([d.token for d in deliveries])
            failed: list[int] = []
        except LeaseLost as exc:
            failed = [f["index"] for f in exc.details["failed"]]
        finally:
            self.busy -= {d.token for d in deliveries}
        assert failed == expect_fail, (
            f"complete refused {failed}, expected {expect_fail}: {deliveries}")
        for d in fresh:
            self.order.complete(d)
        self._forget_released()
        self.tally["completed"] += len(fresh)
        self.tally["stale tokens refused"] += len(failed)

    @precondition(lambda self: any(self.order.current(d) for d in self.held))
    @rule(e=ENGINE, data=st.data(), mode=st.sampled_from(["now", "now", "later", "dead"]),
          delay=st.integers(1, 15_000))
    @guarded
    def retry(self, e: int, data: st.DataObject, mode: str, delay: int) -> None:
        self.run(self._sync_dead())  # an item a lease dead-lettered is no longer held
        d = self._pick(data, True)
        if d is not None:
            self.run(self._retry(self.engines[e], d, mode, delay))

    async def _retry(self, engine: Engine, d: Delivery, mode: str, delay: int) -> None:
        now = engine.clock.now_ms()
        if any(t.call == d.call and t.group == d.group and d.group is not None
               and t.position > d.position and self.order.current(t) and t.deadline > now
               for t in self.held):
            self.tally["heads retried with the rest of their handout in flight"] += 1
        at = now + delay if mode == "later" else None
        # Recorded first: a writer overtaking the retry's writes may find the item
        # waiting again, or already in the dead-letter queue.
        self.order.retried(d)
        if mode == "dead":
            self.dead_retried.add(d.item)
        self.busy.add(d.token)  # no overtaking writer completes it meanwhile
        try:
            await engine.retry(d.token, retry_at_ms=at, dead=mode == "dead")
        finally:
            self.busy.discard(d.token)
        self.tally[f"retried {mode}"] += 1
        self._forget_released()

    def _forget_released(self) -> None:
        """Keep the deliveries neither completed nor retried (current ones, and those
        superseded: their item handed out again, or dead-lettered) as held, and the
        last few released as spent (their tokens are stale, or complete no-ops)."""
        self.spent = (self.spent + [d for d in self.held if not d.open])[-8:]
        self.held = [d for d in self.held if d.open]

    # -- time and the compactor ------------------------------------------------------
    @rule(ms=st.one_of(st.integers(0, 3_000), st.integers(9_000, 16_000)))
    @guarded
    def advance(self, ms: int) -> None:
        self.clock.advance(ms / 1000)

    @rule(merge_target=st.sampled_from([2, 5, 1_000]))
    @guarded
    def compact(self, merge_target: int) -> None:
        c = Compactor(self.compactor_engine, clock=self.clock, options=CompactorOptions(
            min_age=0, merge_below=1_000, merge_target=merge_target))
        report = self.run(c.run_once())
        self.tally["compactor passes"] += 1
        self.tally["segments merged"] += report.segments_merged
        self.tally["segments folded"] += report.segments_folded

    # -- faults -----------------------------------------------------------------------
    @precondition(lambda self: self.FAULTS)
    @rule(e=ENGINE, obj=st.sampled_from(["manifest", "lease", "lease", "dlq"]),
          how=st.sampled_from(["ambiguous", "engine", "engine", "rewrite"]),
          pick=st.integers(0, 11))
    @guarded
    def fault_next_write(self, e: int, obj: str, how: str, pick: int) -> None:
        """Engine e's next write to ``obj`` lands and its writer sees an error; with
        ``engine`` or ``rewrite``, another writer writes the object in between."""
        exact = {"manifest": manifest_key(NS, QUEUE), "dlq": manifest_key(NS, DLQ)}.get(obj)
        prefix = lease_key(NS, QUEUE, "")

        def match(key: str) -> bool:
            return not self.in_hook and (key == exact if exact else key.startswith(prefix))

        if how == "ambiguous":
            self.faulty[e].inject("put", "ambiguous", key=match)
        else:
            hook = functools.partial(self._overtake, e, how, pick)
            self.faulty[e].inject("put", "overtaken", key=match, then=hook)
        self.tally["faults armed"] += 1

    async def _overtake(self, e: int, how: str, pick: int, key: str) -> None:
        self.in_hook = True
        try:
            other = self.engines[1 - e]
            bystander = self._bystander(key, pick)
            if how == "engine" and key == manifest_key(NS, QUEUE):
                await self._produce(other, [(("a", "b", None)[pick % 3], None)] * (1 + pick % 2))
                what = "a produce"
            elif how == "engine" and bystander is not None:
                await self._complete(other, [bystander])
                what = "a completion"
            else:
                await self._rewrite(key)
                what = "a rewrite"
            self.tally[f"writes overtaken by {what}"] += 1
        finally:
            self.in_hook = False

    def _bystander(self, key: str, pick: int) -> Delivery | None:
        """A current delivery of another item of the lease object ``key``, unexpired
        (so the interrupted operation cannot be leasing it again)."""
        seg = key.rpartition("/")[2]
        if key != lease_key(NS, QUEUE, seg):
            return None
        now = self.clock.now_ms()
        pool = [d for d in self.held if self.order.current(d) and d.token not in self.busy
                and self.ids[d.token].startswith(f"{seg}.") and d.deadline > now]
        return pool[pick % len(pool)] if pool else None

    async def _rewrite(self, key: str) -> None:
        await rewrite_unchanged(self.store, key)

    # -- the end: drain everything --------------------------------------------------
    def teardown(self) -> None:
        try:
            if not self.failed:
                self.run(self._drain())
                self.tally["drained examples"] += 1
        finally:
            try:
                for engine in [*self.engines, self.compactor_engine]:
                    self.run(engine.close())
            finally:
                close_loop(self.loop)

    async def _drain(self) -> None:
        """Past every deadline and schedule, lease and complete everything left on both
        engines, in turn; then each item is completed or dead-lettered, once."""
        for faulty in self.faulty:
            faulty.clear()
        # Past every lease, retry time and schedule, and past the dead-letter queue's
        # idempotency window: an engine that helped a dead-letter move from a stale
        # copy then would publish it again (test_ordered.py,
        # test_a_stale_copy_never_dead_letters_twice, found by this test).
        self.clock.advance(3600)
        idle = rounds = 0
        while idle < 2:
            rounds += 1
            assert rounds < 500, "the drain does not end"
            got_any = False
            for engine in self.engines:
                got = await self._lease(engine, 5, None)
                if got:
                    got_any = True
                    await self._complete(engine, got)
                    self.tally["drained"] += len(got)
            if not got_any:
                idle += 1
                self.clock.advance(2)  # the engines' caches age out
        await self._sync_dead()
        left = self.order.unfinished()
        assert not left, f"items never finished (lost?): {sorted(left)}"
        dead = Counter(await self._dead_letters())
        assert all(c == 1 for c in dead.values()), f"dead-lettered twice: {dead}"
        assert not set(dead) & set(self.order.completed), "completed and dead-lettered"
        assert set(dead) | set(self.order.completed) == set(self.order.group)
        m = await read_manifest(self.store, NS, QUEUE)
        assert m.produced == len(self.order.group), "an item was published twice"
        self.order.check_first_handouts()


class FaultyMachine(OrderedMachine):
    FAULTS = True


def _check(machine: type[OrderedMachine], label: str, examples: int,
           monkeypatch: pytest.MonkeyPatch) -> None:
    # Deterministic segment ids (publishes and merges), so that hypothesis can replay.
    n = itertools.count(1)

    def segment_id(now_ms: int) -> str:
        return f"{now_ms:012x}-{next(n) * 0x9E3779B1 % (1 << 40):010x}"

    monkeypatch.setattr(publisher, "new_segment_id", segment_id)
    monkeypatch.setattr(compactor.core, "new_segment_id", segment_id)
    machine.tally = Counter()
    began = time.monotonic()
    cell_log = logging.getLogger("okq.cell")  # every injected fault logs a warning
    level = cell_log.level
    cell_log.setLevel(logging.ERROR if machine.FAULTS else level)
    try:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=examples,
            stateful_step_count=40,
            deadline=None,
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ))
    finally:
        cell_log.setLevel(level)
    c = machine.tally
    if os.environ.get("OKQ_PROPERTY_TALLY"):
        print("\n", dict(c))
    print(f"\nokq ordered property [{label}]: {c['examples']} examples "
          f"({c['drained examples']} drained), {c['lease calls']} lease calls handing out "
          f"{c['leased']} items ({c['lists with several items of a group']} lists with "
          f"several items of a group), {c['completed']} completions, "
          f"{c['dead-lettered']} dead letters, {c['segments merged']} segments merged, "
          f"{c['heads retried with the rest of their handout in flight']} heads retried "
          "with the rest of their handout in flight; "
          f"order and one handout of a group in flight held ({time.monotonic() - began:.1f}s)")


def test_ordered_queue_two_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    _check(OrderedMachine, "two engines", _examples(25, 300), monkeypatch)


def test_ordered_queue_two_engines_faulty_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    _check(FaultyMachine, "two engines, ambiguous and overtaken writes", _examples(25, 300),
           monkeypatch)

