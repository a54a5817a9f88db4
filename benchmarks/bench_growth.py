"""Backlog growth and idle cost of one okq node. Not a test.

Each phase runs a fresh ``okq serve`` subprocess on loopback over a fresh store
(a file:// directory, or a prefix of one SeaweedFS bucket with ``--store
seaweedfs``), driven by okq's client (msgpack). Messages are 1 KiB.

backlog   For each backlog size: fill the queue in batches of 1,000 (4 producers
          at once, ``--fill-workers``; 1 makes a segment of 1,000 items per batch;
          the fill rate), then ``--produce`` messages in batches of 10 from 4
          producers at once (the produce rate on that backlog, and the node's CPU
          per message; 0 skips it), then ``--samples`` single-item cycles: lease 1 (no
          wait), complete it (after 20 not counted). Per cycle: latency of the
          lease and of lease+complete (p50/p99), object-store requests (deltas of
          the node's ``okq_store_requests``), node CPU. Then the manifest's size
          (its head: what every publish writes) and chunks (read from the store),
          node RSS (VmRSS now, VmHWM the peak, from /proc), and ``queue.stats``
          latency (the first call, the median of the next 5;
          its counts are checked against what was produced and completed).
inflight  For each N: N single-item produces (one segment each), all N leased
          and held (lease timeout 12 h), then a backlog of 1,000 behind them; the
          same cycles measured: each lease walks past the N segments whose lease
          objects hold leases.
idle      An empty queue, 4 consumers long-polling (20 s polls) for
          ``--idle-seconds``: the node's object-store requests per second, and
          their cost per month at S3 Standard prices.

``--profile DIR`` records the node with py-spy (raw collapsed stacks, 100 Hz)
during each backlog's cycles, to DIR/growth-{backlog}.txt.

    python benchmarks/bench_growth.py [--store file|seaweedfs]
        [--backlogs 1000,100000,1000000] [--produce 20000] [--inflight 1,10,100]
        [--samples 300]
        [--idle-seconds 30] [--profile DIR] [--quick]

``--quick`` (backlogs 1,000 and 10,000, 2,000 produced, 1 and 10 segments in
flight, 50 samples, 5 s idle) is a smoke run of under half a minute. The full run takes
about two minutes on either store. An empty list skips a phase
(``--inflight ''``), as ``--idle-seconds 0`` skips the idle one. Figures taken
on a shared machine are indicative.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from okq.client import Client
from okq.dev.servers import DUMMY_CREDENTIALS, SeaweedServer
from okq.keys import manifest_key
from okq.manifests import read_manifest
from okq.store import open_store
from tests.nodes import Node, okq_node

PAYLOAD = b"x" * 1024
FILL_BATCH = 1000
FILL_WORKERS = 4
PRODUCE_BATCH = 10
PRODUCERS = 4
WARMUP = 20
STATS_REPEAT = 5
IDLE_CONSUMERS = 4
IDLE_POLL = 20.0
HOLD = 43_200.0  # seconds: leases held through the in-flight phase
NS = "default"
QUEUE = "growth"
BUCKET = "okq"
OPS = ("get", "put", "list", "head", "delete")
#: S3 Standard request prices (us-east-1), dollars per request; DELETE is free.
PRICE = {"put": 0.005e-3, "list": 0.005e-3, "get": 0.0004e-3, "head": 0.0004e-3, "delete": 0.0}
MONTH = 30 * 86_400
MIB = 1 << 20

FULL = {"backlogs": "1000,100000,1000000", "produce": 20_000, "inflight": "1,10,100",
        "samples": 300, "idle_seconds": 30.0}
QUICK = {"backlogs": "1000,10000", "produce": 2_000, "inflight": "1,10", "samples": 50,
         "idle_seconds": 5.0}

Counts = dict[str, float]


# -- where the node keeps its state ---------------------------------------------------


class Target:
    """Fresh stores for the phases: directories under ``tmp``, or prefixes of one
    SeaweedFS bucket."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.tmp = tmp
        self.seaweed: SeaweedServer | None = None
        self.phases = 0

    def start(self) -> None:
        if self.kind == "seaweedfs":
            os.environ.update(DUMMY_CREDENTIALS)  # this process reads manifests too
            self.seaweed = SeaweedServer(BUCKET, root=self.tmp / "seaweedfs").start()

    def stop(self) -> None:
        if self.seaweed is not None:
            self.seaweed.stop()

    @property
    def endpoint(self) -> str | None:
        return self.seaweed.endpoint if self.seaweed is not None else None

    def fresh(self) -> str:
        """A store URL nothing has written to yet."""
        self.phases += 1
        if self.seaweed is not None:
            return f"s3://{BUCKET}/growth-{self.phases}"
        return f"file://{self.tmp}/store-{self.phases}"

    @contextlib.contextmanager
    def node(self) -> Iterator[tuple[Node, str]]:
        store = self.fresh()
        with okq_node(store, self.tmp, endpoint_url=self.endpoint,
                      env=dict(DUMMY_CREDENTIALS)) as node:
            yield node, store

    async def manifest(self, store_url: str) -> tuple[int, int, int]:
        """The queue's manifest: its head's size in bytes, its segments and chunks."""
        store = open_store(store_url, endpoint_url=self.endpoint)
        try:
            blob = await store.get(manifest_key(NS, QUEUE))
            m = await read_manifest(store, NS, QUEUE)
        finally:
            await store.close()
        return len(blob.data), len(m.segments), len(m.chunks)


