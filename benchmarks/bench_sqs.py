"""The SQS front end next to okq's native API, on the same node. Not a test.

One ``okq serve`` (SQS on, ``--sqs-keys``) on loopback, a file:// store in a
temporary directory (``--store file``, the default) or SeaweedFS (``--store
seaweed``: ``weed mini`` from okq.dev.servers). Both APIs run the same workload
from this one asyncio process, in turn, on a fresh queue each time (60 s lease /
visibility timeout):

1. produce: 4 producers send ``--messages`` messages of 1 KiB in batches of 10
   (native: ``okq.client.Client.produce`` of 10, msgpack; SQS: ``SendMessageBatch``
   of 10 entries);
2. receive+delete: 4 consumers take up to 10 and delete those (native: ``lease``
   of 10, then ``complete`` of their 10 tokens; SQS: ``ReceiveMessage`` with
   ``MaxNumberOfMessages=10``, then ``DeleteMessageBatch`` of their 10 handles),
   both long-polling 1 s, until every message is deleted.

The SQS client is aiobotocore (the asyncio botocore that aioboto3 wraps: the
same request signing, protocol and reply checks as boto3), one client shared by
the four workers the way the native side shares one ``Client``: both are
aiohttp in the same event loop, so neither side pays for threads the other does
not. Its retries are off, as the native client has none.

Measured per phase: messages per second (the consume phase ends at the last
deletion, not when the other consumers' long polls return), the node's CPU per
message (utime + stime of the node process from ``/proc/<pid>/stat``, all its
threads), this driver's CPU per message, the node's object-store requests per
message (``okq_store_requests`` from ``/metrics``, read between phases: fewer
messages per write is CPU spent that is not the front end's own), and
SeaweedFS's CPU on ``--store seaweed``. The APIs alternate (native, SQS, then
SQS, native, ...: drift in the node or the machine falls on both); the table
gives medians of ``--runs``.

Every message body starts with a unique number. The consumers count what they
receive; after each run one more receive must find the queue empty (the warm-up
runs, one batch per worker on each API before the measured ones, are checked
too). The benchmark exits 1 if a produced message was never received, was
received twice (a delivery after its deletion), or a deletion was not accepted.

    python benchmarks/bench_sqs.py [--quick] [--messages 10000] [--runs 3]
        [--store file|seaweed]

``--quick`` (400 messages, one run of each API) is a smoke run of a few seconds.
The machine is shared: the figures are indicative; compare rows of one run.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import os
import shlex
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiobotocore
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from okq.client import Client
from okq.dev.fleet import store_requests_of
from okq.dev.servers import DUMMY_CREDENTIALS, SeaweedServer
from okq.store.counting import PUT_CLASS
from tests.sqs_support import ACCESS_KEY, REGION, SECRET_KEY, sqs_node

BATCH = 10
WORKERS = 4
BODY_BYTES = 1024
ID_DIGITS = 12  # a body is its number in this many digits, then padding
WAIT = 1  # long poll, seconds (SQS's WaitTimeSeconds is whole seconds)
LEASE = 60  # lease / visibility timeout of every queue, seconds
STALL = 30.0  # a consume phase without progress for this long gives up (lost messages)
TICK = os.sysconf("SC_CLK_TCK")
APIS = ("native", "SQS")


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of a process (all its threads), in seconds; 0 without one."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def body(n: int) -> bytes:
    return f"{n:0{ID_DIGITS}d}".encode().ljust(BODY_BYTES, b".")


def number(payload: bytes) -> int:
    return int(payload[:ID_DIGITS])


# -- the two APIs --------------------------------------------------------------------------


class Api(abc.ABC):
    """One way to drive the node: create a queue, send, receive, delete."""

    name: str
    client_note: str

    @abc.abstractmethod
    async def create(self, queue: str) -> None: ...

    @abc.abstractmethod
    async def send(self, queue: str, bodies: list[bytes]) -> None: ...

    @abc.abstractmethod
    async def receive(self, queue: str, wait: int) -> list[tuple[bytes, str]]:
        """Up to ``BATCH`` messages: (body, receipt) each."""

    @abc.abstractmethod
    async def delete(self, queue: str, receipts: list[str]) -> int:
        """Delete these; how many deletions the node accepted."""


class Native(Api):
    name = "native"
    client_note = "okq.client.Client (msgpack, aiohttp), one shared by the workers"

    def __init__(self, client: Client) -> None:
        self.client = client

    async def create(self, queue: str) -> None:
        await self.client.create_queue(queue, lease_timeout=LEASE)

    async def send(self, queue: str, bodies: list[bytes]) -> None:
        ids = await self.client.produce(queue, bodies)
        if len(ids) != len(bodies):
            raise RuntimeError(f"produce of {len(bodies)} returned {len(ids)} ids")

    async def receive(self, queue: str, wait: int) -> list[tuple[bytes, str]]:
        got = await self.client.lease(queue, BATCH, request_timeout=wait)
        return [(item.bytes, item.token) for item in got]

    async def delete(self, queue: str, receipts: list[str]) -> int:
        return await self.client.complete(queue, receipts)


class Sqs(Api):
    name = "SQS"

    def __init__(self, client: Any) -> None:
        self.client = client
        self.urls: dict[str, str] = {}
        protocol = client.meta.service_model.protocol
        self.client_note = (f"aiobotocore {aiobotocore.__version__} (asyncio, aiohttp; SigV4; "
                            f"{protocol} protocol; no retries), one shared by the workers")

    async def create(self, queue: str) -> None:
        reply = await self.client.create_queue(
            QueueName=queue, Attributes={"VisibilityTimeout": str(LEASE)})
        self.urls[queue] = reply["QueueUrl"]

    async def send(self, queue: str, bodies: list[bytes]) -> None:
        entries = [{"Id": str(i), "MessageBody": b.decode()} for i, b in enumerate(bodies)]
        reply = await self.client.send_message_batch(QueueUrl=self.urls[queue], Entries=entries)
        if reply.get("Failed") or len(reply["Successful"]) != len(bodies):
            raise RuntimeError(f"SendMessageBatch failed: {reply.get('Failed')}")

    async def receive(self, queue: str, wait: int) -> list[tuple[bytes, str]]:
        reply = await self.client.receive_message(
            QueueUrl=self.urls[queue], MaxNumberOfMessages=BATCH, WaitTimeSeconds=wait)
        return [(m["Body"].encode(), m["ReceiptHandle"]) for m in reply.get("Messages", [])]

    async def delete(self, queue: str, receipts: list[str]) -> int:
        entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(receipts)]
        reply = await self.client.delete_message_batch(QueueUrl=self.urls[queue],
                                                       Entries=entries)
        # A stale handle "succeeds" without deleting; the node says so in a header.
        stale = int(reply["ResponseMetadata"]["HTTPHeaders"].get("x-okq-stale-receipt", 0))
        return len(reply.get("Successful", [])) - stale


# -- measuring -----------------------------------------------------------------------------


@dataclass
class Clocks:
    """Wall, node, SeaweedFS and driver CPU clocks at one moment."""

    wall: float
    node: float
    weed: float
    driver: float

    @classmethod
    def now(cls, node_pid: int, weed_pid: int | None) -> Clocks:
        return cls(time.perf_counter(), cpu_seconds(node_pid), cpu_seconds(weed_pid),
                   time.process_time())


@dataclass
class Phase:
    messages: int
    began: Clocks
    ended: Clocks
    requests: dict[str, float] = field(default_factory=dict)  # store requests per message

    def rate(self) -> float:
        return self.messages / (self.ended.wall - self.began.wall)

    def us(self, clock: str) -> float:
        """CPU of ``clock`` (node, weed, driver) per message, in microseconds."""
        spent = getattr(self.ended, clock) - getattr(self.began, clock)
        return float(spent) / self.messages * 1e6


@dataclass
class Check:
    """What one run's consumers saw of the messages produced."""

    produced: int
    received: Counter[int] = field(default_factory=Counter)
    undeleted: int = 0  # deletions the node did not accept
    late: int = 0  # messages received after every message was deleted

    def lost(self) -> int:
        return sum(1 for n in range(self.produced) if n not in self.received)

    def duplicated(self) -> int:
        again = sum(c - 1 for n, c in self.received.items() if n < self.produced)
        strangers = sum(c for n, c in self.received.items() if not 0 <= n < self.produced)
        return again + strangers + self.late

    def ok(self) -> bool:
        return not (self.lost() or self.duplicated() or self.undeleted)


