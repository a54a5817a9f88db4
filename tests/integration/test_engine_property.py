"""Stateful property tests: the Engine against a small reference model.

Hypothesis drives random sequences of produce / lease / renew / complete /
retry / clock moves against real engines on a real store, and a plain-Python
model of the lease semantics (okq/leases.py) predicts every answer:

* every leased item was ready in the model (never one that is scheduled, held
  under a current unexpired lease, finished or dead), with the right attempt
  count, deadline and payload;
* a token is honoured exactly while its delivery is current (an expired lease
  that nobody re-leased is still current); a stale token is refused with
  LeaseLost and changes nothing (except that completing a delivery again, after
  that same delivery completed the item, succeeds as a no-op);
* each item is completed successfully at most once, and nothing is lost:
  ``stats`` (read fresh from the store) matches the model state by state
  after every step, and a final drain delivers every unfinished item exactly
  once more and finds every dead item exactly once in the dead-letter queue;
* nothing is published twice: the manifest lists each segment once and counts
  each item once, and payloads carry unique markers, so an item delivered under
  an id the model never saw produced is caught at once;
* producer idempotency: a key produced again within the window (300 s on the
  true clock), on whichever engine, returns the first item's id; a key may be
  honoured a little longer (up to four times the skew bound more, 540 s in all:
  a writer stamps its expiry on its own clock, with any margin it adds for skew,
  and a reader reads it on another), and is forgotten after that.

Configurations (one test each):

* one engine on a MemoryStore, and one on a FileStore: the model is exact:
  ``lease(n)`` returns min(n, leasable ready items), oldest ready time first;
* two engines sharing a store: an engine's caches may lag the other's writes
  (``lease_state_max_age``), so only the safety properties are checked;
* two engines whose writes are sometimes *overtaken* (FaultyStore's
  ``overtaken`` mode): a manifest or lease-object write lands, another writer
  writes the same object, and only then does the first writer see an error; its
  re-read finds someone else's version on top of its own. The other writer is
  the other engine, producing (on the manifest) or renewing, completing or
  retrying another item of the segment (on a lease object), each checked
  against the model like any step; or a writer outside the model that rewrites
  the object unchanged under a new version (as a compactor pass that found
  nothing to change);
* two engines whose clocks are off the true time by up to the documented skew
  bound (``okq.clock.MAX_CLOCK_SKEW_MS``, 60 s either way, so up to 120 s
  apart), drawn per example with the extremes favoured. The model keeps every
  time as the engine that wrote it stamped it and judges readiness on the clock
  of the engine that reads, as okq does; an item produced without a schedule
  (or scheduled for no later than its produce) is ready at once on every clock,
  a scheduled one when the reader's clock reaches its time. A node that has just
  started (no caches) leases
  exactly min(n, ready items on its clock), and stats read on either engine's
  clock match the model;
* both at once: skewed clocks and overtaken writes.

Which exhausted items a lease moves to the dead-letter queue is read back from
the lease objects in the store (ties in ready time make it ambiguous), and
checked against the model.

The engine is async; hypothesis's stateful machines are not, so each machine
runs its own private event loop. Run with ``-s`` for a one-line summary per
configuration. Example counts are short by default (CI); the long form:
``OKQ_PROPERTY_EXAMPLES=long pytest tests/integration/test_engine_property.py -s``
(or a number: that many examples for every configuration; add ``--timeout 0``
when a failure must shrink for longer than pytest's 300 s).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from okq import (
    Engine,
    EngineOptions,
    ManualClock,
    NewItem,
    QueueConfig,
    TokenSigner,
    generate_key,
    publisher,
)
from okq import clock as okq_clock
from okq.clock import Clock, OffsetClock, SystemClock
from okq.errors import LeaseLost, ObjectNotFound
from okq.keys import lease_key, manifest_key, segment_created_ms
from okq.leases import DEAD, DEAD_PENDING, ItemState, decode_lease, encode_lease
from okq.manifests import ManifestCodec, read_manifest
from okq.model import encode_manifest, new_nonce
from okq.store import FaultyStore, FileStore, MemoryStore, Store

T = TypeVar("T")

NS = "default"
QUEUE, DLQ = "q", "dlq"
LEASE_TIMEOUT = 10.0  # seconds
IDEM_WINDOW_MS = int(EngineOptions().idem_window * 1000)
#: The documented clock-skew bound: each clock within this of the true time.
SKEW_MS: int = getattr(okq_clock, "MAX_CLOCK_SKEW_MS", 60_000)  # unnamed before issue 8
#: How much longer than its window a key may still be honoured: a writer may add
#: twice the bound to the expiry it stamps on its clock, and a reader up to twice
#: the bound behind reads it on another.
IDEM_SLACK_MS = 4 * SKEW_MS
KEY = generate_key()

# ---------------------------------------------------------------------------
# The reference model
# ---------------------------------------------------------------------------

FRESH, LEASED, WAITING, DONE, GONE = "fresh", "leased", "waiting", "done", "dead"
#: The store's state letter for each model state (DONE also covers P).
STORE_STATE = {LEASED: "L", WAITING: "W", DONE: "D", GONE: "Z"}


@dataclass
class Item:
    id: str
    payload: bytes
    fresh_ready: int  # its place in line while fresh: max(produce time, enqueue_at)
    due: int  # when it may first be leased: enqueue_at if after its produce, else 0 (at once)
    state: str = FRESH
    v: int = 0  # deliveries so far, counting a lease that dead-lettered instead
    attempts: int = 0
    t: int = 0  # LEASED: deadline; WAITING: ready time
    completions: int = 0

    def ready_at(self) -> int | None:
        """When it can next be leased, as stamped by the engine that wrote it."""
        if self.state == FRESH:
            return self.due
        if self.state in (LEASED, WAITING):
            return self.t  # an expired lease is ready again at its deadline
        return None

    def ready(self, now: int) -> bool:
        r = self.ready_at()
        return r is not None and r <= now

    def order_at(self) -> int:
        """Its place in the line of ready items (oldest first)."""
        return self.fresh_ready if self.state == FRESH else self.t

    def describe(self, now: int) -> str:
        if self.state == FRESH:
            return f"fresh (due {f'{self.due - now:+d}ms' if self.due else 'at once'})"
        return f"{self.state} (v={self.v}, attempts={self.attempts}, t={self.t - now:+d}ms)"


@dataclass(frozen=True)
class Tok:
    token: str
    item: str
    v: int


class Model:
    def __init__(self, max_attempts: int) -> None:
        self.max_attempts = max_attempts
        self.items: dict[str, Item] = {}
        self.segments: list[str] = []
        # key -> every item published under it: (item id, true time of its produce)
        self.idem: dict[str, list[tuple[str, int]]] = {}
        self.dead: dict[str, tuple[int, str | None]] = {}  # source id -> (attempts, error)

    def current(self, tok: Tok) -> bool:
        it = self.items[tok.item]
        return it.state == LEASED and it.v == tok.v

    def exhausted(self, it: Item) -> bool:
        """Out of attempts: leasing it moves it to the dead-letter queue instead."""
        return bool(self.max_attempts) and it.attempts >= self.max_attempts

    def completed_by(self, tok: Tok) -> bool:
        """The item was completed by this very delivery (a repeat is accepted)."""
        it = self.items[tok.item]
        return it.state == DONE and it.v == tok.v

    def key_ids(self, key: str, true_now: int) -> tuple[list[str], bool]:
        """The ids a produce of ``key`` may answer instead of publishing (those of
        items published under it within the window and its slack), and whether it
        must (one of them is within the window). An older one may still be live on
        a reader's clock, or in its cached manifest, after a writer whose clock is
        ahead published the key again: answering it publishes nothing twice."""
        entries = self.idem.get(key, [])
        ids = [iid for iid, t in entries if true_now - t < IDEM_WINDOW_MS + IDEM_SLACK_MS]
        return ids, any(true_now - t < IDEM_WINDOW_MS for _, t in entries)

    def lease(self, it: Item, now: int, lease_ms: int) -> None:
        it.v += 1
        it.attempts += 1
        it.state, it.t = LEASED, now + lease_ms

    def to_dead(self, it: Item, error: str | None) -> None:
        it.state = GONE
        self.dead[it.id] = (it.attempts, error)

    def complete(self, it: Item) -> None:
        it.state = DONE
        it.completions += 1
        assert it.completions == 1, f"{it.id} completed {it.completions} times"

    def retry(
        self, it: Item, now: int, retry_at: int | None, dead: bool, error: str | None
    ) -> None:
        if dead or self.exhausted(it):
            self.to_dead(it, error)
        else:
            it.state, it.t = WAITING, max(now, retry_at or now)

    def counts(self, now: int) -> dict[str, int]:
        """What Engine.stats reports on a clock reading ``now``, by its own definitions."""
        c = dict.fromkeys(
            ("available", "in_flight", "scheduled", "waiting_retry", "completed",
             "dead_lettered"), 0,
        )
        for it in self.items.values():
            r = it.ready_at()
            if it.state == LEASED and it.t > now:
                c["in_flight"] += 1
            elif r is not None and r <= now:
                c["available"] += 1
            elif it.state == FRESH:
                c["scheduled"] += 1
            elif it.state == WAITING:
                c["waiting_retry"] += 1
            elif it.state == DONE:
                c["completed"] += 1
            else:
                assert it.state == GONE, it
                c["dead_lettered"] += 1
        return c


def differences(model: Model, states: dict[str, ItemState], now: int) -> list[str]:
    """Items whose state in the store is not the model's, described for a report."""
    out: list[str] = []
    for iid, it in model.items.items():
        s = states.get(iid)
        got = "fresh" if s is None else f"{s.s} v={s.v} attempts={s.attempts} t={s.t - now:+d}ms"
        if it.state == FRESH and s is None:
            continue
        letters = ("D", "P") if it.state == DONE else ("Z", "X") if it.state == GONE else ()
        want = STORE_STATE.get(it.state)
        if s is not None and (s.s == want or s.s in letters) and s.v == it.v:
            continue
        out.append(f"{iid}: model {it.describe(now)}, store {got}")
    return out


