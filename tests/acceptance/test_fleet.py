"""Any node serves any request: a fleet of real processes behind a real nginx.

One fleet for the module (``okq.dev.fleet``): SeaweedFS, three ``okq serve``
nodes, the compactor and nginx round-robin in front, all on loopback. Items
leased through one node are renewed and completed through others; a long poll
on one node is answered by a produce sent to another; a node SIGKILLed under
load loses nothing (its leases come back after their timeout); the sequencer's
holder SIGKILLed under load is replaced and writes resume; Python ``Worker``s and
``okq work`` ride out every node SIGKILLed in turn. Traffic under load is
recorded and checked by tests/history.py.

The module runs twice by default: in sequencer mode (``sequencer``), and in
sequencer mode with three shards and every queue of three partitions
(``partitioned``: ``--default-partitions 3``, okq.partitions), so that each
queue's partitions are held by different nodes and every test here runs on a
queue spread over the fleet too. ``OKQ_FLEET_MODES`` picks modes (comma-separated,
``direct`` for a fleet without the sequencer); each mode starts its own fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from okq.client import Client, Worker
from okq.dev.fleet import FleetNode, LocalFleet
from okq.dev.nginx import nginx_binary
from okq.dev.servers import ServerMissing, descendants, free_port, weed_binary
from okq.errors import LeaseLost, OkqError, Overloaded, PublishAborted
from okq.wire import LeasedItemOut, ProduceItem
from tests.history import ACCEPTED, REFUSED, UNKNOWN, History
from tests.sqs_support import SQS_KEYS, sqs_client

pytestmark = pytest.mark.s3
T = TypeVar("T")

LEASE_TIMEOUT = 2.0  # seconds: redelivery after a lost consumer is quick
ROLE_TTL = 3.0  # the smallest a node accepts
MODES = os.environ.get("OKQ_FLEET_MODES", "sequencer,partitioned").split(",")
PARTITIONS = 3  # of every queue in the partitioned mode (and its sequencer shards)


def _require_programs() -> None:
    try:
        weed_binary()
        nginx_binary()
    except ServerMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module", params=MODES)
def fleet(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    _require_programs()
    sequencer = request.param in ("sequencer", "partitioned")
    spread = ["--default-partitions", str(PARTITIONS)] \
        if request.param == "partitioned" else []
    local = LocalFleet(tmp_path_factory.mktemp("fleet"), 3, sequencer=sequencer,
                       shards=PARTITIONS if spread else 1,
                       role_ttl=ROLE_TTL, compactor_args=["--interval", "2"], stop_timeout=10,
                       node_args=["--sqs-keys", SQS_KEYS, *spread])
    with local:
        if sequencer:  # a node claims a role when a queue of its shard is first written
            asyncio.run(_warm_up(local.url))
            local.wait_holder(30)
        yield local


def _queue() -> str:
    return f"q{uuid.uuid4().hex[:12]}"


async def _create(url: str) -> str:
    name = _queue()
    async with Client(url, timeout=15) as c:
        await c.create_queue(name, lease_timeout=LEASE_TIMEOUT)
    return name


async def _warm_up(url: str) -> None:
    queue = await _create(url)
    async with Client(url, timeout=15) as c:
        await c.produce(queue, ["warm-up"])
        await c.delete_queue(queue)


# -- (a) renew and complete through other nodes ----------------------------------------------


async def test_leased_on_one_node_renewed_and_completed_on_others(fleet: LocalFleet) -> None:
    queue = await _create(fleet.url)
    clients = [Client(n.url, timeout=15) for n in fleet.nodes]
    try:
        for a, b, c in itertools.permutations(range(3)):
            (item_id,) = await clients[c].produce(queue, [f"{a}{b}{c}"])
            (item,) = await clients[a].lease(queue, 1, lease_timeout=5)
            assert item.id == item_id
            deadline = await clients[b].renew(queue, item.token, lease_timeout=30)
            assert deadline > item.lease_deadline
            assert await clients[c].complete(queue, [item.token]) == 1
            with pytest.raises(LeaseLost):
                await clients[a].renew(queue, item.token)
        assert (await clients[1].list_items(queue)).items == []
    finally:
        for client in clients:
            await client.close()


def _served(node: FleetNode, word: str) -> float:
    """Requests to endpoints whose path holds ``word`` that the node answered 200."""
    total = 0.0
    for family in text_string_to_metric_families(node.metrics()):
        if family.name == "okq_http_requests":
            total += sum(s.value for s in family.samples if s.name.endswith("_total")
                         and word in s.labels["endpoint"] and s.labels["status"] == "200")
    return total


async def test_renew_and_complete_through_nginx_reach_several_nodes(fleet: LocalFleet) -> None:
    queue = await _create(fleet.url)
    before = {n.url: (_served(n, "renew"), _served(n, "complete")) for n in fleet.nodes}
    writes_before = fleet.store_requests().total.get("put", 0)
    async with Client(fleet.url, timeout=15) as c:
        await c.produce(queue, [str(n) for n in range(9)])
        items = await c.lease(queue, 9, lease_timeout=10)
        assert len(items) == 9
        for item in items:
            assert await c.renew(queue, item.token, lease_timeout=30) > item.lease_deadline
        for item in items:
            assert await c.complete(queue, [item.token]) == 1
        stats = await c.stats(queue)
    assert (stats.available, stats.in_flight, stats.completed) == (0, 0, 9)
    spread = {n.url: (_served(n, "renew") - before[n.url][0],
                      _served(n, "complete") - before[n.url][1]) for n in fleet.nodes}
    print(f"\nrenews and completions per node through nginx: {spread}")
    assert sum(r for r, _ in spread.values()) == 9 and sum(c for _, c in spread.values()) == 9
    # Round-robin: every node answered some of the renewals and some of the completions.
    assert all(r > 0 and c > 0 for r, c in spread.values()), spread
    requests = fleet.store_requests()
    assert requests.total["put"] > writes_before  # the renewals and completions were written
    assert sum(n.get("put", 0) for n in requests.per_node.values()) == requests.total["put"]


def test_sqs_api_through_nginx_sends_receives_and_deletes_on_any_node(
        fleet: LocalFleet) -> None:
    """boto3 through nginx: each call lands on another node (sequencer mode forwards
    the writes), and the queue URL one node gave works on every node."""
    sqs = sqs_client(fleet.nodes[0])
    url = sqs.create_queue(QueueName=_queue(), Attributes={"VisibilityTimeout": "30"})[
        "QueueUrl"]
    before = {n.url: _sqs_served(n) for n in fleet.nodes}
    front = sqs_client(fleet.url)
    for batch in range(3):
        sent = front.send_message_batch(QueueUrl=url, Entries=[
            {"Id": f"m{i}", "MessageBody": f"{batch}-{i}"} for i in range(10)])
        assert len(sent["Successful"]) == 10, sent
    bodies: list[str] = []
    for _ in range(30):
        got = front.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        if got:
            front.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)])
            bodies += [m["Body"] for m in got]
        if len(bodies) >= 30:
            break
    assert sorted(bodies) == sorted(f"{b}-{i}" for b in range(3) for i in range(10))
    attributes = front.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "0"
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "0"
    spread = {n.url: _sqs_served(n) - before[n.url] for n in fleet.nodes}
    print(f"\nSQS requests per node through nginx: {spread}")
    assert all(n > 0 for n in spread.values()), spread


def _sqs_served(node: FleetNode) -> float:
    """SQS API requests the node answered without an error."""
    return sum(s.value for family in text_string_to_metric_families(node.metrics())
               if family.name == "okq_sqs_requests" for s in family.samples
               if s.name.endswith("_total") and s.labels["code"] == "OK")


# -- (b) long polls answered by produces at other nodes ---------------------------------------


async def _wake(waiter: Client, producer: Client, queue: str, wait: float) -> float:
    """Seconds from a produce's acknowledgement to the waiting lease's answer."""
    polling = asyncio.create_task(waiter.lease(queue, 1, request_timeout=wait))
    await asyncio.sleep(0.5)  # the lease is waiting by now
    assert not polling.done(), "the lease returned before anything was produced"
    (item_id,) = await producer.produce(queue, ["wake up"])
    acked = time.monotonic()
    (item,) = await polling
    latency = time.monotonic() - acked
    assert item.id == item_id
    await producer.complete(queue, [item.token])
    return latency


async def test_long_poll_is_answered_by_a_produce_at_another_node(fleet: LocalFleet) -> None:
    wait = 20.0
    queue = await _create(fleet.url)
    clients = [Client(n.url, timeout=15) for n in fleet.nodes]
    try:
        latencies = [await _wake(clients[w], clients[p], queue, wait)
                     for w, p in itertools.permutations(range(3), 2)]
    finally:
        for client in clients:
            await client.close()
    print(f"\ncross-node wake-up, produce acked -> lease answered: "
          f"median {statistics.median(latencies) * 1000:.0f} ms, "
          f"max {max(latencies) * 1000:.0f} ms over {len(latencies)} node pairs")
    assert max(latencies) < wait / 4, latencies


# -- load with a recorded history -------------------------------------------------------------


@dataclass
class Load:
    """Producers and consumers through one URL, every outcome recorded in ``history``.

    Producers send keyed batches and retry a batch with the same keys until it is
    acknowledged, so an unknown outcome never becomes a loss or a duplicate.
    Consumers complete everything they lease and retry a completion of unknown
    outcome with the same tokens (a completion repeated is a no-op).
    """

    url: str
    queue: str
    history: History = field(default_factory=History)
    producers: int = 2
    consumers: int = 3
    batch: int = 10
    pause: float = 0.05
    writes: list[tuple[float, float]] = field(default_factory=list)  # (began, acked)
    errors: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)  # completions refused, by reason
    slowest: dict[str, float] = field(default_factory=dict)  # seconds, by operation

    def __post_init__(self) -> None:
        self.producing = self.consuming = True
        self._producers: list[asyncio.Task[None]] = []
        self._consumers: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._producers = [asyncio.create_task(self._produce(n)) for n in range(self.producers)]
        self._consumers = [asyncio.create_task(self._consume()) for _ in range(self.consumers)]

    async def _produce(self, n: int) -> None:
        async with Client(self.url, timeout=10) as c:
            for seq in itertools.count():
                if not self.producing:
                    return
                keys = [f"{self.queue}-{n}-{seq}-{i}" for i in range(self.batch)]
                await self._produce_batch(c, keys)
                await asyncio.sleep(self.pause)

    async def _produce_batch(self, c: Client, keys: list[str]) -> None:
        items = [ProduceItem(utf8=k, key=k) for k in keys]
        give_up = time.monotonic() + 60
        while time.monotonic() < give_up:
            began = time.monotonic()
            try:
                ids = await self._timed("produce", c.produce(self.queue, items))
            except (Overloaded, PublishAborted) as exc:  # nothing was published
                self._error("produce", exc)
                self.history.produce_failed(keys, unknown=False)
            except OkqError as exc:
                self._error("produce", exc)
                self.history.produce_failed(keys, unknown=True)
            else:
                self.history.produced(keys, ids)
                self.writes.append((began, time.monotonic()))
                return
            await asyncio.sleep(0.1)

    async def _consume(self) -> None:
        async with Client(self.url, timeout=10) as c:
            while self.consuming:
                began = time.monotonic()
                try:
                    items = await self._timed(
                        "lease", c.lease(self.queue, 20, request_timeout=0.5))
                except OkqError as exc:  # the items may be leased to nobody: they come back
                    self._error("lease", exc)
                    await asyncio.sleep(0.05)
                    continue
                for item in items:
                    self.history.delivered(item.id, item.token, item.attempts, key=item.utf8,
                                           invoked=began, deadline=item.lease_deadline.timestamp())
                if items:
                    await self._complete(c, items)

    async def _complete(self, c: Client, items: list[LeasedItemOut]) -> None:
        for _ in range(30):
            try:
                await self._timed("complete", c.complete(self.queue, [i.token for i in items]))
            except LeaseLost as exc:
                self._refused(items, exc)
                return
            except OkqError as exc:
                self._error("complete", exc)
                await asyncio.sleep(0.1)
                continue
            for item in items:
                self.history.completed(item.id, item.token, ACCEPTED)
            return
        for item in items:
            self.history.completed(item.id, item.token, UNKNOWN)

    async def _timed(self, op: str, call: Awaitable[T]) -> T:
        """The call's result; its duration, when the longest of ``op``'s so far, kept."""
        began = time.monotonic()
        try:
            return await call
        finally:
            took = time.monotonic() - began
            self.slowest[op] = max(took, self.slowest.get(op, 0.0))

    def _refused(self, items: list[LeasedItemOut], exc: LeaseLost) -> None:
        """Some completions were refused: those the error names; the others landed.
        An error that names none leaves every outcome unknown."""
        failed = exc.details.get("failed", [])
        refused = {f["index"] for f in failed}
        self.refusals.update(str(f.get("reason")) for f in failed)
        for n, item in enumerate(items):
            outcome = (REFUSED if n in refused else ACCEPTED) if refused else UNKNOWN
            self.history.completed(item.id, item.token, outcome)

    def _error(self, op: str, exc: OkqError) -> None:
        self.errors[f"{op}: {type(exc).__name__} {exc.details.get('status', '')}".strip()] += 1

    def first_write_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` to the first acknowledgement of a produce begun after it."""
        acked = [done for began, done in self.writes if began >= moment]
        return min(acked) - moment if acked else None

    async def drain(self, timeout: float = 30.0) -> None:
        """Stop producing, then consume until every acknowledged item is settled and the
        queue holds nothing; then stop the consumers."""
        self.producing = False
        try:
            await asyncio.gather(*self._producers)
            deadline = time.monotonic() + timeout
            async with Client(self.url, timeout=10) as c:
                while time.monotonic() < deadline and not await self._empty(c):
                    await asyncio.sleep(0.2)
        finally:
            await self.stop()

    async def _empty(self, c: Client) -> bool:
        """Every acknowledged item settled, and nothing left in the queue."""
        if self.history.outstanding():
            return False
        try:
            stats = await c.stats(self.queue)
        except OkqError:
            return False
        return stats.available + stats.in_flight + stats.waiting_retry == 0

    async def stop(self) -> None:
        self.producing = self.consuming = False
        await asyncio.gather(*self._producers, *self._consumers)


