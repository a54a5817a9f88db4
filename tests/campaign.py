"""The fault campaign (issue 13): a real fleet attacked under client load, each
scenario ending with the history checker (tests/history.py).

    python -m tests.campaign [--short|--long] [--report PATH] [--scenarios a,b] [--seed N]

A fleet (``okq.dev.fleet``: SeaweedFS, three ``okq serve`` nodes in
sequencer mode, the compactor, nginx, and HAProxy from deploy/haproxy as a
second load balancer over the same nodes) runs the scenarios, with the
fault-injecting proxy (tests/s3proxy.py) between SeaweedFS and every node and
the compactor; a second fleet like it without the sequencer then runs those
named ``name@direct`` (there every node takes its lease decisions by its own
clock, which is what the clock scenarios are after). Each scenario gets a
fresh queue (of P partitions for ``name:P``, okq.partitions) and its own client load:
producers send keyed batches and retry an unknown outcome with the same keys,
consumers complete what they lease, some through each load balancer and one
of each per node directly, and every outcome goes into a :class:`~tests.history.History`.

A scenario's name is ``injector[:P][+fifo][@direct]`` (``scenario_spec``), e.g.
``kill:2+fifo`` or ``clock+fifo@direct``: ``+fifo`` runs it on an ordered queue
(``fifo: true``, docs/DESIGN.md "Ordered delivery") whose producers give each item
one of ``FIFO_GROUPS`` message groups (drawn per item, so a batch often holds two
of a group and every producer feeds every group; a retried batch carries the same
keys and groups in the same order). The history then also records each key's
group, when its produce was first sent and when one was acknowledged, each lease
call and each item's place in its reply, and when each completion was first sent,
and ``History.check_order`` checks the order promise (tests/history.py gives the
rules and why each is sound): an item handed out while an item acknowledged before
its own produce was sent was still unfinished and not in its handout (*out of
order*), a reply listing a group's items out of order (*inverted*), and a handout
while another handout of the group surely still held its lease (*two in flight*;
not checked where clocks are skewed, as lease deadlines are the nodes' clocks). The
groups delivered from more than one partition are counted too (a group's items
all belong in one partition).
The faults run for the profile's time; then the load drains (producers stop,
consumers take everything left, waiting out lease timeouts) and the checker
reads the history. Scenarios (``SCENARIOS``):

* ``store`` — object-store faults through the proxy at configurable rates:
  500s before the server sees the request, slow calls, timeouts (no answer
  until past the nodes' S3 client timeout, landed or not), and writes that land
  while the caller gets a 500 or a dropped connection;
* ``kill`` — SIGKILL of nodes (the sequencer's holder first, then a node that
  does not hold it, then any) and of the compactor, again and again, each
  restarted;
* ``stop`` — SIGSTOP of a node (chosen the same way) for longer than the lease
  timeout while a consumer's completion is on its way to it, then SIGCONT: the
  late completions are refused;
* ``clock`` — per-node and compactor clock offsets within the design's skew
  bound (docs/DESIGN.md "Clocks": within 60 s of true time), set from outside
  with libfaketime (``LD_PRELOAD`` and ``FAKETIME``), applied and removed by
  rolling restarts under load; ``clock-beyond`` does the same past the bound,
  where the design promises no lost item and no second completion, only lost
  availability or order;
* ``s3-restart`` — SeaweedFS stopped and started again (same data, same port)
  in the middle of the run;
* ``hang`` — the sequencer's holder SIGSTOPped for ``hang_seconds`` (60 s in the
  long form) under load, then SIGCONT: how soon writes through each load
  balancer resume (the nodes find the holder hung by a ping and claim its role;
  HAProxy's health checks take it out of the rotation, nginx has none) is in the
  notes and in ``resumed``; through HAProxy later than ``HANG_RESUME_S`` is an
  incident;
* ``cutoff`` — the holder cut off from the store (the proxy answers every S3
  request of its own with a 500 at once, as for revoked credentials) while the
  others reach it, for ``cutoff_seconds``: another node must hold the role within
  ``ROLE_TTL`` (the notes say when it did);
* ``replay`` — the forwards between the nodes, captured on their way (the nodes
  advertise a tap, tests/forwardtap.py, for this fleet), posted again to the
  node each was meant for and to another node within the signature window:
  every one must be refused (``replays accepted``);
* ``namespaces`` — the holder SIGKILLed and another namespace's node started on
  its address with the same fleet key, a queue of the same name in it: nothing
  of the load may land there (``misdelivered``); the load runs on the other two
  nodes directly for this one, since nginx would send it there too.

The report (markdown and JSON) gives per scenario the operations, the faults
injected by kind, the checker's figures (on an ordered queue its order violations
and the items delivered per group) and the longest stall (the longest time no
client operation succeeded); a failed scenario's whole history is written to the
work directory as JSON (``History.dump``), beside the processes' logs. A process
that dies unasked (not killed by the campaign) is restarted, as a supervisor
would, and reported. The exit status is 1 when a scenario lost an item,
completed one twice, delivered one after its completion or (on an ordered queue)
broke the order, except past the clock bound (``clock-beyond``), where the design
does not promise order; 2 when the campaign cannot run (a program is missing).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import email.utils
import glob
import itertools
import json
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from okq.client import Client
from okq.clock import MAX_CLOCK_SKEW_MS
from okq.dev.fleet import FleetError, FleetNode, LocalFleet
from okq.dev.nginx import nginx_binary
from okq.dev.servers import Process, ServerMissing, free_port, weed_binary
from okq.errors import LeaseLost, OkqError, Overloaded, PublishAborted
from okq.fleetwire import FORWARD_PATH
from okq.partitions import token_queue
from okq.store.base import DEFAULT_S3_TIMEOUT
from okq.wire import LeasedItemOut, ProduceItem
from tests.forwardtap import ForwardTap
from tests.haproxy import HaproxyServer, haproxy_binary
from tests.history import ACCEPTED, REFUSED, UNKNOWN, History, OrderReport, Report
from tests.s3proxy import Rule, S3Proxy

LEASE_TIMEOUT = 3.0  # seconds: the campaign's queues redeliver a lost lease quickly
ROLE_TTL = 15.0  # a hung holder is found by pings within seconds; its lapse takes this long
CLIENT_TIMEOUT = 10.0  # the load's okq clients: longer than nginx gives a call (5 s)
#: The nodes' and the compactor's S3 request timeout (``--s3-timeout``; the fleet runs
#: them with its default): a "timeout" fault keeps the answer from them for longer.
S3_CLIENT_TIMEOUT = DEFAULT_S3_TIMEOUT
BOUND_S = MAX_CLOCK_SKEW_MS / 1000
#: Writes through a load balancer with active health checks resume this soon after
#: the holder hangs (issue 19), or the ``hang`` scenario reports an incident.
HANG_RESUME_S = 5.0
SCENARIOS = ("store", "kill", "stop", "clock", "clock-beyond", "s3-restart", "hang",
             "cutoff", "replay", "namespaces")
#: The namespace of the node that takes over a dead holder's address in ``namespaces``.
OTHER_NAMESPACE = "campaign-other"


# -- what a run looks like --------------------------------------------------------------


@dataclass(frozen=True)
class StoreFaults:
    """Rates of the object-store faults (each a probability per S3 request)."""

    error: float = 0.03  # a 500 before the request reaches SeaweedFS
    slow: float = 0.03  # the request waits ``slow_delay`` s, then goes through
    slow_delay: float = 1.0
    landed_error: float = 0.02  # a write lands, its caller gets a 500
    landed_drop: float = 0.01  # a write lands, its caller's connection is dropped
    timeout: float = 0.01  # no answer until past the S3 client timeout; never sent on
    timeout_landed: float = 0.01  # sent on (lands), answer held past the client timeout
    timeouts_max: int = 4  # of each timeout kind: each ties a request up past --s3-timeout


@dataclass(frozen=True)
class Profile:
    """How long and how hard: ``SHORT`` (CI, about 3 minutes) or ``LONG``."""

    name: str
    seconds: float  # faults (and load) per scenario, before the drain
    drain: float  # the longest a drain may take
    producers_per_balancer: int = 2
    consumers_per_balancer: int = 2
    batch: int = 5
    pause: float = 0.2  # between a producer's batches
    store: StoreFaults = StoreFaults()
    kill_pause: tuple[float, float] = (0.5, 2.0)  # down, then up, between kills
    compactor_kill_chance: float = 0.5
    stop_rounds: int = 1
    stop_seconds: float = LEASE_TIMEOUT + 5
    offsets: tuple[float, ...] = (60.0, -60.0, 30.0)  # per node, within the bound
    compactor_offset: float = 60.0
    beyond: tuple[float, ...] = (90.0, -90.0, 0.0)  # past the bound
    beyond_compactor: float = -90.0
    s3_restarts: int = 1
    hang_seconds: float = 10.0
    cutoff_seconds: float = ROLE_TTL + 5
    #: ``name`` runs on the sequencer-mode fleet, ``name@direct`` on a second fleet
    #: without it, where every node takes lease decisions by its own clock.
    #: ``name:P`` runs it on a queue of P partitions (okq.partitions): the short form
    #: kills nodes under a queue of 2 (test_fleet.py kills them under queues of 1 and
    #: of 3); the long form runs every scenario both ways. ``name+fifo`` runs it on an
    #: ordered queue with grouped items, its history checked for order too: the short
    #: form kills nodes under an ordered queue of 2 partitions.
    scenarios: tuple[str, ...] = ("store", "kill:2+fifo", "stop", "s3-restart",
                                  "clock@direct")


CAMPAIGN_CHUNK = 4  # segments per manifest chunk in the campaign's fleet
SHORT = Profile("short", seconds=6, drain=60, stop_rounds=2,
                store=StoreFaults(timeout=0.05, timeout_landed=0.05, timeouts_max=2))
#: The long form's scenarios on ordered queues.
FIFO_LONG = ("store+fifo", "kill+fifo", "stop+fifo", "s3-restart+fifo", "hang+fifo",
             "store:2+fifo", "kill:2+fifo", "stop:2+fifo", "clock+fifo@direct",
             "clock:2+fifo@direct", "store:2+fifo@direct")
LONG = Profile("long", seconds=100, drain=180, stop_rounds=5, s3_restarts=3, hang_seconds=60,
               cutoff_seconds=2 * ROLE_TTL + 10, store=StoreFaults(timeouts_max=12),
               scenarios=(*SCENARIOS, *(f"{n}:2" for n in SCENARIOS), *FIFO_LONG[:8],
                          "clock@direct", "clock-beyond@direct", "clock:2@direct",
                          "store:2@direct", *FIFO_LONG[8:]))
#: The message groups of a ``+fifo`` scenario's items.
FIFO_GROUPS = 8


@dataclass(frozen=True)
class Spec:
    """What a scenario's name says (``name[:P][+fifo][@direct]``)."""

    injector: str
    partitions: int = 1
    fifo: bool = False
    direct: bool = False