# ---------------------------------------------------------------------------
# The state machine
# ---------------------------------------------------------------------------

ENGINE = st.integers(min_value=0, max_value=1)  # taken modulo the number of engines
LEASE_TIMEOUTS = st.sampled_from([None, None, None, 0.5, 3.0, 25.0])
ERRORS = st.sampled_from([None, "", "boom", "x" * 5000])
#: Two clocks' offsets from the true time, within the bound: half the time the
#: extremes, 120 s apart; else anything within it.
OFFSET = st.one_of(st.sampled_from([-SKEW_MS, SKEW_MS, 0]), st.integers(-SKEW_MS, SKEW_MS))
CLOCK_PAIRS = st.one_of(
    st.sampled_from([(-SKEW_MS, SKEW_MS), (SKEW_MS, -SKEW_MS)]), st.tuples(OFFSET, OFFSET)
)


def guarded(fn: Callable[..., None]) -> Callable[..., None]:
    """Count steps, and remember a failure so teardown skips the final drain."""

    @functools.wraps(fn)
    def wrapper(self: EngineMachine, *args: Any, **kwargs: Any) -> None:
        if not fn.__name__.startswith("check_"):
            self.tally["steps"] += 1
        try:
            fn(self, *args, **kwargs)
        except BaseException:
            self.failed = True
            raise

    return wrapper


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Close a machine's event loop, cancelling what is left on it (only after a
    failure: the engines' closes settle their own tasks)."""
    left = asyncio.all_tasks(loop)
    if left:
        for task in left:
            task.cancel()

        async def settle() -> None:
            await asyncio.gather(*left, return_exceptions=True)

        loop.run_until_complete(settle())
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()


