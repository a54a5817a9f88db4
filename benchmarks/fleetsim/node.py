"""okq's nodes in sequencer mode, as far as throughput, latency and requests go.

A *partition* is one queue's manifest on one sequencer shard: today a queue, once
partitions exist one partition of a queue. Its holder runs every change of it for
the fleet (docs/DESIGN.md, "Sequencer mode"); any other node that receives a call
for it forwards the call whole to the holder. On the holder, as in okq/:

* produce (okq/publisher.py): calls join the partition's group commit, which
  lingers ``linger`` before each batch (not while a long poll waits for the
  queue), takes up to 1,000 items, writes one segment and one manifest (a CAS);
  what arrives meanwhile joins the next batch;
* lease (okq/scheduler.py): under the partition's lock, a look at the cached
  manifest (re-read once per ``trusted`` seconds), the oldest free items, one GET
  of each segment's lease object the first time it is leased from, and one change
  per segment on that lease object's cell, awaited before the lock is let go;
  nothing ready: a long poll, woken by the next publish or its timeout;
* complete (okq/deliveries.py): one change per segment on its lease object's cell;
* a cell (okq/cell.py) writes one lease object: changes that arrive while its PUT
  is in flight join the next PUT.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from .calibration import Calibration
from .engine import Future, Machine, Mutex, Proc, Process, Sim
from .store import Store

MAX_COMMIT = 1000  # items in one group commit (okq/publisher.py)
SEGMENT_FILL = 400  # items per backlog segment made up front (4 producers x 100)


@dataclass(frozen=True)
class Options:
    linger: float = 0.010  # the sequencer's produce linger (okq/settings.py)
    trusted: float = 15.0  # a holder's cached manifests are current this long
    msg_kib: float = 1.0
    manifest_kib: float = 2.0
    state_kib: float = 0.03  # per item in a lease object


class Cell:
    """One lease object's serialised, group-committed writer."""

    def __init__(self, fleet: Fleet, node: Node, key: str, prefix: str, items: int) -> None:
        self.fleet, self.node, self.key, self.prefix, self.items = fleet, node, key, prefix, items
        self._pending: list[Future[None]] = []
        self._busy = False

    def change(self) -> Future[None]:
        fut: Future[None] = Future()
        self._pending.append(fut)
        if not self._busy:
            self._busy = True
            self.fleet.sim.spawn(self._writer())
        return fut

    def _writer(self) -> Proc[None]:
        node, opts = self.node, self.fleet.opts
        while self._pending:
            batch, self._pending = self._pending, []
            yield node.loop.cpu(self.fleet.cal.cell_write_us)
            yield from node.store("put", self.key, self.prefix,
                                  self.items * opts.state_kib)
            for fut in batch:
                fut.set(None)
        self._busy = False


@dataclass
class Segment:
    key: str
    items: int
    free: int
    cell: Cell
    stamps: deque[list[float]]  # [produce call's start, items] in order
    seen: bool = False  # its lease object read once (not found: a fresh segment)
    done: int = 0

    def take(self, k: int) -> list[tuple[float, int]]:
        """The start times of the next ``k`` free items' produce calls."""
        self.free -= k
        out = []
        while k:
            run = self.stamps[0]
            step = min(k, int(run[1]))
            out.append((run[0], step))
            k -= step
            run[1] -= step
            if not run[1]:
                self.stamps.popleft()
        return out


@dataclass
class Partition:
    name: str
    prefix: str  # the S3 prefix its objects count against
    holder: Node
    segments: deque[Segment] = field(default_factory=deque)
    calls: list[tuple[int, float, Future[None]]] = field(default_factory=list)
    publishing: bool = False
    lock: Mutex = field(default_factory=Mutex)
    waiters: dict[Future[None], None] = field(default_factory=dict)  # in order: no set
    manifest_read: float = -1e9
    backlog: bool = False  # an endless backlog: segments made on demand, unwritten
    produced: int = 0
    completed: int = 0


Leased = list[tuple[Segment, int, list[tuple[float, int]]]]  # segment, items, stamps