def scenario_spec(name: str) -> Spec:
    """``kill:2+fifo@direct`` -> Spec("kill", 2, fifo=True, direct=True); ValueError
    for a name of another shape or an unknown injector."""
    base, at, mode = name.partition("@")
    base, plus, flag = base.partition("+")
    injector, colon, partitions = base.partition(":")
    if (injector not in SCENARIOS or (at and mode != "direct") or (plus and flag != "fifo")
            or (colon and not (partitions.isdigit() and int(partitions) >= 1))):
        raise ValueError(f"not a scenario: {name!r}")
    return Spec(injector, int(partitions) if colon else 1, fifo=bool(plus), direct=bool(at))


def scenario_parts(name: str) -> tuple[str, int]:
    """A scenario's injector and its queue's partitions: ``kill:2@direct`` -> (kill, 2)."""
    spec = scenario_spec(name)
    return spec.injector, spec.partitions


# -- libfaketime ---------------------------------------------------------------------------


def libfaketime() -> str:
    """The multi-threaded libfaketime of Debian's ``faketime`` package (or a local build).

    A node runs with it in ``LD_PRELOAD`` rather than under the ``faketime``
    program, which forks: its pid would not be the node's, and a SIGKILL or a
    SIGSTOP would miss the node.
    """
    patterns = ("/usr/lib/*/faketime/libfaketimeMT.so.1", "/usr/lib/faketime/libfaketimeMT.so.1",
                "/usr/local/lib/faketime/libfaketimeMT.so.1")
    for pattern in patterns:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    raise ServerMissing("no libfaketime: install it with `apt-get install faketime` "
                        "(Debian, Ubuntu)")