async def rewrite_unchanged(store: Store, key: str) -> None:
    """A writer a model does not see (a compactor pass that found nothing to change,
    say) writes a manifest or lease object again: the same content, a new version."""
    blob = await store.get(key)
    if "/manifests/" in key:
        codec = ManifestCodec(store, NS, key.rpartition("/")[2], SystemClock(), 0)
        await codec.load(blob.data)
        m = codec.decode(blob.data)
        m.ver, m.nonce = m.ver + 1, new_nonce()
        data = encode_manifest(m)
    else:
        o = decode_lease(blob.data)
        o.ver, o.nonce = o.ver + 1, new_nonce()
        data = encode_lease(o)
    await store.put(key, data, if_match=blob.etag)


class EngineMachine(RuleBasedStateMachine):
    ENGINES: ClassVar[int] = 1
    STORE: ClassVar[str] = "memory"
    MAX_ATTEMPTS: ClassVar[int] = 2
    #: Writes are sometimes overtaken (see the module docstring).
    FAULTS: ClassVar[bool] = False
    #: Each engine's clock is off the true time (set by ``skew_clocks``); adds
    #: far clock moves and leases by newly started engines.
    SKEWED: ClassVar[bool] = False
    tally: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.tally["examples"] += 1
        self.failed = False
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()  # the true time
        self.tmp: str | None = None
        if self.STORE == "file":
            self.tmp = tempfile.mkdtemp(prefix="okq-prop-")
            self.store: Store = FileStore(self.tmp)
        else:
            self.store = MemoryStore()
        self.clocks: list[Clock] = [
            OffsetClock(self.clock, 0) if self.SKEWED else self.clock
            for _ in range(self.ENGINES)
        ]
        self.faulty = [FaultyStore(self.store) for _ in range(self.ENGINES if self.FAULTS else 0)]
        signer = TokenSigner([KEY])
        opts = EngineOptions(linger=0)
        self.engines = [
            Engine(self.faulty[n] if self.FAULTS else self.store, signer, clock=clock,
                   options=opts)
            for n, clock in enumerate(self.clocks)
        ]
        self.signer, self.opts = signer, opts
        self.exact = self.ENGINES == 1
        self.model = Model(self.MAX_ATTEMPTS)
        self.tokens: list[Tok] = []
        self.busy: set[str] = set()  # items whose renew or retry is in flight
        self.in_hook = False  # another writer is overtaking a write: no nested faults
        self.hooks = 0  # other writers run so far
        self.payloads = 0
        self.run(self._setup())

    async def _setup(self) -> None:
        await self.engines[0].start()
        await self.engines[0].create_queue(DLQ)
        await self.engines[0].create_queue(
            QUEUE,
            QueueConfig(
                lease_timeout=LEASE_TIMEOUT, max_attempts=self.MAX_ATTEMPTS, dead_queue=DLQ
            ),
        )

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def engine(self, n: int) -> Engine:
        return self.engines[n % len(self.engines)]

    def observers(self) -> list[Engine]:
        """The engines whose stats are compared with the model.

        With one engine, that engine. With several, a new engine each time, so the
        counts are the store's truth: stats refreshes the caches of the engine it
        runs on (which would hide the staleness of the engines under test), and a
        long-lived observer's manifest cache is reused by ``Cell.read(max_age_ms=0)``
        until the clock moves past its fetch, which a manual clock may never do.
        With skewed clocks, one on each engine's clock: readiness is a matter of
        the reader's clock.
        """
        if len(self.engines) == 1:
            return self.engines[:1]
        clocks = self.clocks if self.SKEWED else [self.clock]
        return [Engine(self.store, self.signer, clock=c, options=self.opts) for c in clocks]

    def now(self) -> int:
        """The true time."""
        return self.clock.now_ms()

    # -- produce -----------------------------------------------------------
    @rule(
        e=ENGINE,
        specs=st.lists(
            st.tuples(
                st.one_of(st.none(), st.integers(-5_000, 20_000)),  # enqueue_at - now
                st.one_of(st.none(), st.none(), st.sampled_from(["k0", "k1", "k2"])),
            ),
            min_size=1,
            max_size=5,
        ),
    )
    @guarded
    def produce(self, e: int, specs: list[tuple[int | None, str | None]]) -> None:
        self.run(self._produce(self.engine(e), specs))

    async def _produce(self, engine: Engine, specs: list[tuple[int | None, str | None]]) -> None:
        now, true_now = engine.clock.now_ms(), self.now()
        batch: list[NewItem] = []
        for delay, key in specs:
            self.payloads += 1
            at = None if delay is None else now + delay
            batch.append(NewItem(f"p{self.payloads}".encode(), enqueue_at_ms=at, key=key))
        ids = await engine.produce(QUEUE, batch)
        assert len(ids) == len(batch)
        fresh = self._published(batch, ids, true_now)
        if fresh:
            self._record_segment(batch, ids, fresh, now, true_now)

    def _published(self, batch: list[NewItem], ids: list[str], true_now: int) -> list[int]:
        """Which items of a produce were published (their indexes). A key produced
        within the window must have answered an earlier item's id; past the window,
        within the slack, it may go either way; anything else was published."""
        fresh: list[int] = []
        first: dict[str, str] = {}  # key -> the id its first use in this batch got
        for i, item in enumerate(batch):
            key = item.key
            if key is not None and key in first:
                assert ids[i] == first[key], f"key {key} twice in one produce: {ids[i]}"
                continue
            if key is None or not self._deduplicated(key, ids[i], true_now):
                fresh.append(i)
            if key is not None:
                first[key] = ids[i]
        return fresh

    def _deduplicated(self, key: str, got: str, true_now: int) -> bool:
        """Whether a produce of ``key`` answered ``got`` instead of publishing."""
        known, must = self.model.key_ids(key, true_now)
        ages = [true_now - t for _, t in self.model.idem.get(key, [])]
        assert got in known or not must, (
            f"idempotency key {key} produced a second item {got} {min(ages)} ms (true time) "
            f"after an earlier produce of it ({known}), within the {IDEM_WINDOW_MS} ms window"
        )
        return got in known

    def _record_segment(
        self, batch: list[NewItem], ids: list[str], fresh: list[int], now: int, true_now: int
    ) -> None:
        m = self.model
        seg = ids[fresh[0]].rpartition(".")[0]
        assert seg not in m.segments, f"segment {seg} published twice"
        assert segment_created_ms(seg) == now
        m.segments.append(seg)
        for n, i in enumerate(fresh):
            assert ids[i] == f"{seg}.{n}", (
                f"produce returned {ids}; items {fresh} were published, as {seg}.0 onwards"
            )
            item = batch[i]
            at = item.enqueue_at_ms
            due = at if at is not None and at > now else 0
            m.items[ids[i]] = Item(ids[i], item.payload, max(now, at or 0), due)
            if item.key is not None:
                m.idem.setdefault(item.key, []).append((ids[i], true_now))

    # -- lease ---------------------------------------------------------------
    @rule(e=ENGINE, n=st.integers(1, 5), timeout=LEASE_TIMEOUTS)
    @guarded
    def lease(self, e: int, n: int, timeout: float | None) -> None:
        self.run(self._lease(self.engine(e), n, timeout, "order" if self.exact else None))

    @precondition(lambda self: self.SKEWED)
    @rule(e=ENGINE, n=st.integers(1, 5))
    @guarded
    def lease_on_a_new_engine(self, e: int, n: int) -> None:
        """A node that has just started (no caches) on engine e's clock leases
        exactly min(n, items ready on its clock), whoever produced them."""
        cold = Engine(self.store, self.signer, clock=self.clocks[e % len(self.clocks)],
                      options=self.opts)
        try:
            self.run(self._lease(cold, n, None, "count"))
        finally:
            self.run(cold.close())

    async def _lease(
        self, engine: Engine, n: int, timeout: float | None, check: str | None
    ) -> list[Tok]:
        """Lease on ``engine`` and check the items against the model. ``check``:
        "order" (one engine: exactly the oldest ready items), "count" (exactly
        min(n, leasable)), or None (safety only: caches may lag)."""
        m, now = self.model, engine.clock.now_ms()
        ready, leasable = self._ready(now)
        lease_ms = int(timeout * 1000) if timeout else int(LEASE_TIMEOUT * 1000)
        hooks = self.hooks
        got = await engine.lease(QUEUE, n, lease_timeout=timeout)
        if self.hooks != hooks:  # another writer released items meanwhile: fair game too
            more_ready, more_leasable = self._ready(now)
            ready.update(more_ready)
            leasable |= more_leasable
        leased = [x.id for x in got]
        assert len(set(leased)) == len(leased), f"one lease returned an item twice: {leased}"
        assert len(got) <= n
        toks: list[Tok] = []
        for x in got:
            it = m.items.get(x.id)
            assert it is not None, f"leased {x.id}, which was never produced"
            assert x.id in leasable, f"leased {x.id}, which the model has {it.describe(now)}"
            assert x.attempts == it.attempts + 1, (x, it)
            assert x.lease_deadline_ms == now + lease_ms, (x, now, lease_ms)
            assert x.payload == it.payload
            m.lease(it, now, lease_ms)
            toks.append(Tok(x.token, x.id, it.v))
        self.tokens += toks
        self.tally["leased"] += len(got)
        moved = await self._moved_to_dead(ready, leasable, now)
        if check == "order":
            self._check_lease_choice(n, ready, leasable, leased, moved)
        elif check == "count":
            self._check_lease_count(n, ready, leasable, leased, moved)
        return toks

    def _ready(self, now: int) -> tuple[dict[str, int], set[str]]:
        """Items ready on a clock reading ``now`` (with their places in line), and
        those of them a lease would deliver rather than dead-letter."""
        m = self.model
        ready = {i: it.order_at() for i, it in m.items.items() if it.ready(now)}
        return ready, {i for i in ready if not m.exhausted(m.items[i])}

    async def _moved_to_dead(self, ready: dict[str, int], leasable: set[str],
                             now: int) -> set[str]:
        """Items this lease moved to the dead-letter queue, read from the store."""
        m = self.model
        states = await self._store_states()
        moved: set[str] = set()
        for iid, it in m.items.items():
            s = states.get(iid)
            if it.state == GONE or s is None or s.s not in (DEAD_PENDING, DEAD):
                continue
            assert iid in ready and iid not in leasable, (
                f"a lease dead-lettered {iid}, which the model has {it.describe(now)}"
            )
            assert s.s == DEAD, f"{iid} stuck half-way to the dead-letter queue: {s}"
            assert s.v == it.v + 1 and s.attempts == it.attempts, (s, it)
            it.v += 1
            m.to_dead(it, None)  # a lease resets the error; the expired delivery had none
            self.tally["dead-lettered by lease"] += 1
            moved.add(iid)
        return moved

    def _check_lease_count(
        self, n: int, ready: dict[str, int], leasable: set[str], leased: list[str],
        moved: set[str],
    ) -> None:
        assert len(leased) == min(n, len(leasable)), (
            f"lease({n}) returned {len(leased)} items with {len(leasable)} leasable ready "
            f"on its clock ({len(ready) - len(leasable)} more ready but out of attempts; "
            f"{len(moved)} of those dead-lettered by this lease)"
        )

    def _check_lease_choice(
        self, n: int, ready: dict[str, int], leasable: set[str], leased: list[str],
        moved: set[str],
    ) -> None:
        """One engine: the lease took a prefix of the ready items, oldest first,
        dead-lettering the exhausted ones it met, until n were leased."""
        self._check_lease_count(n, ready, leasable, leased, moved)
        taken = set(leased) | moved
        rest = set(ready) - taken
        if taken and rest:
            assert max(ready[i] for i in taken) <= min(ready[i] for i in rest), (
                "lease did not take the oldest ready items first"
            )
        if len(leased) < n:
            assert not rest, f"lease({n}) returned {len(leased)} but left ready items {rest}"
        elif moved:
            assert max(ready[i] for i in moved) <= max(ready[i] for i in leased), (
                "lease dead-lettered items that come after the ones it leased"
            )

    async def _store_states(self) -> dict[str, ItemState]:
        out: dict[str, ItemState] = {}
        for seg in self.model.segments:
            try:
                blob = await self.store.get(lease_key(NS, QUEUE, seg))
            except ObjectNotFound:
                continue
            for idx, s in decode_lease(blob.data).items.items():
                out[f"{seg}.{idx}"] = s
        return out

    # -- token operations ----------------------------------------------------
    def _pick_token(self, data: st.DataObject) -> Tok:
        """Mostly a current token, sometimes a stale one, sometimes any.

        The draws have the same shape whatever the state: with two engines the
        state is not reproducible (ties between segments published in the same
        millisecond go by their random ids), and hypothesis must replay draws."""
        kind = data.draw(st.sampled_from(["current", "current", "stale", "any"]), label="kind")
        pick = data.draw(st.integers(0, 1 << 16), label="token")
        current = [t for t in self.tokens if self.model.current(t)]
        stale = [t for t in self.tokens if not self.model.current(t)]
        pool = {"current": current, "stale": stale}.get(kind) or self.tokens
        return pool[pick % len(pool)]

    def _refused(self, exc: LeaseLost | None, tok: Tok, what: str) -> None:
        now = self.now()
        it = self.model.items[tok.item]
        if self.model.current(tok):
            assert exc is None, (
                f"{what} refused the current delivery v={tok.v} of {tok.item} "
                f"({it.describe(now)}): {exc and exc.message}"
            )
        else:
            assert exc is not None, (
                f"{what} accepted stale delivery v={tok.v} of {tok.item} ({it.describe(now)})"
            )
            self.tally["refused"] += 1

    @precondition(lambda self: self.tokens)
    @rule(e=ENGINE, data=st.data(), timeout=LEASE_TIMEOUTS)
    @guarded
    def renew(self, e: int, data: st.DataObject, timeout: float | None) -> None:
        self.run(self._renew(self.engine(e), self._pick_token(data), timeout))

    async def _renew(self, engine: Engine, tok: Tok, timeout: float | None) -> None:
        now = engine.clock.now_ms()
        lease_ms = int(timeout * 1000) if timeout else int(LEASE_TIMEOUT * 1000)
        self.busy.add(tok.item)
        try:
            deadline = await engine.renew(tok.token, lease_timeout=timeout)
        except LeaseLost as exc:
            self._refused(exc, tok, "renew")
            return
        finally:
            self.busy.discard(tok.item)
        self._refused(None, tok, "renew")
        self.tally["renewed"] += 1
        assert deadline == now + lease_ms
        self.model.items[tok.item].t = deadline

    @precondition(lambda self: self.tokens)
    @rule(e=ENGINE, data=st.data())
    @guarded
    def complete(self, e: int, data: st.DataObject) -> None:
        how_many = data.draw(st.integers(1, 4), label="how many")
        toks = [self._pick_token(data) for _ in range(how_many)]
        self.run(self._complete(self.engine(e), toks))

    async def _complete(self, engine: Engine, toks: list[Tok]) -> None:
        m = self.model
        expect_fail: list[int] = []
        ok: list[Tok] = []
        for n, tok in enumerate(toks):  # applied in order
            if m.current(tok):
                m.complete(m.items[tok.item])
                ok.append(tok)
            elif not m.completed_by(tok):  # completing it again is a harmless no-op
                expect_fail.append(n)
        try:
            await engine.complete([t.token for t in toks])
            failed: list[int] = []
        except LeaseLost as exc:
            failed = [f["index"] for f in exc.details["failed"]]
        assert failed == expect_fail, (
            f"complete refused token indexes {failed}; the model refuses {expect_fail} "
            f"(tokens: {[(t.item, t.v) for t in toks]})"
        )
        self.tally["completed"] += len(ok)
        self.tally["refused"] += len(expect_fail)

    @precondition(lambda self: self.tokens)
    @rule(
        e=ENGINE,
        data=st.data(),
        mode=st.sampled_from(["now", "future", "past", "dead"]),
        delay=st.integers(1, 20_000),
        error=ERRORS,
    )
    @guarded
    def retry(self, e: int, data: st.DataObject, mode: str, delay: int, error: str | None) -> None:
        self.run(self._retry(self.engine(e), self._pick_token(data), mode, delay, error))

    async def _retry(
        self, engine: Engine, tok: Tok, mode: str, delay: int, error: str | None
    ) -> None:
        now = engine.clock.now_ms()
        at = {"now": None, "future": now + delay, "past": now - delay, "dead": None}[mode]
        self.busy.add(tok.item)
        try:
            await engine.retry(tok.token, retry_at_ms=at, dead=mode == "dead", error=error)
        except LeaseLost as exc:
            self._refused(exc, tok, "retry")
            return
        finally:
            self.busy.discard(tok.item)
        self._refused(None, tok, "retry")
        self.tally[f"retry {mode}"] += 1
        self.model.retry(self.model.items[tok.item], now, at, mode == "dead",
                         error[:4096] if error else None)

    # -- overtaken writes ------------------------------------------------------
    @precondition(lambda self: self.FAULTS)
    @rule(
        e=ENGINE,
        obj=st.sampled_from(["manifest", "lease", "lease", "dlq"]),
        how=st.sampled_from(["engine", "engine", "raw"]),
        pick=st.integers(0, 11),
    )
    @guarded
    def overtake_next_write(self, e: int, obj: str, how: str, pick: int) -> None:
        """Engine e's next write to ``obj`` (its queue's manifest, any of its
        lease objects, the dead-letter queue's manifest) lands, then another writer
        (``how``: the other engine, or a raw rewrite) writes the same object, then
        engine e sees an error."""
        n = e % len(self.engines)
        exact = {"manifest": manifest_key(NS, QUEUE), "dlq": manifest_key(NS, DLQ)}.get(obj)
        prefix = lease_key(NS, QUEUE, "")

        def match(key: str) -> bool:
            return not self.in_hook and (key == exact if exact else key.startswith(prefix))

        hook = functools.partial(self._overtake, n, how, pick)
        self.faulty[n].inject("put", "overtaken", key=match, then=hook)
        self.tally["overtakes armed"] += 1

    async def _overtake(self, e: int, how: str, pick: int, key: str) -> None:
        """The other writer: runs after engine e's write of ``key`` landed and
        before engine e sees its error."""
        self.in_hook = True
        self.hooks += 1
        try:
            other = self.engines[(e + 1) % len(self.engines)]
            tok = self._bystander(key, pick)
            if how == "engine" and key == manifest_key(NS, QUEUE):
                await self._produce(other, [(None, None)] * (1 + pick % 3))
                what = "by a produce"
            elif how == "engine" and tok is not None:
                what = await self._token_op(other, tok, pick)
            else:
                await self._rewrite(key)
                what = "by a rewrite"
            self.tally[f"writes overtaken {what}"] += 1
        finally:
            self.in_hook = False

    def _bystander(self, key: str, pick: int) -> Tok | None:
        """A current token of another item of the lease object ``key``: not under
        an operation in flight, and unexpired on every clock (so the interrupted
        operation cannot be re-leasing it)."""
        seg = key.rpartition("/")[2]
        if key != lease_key(NS, QUEUE, seg):
            return None
        latest = max(c.now_ms() for c in self.clocks)
        pool = [
            t for t in self.tokens
            if t.item.startswith(f"{seg}.") and self.model.current(t)
            and t.item not in self.busy and self.model.items[t.item].t > latest
        ]
        return pool[pick % len(pool)] if pool else None

    async def _token_op(self, engine: Engine, tok: Tok, pick: int) -> str:
        kind = ("renew", "complete", "retry", "dead-letter")[pick % 4]
        if kind == "renew":
            await self._renew(engine, tok, None)
        elif kind == "complete":
            await self._complete(engine, [tok])
        else:
            await self._retry(engine, tok, "now" if kind == "retry" else "dead", 0, None)
        return f"by a {kind}"

    async def _rewrite(self, key: str) -> None:
        await rewrite_unchanged(self.store, key)

    # -- time ------------------------------------------------------------------
    @rule(ms=st.one_of(st.integers(0, 3_000), st.integers(9_000, 40_000)))
    @guarded
    def advance(self, ms: int) -> None:
        self.clock.advance(ms / 1000)

    @precondition(lambda self: self.SKEWED)
    @rule(ms=st.integers(60_000, 200_000))
    @guarded
    def advance_far(self, ms: int) -> None:
        """Far enough to cross an idempotency window in a few steps."""
        self.clock.advance(ms / 1000)

    # -- invariants --------------------------------------------------------------
    @invariant()
    @guarded
    def check_stats_match_model(self) -> None:
        for observer in self.observers():
            now = observer.clock.now_ms()
            s = self.run(observer.stats(QUEUE))
            want = self.model.counts(now)
            got = {k: getattr(s, k) for k in want}
            if got != want:
                diff = differences(self.model, self.run(self._store_states()), now)
                raise AssertionError(
                    f"stats {got} != model {want} (read at {now - self.now():+d} ms from "
                    f"the true time); items that differ: {diff}"
                )
            assert sum(got.values()) == len(self.model.items), "an item is missing from stats"
            assert s.segments == len(self.model.segments)
            assert s.dead == len(self.model.dead), (
                f"dlq holds {s.dead}, model {len(self.model.dead)}"
            )
        assert all(it.completions <= 1 for it in self.model.items.values())

    @invariant()
    @guarded
    def check_published_once(self) -> None:
        """The manifest lists every published segment once and counts each item once."""
        m = self.run(read_manifest(self.store, NS, QUEUE))
        listed = [sm.id for sm in m.segments]
        twice = sorted(s for s, c in Counter(listed).items() if c > 1)
        assert not twice, f"the manifest lists segments {twice} more than once: {listed}"
        assert sorted(listed) == sorted(self.model.segments), (
            f"the manifest lists {listed}; published: {self.model.segments}"
        )
        assert m.produced == len(self.model.items), (
            f"the manifest counts {m.produced} items produced; published: {len(self.model.items)}"
        )

    # -- the end: drain everything -------------------------------------------
    def teardown(self) -> None:
        drained = False
        try:
            if not self.failed:
                self._drain()
                self.tally["drained examples"] += 1
            drained = True
        finally:
            try:
                for engine in self.engines:
                    self.run(engine.close())
            except Exception:
                if drained:  # else keep the failure that is already propagating
                    raise
            finally:
                self._close_loop()

    def _close_loop(self) -> None:
        close_loop(self.loop)
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _drain(self) -> None:
        """Past every deadline and schedule, lease and complete everything left:
        each unfinished item exactly once more (or dead-lettered when out of
        attempts); then every dead item is in the dead-letter queue exactly once.
        No queue is stuck: a lease returns items while any are ready."""
        for faulty in self.faulty:
            faulty.clear()  # armed faults that never fired: the drain runs clean
        m = self.model
        self.clock.advance(3600)
        pending = [it for it in m.items.values() if it.state not in (DONE, GONE)]
        want_delivered = {it.id for it in pending if not m.exhausted(it)}
        want_dead = {it.id for it in pending if m.exhausted(it)}
        before_dead = set(m.dead)
        delivered: list[str] = []
        idle = rounds = 0
        while idle < 2:
            rounds += 1
            assert rounds < 500, "drain does not terminate"
            got_any = False
            for engine in self.engines:
                toks = self.run(self._lease(engine, 5, None, None))
                if toks:
                    got_any = True
                    delivered += [t.item for t in toks]
                    self.run(self._complete(engine, toks))
            if not got_any:
                idle += 1
                self.clock.advance(2)  # let the engines' caches age out
        assert len(delivered) == len(set(delivered)), "drain delivered an item twice"
        assert set(delivered) == want_delivered, (
            f"drain delivered {sorted(set(delivered))}, expected {sorted(want_delivered)}"
        )
        assert set(m.dead) - before_dead == want_dead
        assert all(it.state in (DONE, GONE) for it in m.items.values())
        self.tally["drained"] += len(delivered)
        self.check_stats_match_model()
        self.check_published_once()
        self._drain_dlq()

    def _drain_dlq(self) -> None:
        seen: Counter[str] = Counter()
        engine = self.engines[0]
        while got := self.run(engine.lease(DLQ, 100)):
            for x in got:
                meta = x.meta or {}
                src = meta.get("source_id")
                seen[src] += 1
                assert src in self.model.dead, f"dead-letter queue holds unknown {src}: {meta}"
                attempts, error = self.model.dead[src]
                assert meta.get("source_queue") == QUEUE
                assert (meta.get("attempts"), meta.get("error")) == (attempts, error), meta
                assert x.payload == self.model.items[src].payload
            self.run(engine.complete([x.token for x in got]))
        assert set(seen) == set(self.model.dead), "dead items missing from the dead-letter queue"
        assert all(c == 1 for c in seen.values()), f"dead-lettered twice: {seen}"
        self.tally["dead-lettered"] += len(seen)


