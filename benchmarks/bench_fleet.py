"""A fleet of okq nodes on SeaweedFS, with and without the sequencer. Not a test.

Every fleet is a fresh ``okq.dev.fleet.LocalFleet`` (SeaweedFS, ``okq serve``
nodes, the compactor; nginx only for failover) on loopback. Four phases (the
last only when asked for):

table     For each node count and sequencer setting: 1 KiB messages, 4 producers
          and 4 consumers in this process spread over the nodes round-robin,
          batches of 100. Produce ``--messages``, then lease+complete them all;
          then a mixed phase of ``--mixed-seconds``: producers paced to ``--rate``
          msg/s in batches of ``--mixed-batch``, consumers long-polling;
          produce-to-lease latency p50/p99. Object-store requests per message of
          each phase come from the nodes' ``okq_store_requests`` counters, split
          the way S3 bills them (PUT-class = put + list, GET-class = get + head,
          deletes free); CAS conflicts from ``okq_cas_conflicts``. Every produced
          id must be leased and completed exactly once.
idle      Fleets of the smallest and largest node count: the fleet's requests per
          second at rest (one queue, no client: with the sequencer on, the role's
          own cost, as the role is claimed on a queue's first state change), then
          with 4 consumers long-polling (20 s) on every node; then wake latency:
          single messages produced through node 0, time until a waiting consumer
          has one, first with every node's consumers waiting, then (several
          nodes) with node 0's stopped, so that the lease woken is on another node.
failover  3 nodes, sequencer on, behind nginx, under continuous load (keyed
          produces retried on errors, consumers leasing and completing, all of it
          recorded for a history check). ``--kills`` times: SIGKILL the role
          holder; time until another node reports the role, and until a produce
          issued right after the kill is acknowledged; restart the node, settle.
shards    Fleet-wide role or sharded by queue? 4 nodes, sequencer on, run with 1 and
          with 4 shards; the table's driver (4 producers, 4 consumers, batches of
          100, 1 KiB) over 4 queues on 4 distinct shards, queue k first written
          through node k so that with 4 shards each node claims one. Produce
          ``--messages``, then drain; each process's CPU seconds per phase (from
          /proc): is the one holder's core the limit, does the work spread?
partitions One queue of 2 partitions on 2 sequencer nodes (2 shards), alternating
          ``--rounds`` times with one of 1 partition on 1 node, and one of those
          last (``--setups``: other node and partition counts): the table's
          driver, client k on node k; each node's CPU per phase, its share of
          the fleet's, the fleet's CPU per message against one node's
          (medians), forwards per message.

The idle figures count the nodes' and the compactor's object-store requests
(both export ``okq_store_requests``).

    python benchmarks/bench_fleet.py [--nodes 1,2,4] [--sequencer off,on]
        [--messages 20000] [--phases table,idle,failover,shards] [--kills 10]
        [--idle-seconds 60] [--quick]

``--quick`` (2,000 messages, 1 and 2 nodes, 5 s mixed, idle at 2 nodes for 10 s,
3 kills) is a smoke test of about two and a half minutes; the full run takes about
15 minutes on two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import signal
import statistics
import struct
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from okq.client import Client
from okq.dev.fleet import LocalFleet
from okq.errors import LeaseLost, OkqError, Overloaded, PublishAborted
from okq.sequencer import shard_of
from okq.wire import LeasedItemOut, ProduceItem
from tests.campaign import forward_outcomes
from tests.history import ACCEPTED, REFUSED, UNKNOWN, History, Report
from tests.nodes import live_items

T = TypeVar("T")

BATCH = 100
WORKERS = 4
PAYLOAD = b"x" * 1024
OPS = ("put", "list", "get", "head", "delete")
PUT_CLASS = ("put", "list")
GET_CLASS = ("get", "head")
#: S3 Standard request prices (us-east-1), dollars per request; DELETE is free.
PRICE = {"put": 0.005e-3, "list": 0.005e-3, "get": 0.0004e-3, "head": 0.0004e-3, "delete": 0.0}
MONTH = 30 * 86_400
RETRIES = 5
LEASE_TIMEOUT = 10.0  # failover queue: leases lost with a killed node come back soon

FULL = {"nodes": "1,2,4", "messages": 20_000, "mixed_seconds": 30.0, "idle_seconds": 60.0,
        "rest_seconds": 60.0, "samples": 50, "kills": 10}
QUICK = {"nodes": "1,2", "messages": 2_000, "mixed_seconds": 5.0, "idle_seconds": 10.0,
         "rest_seconds": 10.0, "samples": 15, "kills": 3}

Counts = dict[str, float]


# -- reading the nodes' counters ------------------------------------------------------


def parse_metrics(text: str) -> Counts:
    """``okq_store_requests`` by operation and ``okq_cas_conflicts`` from one /metrics."""
    counts: Counts = dict.fromkeys((*OPS, "cas"), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "okq_store_requests_total":
                counts[sample.labels["operation"]] = sample.value
            elif sample.name == "okq_cas_conflicts_total":
                counts["cas"] = sample.value
    return counts


class Meter:
    """Reads every node's counters; ``since`` sums the fleet's deltas between reads."""

    def __init__(self, http: aiohttp.ClientSession, urls: Sequence[str]) -> None:
        self.http = http
        self.urls = list(urls)

    async def read(self) -> list[Counts]:
        return list(await asyncio.gather(*(self._one(u) for u in self.urls)))

    async def _one(self, url: str) -> Counts:
        async with self.http.get(f"{url}/metrics") as resp:
            return parse_metrics(await resp.text())

    async def over(self, seconds: float) -> Counts:
        """The fleet's requests per second over the next ``seconds``."""
        before = await self.read()
        await asyncio.sleep(seconds)
        return {k: v / seconds for k, v in since(await self.read(), before).items()}