def faketime_env(offset: float) -> dict[str, str]:
    """The environment that shifts a process's wall clock by ``offset`` seconds (its
    monotonic clock is left alone: only the time of day is wrong)."""
    return {"LD_PRELOAD": libfaketime(), "FAKETIME": f"{offset:+g}s",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def clock_offset(url: str) -> float | None:
    """How far a node's clock is from ours, read off its HTTP ``Date`` header
    (whole seconds); None when it does not answer."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
            stamp = resp.headers.get("Date")
    except OSError:
        return None
    if stamp is None:
        return None
    return email.utils.parsedate_to_datetime(stamp).timestamp() - time.time()


def forward_outcomes(fleet: LocalFleet) -> dict[str, float]:
    """``okq_sequencer_forwards`` by outcome, summed over the live nodes (since their
    last start)."""
    found: Counter[str] = Counter()
    for node in fleet.nodes:
        for family in text_string_to_metric_families(node.metrics()):
            if family.name == "okq_sequencer_forwards":
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        found[sample.labels["outcome"]] += int(sample.value)
    return dict(found)


def require_programs() -> None:
    """ServerMissing unless weed, nginx, HAProxy and libfaketime are all here."""
    weed_binary()
    nginx_binary()
    haproxy_binary()
    libfaketime()


# -- client load ----------------------------------------------------------------------------


class Progress:
    """The longest time with no successful client operation (a produce acknowledged,
    a lease that returned items, a completion accepted)."""

    def __init__(self) -> None:
        self.began = self.last = time.monotonic()
        self.longest = 0.0
        self.longest_at = 0.0  # seconds into the run when that stall began

    def tick(self) -> None:
        now = time.monotonic()
        self._gap(now)
        self.last = now

    def end(self) -> None:
        self._gap(time.monotonic())

    def _gap(self, now: float) -> None:
        if now - self.last > self.longest:
            self.longest = now - self.last
            self.longest_at = self.last - self.began


@dataclass
class Load:
    """Producers and consumers, each bound to one URL (nginx or a node), every outcome
    recorded in ``history``.

    A producer retries a batch whose outcome is unknown with the same keys until
    it is acknowledged, so an unknown outcome never becomes a loss or a
    duplicate. A consumer completes everything it leases and retries a
    completion of unknown outcome with the same tokens (repeating a completion
    is a no-op); it records each completion's outcome, and which URL refused it.
    """

    queue: str
    producer_urls: Sequence[str]
    consumer_urls: Sequence[str]
    batch: int = 5
    pause: float = 0.2
    client_timeout: float = CLIENT_TIMEOUT
    #: message groups the producers spread their items over (0: none): on an ordered
    #: queue, ``g0`` ... each item's drawn at random, so that a batch often holds two
    #: of one group and every group is fed by every producer
    groups: int = 0
    history: History = field(default_factory=History)
    ops: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    refused_via: Counter[str] = field(default_factory=Counter)
    #: (monotonic time, URL) of every acknowledged produce
    writes: list[tuple[float, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.producing = self.consuming = True
        self.progress = Progress()
        self._stopped = False
        self._producers: list[asyncio.Task[None]] = []
        self._consumers: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.progress = Progress()
        self._producers = [asyncio.create_task(self._produce(n, url))
                           for n, url in enumerate(self.producer_urls)]
        self._consumers = [asyncio.create_task(self._consume(url))
                           for url in self.consumer_urls]

    # -- producing ----------------------------------------------------------------------

    async def _produce(self, n: int, url: str) -> None:
        rng = random.Random(f"{self.queue}-{n}")
        async with Client(url, timeout=self.client_timeout) as c:
            for seq in itertools.count():
                if not self.producing:
                    return
                groups = ([f"g{rng.randrange(self.groups)}" for _ in range(self.batch)]
                          if self.groups else None)
                await self._produce_batch(c, [f"{self.queue}-{n}-{seq}-{i}"
                                              for i in range(self.batch)], groups)
                self.writes.append((time.monotonic(), url))
                await asyncio.sleep(self.pause)

    def write_gaps(self, url: str, start: float, end: float) -> tuple[float | None, float]:
        """Through ``url`` between ``start`` and ``end``: seconds to the first
        acknowledged produce, and the longest time with none."""
        times = [t for t, u in self.writes if u == url and start <= t <= end]
        if not times:
            return None, end - start
        edges = [start, *times, end]
        return times[0] - start, max(b - a for a, b in itertools.pairwise(edges))

    async def _produce_batch(self, c: Client, keys: list[str],
                             groups: list[str] | None = None) -> None:
        """Until acknowledged: a batch whose outcome is unknown may exist already, so
        it is sent again with the same keys and groups, in the same order (for at most
        90 s, then left unknown)."""
        items = [ProduceItem(utf8=k, key=k, group=groups[n] if groups else None)
                 for n, k in enumerate(keys)]
        give_up = time.monotonic() + 90
        while time.monotonic() < give_up:
            self.history.sending(keys, groups)
            try:
                ids = await c.produce(self.queue, items)
            except (Overloaded, PublishAborted) as exc:  # nothing was published
                self._error("produce", exc)
                self.ops["produce failed"] += 1
                self.history.produce_failed(keys, unknown=False)
            except OkqError as exc:
                self._error("produce", exc)
                self.ops["produce unknown"] += 1
                self.history.produce_failed(keys, unknown=True)
            else:
                self.ops["produce acknowledged"] += 1
                self.history.produced(keys, ids)
                self.progress.tick()
                return
            await asyncio.sleep(0.2)

    # -- consuming ----------------------------------------------------------------------

    async def _consume(self, url: str) -> None:
        async with Client(url, timeout=self.client_timeout) as c:
            while self.consuming:
                items = await self.lease(c)
                if items:
                    await self.complete(c, items)

    async def lease(self, c: Client, batch: int = 20,
                    wait: float = 0.5) -> list[LeasedItemOut] | None:
        """One lease call, its deliveries recorded; None when it failed (the items it
        may have leased come back after their lease timeout)."""
        began = self.history.clock()
        try:
            items = await c.lease(self.queue, batch, request_timeout=wait)
        except OkqError as exc:
            self._error("lease", exc)
            self.ops["lease failed"] += 1
            await asyncio.sleep(0.1)
            return None
        returned, wall = self.history.clock(), self.history.wall()
        self.ops["lease calls"] += 1
        call = self.history.new_call()
        for n, item in enumerate(items):
            group = (item.meta or {}).get("group")
            self.history.delivered(item.id, item.token, item.attempts, key=item.utf8,
                                   invoked=began, deadline=item.lease_deadline.timestamp(),
                                   returned=returned, returned_wall=wall, call=call, index=n,
                                   group=group if isinstance(group, str) else None)
        if items:
            self.progress.tick()
        return items

    async def complete(self, c: Client, items: list[LeasedItemOut], patience: float = 30) -> None:
        """Complete ``items`` through ``c``, retrying an unknown outcome with the same
        tokens for ``patience`` seconds; record each item's outcome, with when the
        first attempt was sent (unknown if the task is cancelled on its way)."""
        sent = self.history.clock()
        try:
            await self._complete(c, items, sent, patience)
        except asyncio.CancelledError:
            for item in items:
                self.history.completed(item.id, item.token, UNKNOWN, sent=sent)
            raise

    async def _complete(self, c: Client, items: list[LeasedItemOut], sent: float,
                        patience: float) -> None:
        ambiguous = False
        give_up = time.monotonic() + patience
        while time.monotonic() < give_up:
            try:
                await c.complete(self.queue, [i.token for i in items])
            except LeaseLost as exc:
                self._refused(c.url, items, exc, ambiguous, sent)
                return
            except OkqError as exc:
                self._error("complete", exc)
                ambiguous = True
                await asyncio.sleep(0.2)
                continue
            for item in items:
                self.history.completed(item.id, item.token, ACCEPTED, sent=sent)
            self.progress.tick()
            return
        for item in items:
            self.history.completed(item.id, item.token, UNKNOWN, sent=sent)

    def _refused(self, url: str, items: list[LeasedItemOut], exc: LeaseLost,
                 ambiguous: bool, sent: float) -> None:
        """Some completions were refused: those the error names; the others landed.

        A refusal because the item's segment was compacted away, after an earlier
        attempt of unknown outcome, leaves the outcome unknown: that attempt may
        have been the completion the compactor folded."""
        failed = {f["index"]: str(f.get("reason", "")) for f in exc.details.get("failed", [])}
        for n, item in enumerate(items):
            if not failed:
                outcome = UNKNOWN
            elif n not in failed:
                outcome = ACCEPTED
            elif ambiguous and "compacted" in failed[n]:
                outcome = UNKNOWN
            else:
                outcome = REFUSED
                self.refused_via[url] += 1
            self.history.completed(item.id, item.token, outcome, sent=sent)

    def _error(self, op: str, exc: OkqError) -> None:
        status = exc.details.get("status", "")
        self.errors[f"{op}: {type(exc).__name__} {status}".strip()] += 1

    # -- the end ------------------------------------------------------------------------

    async def drain(self, timeout: float, stats_url: str) -> bool:
        """Stop producing, then consume until every acknowledged item is settled and
        the queue holds nothing (or ``timeout`` passed); stop the consumers. True
        when it drained."""
        self.producing = False
        deadline = time.monotonic() + timeout
        drained = False
        try:
            await asyncio.wait(self._producers, timeout=timeout)
            async with Client(stats_url, timeout=self.client_timeout) as c:
                while not drained and time.monotonic() < deadline:
                    drained = await self._empty(c)
                    if not drained:
                        await asyncio.sleep(0.25)
        finally:
            await self.stop(drained)
        return drained

    async def _empty(self, c: Client) -> bool:
        if self.history.outstanding():
            return False
        try:
            stats = await c.stats(self.queue)
        except OkqError:
            return False
        return stats.available + stats.in_flight + stats.waiting_retry + stats.scheduled == 0

    async def stop(self, drained: bool = False) -> None:
        """Stop every client. Unless the queue was found drained, the time since the
        last success counts as a stall (work was left that nothing did)."""
        if self._stopped:
            return
        self._stopped = True
        self.producing = self.consuming = False
        tasks = [*self._producers, *self._consumers]
        _, late = await asyncio.wait(tasks, timeout=120) if tasks else (set(), set())
        for task in late:  # a call stuck past every timeout: cut it off
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if not drained:
            self.progress.end()


# -- object-store faults ---------------------------------------------------------------------


def store_rules(f: StoreFaults) -> dict[str, list[Rule]]:
    """The proxy's rules for ``f``, by kind of fault. Writes (PUT, POST, DELETE) are
    the ones that can land before their caller is told anything."""
    past = S3_CLIENT_TIMEOUT + 2
    writes = ("PUT", "POST", "DELETE")
    return {
        "timeout (not landed)": [Rule(path="", times=f.timeouts_max, probability=f.timeout,
                                      delay=past, forward=False)],
        "timeout (landed)": [Rule(method="PUT", times=f.timeouts_max,
                                  probability=f.timeout_landed, hold=True, hold_timeout=past,
                                  reply="drop")],
        "500 (landed)": [Rule(method=m, times=None, probability=f.landed_error, reply="error")
                         for m in writes],
        "dropped connection (landed)": [Rule(method=m, times=None, probability=f.landed_drop,
                                             reply="drop") for m in writes],
        "500": [Rule(times=None, probability=f.error, forward=False, reply="error")],
        "slow": [Rule(times=None, probability=f.slow, delay=f.slow_delay)],
    }


def _object_kind(hit: str) -> str:
    """``PUT /okq/fleet/default/manifests/q`` -> ``PUT manifests``."""
    method, _, path = hit.partition(" ")
    parts = path.strip("/").split("/")
    return f"{method} {parts[3] if len(parts) > 3 else path}"


def retire(rules: dict[str, list[Rule]]) -> None:
    """Stop the rules from matching anything more, without releasing a reply they
    hold: a timeout already under way still runs past the client timeout."""
    for group in rules.values():
        for rule in group:
            rule.times = len(rule.matched)


# -- results ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One scenario's figures, as the report shows them."""

    scenario: str  # as named on the command line: ``clock@direct``
    mode: str  # sequencer or direct
    seconds: float
    drained: bool
    operations: dict[str, int]
    faults: dict[str, int]
    died: dict[str, int]  # processes that exited on their own (and were restarted)
    lost: int
    completed_twice: int
    delivered_after_completion: int
    deliveries: int
    items_delivered: int
    duplicate_deliveries: int
    duplicate_rate: float
    longest_stall: float
    longest_stall_at: float
    uncertain: int
    unexpected: int
    duplicated_keys: int
    early_redeliveries: int | None
    clocks: dict[str, dict[str, float | None]]
    errors: dict[str, int]
    notes: list[str]
    checker: str
    examples: dict[str, list[Any]]
    misdelivered: int = 0
    replays_accepted: int = 0
    resumed: dict[str, float | None] = field(default_factory=dict)
    #: ``+fifo`` only (None elsewhere): ``History.check_order``'s findings, the items
    #: delivered per group, and the groups delivered from more than one partition
    order_violations: int | None = None
    out_of_order: int | None = None
    #: of those, behind an item that was never completed at all (lost): the loss may
    #: be what let the group go on
    out_of_order_behind_lost: int | None = None
    inverted_in_handout: int | None = None
    two_in_flight: int | None = None  # None as well where clocks were skewed
    order_checked: int | None = None
    groups: dict[str, int] = field(default_factory=dict)
    split_groups: int | None = None
    order: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.lost or self.completed_twice or self.delivered_after_completion
                    or self.misdelivered or self.replays_accepted or self.order_failed)

    @property
    def order_failed(self) -> bool:
        """Order broken where the design promises it: everywhere but ``clock-beyond``
        (past the clock bound it promises no lost item and no second completion,
        only lost availability or order)."""
        broken = bool(self.order_violations or self.split_groups)
        return broken and scenario_spec(self.scenario).injector != "clock-beyond"