class FileMachine(EngineMachine):
    STORE = "file"
    MAX_ATTEMPTS = 3  # more retries below the limit; the memory runs are dead-letter heavy


class TwoEngineMachine(EngineMachine):
    ENGINES = 2


class OvertakenMachine(TwoEngineMachine):
    FAULTS = True


class SkewMachine(TwoEngineMachine):
    SKEWED = True

    @initialize(offsets=CLOCK_PAIRS)
    def skew_clocks(self, offsets: tuple[int, int]) -> None:
        """Each engine's clock off the true time by up to the bound."""
        for clock, offset in zip(self.clocks, offsets, strict=True):
            assert isinstance(clock, OffsetClock)
            clock.offset_ms = offset
        self.tally["clock pairs"] += 1
        self.tally["clocks 120 s apart"] += abs(offsets[0] - offsets[1]) == 2 * SKEW_MS


class SkewOvertakenMachine(SkewMachine):
    FAULTS = True


# ---------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------


def _examples(short: int, long: int) -> int:
    """OKQ_PROPERTY_EXAMPLES: unset, the CI-short count; ``long``, the long count;
    a number, that many for every configuration."""
    value = os.environ.get("OKQ_PROPERTY_EXAMPLES", "")
    if value == "long":
        return long
    return int(value or "0") or short