@dataclass
class Run:
    api: str
    produce: Phase
    consume: Phase
    check: Check


class Driver:
    """The workload against one node: produce, then receive+delete, then check."""

    def __init__(self, url: str, node_pid: int, weed_pid: int | None) -> None:
        self.url, self.node_pid, self.weed_pid = url, node_pid, weed_pid

    def clocks(self) -> Clocks:
        return Clocks.now(self.node_pid, self.weed_pid)

    def store_requests(self) -> dict[str, float]:
        """The node's object-store requests so far, by operation (read between phases)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as resp:
            return store_requests_of(resp.read().decode())

    def per_message(self, before: dict[str, float], phase: Phase) -> Phase:
        after = self.store_requests()
        phase.requests = {op: (n - before.get(op, 0)) / phase.messages
                          for op, n in after.items()}
        return phase

    async def produce(self, api: Api, queue: str, total: int) -> Phase:
        per_worker = total // WORKERS

        async def producer(first: int) -> None:
            for start in range(first, first + per_worker, BATCH):
                await api.send(queue, [body(n) for n in range(start, start + BATCH)])

        began = self.clocks()
        await asyncio.gather(*(producer(w * per_worker) for w in range(WORKERS)))
        return Phase(total, began, self.clocks())

    async def consume(self, api: Api, queue: str, check: Check) -> Phase:
        total = check.produced
        done = 0
        last_progress = time.monotonic()
        ended: Clocks | None = None

        async def consumer() -> None:
            nonlocal done, last_progress, ended
            while done < total and time.monotonic() - last_progress < STALL:
                got = await api.receive(queue, WAIT)
                if not got:
                    continue
                check.received.update(number(b) for b, _ in got)
                deleted = await api.delete(queue, [r for _, r in got])
                check.undeleted += len(got) - deleted
                done += len(got)
                last_progress = time.monotonic()
                if done >= total and ended is None:
                    ended = self.clocks()

        began = self.clocks()
        await asyncio.gather(*(consumer() for _ in range(WORKERS)))
        check.late = len(await api.receive(queue, 0))  # deleted means never again
        return Phase(total, began, ended or self.clocks())

    async def run(self, api: Api, total: int) -> Run:
        queue = f"{api.name.lower()}-{uuid.uuid4().hex[:10]}"
        await api.create(queue)
        before = self.store_requests()
        produce = self.per_message(before, await self.produce(api, queue, total))
        check = Check(total)
        before = self.store_requests()
        consume = self.per_message(before, await self.consume(api, queue, check))
        return Run(api.name, produce, consume, check)


# -- the run -------------------------------------------------------------------------------


@contextmanager
def seaweed_if(wanted: bool) -> Iterator[SeaweedServer | None]:
    if not wanted:
        yield None
        return
    with SeaweedServer("okq") as weed:
        yield weed


async def open_apis(stack: AsyncExitStack, url: str) -> dict[str, Api]:
    client = await stack.enter_async_context(Client(url))
    config = AioConfig(retries={"total_max_attempts": 1}, max_pool_connections=2 * WORKERS)
    sqs = await stack.enter_async_context(get_session().create_client(
        "sqs", endpoint_url=url, region_name=REGION, aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY, config=config))
    return {"native": Native(client), "SQS": Sqs(sqs)}


def progress(r: int, run: Run, seaweed: bool) -> None:
    p, c = run.produce, run.consume
    weed = (f", SeaweedFS {p.us('weed'):.0f} / {c.us('weed'):.0f} us/msg" if seaweed else "")
    print(f"  run {r + 1} {run.api:<6} produce {p.rate():7,.0f}/s {p.us('node'):4.0f} us/msg, "
          f"receive+delete {c.rate():7,.0f}/s {c.us('node'):4.0f} us/msg "
          f"(driver {p.us('driver'):.0f} / {c.us('driver'):.0f} us/msg{weed})"
          f"{'' if run.check.ok() else '  CHECK FAILED'}", flush=True)


async def drive_all(args: argparse.Namespace,
                    tmp: Path) -> tuple[list[Run], list[Run], list[str]]:
    """The warm-up runs and the measured runs (both checked), and notes for the report."""
    runs: list[Run] = []
    with seaweed_if(args.store == "seaweed") as weed:
        store = f"file://{tmp}/store"
        if weed is not None:
            store = f"s3://{weed.bucket}/bench-sqs-{uuid.uuid4().hex[:8]}"
        with sqs_node(store, tmp, endpoint_url=weed.endpoint if weed else None) as node:
            async with AsyncExitStack() as stack:
                apis = await open_apis(stack, node.url)
                driver = Driver(node.url, node.proc.pid, weed.pid if weed else None)
                # Warm both up (connections, lazy imports); not measured, but checked.
                warmups = [await driver.run(api, WORKERS * BATCH) for api in apis.values()]
                for r in range(args.runs):
                    for name in (APIS if r % 2 == 0 else reversed(APIS)):
                        runs.append(await driver.run(apis[name], args.messages))
                        progress(r, runs[-1], weed is not None)
                notes = [f"{name}: {api.client_note}" for name, api in apis.items()]
        where = "SeaweedFS (weed mini), " + store if weed else "a file:// store in a temp dir"
    settings = [f"{k}={v}" for k, v in sorted(os.environ.items())
                if k.startswith("OKQ_") and "KEY" not in k]
    return warmups, runs, [f"node: one okq serve on {where}; settings: "
                           f"{', '.join(settings) or 'defaults'}", *notes]


def median(runs: list[Run], phase: str, what: str) -> float:
    """The median over ``runs`` of a phase's rate (``what="rate"``), CPU per message (a
    clock's name) or store requests per message (``"put"``: PUT-class, ``"get"``)."""
    def value(p: Phase) -> float:
        if what == "rate":
            return p.rate()
        if what in ("put", "get"):
            ops = ("get",) if what == "get" else PUT_CLASS
            return sum(n for op, n in p.requests.items() if op in ops)
        return p.us(what)

    return statistics.median(value(getattr(r, phase)) for r in runs)