def _check(load: Load) -> None:
    report = load.history.check(lease_timeout=LEASE_TIMEOUT)
    print(f"\nhistory: {report.summary()}; client errors: {dict(load.errors)}; "
          f"completions refused: {dict(load.refusals)}; slowest calls: "
          f"{ {op: round(t, 2) for op, t in load.slowest.items()} }")
    assert report.produced > 0
    assert (report.lost, report.completed_twice) == ([], [])
    assert (report.late_deliveries, report.unexpected, report.duplicated_keys) == ([], [], [])
    assert report.early_redeliveries == []


# -- (c) a node SIGKILLed under load -----------------------------------------------------------


async def _hold(node: FleetNode, queue: str, count: int,
                history: History) -> list[LeasedItemOut]:
    """Lease ``count`` items through ``node`` and never finish them: a consumer that
    dies with its node. Each lease's deliveries are recorded as it returns (with the
    time it was called): a lease may bring fewer than asked, and its items may be
    leased again once their lease ends while the next call waits for the rest."""
    async with Client(node.url, timeout=10) as c:
        held: list[LeasedItemOut] = []
        while len(held) < count:
            invoked = history.clock()
            got = await c.lease(queue, count - len(held), request_timeout=2)
            for item in got:
                history.delivered(item.id, item.token, item.attempts, key=item.utf8,
                                  invoked=invoked, deadline=item.lease_deadline.timestamp())
            held += got
        return held