# -- reading the node --------------------------------------------------------------------


def parse_metrics(text: str) -> Counts:
    """``okq_store_requests`` by operation from one /metrics page."""
    counts: Counts = dict.fromkeys(OPS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "okq_store_requests_total":
                counts[sample.labels["operation"]] = sample.value
    return counts


async def store_requests(http: aiohttp.ClientSession, node: Node) -> Counts:
    async with http.get(f"{node.url}/metrics") as resp:
        return parse_metrics(await resp.text())


def delta(after: Counts, before: Counts, per: float = 1.0) -> Counts:
    return {op: (after[op] - before[op]) / per for op in OPS}


def proc_kib(pid: int, field_name: str) -> int:
    """A ``Vm*`` line of /proc/PID/status, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field_name}:"):
            return int(line.split()[1])
    raise LookupError(field_name)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile, in milliseconds."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000


@contextlib.contextmanager
def profiled(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy recording ``pid`` while the block runs (nothing without ``out``)."""
    if out is None:
        yield
        return
    spy = subprocess.Popen(
        [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid),
         "--format", "raw", "--rate", "100", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the work starts
    try:
        yield
    finally:
        spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
        spy.wait(60)


# -- the phases ---------------------------------------------------------------------------


@dataclass
class Cycles:
    """Single-item lease+complete cycles of one phase."""

    lease: list[float] = field(default_factory=list)
    cycle: list[float] = field(default_factory=list)
    requests: Counts = field(default_factory=dict)  # per cycle
    cpu_ms: float = 0.0  # node CPU per cycle


@dataclass
class Row:
    label: int
    segments: int = 0
    chunks: int = 0
    manifest_bytes: int = 0
    fill_rate: float = 0.0
    produce_rate: float = 0.0  # batches of PRODUCE_BATCH on the backlog
    produce_cpu_us: float = 0.0  # node CPU per message of those
    cycles: Cycles = field(default_factory=Cycles)
    rss_mib: float = 0.0
    peak_mib: float = 0.0
    stats_first_ms: float = 0.0
    stats_median_ms: float = 0.0
    stats_ok: str = ""


async def fill(client: Client, total: int, workers: int = FILL_WORKERS) -> float:
    """Produce ``total`` messages in batches of 1,000 from ``workers`` producers at
    once (the node gathers concurrent batches into one segment); msg/s."""
    batches = [min(FILL_BATCH, total - n) for n in range(0, total, FILL_BATCH)]
    began = time.perf_counter()

    async def producer() -> None:
        while batches:
            await client.produce(QUEUE, [PAYLOAD] * batches.pop())

    await asyncio.gather(*(producer() for _ in range(workers)))
    return total / (time.perf_counter() - began)


async def produce_small(client: Client, node: Node, total: int, row: Row) -> None:
    """``total`` messages in batches of 10 from 4 producers at once: msg/s, and the
    node's CPU per message."""
    batches = [min(PRODUCE_BATCH, total - n) for n in range(0, total, PRODUCE_BATCH)]
    cpu = cpu_seconds(node.proc.pid)
    began = time.perf_counter()

    async def producer() -> None:
        while batches:
            await client.produce(QUEUE, [PAYLOAD] * batches.pop())

    await asyncio.gather(*(producer() for _ in range(PRODUCERS)))
    row.produce_rate = total / (time.perf_counter() - began)
    row.produce_cpu_us = (cpu_seconds(node.proc.pid) - cpu) * 1e6 / total


async def one_cycle(client: Client, into: Cycles | None) -> None:
    began = time.perf_counter()
    (got,) = await client.lease(QUEUE, 1)
    leased = time.perf_counter()
    await client.complete(QUEUE, [got.token])
    if into is not None:
        into.lease.append(leased - began)
        into.cycle.append(time.perf_counter() - began)


async def cycles(client: Client, http: aiohttp.ClientSession, node: Node, samples: int,
                 profile: Path | None = None) -> Cycles:
    """``samples`` lease+complete cycles, after a warm-up that is not counted."""
    for _ in range(WARMUP):
        await one_cycle(client, None)
    out = Cycles()
    with profiled(node.proc.pid, profile):
        before, cpu = await store_requests(http, node), cpu_seconds(node.proc.pid)
        for _ in range(samples):
            await one_cycle(client, out)
        out.cpu_ms = (cpu_seconds(node.proc.pid) - cpu) * 1000 / samples
        out.requests = delta(await store_requests(http, node), before, samples)
    return out


async def timed_stats(client: Client, row: Row, available: int, completed: int) -> None:
    """queue.stats latency: the first call, then the median of the next few; the
    counts are checked against what the phase produced and completed."""
    times = []
    for _ in range(STATS_REPEAT + 1):
        began = time.perf_counter()
        st = await client.stats(QUEUE)
        times.append((time.perf_counter() - began) * 1000)
    row.stats_first_ms, row.stats_median_ms = times[0], statistics.median(times[1:])
    got = (st.available, st.completed)
    row.stats_ok = "ok" if got == (available, completed) else \
        f"MISMATCH: available, completed = {got}, expected {(available, completed)}"


def memory(node: Node, row: Row) -> None:
    row.rss_mib = proc_kib(node.proc.pid, "VmRSS") / 1024
    row.peak_mib = proc_kib(node.proc.pid, "VmHWM") / 1024


async def backlog_row(target: Target, backlog: int, args: argparse.Namespace) -> Row:
    row = Row(backlog)
    with target.node() as (node, store):
        async with Client(node.url) as client, aiohttp.ClientSession() as http:
            await client.create_queue(QUEUE)
            row.fill_rate = await fill(client, backlog, args.fill_workers)
            os.sync()  # the fill's data on disk first: the next phases do not pay its writeback
            if args.produce:
                step(f"  {args.produce:,} in batches of {PRODUCE_BATCH}")
                await produce_small(client, node, args.produce, row)
            profile = args.profile / f"growth-{backlog}.txt" if args.profile else None
            samples = min(args.samples, backlog - WARMUP)  # a small backlog runs out
            row.cycles = await cycles(client, http, node, samples, profile)
            row.manifest_bytes, row.segments, row.chunks = await target.manifest(store)
            memory(node, row)
            done = WARMUP + samples
            await timed_stats(client, row, backlog + args.produce - done, done)
    return row


async def inflight_row(target: Target, held: int, args: argparse.Namespace) -> Row:
    row = Row(held)
    with target.node() as (node, store):
        async with Client(node.url) as client, aiohttp.ClientSession() as http:
            await client.create_queue(QUEUE)
            for n in range(held):
                await client.produce(QUEUE, [f"held {n}".encode()])
            got = await client.lease(QUEUE, held, lease_timeout=HOLD)
            segments = {item.id.rsplit(".", 1)[0] for item in got}
            if len(segments) != held:
                raise RuntimeError(f"{held} leases held in {len(segments)} segments")
            behind = max(FILL_BATCH, WARMUP + args.samples)
            row.fill_rate = await fill(client, behind)
            row.cycles = await cycles(client, http, node, args.samples)
            row.manifest_bytes, row.segments, row.chunks = await target.manifest(store)
            memory(node, row)
    return row


@dataclass
class Idle:
    seconds: float
    per_second: Counts

    @property
    def dollars_a_month(self) -> float:
        return sum(self.per_second[op] * price for op, price in PRICE.items()) * MONTH


async def idle_run(target: Target, seconds: float) -> Idle:
    with target.node() as (node, _):
        async with Client(node.url) as client, aiohttp.ClientSession() as http:
            await client.create_queue(QUEUE)

            async def consumer() -> None:
                while True:
                    await client.lease(QUEUE, 1, request_timeout=IDLE_POLL)

            tasks = [asyncio.create_task(consumer()) for _ in range(IDLE_CONSUMERS)]
            try:
                await asyncio.sleep(2.0)  # every consumer waiting
                before = await store_requests(http, node)
                await asyncio.sleep(seconds)
                per_second = delta(await store_requests(http, node), before, seconds)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
    return Idle(seconds, per_second)


# -- the tables ---------------------------------------------------------------------------


def three(c: Counts) -> str:
    return f"{c['get']:.2f} / {c['put']:.2f} / {c['list']:.2f}"


def latency(c: Cycles) -> str:
    return (f"{pct(c.cycle, 0.5):.1f} / {pct(c.cycle, 0.99):.1f} "
            f"({pct(c.lease, 0.5):.1f} / {pct(c.lease, 0.99):.1f})")


def print_backlog(rows: list[Row], args: argparse.Namespace) -> None:
    print(f"\n**Backlog growth** ({args.samples} single-item cycles after {WARMUP} not "
          f"counted; latency in ms, lease alone in brackets)\n")
    print(f"| backlog | fill msg/s | produce msg/s, batches of {PRODUCE_BATCH}, {PRODUCERS} "
          "producers (node CPU µs/msg) | segments (chunks) | manifest head bytes | "
          "lease+complete p50 / p99 (lease) | GET / PUT / LIST per cycle | node CPU ms per "
          "cycle | node RSS / peak MiB | `queue.stats` first / median ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        c = r.cycles
        check = "" if r.stats_ok == "ok" else f" {r.stats_ok}"
        fewer = "" if len(c.cycle) == args.samples else f" ({len(c.cycle)} cycles)"
        made = f"{r.produce_rate:,.0f} ({r.produce_cpu_us:.0f})" if r.produce_rate else "-"
        print(f"| {r.label:,}{fewer} | {r.fill_rate:,.0f} | {made} | {r.segments} ({r.chunks}) | "
              f"{r.manifest_bytes:,} | "
              f"{latency(c)} | {three(c.requests)} | {c.cpu_ms:.2f} | "
              f"{r.rss_mib:.0f} / {r.peak_mib:.0f} | "
              f"{r.stats_first_ms:.1f} / {r.stats_median_ms:.1f}{check} |")


def print_inflight(rows: list[Row], args: argparse.Namespace) -> None:
    print(f"\n**Segments holding in-flight leases** (each holds one leased item; a "
          f"backlog of {max(FILL_BATCH, WARMUP + args.samples):,} behind them; "
          f"{args.samples} cycles)\n")
    print("| segments holding leases | segments in manifest | manifest bytes | lease+complete "
          "p50 / p99 (lease) | GET / PUT / LIST per cycle | node CPU ms per cycle | "
          "node RSS MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        c = r.cycles
        print(f"| {r.label} | {r.segments} | {r.manifest_bytes:,} | {latency(c)} | "
              f"{three(c.requests)} | {c.cpu_ms:.2f} | {r.rss_mib:.0f} |")


def print_idle(idle: Idle) -> None:
    p = idle.per_second
    total = sum(p.values())
    print(f"\n**Idle cost** (one node, an empty queue, {IDLE_CONSUMERS} consumers "
          f"long-polling {IDLE_POLL:.0f} s at a time, measured over {idle.seconds:.0f} s)\n")
    print("| GET/s | PUT/s | LIST/s | HEAD/s | requests/s | $ per month (S3 Standard) |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {p['get']:.2f} | {p['put']:.2f} | {p['list']:.2f} | {p['head']:.2f} | "
          f"{total:.2f} | {idle.dollars_a_month:.2f} |")


# -- main -------------------------------------------------------------------------------


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--store", choices=("file", "seaweedfs"), default="file")
    parser.add_argument("--backlogs")
    parser.add_argument("--inflight")
    parser.add_argument("--samples", type=int)
    parser.add_argument("--produce", type=int,
                        help=f"messages produced in batches of {PRODUCE_BATCH} on each backlog")
    parser.add_argument("--fill-workers", type=int, default=FILL_WORKERS,
                        help="concurrent producers filling a backlog (1: a segment per batch)")
    parser.add_argument("--idle-seconds", type=float)
    parser.add_argument("--profile", type=Path, help="py-spy output directory")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    return args


def sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def step(what: str) -> None:
    """Progress, on stderr: the tables on stdout stay clean."""
    print(f"  {datetime.now():%H:%M:%S} {what}", file=sys.stderr, flush=True)


async def phases(target: Target, args: argparse.Namespace) -> None:
    rows = []
    for n in sizes(args.backlogs):
        step(f"backlog {n:,}")
        rows.append(await backlog_row(target, n, args))
    held = []
    for n in sizes(args.inflight):
        step(f"{n} segments holding leases")
        held.append(await inflight_row(target, n, args))
    idle = None
    if args.idle_seconds > 0:
        step(f"idle, {args.idle_seconds:.0f} s")
        idle = await idle_run(target, args.idle_seconds)
    store = "okq's file store" if args.store == "file" else "SeaweedFS on loopback"
    command = shlex.join(["python", f"benchmarks/{Path(__file__).name}", *sys.argv[1:]])
    print(f"\n`{command}` ({datetime.now(UTC):%Y-%m-%d}; one node, {store}; 1 KiB messages; "
          f"{os.cpu_count()} cores shared with other work: indicative figures)")
    if rows:
        print_backlog(rows, args)
    if held:
        print_inflight(held, args)
    if idle is not None:
        print_idle(idle)


@contextlib.asynccontextmanager
async def started(args: argparse.Namespace) -> AsyncIterator[Target]:
    with tempfile.TemporaryDirectory(prefix="okq-growth-") as tmp:
        target = Target(args.store, Path(tmp))
        target.start()
        try:
            yield target
        finally:
            target.stop()


async def main() -> None:
    args = arguments()
    async with started(args) as target:
        await phases(target, args)


if __name__ == "__main__":
    asyncio.run(main())