def report(runs: list[Run], notes: list[str], args: argparse.Namespace) -> None:
    by_api = {name: [r for r in runs if r.api == name] for name in APIS}
    print(f"\n{args.messages:,} x 1 KiB messages per run, batches of {BATCH}, {WORKERS} "
          f"producers then {WORKERS} consumers (long poll {WAIT} s), median of {args.runs} "
          f"alternating runs per API; CPU is the node process's utime+stime per message\n")
    print("| api | produce msg/s | receive+delete msg/s | CPU us/msg produce | "
          "CPU us/msg consume |")
    print("|---|---:|---:|---:|---:|")
    for name, rs in by_api.items():
        print(f"| {name} | {median(rs, 'produce', 'rate'):,.0f} | "
              f"{median(rs, 'consume', 'rate'):,.0f} | {median(rs, 'produce', 'node'):.1f} | "
              f"{median(rs, 'consume', 'node'):.1f} |")
    ratio = {key: median(by_api["SQS"], *key) / median(by_api["native"], *key)
             for key in (("produce", "rate"), ("consume", "rate"), ("produce", "node"),
                         ("consume", "node"))}
    print(f"\nSQS / native: produce msg/s {ratio['produce', 'rate']:.2f}x, receive+delete "
          f"msg/s {ratio['consume', 'rate']:.2f}x, CPU us/msg produce "
          f"{ratio['produce', 'node']:.2f}x, consume {ratio['consume', 'node']:.2f}x")
    print("driver CPU us/msg produce / consume (this process, client side): " + ", ".join(
        f"{name} {median(rs, 'produce', 'driver'):.0f} / {median(rs, 'consume', 'driver'):.0f}"
        for name, rs in by_api.items()))
    print("node store requests/msg produce / consume, PUT-class + GET: " + ", ".join(
        f"{name} {median(rs, 'produce', 'put'):.3f} + {median(rs, 'produce', 'get'):.3f} / "
        f"{median(rs, 'consume', 'put'):.3f} + {median(rs, 'consume', 'get'):.3f}"
        for name, rs in by_api.items()))
    if args.store == "seaweed":
        print("SeaweedFS CPU us/msg produce / consume: " + ", ".join(
            f"{name} {median(rs, 'produce', 'weed'):.0f} / {median(rs, 'consume', 'weed'):.0f}"
            for name, rs in by_api.items()))
    for note in notes:
        print(f"- {note}")