def outcome_of(name: str, mode: str, seconds: float, drained: bool, load: Load,
               report: Report, run: Run, order: OrderReport | None = None) -> Outcome:
    outcomes = Counter(c.outcome for c in load.history.completions)
    ops = {**load.ops, "items acknowledged": report.produced,
           "completions accepted": outcomes[ACCEPTED],
           "completions refused": outcomes[REFUSED],
           "completions unknown": outcomes[UNKNOWN]}
    return Outcome(
        scenario=name, mode=mode, seconds=round(seconds, 1), drained=drained, operations=dict(ops),
        faults=dict(run.faults), died=dict(run.incidents), lost=len(report.lost),
        completed_twice=len(report.completed_twice),
        delivered_after_completion=len(report.late_deliveries),
        deliveries=report.deliveries, items_delivered=report.items_delivered,
        duplicate_deliveries=report.deliveries - report.items_delivered,
        duplicate_rate=round(report.duplicate_delivery_rate, 4),
        longest_stall=round(load.progress.longest, 2),
        longest_stall_at=round(load.progress.longest_at, 1),
        uncertain=len(report.uncertain), unexpected=len(report.unexpected),
        duplicated_keys=len(report.duplicated_keys),
        early_redeliveries=None if run.skewed else len(report.early_redeliveries),
        clocks=run.clocks, misdelivered=run.misdelivered,
        replays_accepted=run.replays_accepted, resumed=run.resumed,
        errors=dict(load.errors.most_common()), notes=run.notes, checker=report.summary(),
        examples={"lost": report.lost[:10], "completed_twice": report.completed_twice[:10],
                  "late_deliveries": [list(x) for x in report.late_deliveries[:10]],
                  "unexpected": report.unexpected[:10],
                  **(_order_examples(order) if order is not None else {})},
        **(_order_fields(order, load.history, report) if order is not None else {}),
    )


def _order_fields(order: OrderReport, history: History, report: Report) -> dict[str, Any]:
    lost = {history.key_of.get(i, i) for i in report.lost}
    return {"order_violations": order.violations, "out_of_order": len(order.out_of_order),
            "out_of_order_behind_lost": sum(y in lost for _, _, y in order.out_of_order),
            "inverted_in_handout": len(order.inverted),
            "two_in_flight": None if order.two_in_flight is None else len(order.two_in_flight),
            "order_checked": order.checked, "groups": order.groups,
            "split_groups": len(split_groups(history)), "order": order.summary()}


def _order_examples(order: OrderReport) -> dict[str, list[Any]]:
    return {"out_of_order": [list(x) for x in order.out_of_order[:10]],
            "inverted_in_handout": [list(x) for x in order.inverted[:10]],
            "two_in_flight": [list(x) for x in (order.two_in_flight or [])[:10]]}


