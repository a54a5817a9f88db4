"""Producers and consumers, in the phases of benchmarks/bench_fleet.py.

``World`` is one fleet: nodes, partitions, the store, and (to validate against
this machine) the driver and SeaweedFS on one machine of ``cores`` cores. Phases:

* produce: closed-loop producers, producer k on node k mod N, its r-th call of
  ``batch`` messages to partition (k + r) mod P; for ``messages`` in all, or for
  ``seconds``;
* drain: consumers, consumer k on node k mod N, each lease (``batch``, 0.5 s long
  poll) to the next partition with items left, then the completion of what came;
  until every produced item is done, or for ``seconds`` on an endless backlog;
* mixed: calls of ``batch`` paced to ``rate`` msg/s over the nodes and partitions in
  turn, consumers long-polling (5 s); latency from a produce call's start to the
  lease reply read by its consumer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .calibration import Calibration
from .engine import Future, Machine, Proc, Process, Sim
from .node import Fleet, Leased, Node, Options, Partition
from .store import PROFILES, Profile, Store


@dataclass(frozen=True)
class Setup:
    store: str = "seaweed-local"
    nodes: int = 1
    partitions: int = 1  # queues (one manifest each); partitions once they exist
    shards: int = 1  # partition k is held by node (k mod shards) mod nodes
    cores: int | None = None  # one machine of this many cores for all, or a core per node
    driver: bool = False  # the clients' CPU counts (on that machine)
    prefixes: int = 1  # S3 prefixes the partitions' objects spread over
    producers: int = 4
    consumers: int = 4
    batch: int = 100
    seed: int = 1
    opts: Options = field(default_factory=Options)
    profile: Profile | None = None  # instead of PROFILES[store]


@dataclass
class Phase:
    messages: int = 0
    seconds: float = 0.0
    requests: dict[str, float] = field(default_factory=dict)  # store.COUNTS
    latencies: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds
    forwards: int = 0

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    def per_message(self, op: str) -> float:
        return self.requests.get(op, 0.0) / self.messages if self.messages else 0.0


class World:
    def __init__(self, setup: Setup, cal: Calibration) -> None:
        self.setup, self.cal = setup, cal
        self.sim = sim = Sim(setup.seed)
        profile = setup.profile or PROFILES[setup.store]
        shared = Machine(sim, setup.cores) if setup.cores else None
        machines = [shared or Machine(sim, 1) for _ in range(setup.nodes)]
        server = None
        if profile.local:
            server = Process("SeaweedFS", shared or Machine(sim, None), threads=2)
        self.driver = Process("driver", shared or Machine(sim, None)) if setup.driver else None
        self.store = Store(sim, profile, cal, server)
        holders = [(k % setup.shards) % setup.nodes for k in range(setup.partitions)]
        self.fleet = Fleet(sim, self.store, cal, setup.opts, machines, setup.partitions,
                           holders, setup.prefixes)
        self.processes = [p for n in self.fleet.nodes for p in (n.loop, n.io)]
        self.processes += [p for p in (server, self.driver) if p is not None]
        self.producing = False

    # -- a client's call ---------------------------------------------------------------

    def _client(self, micros: float) -> Future[None]:
        if self.driver is None:
            done: Future[None] = Future()
            done.set(None)
            return done
        return self.driver.cpu(micros)

    def produce(self, node: Node, part: Partition, n: int) -> Proc[None]:
        cal, sim = self.cal, self.sim
        began = sim.now
        yield self._client(cal.client_call_us + cal.client_produce_item_us * n)
        yield sim.sleep(self.fleet.net)
        yield from node.produce(part, n, began)
        yield sim.sleep(self.fleet.net)

    def consume(self, node: Node, part: Partition, wait: float,
                latencies: list[float] | None = None) -> Proc[int]:
        """One lease and the completion of what it got; items got."""
        cal, sim, n = self.cal, self.sim, self.setup.batch
        yield self._client(cal.client_call_us)
        yield sim.sleep(self.fleet.net)
        got: Leased = yield from node.lease(part, n, wait)
        yield sim.sleep(self.fleet.net)
        items = sum(k for _, k, _ in got)
        yield self._client(cal.client_lease_item_us * items)
        if latencies is not None:
            for _, _, stamps in got:
                for began, k in stamps:
                    latencies.extend([sim.now - began] * k)
        if items:
            yield self._client(cal.client_call_us + cal.client_complete_item_us * items)
            yield sim.sleep(self.fleet.net)
            yield from node.complete(part, got)
            yield sim.sleep(self.fleet.net)
        return items

    # -- measuring a phase ---------------------------------------------------------------

    def _measure(self, body: Future[Any], phase: Phase) -> Phase:
        before_req = dict(self.store.counts)
        before_cpu = {p.name: p.cpu_seconds for p in self.processes}
        forwards, began = self.fleet.forwards, self.sim.now
        self.sim.run(until=body)
        if not body.done:
            raise RuntimeError("the simulation stalled: nothing left to run")
        phase.seconds = self.sim.now - began
        phase.requests = {k: v - before_req[k] for k, v in self.store.counts.items()}
        phase.cpu = {p.name: p.cpu_seconds - before_cpu[p.name] for p in self.processes}
        phase.forwards = self.fleet.forwards - forwards
        return phase

    def produce_phase(self, messages: int = 0, seconds: float = 0.0) -> Phase:
        """Closed-loop producers: ``messages`` in all, or as many as ``seconds`` allow."""
        s, nodes, parts = self.setup, self.fleet.nodes, self.fleet.parts
        rounds = messages // s.producers // s.batch if messages else 1 << 30
        end = self.sim.now + seconds if seconds else float("inf")
        phase = Phase()

        def producer(k: int) -> Proc[None]:
            for r in range(rounds):
                if self.sim.now >= end:
                    return
                yield from self.produce(nodes[k % len(nodes)], parts[(k + r) % len(parts)],
                                        s.batch)
                phase.messages += s.batch

        tasks = [self.sim.spawn(producer(k)) for k in range(s.producers)]
        return self._measure(self.sim.gather(tasks), phase)

    def drain_phase(self, seconds: float = 0.0) -> Phase:
        """Consumers until every produced item is done, or ``seconds`` on an endless
        backlog (segments of 400 made as needed, as the produce phase makes them)."""
        s, nodes, parts = self.setup, self.fleet.nodes, self.fleet.parts
        end = self.sim.now + seconds if seconds else float("inf")
        for part in parts:
            part.backlog = bool(seconds)
        phase = Phase()

        def open_parts() -> list[Partition]:
            return [p for p in parts if p.backlog or p.completed < p.produced]

        def consumer(k: int) -> Proc[None]:
            r = k
            while (left := open_parts()) and self.sim.now < end:
                got = yield from self.consume(nodes[k % len(nodes)], left[r % len(left)], 0.5)
                phase.messages += got  # not `+= yield from`: that reads the count first
                r += 1

        tasks = [self.sim.spawn(consumer(k)) for k in range(s.consumers)]
        return self._measure(self.sim.gather(tasks), phase)

    def mixed_phase(self, rate: float, seconds: float) -> Phase:
        """Produce calls paced to ``rate`` msg/s for ``seconds``, consumers long-polling,
        until everything produced is completed."""
        s, sim, nodes, parts = self.setup, self.sim, self.fleet.nodes, self.fleet.parts
        phase = Phase()
        finished: Future[None] = Future()
        state = {"sent": 0, "calls": 0, "done": 0}
        interval = s.batch / rate
        calls = int(seconds / interval)

        def one_call(k: int) -> Proc[None]:
            yield from self.produce(nodes[k % len(nodes)], parts[k % len(parts)], s.batch)

        def producer() -> Proc[None]:
            for k in range(calls):
                state["sent"] += s.batch
                sim.spawn(one_call(k))
                yield sim.sleep(interval)
            state["calls"] = 1

        def consumer(k: int) -> Proc[None]:
            while not finished.done:
                got = yield from self.consume(nodes[k % len(nodes)], parts[k % len(parts)],
                                              5.0, phase.latencies)
                state["done"] += got
                if state["calls"] and state["done"] >= state["sent"]:
                    finished.set(None)

        sim.spawn(producer())
        for k in range(s.consumers):
            sim.spawn(consumer(k))
        self._measure(finished, phase)
        phase.messages = state["done"]
        return phase