def _check(
    machine: type[EngineMachine], label: str, examples: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Deterministic segment ids, so that hypothesis can replay a run: which of two
    # segments published in the same millisecond goes first follows their ids.
    # They stay out of publish order, as random ids are.
    n = itertools.count(1)
    monkeypatch.setattr(
        publisher, "new_segment_id",
        lambda now_ms: f"{now_ms:012x}-{next(n) * 0x9E3779B1 % (1 << 40):010x}",
    )
    machine.tally = Counter()
    began = time.monotonic()
    # Every injected fault makes a cell log a warning; they are the point here.
    cell_log = logging.getLogger("okq.cell")
    level = cell_log.level
    cell_log.setLevel(logging.ERROR if machine.FAULTS else level)
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=50,
                deadline=None,
                # No "explain" phase: its coverage-traced replays of a failing stateful
                # run take minutes here and would trip the 300 s pytest timeout.
                phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target,
                        Phase.shrink],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            ),
        )
    finally:
        cell_log.setLevel(level)
    _summary(machine.tally, label, time.monotonic() - began)


def _summary(c: Counter[str], label: str, seconds: float) -> None:
    if os.environ.get("OKQ_PROPERTY_TALLY"):
        print("\n", dict(c))
    overtaken = sum(v for k, v in c.items() if k.startswith("writes overtaken"))
    extra = f", {overtaken} writes overtaken" if overtaken else ""
    if c["clock pairs"]:
        extra += f", {c['clocks 120 s apart']} of {c['clock pairs']} clock pairs 120 s apart"
    print(
        f"\nokq engine property [{label}]: {c['examples']} examples "
        f"({c['drained examples']} run to the final drain), {c['steps']} steps, "
        f"{c['leased']} leases and {c['completed']} completions checked, "
        f"{c['refused']} stale tokens refused, {c['drained']} items drained, "
        f"{c['dead-lettered']} dead letters verified{extra}; no item lost, completed "
        f"twice or published twice ({seconds:.1f}s)"
    )