def split_groups(history: History) -> dict[str, set[str]]:
    """Groups whose items were delivered from more than one partition (read off the
    lease tokens): each group's items all belong in the partition its name hashes to."""
    seen: dict[str, set[str]] = {}
    for d in history.deliveries:
        group = history.groups.get(d.key or "") or d.group
        if group is not None:
            seen.setdefault(group, set()).add(str(token_queue(d.token)))
    return {g: parts for g, parts in sorted(seen.items()) if len(parts) > 1}


def markdown(outcomes: Sequence[Outcome], header: dict[str, Any]) -> str:
    """The report: one table row per scenario, then each scenario's details."""
    lines = [f"# okq fault campaign ({header['profile']}, seed {header['seed']})", "",
             f"{header['started']}; {header['seconds']:.0f} s in all (fleet start "
             f"{', '.join(f'{s:g}' for s in header['fleet_start'])} s); {header['fleet']}", "",
             "| scenario | s | produces ack / unknown / failed (items) | leases ok / failed "
             "| completions accepted / refused / unknown | faults injected | misdelivered "
             "| replays accepted | lost "
             "| completed twice | delivered after completion | order violations "
             "| duplicate deliveries (rate) | longest stall | died unasked |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [_row(o) for o in outcomes]
    for o in outcomes:
        early = "n/a (clocks skewed)" if o.early_redeliveries is None else o.early_redeliveries
        lines += ["", f"## {o.scenario}", "", f"- checker: {o.checker}",
                  f"- drained: {'yes' if o.drained else 'NO (timed out)'}; uncertain items "
                  f"{o.uncertain}; unexpected {o.unexpected}; duplicated keys "
                  f"{o.duplicated_keys}; early redeliveries {early}",
                  f"- longest stall {o.longest_stall:.2f} s, beginning {o.longest_stall_at:.1f} s "
                  "into the run",
                  f"- client errors: {_errors(o.errors)}"]
        if o.order_violations is not None:
            flight = "n/a (clocks skewed)" if o.two_in_flight is None else o.two_in_flight
            lines.append(
                f"- order (ordered queue, {len(o.groups)} groups): {o.order_checked} "
                f"deliveries checked against earlier items of their group; out of order "
                f"{o.out_of_order} ({o.out_of_order_behind_lost} behind a lost item), "
                f"inverted within a handout {o.inverted_in_handout}, two handouts of a "
                f"group in flight {flight}; groups in more than one partition "
                f"{o.split_groups}; items delivered per group {o.groups}"
                + ("; past the clock bound order is not promised" if o.order_violations
                   and not o.order_failed else ""))
        lines += [f"- {note}" for note in o.notes]
        if o.failed:
            lines.append(f"- FAILED: examples {json.dumps(o.examples)}")
    return "\n".join(lines) + "\n"


def _row(o: Outcome) -> str:
    ops = o.operations
    produces = (f"{ops.get('produce acknowledged', 0)} / {ops.get('produce unknown', 0)} / "
                f"{ops.get('produce failed', 0)} ({ops.get('items acknowledged', 0)})")
    leases = f"{ops.get('lease calls', 0)} / {ops.get('lease failed', 0)}"
    completions = (f"{ops['completions accepted']} / {ops['completions refused']} / "
                   f"{ops['completions unknown']}")
    faults = ", ".join(f"{k} {v}" for k, v in o.faults.items()) or "none"
    order = "n/a" if o.order_violations is None else o.order_violations
    return (f"| {o.scenario} | {o.seconds:.0f} | {produces} | {leases} | {completions} "
            f"| {faults} | {o.misdelivered} | {o.replays_accepted} | {o.lost} "
            f"| {o.completed_twice} "
            f"| {o.delivered_after_completion} | {order} "
            f"| {o.duplicate_deliveries} ({o.duplicate_rate:.3f}) | {o.longest_stall:.1f} s "
            f"| {', '.join(f'{k} {v}' for k, v in o.died.items()) or 'none'} |")


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in list(errors.items())[:8]) or "none"


# -- the campaign -----------------------------------------------------------------------------


@dataclass
class Run:
    """What a scenario's fault injector writes down while the load runs."""

    load: Load
    faults: Counter[str] = field(default_factory=Counter)
    incidents: Counter[str] = field(default_factory=Counter)  # processes that died unasked
    notes: list[str] = field(default_factory=list)
    clocks: dict[str, dict[str, float | None]] = field(default_factory=dict)  # asked, seen
    skewed: bool = False  # clocks were wrong: lease deadlines are not comparable
    misdelivered: int = 0  # items that reached another namespace's queue
    replays_accepted: int = 0  # captured forwards a node ran again
    #: load balancer -> seconds from the fault to the first write acknowledged through it
    resumed: dict[str, float | None] = field(default_factory=dict)