class Node:
    """An ``okq serve --sequencer`` process: its event loop and obstore's threads."""

    def __init__(self, fleet: Fleet, index: int, machine: Machine) -> None:
        self.fleet, self.index = fleet, index
        self.loop = Process(f"node {index}", machine)
        self.io = Process(f"node {index} io", machine, threads=2)

    def store(self, op: str, key: str, prefix: str, kib: float) -> Proc[None]:
        yield from self.fleet.store.request(self.loop, self.io, op, key, prefix, kib)

    # -- what a client's call costs where it lands --------------------------------------

    def produce(self, part: Partition, n: int, began: float) -> Proc[None]:
        yield from self._route(part, n, False, lambda h: h._produce_here(part, n, began))

    def lease(self, part: Partition, n: int, wait: float) -> Proc[Leased]:
        got: Leased = yield from self._route(part, 0, True, lambda h: h._lease_reply(part, n, wait))
        return got

    def _lease_reply(self, part: Partition, n: int, wait: float) -> Proc[Leased]:
        """A lease, and its reply built after the partition's lock is let go."""
        got: Leased = yield from self._lease_here(part, n, wait)
        yield self.loop.cpu(self.fleet.cal.reply_item_us * sum(k for _, k, _ in got))
        return got

    def complete(self, part: Partition, leased: Leased) -> Proc[None]:
        yield from self._route(part, 0, False, lambda h: h._complete_here(part, leased))

    def _route(self, part: Partition, items_in: int, payloads_out: bool,
               work: Callable[[Node], Proc[Any]]) -> Proc[Any]:
        """The call's HTTP cost here; then the work here, or forwarded to the holder
        (this node's cost of the forward and of the payloads it carries either way,
        a hop each way, the holder's HTTP cost)."""
        cal, sim = self.fleet.cal, self.fleet.sim
        yield self.loop.cpu(cal.call_us)
        holder = part.holder
        if holder is self:
            result = yield from work(self)
            return result
        self.fleet.forwards += 1
        yield self.loop.cpu(cal.fwd_call_us + cal.fwd_item_us * items_in)
        yield sim.sleep(self.fleet.net)
        yield holder.loop.cpu(cal.call_us)
        result = yield from work(holder)
        yield sim.sleep(self.fleet.net)
        if payloads_out:
            yield self.loop.cpu(cal.fwd_item_us * sum(k for _, k, _ in result))
        return result

    # -- the holder's work -------------------------------------------------------------

    def _produce_here(self, part: Partition, n: int, began: float) -> Proc[None]:
        yield self.loop.cpu(self.fleet.cal.produce_item_us * n)
        fut: Future[None] = Future()
        part.calls.append((n, began, fut))
        if not part.publishing:
            part.publishing = True
            self.fleet.sim.spawn(self._publisher(part))
        yield fut

    def _publisher(self, part: Partition) -> Proc[None]:
        fleet = self.fleet
        cal, opts = fleet.cal, fleet.opts
        while part.calls:
            if opts.linger and not part.waiters:
                yield fleet.sim.sleep(opts.linger)
            taken, items = 0, 0
            while taken < len(part.calls) and (not taken or
                                                items + part.calls[taken][0] <= MAX_COMMIT):
                items += part.calls[taken][0]
                taken += 1
            batch, part.calls = part.calls[:taken], part.calls[taken:]
            yield self.loop.cpu(cal.commit_us)
            seg = fleet.new_segment(part, items, [[b, k] for k, b, _ in batch])
            yield from self.store("put", seg.key, part.prefix, items * opts.msg_kib)
            yield from self.store("put", f"manifests/{part.name}", part.prefix,
                                  opts.manifest_kib)
            part.segments.append(seg)
            part.produced += items
            for _, _, fut in batch:
                fut.set(None)
            waiters, part.waiters = part.waiters, {}
            for w in waiters:
                w.set(None)
        part.publishing = False

    def _lease_here(self, part: Partition, n: int, wait: float) -> Proc[Leased]:
        sim = self.fleet.sim
        deadline = sim.now + wait
        while True:
            yield part.lock.acquire()
            try:
                got = yield from self._lease_once(part, n)
            finally:
                part.lock.release()
            if got or sim.now >= deadline:
                return got
            woken: Future[None] = Future()
            part.waiters[woken] = None
            sim.at(deadline - sim.now, woken.set, None)
            yield woken
            part.waiters.pop(woken, None)

    def _lease_once(self, part: Partition, n: int) -> Proc[Leased]:
        fleet = self.fleet
        cal, opts = fleet.cal, fleet.opts
        yield self.loop.cpu(cal.lease_call_us)
        if fleet.sim.now - part.manifest_read > opts.trusted:
            part.manifest_read = fleet.sim.now
            yield from self.store("get", f"manifests/{part.name}", part.prefix,
                                  opts.manifest_kib)
        picks: Leased = []
        want = n
        if part.backlog and sum(s.free for s in part.segments) < n:
            part.segments.append(fleet.new_segment(part, SEGMENT_FILL, [[0.0, SEGMENT_FILL]]))
        for seg in part.segments:
            if want <= 0:
                break
            take = min(seg.free, want)
            if take:
                want -= take
                picks.append((seg, take, seg.take(take)))
        for seg, _, _ in picks:
            if not seg.seen:
                seg.seen = True
                yield from self.store("get", seg.cell.key, part.prefix,
                                      seg.items * opts.state_kib)
        if picks:
            yield self.loop.cpu(cal.lease_item_us * (n - want))
            yield fleet.sim.gather(seg.cell.change() for seg, _, _ in picks)
        return picks

    def _complete_here(self, part: Partition, leased: Leased) -> Proc[None]:
        fleet = self.fleet
        yield self.loop.cpu(fleet.cal.complete_item_us * sum(k for _, k, _ in leased))
        yield fleet.sim.gather(seg.cell.change() for seg, _, _ in leased)
        for seg, k, _ in leased:
            seg.done += k
            part.completed += k
        while part.segments and part.segments[0].done >= part.segments[0].items:
            part.segments.popleft()


class Fleet:
    """Nodes, partitions, the store. ``holders`` maps partition k to a node."""

    def __init__(self, sim: Sim, store: Store, cal: Calibration, opts: Options,
                 machines: list[Machine], partitions: int, holders: list[int],
                 prefixes: int) -> None:
        self.sim, self.store, self.cal, self.opts = sim, store, cal, opts
        self.nodes = [Node(self, k, m) for k, m in enumerate(machines)]
        self.net = store.profile.net_ms / 1000
        self.parts = [Partition(f"q{k}", f"prefix-{k % prefixes}", self.nodes[holders[k]])
                      for k in range(partitions)]
        self.forwards = 0
        self._ids = count()

    def new_segment(self, part: Partition, items: int, stamps: list[list[float]]) -> Segment:
        sid = next(self._ids)
        cell = Cell(self, part.holder, f"leases/{part.name}/{sid}", part.prefix, items)
        return Segment(f"segments/{part.name}/{sid}", items, items, cell, deque(stamps))