def since(after: list[Counts], before: list[Counts]) -> Counts:
    total: Counts = {}
    for a, b in zip(after, before, strict=True):
        for k, v in a.items():
            total[k] = total.get(k, 0.0) + v - b.get(k, 0.0)
    return total


def total(counts: Counts, ops: Iterable[str] = OPS) -> float:
    return sum(counts.get(op, 0.0) for op in ops)


def dollars_a_month(per_second: Counts) -> float:
    return sum(per_second.get(op, 0.0) * price for op, price in PRICE.items()) * MONTH


# -- small helpers ----------------------------------------------------------------------


def pct(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile in milliseconds; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000


async def until(done: Callable[[], bool], timeout: float, step: float = 0.02) -> bool:
    """Wait until ``done()``; False if ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(step)
    return True


async def stop_all(tasks: Sequence[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def running(workdir: Path, nodes: int, sequencer: bool, *, nginx: bool = False,
                  node_args: Sequence[str] = (), shards: int = 1) -> AsyncIterator[LocalFleet]:
    """A fresh fleet. Start and stop run in a thread: they block for seconds."""
    fleet = LocalFleet(Path(tempfile.mkdtemp(prefix="fleet-", dir=workdir)), nodes,
                       sequencer=sequencer, nginx=nginx, node_args=tuple(node_args),
                       shards=shards)
    await asyncio.to_thread(fleet.start)
    try:
        yield fleet
    finally:
        await asyncio.to_thread(fleet.stop)


async def claimed(fleet: LocalFleet, sequencer: bool, client: Client, queue: str) -> None:
    """With the sequencer on, until a node holds the role. A role is claimed when a
    node first routes a queue's state change, so an empty lease asks for it."""
    if sequencer:
        await client.lease(queue, 1)
        await asyncio.to_thread(fleet.wait_holder, 60)


@contextlib.asynccontextmanager
async def clients_of(fleet: LocalFleet) -> AsyncIterator[list[Client]]:
    """One client per node, in node order."""
    clients = [Client(node.url) for node in fleet.nodes]
    try:
        yield clients
    finally:
        for c in clients:
            await c.close()


# -- table: throughput, latency, cost ---------------------------------------------------


@dataclass
class Ledger:
    """What the clients of one queue saw: ids acknowledged, leases, completions."""

    produced: list[str] = field(default_factory=list)
    leased: Counter[str] = field(default_factory=Counter)
    tokens: int = 0  # tokens sent to complete
    completed: int = 0  # completions the nodes confirmed
    errors: int = 0  # calls that failed and were retried

    def problems(self) -> dict[str, int]:
        acked = set(self.produced)
        found = {
            "lost": len(acked - self.leased.keys()),
            "leased twice": sum(n - 1 for n in self.leased.values()),
            "not acked": len(self.leased.keys() - acked),
            "acked twice": len(self.produced) - len(acked),
            "not completed": self.tokens - self.completed,
            "errors": self.errors,
        }
        return {k: v for k, v in found.items() if v}


async def persist(call: Callable[[], Awaitable[T]], ledger: Ledger) -> T:
    """``call()``, retried on okq errors other than a lost lease (each one counted)."""
    for _ in range(RETRIES - 1):
        try:
            return await call()
        except LeaseLost:
            raise
        except OkqError:
            ledger.errors += 1
            await asyncio.sleep(0.1)
    return await call()


async def consume(client: Client, queue: str, ledger: Ledger, wait: float,
                  seen: Callable[[list[LeasedItemOut], float], None] | None = None) -> int:
    """One lease of up to a batch and the completion of all of it; items got."""
    got = await persist(partial(client.lease, queue, BATCH, request_timeout=wait), ledger)
    if seen is not None:
        seen(got, time.perf_counter())
    if got:
        ledger.leased.update(i.id for i in got)
        ledger.tokens += len(got)
        done = await persist(partial(client.complete, queue, [i.token for i in got]), ledger)
        ledger.completed += done  # not `+= await`: that would read the count before waiting
    return len(got)


async def produce_all(clients: list[Client], queue: str, messages: int,
                      ledger: Ledger) -> float:
    """4 producers, batches of 100; msg/s."""
    rounds = messages // WORKERS // BATCH

    async def producer(c: Client) -> None:
        for _ in range(rounds):
            ids = await persist(partial(c.produce, queue, [PAYLOAD] * BATCH), ledger)
            ledger.produced.extend(ids)

    began = time.perf_counter()
    await asyncio.gather(*(producer(clients[i % len(clients)]) for i in range(WORKERS)))
    return rounds * WORKERS * BATCH / (time.perf_counter() - began)


async def drain(clients: list[Client], queue: str, ledger: Ledger) -> float:
    """4 consumers lease and complete until every acknowledged item is done; msg/s."""
    goal = len(ledger.produced)
    deadline = time.monotonic() + 60 + goal / 200

    async def consumer(c: Client) -> None:
        while ledger.completed < goal and time.monotonic() < deadline:
            await consume(c, queue, ledger, 0.5)

    began = time.perf_counter()
    await asyncio.gather(*(consumer(clients[i % len(clients)]) for i in range(WORKERS)))
    return ledger.completed / (time.perf_counter() - began)


async def mixed(clients: list[Client], queue: str, args: argparse.Namespace,
                ledger: Ledger) -> list[float]:
    """Producers paced to ``args.rate`` msg/s, consumers long-polling, until every
    item produced is completed; produce-call-to-lease latencies in seconds."""
    latencies: list[float] = []
    interval = args.mixed_batch * WORKERS / args.rate
    began = time.perf_counter()

    def seen(got: list[LeasedItemOut], now: float) -> None:
        latencies.extend(now - struct.unpack_from("d", i.bytes)[0] for i in got)

    async def producer(k: int, c: Client) -> None:
        due = began + k * interval / WORKERS
        while due < began + args.mixed_seconds:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            item = struct.pack("d", time.perf_counter()) + PAYLOAD[8:]
            ids = await persist(partial(c.produce, queue, [item] * args.mixed_batch), ledger)
            ledger.produced.extend(ids)
            due += interval

    async def consumer(c: Client) -> None:
        while True:
            await consume(c, queue, ledger, 5.0, seen)

    n = len(clients)
    consumers = [asyncio.create_task(consumer(clients[i % n])) for i in range(WORKERS)]
    await asyncio.gather(*(producer(k, clients[k % n]) for k in range(WORKERS)))
    await until(lambda: ledger.completed >= len(ledger.produced), 60 + args.mixed_seconds)
    await stop_all(consumers)
    return latencies


@dataclass
class Row:
    nodes: int
    sequencer: bool
    produce: float = 0.0
    consume: float = 0.0
    latencies: list[float] = field(default_factory=list)
    costs: dict[str, Counts] = field(default_factory=dict)  # per message, by phase
    cas: float = 0.0
    mixed_messages: int = 0
    problems: dict[str, int] = field(default_factory=dict)


def per_message(counts: Counts, messages: int) -> Counts:
    return {k: v / max(1, messages) for k, v in counts.items()}


async def table_row(nodes: int, sequencer: bool, args: argparse.Namespace,
                    http: aiohttp.ClientSession) -> Row:
    row = Row(nodes, sequencer)
    async with running(args.workdir, nodes, sequencer) as fleet, clients_of(fleet) as clients:
        meter = Meter(http, [node.url for node in fleet.nodes])
        for queue in ("bench", "mixed"):
            await clients[0].create_queue(queue)
        await claimed(fleet, sequencer, clients[0], "bench")
        bench, mix = Ledger(), Ledger()
        marks = [await meter.read()]
        row.produce = await produce_all(clients, "bench", args.messages, bench)
        marks.append(await meter.read())
        row.consume = await drain(clients, "bench", bench)
        marks.append(await meter.read())
        row.latencies = await mixed(clients, "mixed", args, mix)
        marks.append(await meter.read())
    done = len(bench.produced)
    row.mixed_messages = len(mix.produced)
    row.costs = {phase: per_message(since(marks[n + 1], marks[n]), count) for n, (phase, count)
                 in enumerate((("produce", done), ("consume", done),
                               ("mixed", row.mixed_messages)))}
    row.cas = since(marks[3], marks[2])["cas"]
    row.problems = Counter(bench.problems()) + Counter(mix.problems())
    return row


def three(row: Row, ops: Sequence[str]) -> str:
    return " / ".join(f"{total(row.costs[p], ops):.3f}" for p in ("produce", "consume", "mixed"))


def print_table(rows: list[Row], args: argparse.Namespace) -> None:
    print(f"\n## Table: 1 KiB messages, {WORKERS} producers and {WORKERS} consumers over the "
          f"nodes round-robin, batches of {BATCH}, {args.messages:,} messages; mixed phase "
          f"{args.mixed_seconds:g} s at {args.rate:,.0f} msg/s offered in batches of "
          f"{args.mixed_batch}; SeaweedFS\n")
    print("| nodes | sequencer | produce msg/s | lease+complete msg/s | mixed e2e p50 / p99 "
          "| S3 requests/msg produce / consume / mixed | PUT-class/msg p / c / m "
          "| GET-class/msg p / c / m | CAS 412s in mixed (per 1k msg) | check |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        check = "ok" if not r.problems else ", ".join(f"{k} {v}" for k, v in r.problems.items())
        print(f"| {r.nodes} | {'on' if r.sequencer else 'off'} | {r.produce:,.0f} "
              f"| {r.consume:,.0f} | {pct(r.latencies, 0.5):,.0f} ms / "
              f"{pct(r.latencies, 0.99):,.0f} ms | {three(r, OPS)} | {three(r, PUT_CLASS)} "
              f"| {three(r, GET_CLASS)} | {r.cas:,.0f} "
              f"({1000 * r.cas / max(1, r.mixed_messages):.2f}) | {check} |")
    clean = sum(not r.problems for r in rows)
    print(f"\ncheck: {clean} of {len(rows)} runs had every produced id leased and completed "
          "exactly once, with no call retried")


# -- idle: the cost of waiting, and how fast a produce wakes a waiting lease -----------


@dataclass
class Idle:
    nodes: int
    sequencer: bool
    rest: Counts = field(default_factory=dict)  # requests/s of the nodes, no client
    idle: Counts = field(default_factory=dict)  # requests/s of the nodes, idle waiters
    rest_compactor: Counts = field(default_factory=dict)  # the compactor's, at rest
    idle_compactor: Counts = field(default_factory=dict)  # the compactor's, idle waiters
    passes: float = 0.0  # compactor passes during the idle window
    # (from the produce call, from its acknowledgement) in seconds:
    anywhere: list[tuple[float, float]] = field(default_factory=list)  # all nodes waiting
    cross: list[tuple[float, float]] = field(default_factory=list)  # node 0's waiters gone


async def waiter(client: Client, queue: str, seen: dict[str, float]) -> None:
    """A consumer long-polling 20 s at a time, noting when each item came."""
    while True:
        try:
            got = await client.lease(queue, 10, request_timeout=20)
        except OkqError:
            await asyncio.sleep(0.5)
            continue
        now = time.perf_counter()
        for item in got:
            seen[item.utf8 or ""] = now
        if got:
            with contextlib.suppress(OkqError):
                await client.complete(queue, [i.token for i in got])


async def wake(producer: Client, queue: str, seen: dict[str, float],
               samples: int, tag: str) -> list[tuple[float, float]]:
    """Single produces through ``producer``, one at a time: how long until some
    waiting consumer has each one, from the produce call and from its ack."""
    found: list[tuple[float, float]] = []
    for k in range(samples):
        key = f"{tag}-{k}"
        began = time.perf_counter()
        await producer.produce(queue, [key])
        acked = time.perf_counter()
        if await until(partial(seen.__contains__, key), 10, 0.005):
            found.append((seen[key] - began, seen[key] - acked))
        await asyncio.sleep(random.uniform(0.05, 0.25))
    return found


async def compactor_passes(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url) as resp:
        text = await resp.text()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "okq_compactor_passes_total")


async def idle_run(nodes: int, sequencer: bool, args: argparse.Namespace,
                   http: aiohttp.ClientSession) -> Idle:
    """At rest, then one idle queue with waiters on every node, then wake latency with
    every node's waiters, then (several nodes) with node 0's stopped, so that a
    produce through node 0 must wake a lease waiting on another node."""
    result = Idle(nodes, sequencer)
    async with running(args.workdir, nodes, sequencer) as fleet, clients_of(fleet) as clients:
        meter = Meter(http, [node.url for node in fleet.nodes])
        compactor = Meter(http, [fleet.compactor_metrics_url.removesuffix("/metrics")])
        await clients[0].create_queue("idle")
        await claimed(fleet, sequencer, clients[0], "idle")
        await asyncio.sleep(args.settle)
        result.rest, result.rest_compactor = await asyncio.gather(
            meter.over(args.rest_seconds), compactor.over(args.rest_seconds))
        seen: dict[str, float] = {}
        tasks = [[asyncio.create_task(waiter(c, "idle", seen)) for _ in range(WORKERS)]
                 for c in clients]
        await asyncio.sleep(args.settle)  # every consumer in its first poll
        passes = await compactor_passes(http, fleet.compactor_metrics_url)
        result.idle, result.idle_compactor = await asyncio.gather(
            meter.over(args.idle_seconds), compactor.over(args.idle_seconds))
        result.passes = await compactor_passes(http, fleet.compactor_metrics_url) - passes
        result.anywhere = await wake(clients[0], "idle", seen, args.samples, "any")
        if nodes > 1:
            await stop_all(tasks[0])
            await asyncio.sleep(0.5)
            result.cross = await wake(clients[0], "idle", seen, args.samples, "cross")
        await stop_all([t for ts in tasks for t in ts])
    return result


def by_op(per_second: Counts) -> str:
    return " ".join(f"{op} {per_second.get(op, 0.0):.2f}" for op in OPS
                    if per_second.get(op, 0.0) > 0.0005) or "none"


def latency_pair(samples: list[tuple[float, float]], which: int) -> str:
    values = [s[which] for s in samples]
    return f"{pct(values, 0.5):.0f} / {pct(values, 0.99):.0f}"


def print_idle(results: list[Idle], args: argparse.Namespace) -> None:
    print(f"\n## Idle: object-store requests/s (okq_store_requests of the nodes and of "
          f"the compactor; fleet = both), {args.rest_seconds:g} s at rest "
          f"(one queue, no client: with the sequencer on, the role's own cost), then "
          f"{args.idle_seconds:g} s with one idle queue and {WORKERS} consumers long-polling "
          f"20 s on every node; S3 prices, 30-day month\n")
    print("| nodes | sequencer | at rest: nodes / compactor req/s | at rest by op (nodes) "
          "| idle queue: nodes / compactor / fleet req/s | nodes per node "
          "| idle by op (nodes; compactor) | $/month fleet, idle queue | compactor passes |")
    print("|---|---|---:|---|---:|---:|---|---:|---:|")
    for r in results:
        fleet = {k: r.idle.get(k, 0.0) + r.idle_compactor.get(k, 0.0) for k in OPS}
        print(f"| {r.nodes} | {'on' if r.sequencer else 'off'} "
              f"| {total(r.rest):.3f} / {total(r.rest_compactor):.3f} | {by_op(r.rest)} "
              f"| {total(r.idle):.3f} / {total(r.idle_compactor):.3f} / {total(fleet):.3f} "
              f"| {total(r.idle) / r.nodes:.3f} | {by_op(r.idle)}; {by_op(r.idle_compactor)} "
              f"| {dollars_a_month(fleet):.2f} | {r.passes:g} |")
    print("\n## Wake: single produces through node 0; ms from the produce call (and from "
          "its acknowledgement) until a waiting consumer has it. 'any': consumers wait on "
          "every node, node 0's included; 'other node': node 0's consumers stopped\n")
    print("| nodes | sequencer | any p50 / p99 | from ack | other node p50 / p99 | from ack "
          "| samples |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r.nodes} | {'on' if r.sequencer else 'off'} "
              f"| {latency_pair(r.anywhere, 0)} | {latency_pair(r.anywhere, 1)} "
              f"| {latency_pair(r.cross, 0)} | {latency_pair(r.cross, 1)} "
              f"| {len(r.anywhere)} + {len(r.cross)} |")


# -- failover: SIGKILL the sequencer under load ----------------------------------------


class Load:
    """Keyed produces retried until acknowledged and consumers leasing and completing,
    all through one URL (nginx), every outcome recorded in a ``History``. Each
    payload carries its idempotency key, so the checker can match deliveries to keys."""

    def __init__(self, client: Client, queue: str, history: History, rate: float) -> None:
        self.client = client
        self.queue = queue
        self.history = history
        self.rate = rate
        self.producing = True
        self.gave_up = 0

    async def produce(self, keys: list[str], patience: float = 25.0) -> float:
        """Produce until acknowledged (same keys each try); when it was acknowledged,
        NaN if it gave up after ``patience`` seconds (less than the idempotency
        window, so no try could have made a second item of a key)."""
        items = [ProduceItem(bytes=key.encode().ljust(len(PAYLOAD)), key=key) for key in keys]
        began = time.perf_counter()
        while time.perf_counter() - began < patience:
            try:
                ids = await self.client.produce(self.queue, items)
            except OkqError as exc:
                sure = isinstance(exc, Overloaded | PublishAborted) or 400 <= exc.status < 500
                self.history.produce_failed(keys, unknown=not sure)
                await asyncio.sleep(0.02)
                continue
            self.history.produced(keys, ids)
            return time.perf_counter()
        self.gave_up += len(keys)
        return float("nan")

    async def producer(self, k: int, batch: int = 5) -> None:
        interval = batch * WORKERS / self.rate
        due = time.perf_counter() + k * interval / WORKERS
        for n in itertools.count():
            if not self.producing:
                return
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            await self.produce([f"p{k}-{n}-{i}" for i in range(batch)])
            due += interval

    async def consumer(self) -> None:
        while True:
            invoked = time.perf_counter()
            try:
                got = await self.client.lease(self.queue, 10, request_timeout=2)
            except OkqError:
                await asyncio.sleep(0.05)
                continue
            for i in got:
                self.history.delivered(i.id, i.token, i.attempts, key=i.bytes.rstrip().decode(),
                                       invoked=invoked, deadline=i.lease_deadline.timestamp())
            if got:
                await self.complete(got)

    async def complete(self, got: list[LeasedItemOut]) -> None:
        """Complete a batch. A refusal names the tokens whose lease was lost; an error
        is retried, and after one a refusal may mean the earlier try landed (unknown)."""
        tokens = [i.token for i in got]
        for attempt in range(RETRIES):
            try:
                await self.client.complete(self.queue, tokens)
            except LeaseLost as exc:
                refused = {f.get("index") for f in exc.details.get("failed", [])}
                lost = UNKNOWN if attempt else REFUSED
                for n, i in enumerate(got):
                    self.history.completed(i.id, i.token, lost if n in refused else ACCEPTED)
                return
            except OkqError:
                await asyncio.sleep(0.1)
                continue
            for i in got:
                self.history.completed(i.id, i.token, ACCEPTED)
            return
        for i in got:
            self.history.completed(i.id, i.token, UNKNOWN)


@dataclass
class Kill:
    holder: str
    role: float  # seconds from the kill until another node reports the role
    write: float  # seconds from the kill until a produce issued then is acknowledged


async def role_moved(http: aiohttp.ClientSession, urls: list[str], began: float,
                     timeout: float = 60) -> float:
    """Seconds from ``began`` until one of ``urls`` reports a role on GET /health."""
    while time.perf_counter() - began < timeout:
        for url in urls:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with http.get(f"{url}/health",
                                    timeout=aiohttp.ClientTimeout(total=1)) as resp:
                    if (await resp.json()).get("roles"):
                        return time.perf_counter() - began
        await asyncio.sleep(0.01)
    return float("nan")


async def one_kill(fleet: LocalFleet, http: aiohttp.ClientSession, load: Load, k: int,
                   settle: float) -> Kill:
    holder = await asyncio.to_thread(fleet.wait_holder, 60)
    others = [node.url for node in fleet.nodes if node is not holder]
    began = time.perf_counter()
    holder.kill(signal.SIGKILL)
    role, acked = await asyncio.gather(
        role_moved(http, others, began),
        load.produce([f"probe-{k}"]),
    )
    await asyncio.to_thread(holder.restart)
    await asyncio.sleep(settle)
    return Kill(f"node {holder.index}", role, acked - began)


async def failover(args: argparse.Namespace, http: aiohttp.ClientSession) -> None:
    history = History(clock=time.perf_counter)
    node_args = ("--idem-window", "30")  # keyed produces at this rate stay under the key cap
    async with running(args.workdir, 3, True, nginx=True, node_args=node_args) as fleet, \
            Client(fleet.url) as client:
        await client.create_queue("failover", lease_timeout=LEASE_TIMEOUT)
        await claimed(fleet, True, client, "failover")
        load = Load(client, "failover", history, args.failover_rate)
        tasks = [asyncio.create_task(load.producer(k)) for k in range(WORKERS)]
        tasks += [asyncio.create_task(load.consumer()) for _ in range(WORKERS)]
        await asyncio.sleep(args.settle)
        kills = []
        for k in range(args.kills):
            kills.append(await one_kill(fleet, http, load, k, args.settle))
            print(f"  kill {k + 1}: role moved after {kills[-1].role * 1000:,.0f} ms, "
                  f"writes after {kills[-1].write * 1000:,.0f} ms", flush=True)
        load.producing = False
        await asyncio.gather(*tasks[:WORKERS])
        # leases lost with a killed node come back after their timeout
        await until(lambda: not history.outstanding(), 3 * LEASE_TIMEOUT + 30, 0.2)
        await stop_all(tasks[WORKERS:])
        live = {i.id for i in await live_items(fleet.url, "failover")}
    print_failover(kills, history.check(LEASE_TIMEOUT), live, load.gave_up, args)


def print_failover(kills: list[Kill], report: Report, live: set[str], gave_up: int,
                   args: argparse.Namespace) -> None:
    print(f"\n## Failover: 3 nodes, sequencer on, behind nginx, {args.failover_rate:g} msg/s "
          f"of keyed produces and {WORKERS} consumers through nginx; SIGKILL of the role "
          f"holder, restart, {args.settle:g} s to settle\n")
    print("| kill | holder | role elsewhere ms | first produce after the kill acked ms |")
    print("|---:|---|---:|---:|")
    for n, k in enumerate(kills, 1):
        print(f"| {n} | {k.holder} | {k.role * 1000:,.0f} | {k.write * 1000:,.0f} |")
    for name, agg in (("median", statistics.median), ("max", max)):
        print(f"| {name} | | {agg(k.role for k in kills) * 1000:,.0f} "
              f"| {agg(k.write for k in kills) * 1000:,.0f} |")
    print(f"\nhistory: {'ok' if report.ok else 'FAILED'}: {report.summary()}; "
          f"{gave_up} items given up by their producer")
    if report.lost:
        print(f"of the {len(report.lost)} lost, {len(live & set(report.lost))} are still "
              "in the queue (not completed within the drain)")
    for name in ("lost", "completed_twice", "late_deliveries", "unexpected",
                 "duplicated_keys", "early_redeliveries"):
        if getattr(report, name):
            print(f"  {name}: {getattr(report, name)[:10]}")


# -- shards: one fleet-wide sequencer role, or one role per shard of queues ------------

SHARDED_NODES = 4  # nodes, queues and (in the sharded run) shards
SHARD_COUNTS = (1, SHARDED_NODES)
TICK = os.sysconf("SC_CLK_TCK")
Roles = dict[str, list[int]]  # node name -> the shards it says it holds


def spread_queues(count: int) -> list[str]:
    """``count`` queue names, the k-th on shard k of ``count``: one queue per shard."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < count:
        found.setdefault(shard_of(f"spread-{n}", count), f"spread-{n}")
        n += 1
    return [found[k] for k in range(count)]


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of a process so far (/proc/PID/stat); NaN when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = stat.rsplit(")", 1)[1].split()  # fields from the 3rd (state) on
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_busy() -> float:
    """CPU seconds all cores of the machine spent busy so far, whoever's (/proc/stat)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / TICK  # less idle and iowait


def cpu_of(fleet: LocalFleet) -> Counts:
    """CPU seconds so far of every process of the fleet, of this driver and of the
    whole machine (a shared machine: what others run shows as the difference)."""
    used = {name: cpu_seconds(pid) for name, pid in fleet.processes().items()}
    return {**used, "driver": time.process_time(), "machine": machine_busy()}


def roles_of(fleet: LocalFleet) -> Roles:
    """Each node's sequencer shards by its GET /health (blocking)."""
    return {f"node {node.index}": node.roles() for node in fleet.nodes}


async def all_held(fleet: LocalFleet, shards: int, timeout: float = 60) -> Roles:
    """Each node's shards once every shard has a holder (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        roles = await asyncio.to_thread(roles_of, fleet)
        if sum(map(len, roles.values())) >= shards or time.monotonic() > deadline:
            return roles
        await asyncio.sleep(0.05)


async def produce_spread(clients: list[Client], queues: list[str], messages: int,
                         ledgers: list[Ledger]) -> float:
    """4 producers, producer k on node k (round-robin), its r-th batch of 100 to queue
    k + r (round-robin): every queue is written at once, through every node in turn."""
    rounds = messages // WORKERS // BATCH

    async def producer(k: int) -> None:
        client = clients[k % len(clients)]
        for r in range(rounds):
            q = (k + r) % len(queues)
            ids = await persist(partial(client.produce, queues[q], [PAYLOAD] * BATCH),
                                ledgers[q])
            ledgers[q].produced.extend(ids)

    began = time.perf_counter()
    await asyncio.gather(*(producer(k) for k in range(WORKERS)))
    return rounds * WORKERS * BATCH / (time.perf_counter() - began)


async def drain_spread(clients: list[Client], queues: list[str],
                       ledgers: list[Ledger]) -> float:
    """4 consumers, consumer k on node k, each lease to the next queue with items left,
    until every acknowledged item is completed; msg/s."""
    goals = [len(ledger.produced) for ledger in ledgers]
    deadline = time.monotonic() + 60 + sum(goals) / 200

    def open_queues() -> list[int]:
        return [q for q, ledger in enumerate(ledgers) if ledger.completed < goals[q]]

    async def consumer(k: int) -> None:
        client = clients[k % len(clients)]
        r = k
        while (left := open_queues()) and time.monotonic() < deadline:
            q = left[r % len(left)]
            await consume(client, queues[q], ledgers[q], 0.5)
            r += 1

    began = time.perf_counter()
    await asyncio.gather(*(consumer(k) for k in range(WORKERS)))
    return sum(ledger.completed for ledger in ledgers) / (time.perf_counter() - began)


@dataclass
class Sharded:
    shards: int
    produce: float = 0.0
    consume: float = 0.0
    roles: Roles = field(default_factory=dict)  # after the warm-up
    roles_after: Roles = field(default_factory=dict)  # after the drain
    cpu: dict[str, Counts] = field(default_factory=dict)  # phase -> process -> CPU s
    wall: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    problems: dict[str, int] = field(default_factory=dict)


async def shards_run(shards: int, args: argparse.Namespace) -> Sharded:
    """4 nodes, sequencer on with ``shards`` shards, 4 queues on 4 distinct shards of 4.
    Queue k's first produce goes through node k, which so claims that queue's shard:
    with 4 shards each node holds one, with 1 the first node holds the only one."""
    result = Sharded(shards)
    queues = spread_queues(SHARDED_NODES)
    ledgers = [Ledger() for _ in queues]
    async with running(args.workdir, SHARDED_NODES, True, shards=shards) as fleet, \
            clients_of(fleet) as clients:
        for queue in queues:
            await clients[0].create_queue(queue)  # not a routed change: claims nothing
        for k, queue in enumerate(queues):
            ledgers[k].produced.extend(await clients[k % len(clients)].produce(queue, [PAYLOAD]))
        result.roles = await all_held(fleet, shards)
        marks = [(time.perf_counter(), cpu_of(fleet))]
        result.produce = await produce_spread(clients, queues, args.messages, ledgers)
        marks.append((time.perf_counter(), cpu_of(fleet)))
        result.consume = await drain_spread(clients, queues, ledgers)
        marks.append((time.perf_counter(), cpu_of(fleet)))
        result.roles_after = await asyncio.to_thread(roles_of, fleet)
    for n, phase in enumerate(("produce", "drain")):
        (t0, c0), (t1, c1) = marks[n], marks[n + 1]
        result.wall[phase] = t1 - t0
        result.cpu[phase] = {k: c1[k] - c0[k] for k in c1}
    result.problems = dict(sum((Counter(ledger.problems()) for ledger in ledgers), Counter()))
    return result


def held(roles: Roles) -> str:
    return ", ".join(f"{node} {shards}" for node, shards in roles.items() if shards) or "none"


def cpu_cells(r: Sharded, phase: str) -> str:
    """Per node CPU s; the busiest node's share of one core; SeaweedFS / compactor /
    driver CPU s; the machine's busy share of all its cores."""
    cpu, wall = r.cpu[phase], r.wall[phase]
    nodes = [cpu[f"node {k}"] for k in range(1, SHARDED_NODES + 1)]
    others = " / ".join(f"{cpu.get(name, float('nan')):.1f}"
                        for name in ("SeaweedFS", "compactor", "driver"))
    machine = cpu["machine"] / (wall * (os.cpu_count() or 1))
    return (f"{' / '.join(f'{c:.1f}' for c in nodes)} | {max(nodes) / wall:.0%} "
            f"| {others} | {machine:.0%}")


def print_shards(results: list[Sharded], args: argparse.Namespace) -> None:
    print(f"\n## Shards: {SHARDED_NODES} nodes, sequencer on, {SHARDED_NODES} queues on "
          f"{SHARDED_NODES} distinct shards of {SHARDED_NODES}; {WORKERS} producers and "
          f"{WORKERS} consumers, client k on node k, each call to the next queue in turn; "
          f"batches of {BATCH}, 1 KiB, {args.messages:,} messages produced then drained; "
          f"queue k first written through node k; CPU from /proc over each phase; "
          f"{os.cpu_count()} cores; SeaweedFS\n")
    print("| shards | roles held | phase | msg/s | s | CPU s node 1 / 2 / 3 / 4 "
          "| busiest node, of one core | CPU s SeaweedFS / compactor / driver "
          "| machine busy | check |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        check = "ok" if not r.problems else ", ".join(f"{k} {v}" for k, v in r.problems.items())
        roles = held(r.roles) + ("" if r.roles_after == r.roles
                                 else f" (after: {held(r.roles_after)})")
        for phase, rate in (("produce", r.produce), ("lease+complete", r.consume)):
            key = "produce" if phase == "produce" else "drain"
            print(f"| {r.shards} | {roles} | {phase} | {rate:,.0f} | {r.wall[key]:.1f} "
                  f"| {cpu_cells(r, key)} | {check} |")
    clean = sum(not r.problems for r in results)
    print(f"\ncheck: {clean} of {len(results)} runs had every produced id leased and "
          "completed exactly once, with no call retried")


# -- partitions: one queue over several nodes ------------------------------------------


@dataclass
class Spread:
    nodes: int
    partitions: int
    produce: float = 0.0
    consume: float = 0.0
    roles: Roles = field(default_factory=dict)
    cpu: dict[str, Counts] = field(default_factory=dict)  # phase -> process -> CPU s
    wall: dict[str, float] = field(default_factory=dict)
    forwards: float = 0.0  # forwards the nodes sent over the measured phases
    puts: dict[str, float] = field(default_factory=dict)  # phase -> PUT-class requests
    problems: dict[str, int] = field(default_factory=dict)


async def forwards_sent(fleet: LocalFleet) -> float:
    """Forwards the fleet's nodes sent (not those written directly instead)."""
    outcomes = await asyncio.to_thread(forward_outcomes, fleet)
    return sum(n for outcome, n in outcomes.items() if outcome != "direct")


async def partitions_run(nodes: int, partitions: int, args: argparse.Namespace) -> Spread:
    """``nodes`` nodes in sequencer mode with ``partitions`` shards, one queue of
    ``partitions`` partitions; the table's driver (4 producers and 4 consumers, client
    k on node k, batches of 100, 1 KiB). Each node's first produces claim a partition
    it finds unheld (okq.partitions), until every partition has a holder."""
    result = Spread(nodes, partitions)
    ledger = Ledger()
    queue = "spread"
    async with running(args.workdir, nodes, True, shards=partitions) as fleet, \
            clients_of(fleet) as clients:
        await clients[0].create_queue(queue, partitions=partitions)
        for _ in range(4):  # a node that found a partition held takes the next unheld one
            for c in clients:
                ledger.produced.extend(await c.produce(queue, [PAYLOAD]))
            roles = await asyncio.to_thread(roles_of, fleet)
            if sum(map(len, roles.values())) >= partitions:
                break
        result.roles = await all_held(fleet, partitions)
        sent = await forwards_sent(fleet)

        async def mark() -> tuple[float, Counts, float]:
            requests = (await asyncio.to_thread(fleet.store_requests)).total
            return time.perf_counter(), cpu_of(fleet), total(requests, PUT_CLASS)

        marks = [await mark()]
        result.produce = await produce_all(clients, queue, args.messages, ledger)
        marks.append(await mark())
        result.consume = await drain(clients, queue, ledger)
        marks.append(await mark())
        result.forwards = await forwards_sent(fleet) - sent
    for n, phase in enumerate(("produce", "drain")):
        (t0, c0, p0), (t1, c1, p1) = marks[n], marks[n + 1]
        result.wall[phase] = t1 - t0
        result.cpu[phase] = {k: c1[k] - c0[k] for k in c1}
        result.puts[phase] = p1 - p0
    result.problems = ledger.problems()
    return result


def print_partitions(results: list[Spread], args: argparse.Namespace) -> None:
    print(f"\n## Partitions: one queue of P partitions on N sequencer nodes (P shards); "
          f"{WORKERS} producers and {WORKERS} consumers in this process, client k on node "
          f"k, batches of {BATCH}, 1 KiB, {args.messages:,} messages produced then drained; "
          f"CPU from /proc over each phase; {os.cpu_count()} cores; SeaweedFS\n")
    print("| nodes | partitions | roles held | phase | msg/s | node CPU s (each) "
          "| each node's share of the fleet's | fleet CPU µs/msg | forwards/msg "
          "| PUT-class/msg | check |")
    print("|---:|---:|---|---|---:|---|---|---:|---:|---:|---|")
    base: dict[str, float] = {}
    for r in results:
        check = "ok" if not r.problems else ", ".join(f"{k} {v}" for k, v in r.problems.items())
        for phase, key in (("produce", "produce"), ("lease+complete", "drain")):
            cpu = r.cpu[key]
            each = [cpu[f"node {k}"] for k in range(1, r.nodes + 1)]
            fleet_us = sum(each) / args.messages * 1e6
            base.setdefault(phase, fleet_us)
            shares = " / ".join(f"{c / sum(each):.0%}" for c in each)
            print(f"| {r.nodes} | {r.partitions} | {held(r.roles)} | {phase} "
                  f"| {(r.produce if key == 'produce' else r.consume):,.0f} "
                  f"| {' / '.join(f'{c:.1f}' for c in each)} | {shares} "
                  f"| {fleet_us:.0f} ({fleet_us / base[phase]:.2f}x) "
                  f"| {r.forwards / args.messages / 2:.3f} "
                  f"| {r.puts[key] / args.messages:.4f} | {check} |")
    for phase, key in (("produce", "produce"), ("lease+complete", "drain")):
        per = {(n, p): statistics.median(
            sum(r.cpu[key][f"node {k}"] for k in range(1, n + 1)) / args.messages * 1e6
            for r in results if (r.nodes, r.partitions) == (n, p))
            for n, p in sorted({(r.nodes, r.partitions) for r in results})}
        first = (results[0].nodes, results[0].partitions)
        print(f"\n{phase}: fleet CPU per message, median: " + ", ".join(
            f"{n} nodes x {p} partitions {us:.1f} µs ({us / per[first]:.2f}x)"
            for (n, p), us in per.items()))


# -- main -------------------------------------------------------------------------------


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", help="node counts for the table (1,2,4; quick: 1,2)")
    parser.add_argument("--sequencer", default="off,on", help="off, on or off,on")
    parser.add_argument("--messages", type=int, help="messages per throughput run (20000)")
    parser.add_argument("--phases", default="table,idle,failover",
                        help="any of table, idle, failover, shards, partitions, "
                        "comma-separated")
    parser.add_argument("--mixed-seconds", type=float, help="length of the mixed phase (30)")
    parser.add_argument("--rate", type=float, default=1000.0, help="mixed phase msg/s offered")
    parser.add_argument("--mixed-batch", type=int, default=BATCH, help="mixed phase produce batch")
    parser.add_argument("--idle-nodes", help="node counts for the idle phase (the smallest "
                        "and largest of --nodes; quick: the largest)")
    parser.add_argument("--idle-seconds", type=float, help="idle-queue measurement (60)")
    parser.add_argument("--rest-seconds", type=float,
                        help="measurement with a queue but no client (60)")
    parser.add_argument("--samples", type=int, help="wake-latency samples (50)")
    parser.add_argument("--kills", type=int, help="SIGKILLs of the sequencer (10)")
    parser.add_argument("--failover-rate", type=float, default=40.0,
                        help="keyed msg/s during failover")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds to settle")
    parser.add_argument("--setups", default="1x1,2x2", help="partitions: NODESxPARTITIONS "
                        "runs, comma-separated; the first is the baseline")
    parser.add_argument("--rounds", type=int, default=2, help="partitions: rounds of the "
                        "setups, and the first once more at the end")
    parser.add_argument("--workers", type=int, default=WORKERS, help="producers and "
                        f"consumers of the driver (default {WORKERS}, the race's)")
    parser.add_argument("--quick", action="store_true", help="a smoke test of ~2 minutes")
    args = parser.parse_args()
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.node_counts = [int(n) for n in args.nodes.split(",")]
    if args.idle_nodes is None:  # the extremes of the table's; only the largest when quick
        ends = {max(args.node_counts)} if args.quick else {min(args.node_counts),
                                                             max(args.node_counts)}
        args.idle_nodes = ",".join(map(str, sorted(ends)))
    args.idle_counts = [int(n) for n in args.idle_nodes.split(",")]
    args.sequencers = [{"on": True, "off": False}[s] for s in args.sequencer.split(",")]
    return args


async def main() -> None:
    global WORKERS
    args = arguments()
    WORKERS = args.workers
    phases = args.phases.split(",")
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="okq-bench-fleet-") as tmp:
        args.workdir = Path(tmp)
        async with aiohttp.ClientSession() as http:
            if "table" in phases:
                rows = []
                for nodes in args.node_counts:
                    for seq in args.sequencers:
                        rows.append(await table_row(nodes, seq, args, http))
                        print(f"  table: {nodes} nodes, sequencer {seq}: done", flush=True)
                print_table(rows, args)
            if "idle" in phases:
                idle = []
                for nodes in args.idle_counts:
                    for seq in args.sequencers:
                        idle.append(await idle_run(nodes, seq, args, http))
                        print(f"  idle: {nodes} nodes, sequencer {seq}: done", flush=True)
                print_idle(idle, args)
            if "failover" in phases:
                await failover(args, http)
            if "shards" in phases:
                sharded = []
                for shards in SHARD_COUNTS:
                    sharded.append(await shards_run(shards, args))
                    print(f"  shards: {shards}: done", flush=True)
                print_shards(sharded, args)
            if "partitions" in phases:
                spread = []
                setups = [tuple(int(x) for x in s.split("x")) for s in args.setups.split(",")]
                runs = [r for _ in range(args.rounds) for r in setups] + setups[:1]
                for nodes, partitions in runs:
                    spread.append(await partitions_run(nodes, partitions, args))
                    print(f"  partitions: {nodes} nodes, {partitions} partitions: done",
                          flush=True)
                print_partitions(spread, args)
    print(f"\n(whole run {time.monotonic() - began:,.0f} s)")


if __name__ == "__main__":
    asyncio.run(main())