class Campaign:
    """A fleet with the proxy in front of its SeaweedFS, and the scenarios run on it."""

    def __init__(self, profile: Profile, workdir: Path, seed: int,
                 sequencer: bool = True, tap: bool = False) -> None:
        self.profile = profile
        self.workdir = workdir
        self.seed = seed
        self.rng = random.Random(seed)
        self.proxy: S3Proxy | None = None
        self.tap = ForwardTap().start() if tap else None
        self.fleet = LocalFleet(
            workdir / ("fleet" if sequencer else "fleet-direct"), 3, sequencer=sequencer,
            role_ttl=ROLE_TTL,
            # Manifest chunks of a few segments (the default is 128), so that the faults
            # land on heads and chunks cut, rewritten by compaction and read cold.
            node_args=["--manifest-chunk", str(CAMPAIGN_CHUNK)],
            compactor_args=["--interval", "2", "--safety-age", "200", "--gc-every", "5",
                            "--manifest-chunk", str(CAMPAIGN_CHUNK)],
            stop_timeout=10, s3_via=self._proxy_for, node_s3=self._node_s3,
            advertise=self.tap.url_for if self.tap else None)
        #: A second load balancer over the same nodes, with active health checks.
        self.haproxy: HaproxyServer | None = None
        self.fleet_start = 0.0
        #: Held while a scenario or the supervisor takes processes down or up: one at a time.
        self._hands = threading.Lock()

    def _proxy_for(self, seaweed: str) -> str:
        """LocalFleet's hook: the proxy, started in front of SeaweedFS once it runs."""
        self.proxy = S3Proxy(seaweed, seed=self.seed, clients=3).start()
        return self.proxy.endpoint

    def _node_s3(self, index: int) -> str:
        """LocalFleet's hook: node ``index``'s own address of the proxy (``cutoff``)."""
        assert self.proxy is not None
        return self.proxy.endpoint_for(index)

    # -- life -----------------------------------------------------------------------------

    def start(self) -> None:
        began = time.monotonic()
        self.fleet.start()
        self.haproxy = HaproxyServer(
            self.workdir / ("haproxy" if self.fleet.sequencer else "haproxy-direct"), free_port(),
            [n.url.removeprefix("http://") for n in self.fleet.nodes]).start()
        asyncio.run(self._warm_up())
        if self.fleet.sequencer:
            self.fleet.wait_holder(30)
        self.fleet_start = time.monotonic() - began

    async def _warm_up(self) -> None:
        """A node claims a sequencer role when a queue of its shard is first written."""
        async with Client(self.fleet.url, timeout=30) as c:
            await c.create_queue("warm-up", exist_ok=True)
            await c.produce("warm-up", ["warm-up"])

    def stop(self) -> None:
        if self.haproxy is not None:
            self.haproxy.stop()
        self.fleet.stop()
        if self.proxy is not None:
            self.proxy.stop()
        if self.tap is not None:
            self.tap.stop()

    # -- scenarios ---------------------------------------------------------------------------

    async def scenario(self, name: str) -> Outcome:
        """Run one scenario (``clock``, ``clock@direct``, ``kill:2+fifo``) under load,
        drain, check."""
        spec = scenario_spec(name)
        injector = spec.injector
        inject = self._injectors()[injector]
        queue = f"c-{injector}{'-fifo' if spec.fifo else ''}-{uuid.uuid4().hex[:8]}"
        fifo = {"fifo": True} if spec.fifo else {}
        async with Client(self.fleet.url, timeout=30) as c:
            info = await c.create_queue(queue, lease_timeout=LEASE_TIMEOUT,
                                        partitions=spec.partitions, **fifo)
        assert info.fifo == spec.fifo, info
        nodes = [n.url for n in self.fleet.nodes]
        via = self._balancers()
        if injector == "namespaces":  # a balancer would send clients to the other namespace's node
            holder = await asyncio.to_thread(self.fleet.holder)
            nodes = [n.url for n in self.fleet.nodes if n is not holder]
            via = []
        load = Load(queue, via * self.profile.producers_per_balancer + nodes,
                    via * self.profile.consumers_per_balancer + nodes,
                    batch=self.profile.batch, pause=self.profile.pause,
                    groups=FIFO_GROUPS if spec.fifo else 0)
        run = Run(load)
        began = time.monotonic()
        load.start()
        supervisor = asyncio.create_task(self._supervise(run))
        try:
            await inject(run)
            await asyncio.to_thread(self._heal, run)
            drained = await load.drain(self.profile.drain, self.fleet.url)
        finally:
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
            await load.stop()
        report = load.history.check(lease_timeout=None if run.skewed else LEASE_TIMEOUT)
        # the lease deadlines are the nodes' wall clocks: comparable with ours unless
        # skewed; a queue without max_attempts (the campaign's) never dead-letters
        order = (load.history.check_order(in_flight=not run.skewed,
                                          dead_letters=info.max_attempts > 0)
                 if spec.fifo else None)
        mode = "sequencer" if self.fleet.sequencer else "direct"
        outcome = outcome_of(name, mode, time.monotonic() - began, drained, load, report, run,
                             order)
        if outcome.failed:  # the whole history, beside the logs the campaign keeps
            path = self.workdir / f"history-{name}.json"
            path.write_text(json.dumps({"queue": queue, **load.history.dump()}))
            outcome.notes.append(f"history written to {path}")
        return outcome

    def _balancers(self) -> list[str]:
        """The load balancers' URLs: nginx (``okq fleet``'s) and HAProxy."""
        assert self.haproxy is not None, "the campaign is not started"
        return [self.fleet.url, self.haproxy.url]

    def _resumed(self, run: Run, since: float) -> str:
        """Notes each balancer's first acknowledged write after ``since`` in ``run``;
        says so in words."""
        said = []
        for name, url in zip(("nginx", "HAProxy"), self._balancers(), strict=True):
            first, longest = run.load.write_gaps(url, since, time.monotonic())
            run.resumed[name] = None if first is None else round(first, 2)
            said.append(f"through {name} first {'none' if first is None else f'{first:.1f} s'}"
                        f" after it, longest time with none {longest:.1f} s")
        return "; ".join(said)

    def _injectors(self) -> dict[str, Callable[[Run], Awaitable[None]]]:
        return {"store": self._store, "kill": self._kill, "stop": self._stop,
                "clock": self._clock, "clock-beyond": self._clock_beyond,
                "s3-restart": self._s3_restart, "hang": self._hang, "cutoff": self._cutoff,
                "replay": self._replay, "namespaces": self._namespaces}

    @contextlib.asynccontextmanager
    async def _on_purpose(self) -> AsyncIterator[None]:
        """While a scenario takes processes down and up itself, the supervisor keeps off
        (a threading lock, taken off the event loop: the supervisor works in a thread)."""
        await asyncio.to_thread(self._hands.acquire)
        try:
            yield
        finally:
            self._hands.release()

    async def _supervise(self, run: Run) -> None:
        """Restart a process that died on its own, as systemd or Kubernetes would, and
        write down what it said last: a campaign finding."""
        while True:
            await asyncio.sleep(1)
            await asyncio.to_thread(self._revive_unless_busy, run)

    def _revive_unless_busy(self, run: Run) -> None:
        if self._hands.acquire(blocking=False):
            try:
                self._revive(run)
            finally:
                self._hands.release()

    def _revive(self, run: Run) -> None:
        for node in self.fleet.nodes:
            if not node.alive():
                self._died(run, f"node {node.index}", node.process)
                node.restart()
        compactor = self.fleet.compactor
        if compactor is not None and not compactor.alive():
            self._died(run, "compactor", compactor)
            self.fleet.restart_compactor()

    @staticmethod
    def _died(run: Run, name: str, process: Process) -> None:
        run.incidents[f"{name} exited on its own"] += 1
        said = [line for line in process.tail(400).splitlines()
                if line.startswith(("Error", "Traceback", "okq", "RuntimeError"))]
        last = said[-1][:240] if said else process.tail(1)[:240]
        run.notes.append(f"{name} exited on its own with status {process.exit_code()}; "
                         f"it said: {last}")

    def _heal(self, run: Run) -> None:
        """Whatever a scenario left stopped or down runs again."""
        with self._hands:
            for node in self.fleet.nodes:
                node.kill(signal.SIGCONT)
            self._revive(run)

    async def _store(self, run: Run) -> None:
        """Errors, slow calls and landed errors for the whole time; timeouts join them
        for the last third (each stalls what waits on it for the S3 client timeout,
        which would leave the other faults few requests to act on)."""
        assert self.proxy is not None
        rules = store_rules(self.profile.store)
        timeouts = [k for k in rules if k.startswith("timeout")]
        before = sum(self.proxy.requests.values())
        try:
            for kind in sorted(rules, key=lambda k: k in timeouts):
                if kind == timeouts[0]:
                    await asyncio.sleep(self.profile.seconds * 2 / 3)
                for rule in rules[kind]:
                    self.proxy.add(rule)
            await asyncio.sleep(self.profile.seconds / 3)
        finally:
            retire(rules)
        for kind, group in rules.items():
            run.faults[kind] = sum(len(r.matched) for r in group)
        requests = sum(self.proxy.requests.values()) - before
        held = Counter(_object_kind(hit) for k in timeouts for r in rules[k] for hit in r.matched)
        run.notes.append(f"{requests} S3 requests through the proxy while the faults ran; "
                         f"rates {asdict(self.profile.store)}; timeouts hit {dict(held)}")

    async def _kill(self, run: Run) -> None:
        end = time.monotonic() + self.profile.seconds
        down, up = self.profile.kill_pause
        for turn in itertools.count():
            if time.monotonic() >= end:
                return
            node = await self._victim(turn, run)
            compactor = turn == 0 or self.rng.random() < self.profile.compactor_kill_chance
            async with self._on_purpose():
                await asyncio.to_thread(self._sigkill, node, compactor, run)
                await asyncio.sleep(self.rng.uniform(0.2, down))
                await asyncio.to_thread(node.restart)
                if compactor:
                    await asyncio.to_thread(self.fleet.restart_compactor)
            await asyncio.sleep(self.rng.uniform(0.2, up))

    async def _victim(self, turn: int, run: Run) -> FleetNode:
        """The sequencer's holder at the first turn, a node that does not hold it at the
        second (a node that is only a gateway), then any node."""
        holder = await asyncio.to_thread(self.fleet.holder) if self.fleet.sequencer else None
        if holder is None or turn > 1:
            return self.rng.choice(self.fleet.nodes)
        if turn == 0:
            run.notes.append(f"first victim: node {holder.index}, the sequencer's holder")
            return holder
        return self.rng.choice([n for n in self.fleet.nodes if n is not holder])

    def _sigkill(self, node: FleetNode, compactor: bool, run: Run) -> None:
        node.kill(signal.SIGKILL)
        run.faults["SIGKILL node"] += 1
        if compactor and self.fleet.compactor is not None:
            self.fleet.compactor.kill()
            run.faults["SIGKILL compactor"] += 1

    async def _stop(self, run: Run) -> None:
        """Each round: a consumer leases through the victim, the victim is stopped,
        the consumer sends its completion to it; past the lease timeout the items
        are leased again elsewhere; SIGCONT, and the completion is answered."""
        rounds = self.profile.stop_rounds
        gap = max(1.0, (self.profile.seconds - rounds * self.profile.stop_seconds) / rounds)
        for n in range(rounds):
            await asyncio.sleep(gap / 2)
            await self._stop_round(await self._victim(n, run), run)
            await asyncio.sleep(gap / 2)

    async def _stop_round(self, victim: FleetNode, run: Run) -> None:
        load = run.load
        held_role = victim is await asyncio.to_thread(self.fleet.holder)
        refused_before = load.refused_via[victim.url]
        async with Client(victim.url, timeout=self.profile.stop_seconds + 30) as c:
            items: list[LeasedItemOut] | None = None
            while not items:
                items = await load.lease(c, 10, wait=2)
            victim.kill(signal.SIGSTOP)
            run.faults["SIGSTOP node"] += 1
            stopped = time.monotonic()
            completion = asyncio.create_task(load.complete(c, items, patience=5))
            await asyncio.sleep(self.profile.stop_seconds)
            victim.kill(signal.SIGCONT)
            await completion
        refused = load.refused_via[victim.url] - refused_before
        run.faults["late completions refused"] += refused
        role = ", the sequencer's holder," if held_role else ""
        run.notes.append(
            f"node {victim.index}{role} stopped {time.monotonic() - stopped:.1f} s (lease "
            f"timeout {LEASE_TIMEOUT:g} s); its consumers' completions refused after SIGCONT: "
            f"{refused} (of which the {len(items)} items held across the stop: "
            f"{self._refused_of(load, items)})")

    @staticmethod
    def _refused_of(load: Load, items: list[LeasedItemOut]) -> int:
        tokens = {i.token for i in items}
        return sum(c.outcome == REFUSED and c.token in tokens for c in load.history.completions)

    async def _clock(self, run: Run) -> None:
        await self._skewed(run, self.profile.offsets, self.profile.compactor_offset)

    async def _clock_beyond(self, run: Run) -> None:
        await self._skewed(run, self.profile.beyond, self.profile.beyond_compactor)

    async def _skewed(self, run: Run, offsets: Sequence[float], compactor: float) -> None:
        """Rolling restarts under load that give each node (and the compactor) its
        offset, the faults' time with wrong clocks, rolling restarts back."""
        run.skewed = True
        began = time.monotonic()
        for node, offset in zip(self.fleet.nodes, offsets, strict=False):
            if not offset:
                continue
            await self._restart_with(node, faketime_env(offset), run)
            seen = await asyncio.to_thread(clock_offset, node.url)
            run.clocks[f"node {node.index}"] = {"asked": offset, "seen": seen}
            run.faults[f"node {node.index} clock {offset:+g} s"] += 1
            run.notes.append(f"node {node.index}: offset {offset:+g} s asked, its Date header "
                             f"says {seen:+.0f} s" if seen is not None else
                             f"node {node.index}: offset {offset:+g} s asked, no answer")
        async with self._on_purpose():
            await asyncio.to_thread(self.fleet.restart_compactor, faketime_env(compactor))
        run.faults[f"compactor clock {compactor:+g} s"] += 1
        await asyncio.sleep(max(0.0, self.profile.seconds - (time.monotonic() - began)))
        if self.fleet.sequencer:
            forwards = await asyncio.to_thread(forward_outcomes, self.fleet)
            run.notes.append(f"forwards to the sequencer with the clocks wrong, by outcome "
                             f"(refused: outside the signature window): {forwards}")
        for node in self.fleet.nodes:
            await self._restart_with(node, None, run)
        async with self._on_purpose():
            await asyncio.to_thread(self.fleet.restart_compactor)
        run.notes.append(f"the design's bound: every clock within {BOUND_S:g} s of true time "
                         f"(two within {2 * BOUND_S:g} s); offsets here "
                         f"{list(offsets)} (nodes), {compactor:+g} (compactor)")

    async def _restart_with(self, node: FleetNode, env: dict[str, str] | None,
                            run: Run) -> None:
        node.set_extra_env(env)
        async with self._on_purpose():
            await asyncio.to_thread(node.restart)
        run.faults["node restarts"] += 1

    async def _s3_restart(self, run: Run) -> None:
        restarts = self.profile.s3_restarts
        gap = self.profile.seconds / (restarts + 1)
        for _ in range(restarts):
            await asyncio.sleep(gap)
            began = time.monotonic()
            await asyncio.to_thread(self.fleet.restart_seaweed)
            run.faults["SeaweedFS restarts"] += 1
            run.notes.append(f"SeaweedFS stopped and up again in "
                             f"{time.monotonic() - began:.1f} s")
        await asyncio.sleep(gap)

    async def _hang(self, run: Run) -> None:
        """The holder SIGSTOPped under load, then SIGCONT: writes through nginx must
        resume within seconds (the other nodes find it hung and claim its role), not
        after the role's TTL."""
        await asyncio.sleep(self.profile.seconds / 4)
        victim = await self._victim(0, run)
        async with self._on_purpose():
            victim.kill(signal.SIGSTOP)
            run.faults["SIGSTOP holder"] += 1
            stopped = time.monotonic()
            await asyncio.sleep(self.profile.hang_seconds)
            victim.kill(signal.SIGCONT)
        writes = self._resumed(run, stopped)
        holder = await asyncio.to_thread(self.fleet.holder)
        run.notes.append(
            f"node {victim.index} stopped {self.profile.hang_seconds:g} s: writes {writes}; "
            f"the role is now held by node {holder.index if holder else '-'}")
        if (run.resumed["HAProxy"] or HANG_RESUME_S + 1) > HANG_RESUME_S:
            run.incidents[f"writes through HAProxy not resumed within {HANG_RESUME_S:g} s"] += 1
        await asyncio.sleep(self.profile.seconds / 4)

    async def _cutoff(self, run: Run) -> None:
        """The holder's store requests fail at once while the others' go through:
        another node must hold the role within ``ROLE_TTL`` and writes go on."""
        assert self.proxy is not None
        await asyncio.sleep(self.profile.seconds / 4)
        victim = await self._victim(0, run)
        rule = self.proxy.add(Rule(client=S3Proxy.client_host(victim.index), times=None,
                                   forward=False, reply="error"))
        cut = time.monotonic()
        moved: float | None = None
        try:
            while time.monotonic() - cut < self.profile.cutoff_seconds:
                holders = await asyncio.to_thread(self.fleet.holders)
                if moved is None and holders and all(h is not victim
                                                     for h in holders.values()):
                    moved = time.monotonic() - cut
                await asyncio.sleep(0.5)
        finally:
            retire({"cutoff": [rule]})
        run.faults[f"node {victim.index} cut off from the store"] += 1
        run.faults["its S3 requests refused"] += len(rule.matched)
        writes = self._resumed(run, cut)
        run.notes.append(
            f"node {victim.index}, the holder, cut off from the store for "
            f"{self.profile.cutoff_seconds:g} s (role TTL {ROLE_TTL:g} s): another node held "
            f"the role {'never' if moved is None else f'{moved:.1f} s'} after the cut; "
            f"writes {writes}")
        if moved is None or moved > ROLE_TTL + 2:
            run.incidents["role not moved within the TTL"] += 1
        await asyncio.sleep(self.profile.seconds / 4)

    async def _replay(self, run: Run) -> None:
        """Forwards captured on their way between the nodes, posted again to the node
        each was meant for and to the next node: each must be refused."""
        assert self.tap is not None, "the replay scenario needs the fleet's tap"
        began = time.monotonic()
        await asyncio.sleep(self.profile.seconds / 2)
        captured = self.tap.since(began)
        statuses: Counter[str] = Counter()
        nodes = {n.index: n.url for n in self.fleet.nodes}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            for c in captured:
                other = nodes[c.node % len(nodes) + 1]
                for target, url in (("meant", nodes[c.node]), ("other", other)):
                    async with http.post(url + FORWARD_PATH, data=c.body,
                                         headers=c.headers) as resp:
                        statuses[f"{target} {resp.status}"] += 1
                        if resp.status < 400:
                            run.replays_accepted += 1
        run.faults["forwards replayed"] += 2 * len(captured)
        run.notes.append(f"{len(captured)} captured forwards replayed to their node and "
                         f"another; answers {dict(sorted(statuses.items()))}")
        await asyncio.sleep(self.profile.seconds / 2)

    async def _namespaces(self, run: Run) -> None:
        """The holder dies and a node of another namespace comes up on its address with
        the same fleet key and a queue of the same name: the forwards that still go to
        that address must not land there."""
        victim = await self._victim(0, run)
        await asyncio.sleep(self.profile.seconds / 4)
        async with self._on_purpose():
            victim.kill(signal.SIGKILL)
            run.faults["SIGKILL holder"] += 1
            victim.set_extra_env({"OKQ_NAMESPACE": OTHER_NAMESPACE})
            await asyncio.to_thread(victim.restart)
            run.faults[f"node of namespace {OTHER_NAMESPACE} on its address"] += 1
            async with Client(victim.url, timeout=30) as c:
                await c.create_queue(run.load.queue, exist_ok=True)
                await asyncio.sleep(self.profile.seconds / 2)
                stats = await c.stats(run.load.queue)
            run.misdelivered = stats.available + stats.in_flight + stats.completed
            victim.set_extra_env(None)
            await asyncio.to_thread(victim.restart)
        run.notes.append(f"items in namespace {OTHER_NAMESPACE}'s queue of the same name: "
                         f"{run.misdelivered}")
        await asyncio.sleep(self.profile.seconds / 4)