async def test_a_node_killed_under_load_loses_nothing(fleet: LocalFleet) -> None:
    holder = fleet.holder()
    victim = next(n for n in fleet.nodes[1:] + fleet.nodes[:1] if n is not holder)
    load = Load(fleet.url, await _create(fleet.url))
    load.start()
    try:
        await asyncio.sleep(2)
        held = await _hold(victim, load.queue, 10, load.history)
        victim.kill(signal.SIGKILL)
        killed = time.monotonic()
        assert not victim.alive()
        await asyncio.sleep(LEASE_TIMEOUT + 2)
        victim.restart()
        assert fleet.holder() is holder or holder is None
    finally:
        await load.drain()
    _check(load)
    print(f"writes resumed {load.first_write_after(killed)} s after the kill")
    by_id = {d.item_id: d for d in load.history.deliveries}
    for item in held:  # every lease the dead consumer held came back and was completed
        again = [d for d in load.history.deliveries
                 if d.item_id == item.id and d.token != item.token]
        assert again, f"{item.id} held by the killed node's consumer was never redelivered"
        assert by_id[item.id].attempts >= 2
    settled = load.history.settled_ids()
    assert {i.id for i in held} <= settled


# -- (d) the sequencer SIGKILLed under load ----------------------------------------------------


async def test_the_sequencer_killed_under_load_is_replaced(fleet: LocalFleet) -> None:
    load = Load(fleet.url, await _create(fleet.url))
    load.start()
    try:
        await asyncio.sleep(2)
        old = fleet.holder() if fleet.sequencer else fleet.nodes[0]
        assert old is not None, "no node holds the sequencer role"
        roles = old.roles()  # with partitions: the shards of some of the queue's partitions
        old.kill(signal.SIGKILL)
        killed = time.monotonic()
        if fleet.sequencer:
            await asyncio.to_thread(fleet.wait_holder, 15, not_=old)
            moved = await asyncio.to_thread(_wait_held, fleet, roles, old, 15)
            print(f"\nroles {roles} moved from node {old.index} to nodes "
                  f"{sorted({n.index for n in moved.values()})} in "
                  f"{time.monotonic() - killed:.2f} s")
        await asyncio.sleep(3)
        resumed = load.first_write_after(killed)
        print(f"writes resumed {resumed} s after the kill")
        assert resumed is not None and resumed < 10
        old.restart()
        if fleet.sequencer:
            await asyncio.to_thread(fleet.wait_holder, 15)
    finally:
        await load.drain()
    _check(load)