def test_engine_matches_model_memory_store(monkeypatch: pytest.MonkeyPatch) -> None:
    _check(EngineMachine, "MemoryStore, one engine", _examples(52, 500), monkeypatch)


def test_engine_matches_model_file_store(monkeypatch: pytest.MonkeyPatch) -> None:
    _check(FileMachine, "FileStore, one engine", _examples(10, 100), monkeypatch)


def test_two_engines_share_a_store_safely(monkeypatch: pytest.MonkeyPatch) -> None:
    _check(TwoEngineMachine, "MemoryStore, two engines", _examples(30, 300), monkeypatch)


def test_two_engines_survive_overtaken_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    _check(OvertakenMachine, "MemoryStore, two engines, overtaken writes",
           _examples(42, 400), monkeypatch)


def test_two_engines_with_skewed_clocks(monkeypatch: pytest.MonkeyPatch) -> None:
    _check(SkewMachine, f"MemoryStore, two engines, clocks within ±{SKEW_MS // 1000} s",
           _examples(42, 400), monkeypatch)


def test_skewed_clocks_and_overtaken_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    _check(SkewOvertakenMachine,
           f"MemoryStore, two engines, clocks within ±{SKEW_MS // 1000} s, overtaken writes",
           _examples(21, 200), monkeypatch)