def checked(warmups: list[Run], runs: list[Run]) -> bool:
    """Print what the checks found over every run; True when nothing went wrong."""
    every = [r.check for r in warmups + runs]
    lost = sum(c.lost() for c in every)
    duplicated = sum(c.duplicated() for c in every)
    undeleted = sum(c.undeleted for c in every)
    print(f"checked: {lost} lost, {duplicated} duplicated, {undeleted} deletions refused "
          f"({len(runs)} runs and {len(warmups)} warm-ups, "
          f"{sum(c.produced for c in every):,} messages)")
    return all(c.ok() for c in every)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--store", choices=("file", "seaweed"), default="file")
    parser.add_argument("--quick", action="store_true",
                        help="400 messages, one run of each API: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.runs = 400, 1
    args.messages -= args.messages % (WORKERS * BATCH)  # whole batches per producer
    if args.messages <= 0 or args.runs <= 0:
        parser.error("--messages must be at least 40 and --runs at least 1")
    return args


def main() -> int:
    args = parse()
    for name, value in {**DUMMY_CREDENTIALS, "AWS_EC2_METADATA_DISABLED": "true"}.items():
        os.environ.setdefault(name, value)  # nothing may look beyond loopback for an identity
    print(f"# okq SQS front end against the native API, "
          f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(f"command: {shlex.join([sys.executable, *sys.argv])}\n", flush=True)
    with tempfile.TemporaryDirectory(prefix="okq-bench-sqs-") as name:
        warmups, runs, notes = asyncio.run(drive_all(args, Path(name)))
    report(runs, notes, args)
    return 0 if checked(warmups, runs) else 1


if __name__ == "__main__":
    sys.exit(main())