def _wait_held(fleet: LocalFleet, shards: Sequence[int], not_: FleetNode,
               timeout: float) -> dict[int, FleetNode]:
    """Until every one of ``shards`` is held by a node other than ``not_``; TimeoutError
    if one is not (the writes of its queues would go nowhere but direct)."""
    deadline = time.monotonic() + timeout
    while True:
        held = fleet.holders()
        moved = {s: held[s] for s in shards if s in held and held[s] is not not_}
        if len(moved) == len(shards):
            return moved
        if time.monotonic() > deadline:
            raise TimeoutError(f"shards {sorted(set(shards) - set(moved))} not taken over "
                               f"within {timeout:g}s")
        time.sleep(0.05)


# -- okq fleet, the command -------------------------------------------------------------------


def _start_time(pid: int) -> str | None:
    """A process's start time (pids are reused; pid and start time are not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _read_until(proc: subprocess.Popen[str], marker: str, timeout: float) -> list[str]:
    """stdout lines up to the one holding ``marker``."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if marker in line:
            return lines
    raise AssertionError(f"no {marker!r} from okq fleet; it printed {lines}")


async def test_okq_fleet_command_serves_and_stops_all_it_started(tmp_path: Path) -> None:
    _require_programs()
    port = free_port()
    argv = [sys.executable, "-m", "okq.cli", "fleet", "--nodes", "2", "--port", str(port),
            "--dir", str(tmp_path / "fleet")]
    with (tmp_path / "stderr").open("w") as errors:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True)
    try:
        lines = await asyncio.to_thread(_read_until, proc, "Ctrl-C stops the fleet", 90)
        children = {pid: _start_time(pid) for pid in descendants(proc.pid)}
        url = next(w for line in lines if line.strip().startswith("nginx")
                   for w in line.split() if w.startswith("http://"))
        assert url == f"http://127.0.0.1:{port}"
        assert sum(line.strip().startswith("node ") for line in lines) == 2
        async with Client(url, timeout=15) as c:
            await c.create_queue("jobs")
            ids = await c.produce("jobs", ["one", "two"])
            leased = await c.lease("jobs", 2)
            assert sorted(i.id for i in leased) == sorted(ids)
            assert await c.complete("jobs", [i.token for i in leased]) == 2
        # SeaweedFS, two nodes, the compactor, nginx and its worker
        assert len(children) >= 6, children
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    left = [pid for pid, started in children.items() if _start_time(pid) == started]
    assert left == [], f"processes the fleet started outlived it: {left}"
    assert "stopped" in (tmp_path / "stderr").read_text()