# -- the command -----------------------------------------------------------------------------


def run_campaign(profile: Profile, names: Sequence[str], seed: int,
                 workdir: Path) -> tuple[list[Outcome], dict[str, Any]]:
    """Run the scenarios on a sequencer-mode fleet, then those named ``name@direct``
    on a fleet without the sequencer: the outcomes and the report's header."""
    require_programs()
    began = time.monotonic()
    header: dict[str, Any] = {
        "profile": profile.name, "seed": seed, "scenarios": list(names), "dir": str(workdir),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "fleet_start": [],
        "fleet": (f"3 nodes in sequencer mode (without it for `name@direct`), compactor, "
                  f"nginx, SeaweedFS behind the fault proxy; lease timeout {LEASE_TIMEOUT:g} "
                  f"s; {profile.seconds:g} s of faults per scenario")}
    outcomes: list[Outcome] = []
    for sequencer in (True, False):
        mine = [n for n in names if scenario_spec(n).direct != sequencer]
        if mine:
            campaign = Campaign(profile, workdir, seed, sequencer,
                                tap=any(n.startswith("replay") for n in mine))
            header["fleet_start"].append(round(campaign_start(campaign), 1))
            try:
                outcomes += [_scenario(campaign, name) for name in mine]
            finally:
                campaign.stop()
    header["seconds"] = time.monotonic() - began
    return outcomes, header