# -- (e) workers behind nginx while every node is SIGKILLed in turn ----------------------------


class _Recording(Client):
    """A client that records each completion that succeeded: item id -> tokens."""

    def __init__(self, url: str, ids: dict[str, str]) -> None:
        super().__init__(url, timeout=10)
        self.ids = ids  # token -> item id, filled in by the handler
        self.completed: dict[str, set[str]] = {}

    async def complete(self, queue: str, tokens: Sequence[str]) -> int:
        done = await super().complete(queue, tokens)
        for token in tokens:
            self.completed.setdefault(self.ids[token], set()).add(token)
        return done


async def _produce_keyed(url: str, queue: str, acked: set[str], going: asyncio.Event) -> None:
    """Keyed batches of five until ``going`` is cleared; a batch is sent again with
    the same keys until it is acknowledged, so nothing is lost or doubled."""
    async with Client(url, timeout=10) as c:
        for seq in itertools.count():
            if not going.is_set():
                return
            keys = [f"{queue}-{seq}-{i}" for i in range(5)]
            give_up = time.monotonic() + 60
            while True:
                try:
                    await c.produce(queue, [ProduceItem(utf8=k, key=k) for k in keys])
                    break
                except OkqError:
                    assert time.monotonic() < give_up, "a keyed produce never got through"
                    await asyncio.sleep(0.2)
            acked.update(keys)
            await asyncio.sleep(0.05)


async def test_workers_behind_nginx_ride_out_every_node_killed_in_turn(
        fleet: LocalFleet, tmp_path: Path) -> None:
    """Two Python ``Worker``s and one ``okq work`` through nginx while each node is
    SIGKILLed and restarted in turn, the sequencer's holder first: every worker keeps
    running, every acknowledged item is completed, none twice."""
    queue = await _create(fleet.url)
    acked: set[str] = set()
    handled: Counter[str] = Counter()
    ids: dict[str, str] = {}

    async def handler(item: LeasedItemOut) -> None:
        ids[item.token] = item.id
        handled[item.utf8 or ""] += 1
        await asyncio.sleep(0.02)

    ran = tmp_path / "okq-work-ran"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OKQ_")}
    shell = subprocess.Popen(
        [sys.executable, "-m", "okq.cli", "--url", fleet.url, "-o", "json", "work", "-q",
         queue, "-c", f"cat >> {ran}; echo >> {ran}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    clients = [_Recording(fleet.url, ids) for _ in range(2)]
    workers = [Worker(c, queue, handler, concurrency=4, poll=1.0) for c in clients]
    runs = [asyncio.create_task(w.run()) for w in workers]
    going = asyncio.Event()
    going.set()
    producer = asyncio.create_task(_produce_keyed(fleet.url, queue, acked, going))
    try:
        holder = fleet.holder() if fleet.sequencer else None
        order = ([holder] if holder else []) + [n for n in fleet.nodes if n is not holder]
        for node in order:
            await asyncio.sleep(1.0)  # under load
            node.kill(signal.SIGKILL)
            await asyncio.sleep(1.0)  # nginx and the workers meet the dead node
            assert not any(r.done() for r in runs), [r for r in runs if r.done()]
            assert shell.poll() is None, shell.communicate()
            await asyncio.to_thread(node.restart)
        going.clear()
        await producer

        async def settled() -> bool:
            async with Client(fleet.url, timeout=10) as c:
                st = await c.stats(queue)
            return st.available + st.in_flight + st.waiting_retry == 0 and \
                st.completed >= len(acked)

        deadline = time.monotonic() + 30
        while not await settled():
            assert time.monotonic() < deadline, "acknowledged items were not all completed"
            await asyncio.sleep(0.2)
        assert not any(r.done() for r in runs) and shell.poll() is None
    finally:
        going.clear()
        for worker in workers:
            worker.stop()
        stats = await asyncio.wait_for(asyncio.gather(*runs), 30)
        shell.send_signal(signal.SIGTERM)
        out, err = await asyncio.to_thread(shell.communicate, timeout=60)
        producer.cancel()
        for c in clients:
            await c.close()
    assert shell.returncode == 0, err
    summary = json.loads(out)
    python_completed = {i: t for c in clients for i, t in c.completed.items()}
    assert all(len(t) == 1 for c in clients for t in c.completed.values())
    assert not set(clients[0].completed) & set(clients[1].completed)  # none twice
    async with Client(fleet.url, timeout=10) as c:
        st = await c.stats(queue)
        assert (await c.list_items(queue)).items == []
    assert st.completed == len(acked)  # every acknowledged item, once
    assert len(python_completed) + summary["completed"] == len(acked)
    ran_lines = Counter(line for line in ran.read_text().splitlines() if line)
    assert acked <= set(handled) | set(ran_lines)
    again = sum(handled.values()) + sum(ran_lines.values()) - len(acked)
    print(f"\n{len(acked)} items: {len(python_completed)} completed by the Python workers "
          f"({[s.completed for s in stats]}), {summary['completed']} by okq work; "
          f"handled again after a kill: {again}")