def campaign_start(campaign: Campaign) -> float:
    """Start the campaign's fleet (stopping what started if it fails): seconds taken."""
    try:
        campaign.start()
    except BaseException:
        campaign.stop()
        raise
    return campaign.fleet_start


def _scenario(campaign: Campaign, name: str) -> Outcome:
    print(f"campaign: {name} ...", file=sys.stderr, flush=True)
    outcome = asyncio.run(campaign.scenario(name))
    print(f"campaign: {name}: {outcome.checker}"
          + (f"; {outcome.order}" if outcome.order else ""), file=sys.stderr, flush=True)
    return outcome


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.campaign", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--short", dest="profile", action="store_const", const=SHORT,
                      help="the CI form: about 3 minutes (the default)")
    form.add_argument("--long", dest="profile", action="store_const", const=LONG,
                      help="every scenario, longer and harder: 15-20 minutes")
    parser.add_argument("--report", type=Path, help="write the markdown report here, and "
                        "the JSON one beside it (.json)")
    parser.add_argument("--scenarios", help=f"comma-separated, of {', '.join(SCENARIOS)}, "
                        "each as name[:P][+fifo][@direct]: :P to run it on a queue of P "
                        "partitions, +fifo on an ordered queue with grouped items (its "
                        "order checked), @direct on a fleet without the sequencer "
                        "(default: the profile's)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--seconds", type=float, help="faults per scenario, overriding the "
                        "profile's")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one, "
                        "kept only when a scenario failed)")
    args = parser.parse_args(argv)
    args.profile = args.profile or SHORT
    if args.seconds is not None:
        args.profile = replace(args.profile, seconds=args.seconds)
    names = args.scenarios.split(",") if args.scenarios else list(args.profile.scenarios)
    unknown = [n for n in names if not _known(n)]
    if unknown:
        parser.error(f"unknown scenarios {unknown}: choose from {', '.join(SCENARIOS)}, "
                     "each as name[:P][+fifo][@direct]")
    args.names = names
    args.seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    return args


def _known(name: str) -> bool:
    try:
        scenario_spec(name)
    except ValueError:
        return False
    return True


def write_report(path: Path, outcomes: Sequence[Outcome], header: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown(outcomes, header))
    path.with_suffix(".json").write_text(json.dumps(
        {**header, "scenarios": [asdict(o) for o in outcomes]}, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="okq-campaign-"))
    try:
        outcomes, header = run_campaign(args.profile, args.names, args.seed, workdir)
    except (ServerMissing, FleetError) as exc:
        print(f"campaign: cannot run: {exc}", file=sys.stderr)
        return 2
    print(markdown(outcomes, header))
    if args.report:
        write_report(args.report, outcomes, header)
    failed = [o.scenario for o in outcomes if o.failed]
    if failed:
        print(f"campaign: FAILED {failed}; logs kept in {workdir}", file=sys.stderr)
        return 1
    if args.dir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
