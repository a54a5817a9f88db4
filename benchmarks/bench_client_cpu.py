"""The Python client's own CPU per message: seconds against a node, and
instructions counted by valgrind's callgrind. Not a test.

Seconds. A fresh ``okq serve`` on the file store runs in a subprocess; this
process drives it with okq's ``Client`` (msgpack) and reads its own CPU
(``time.process_time``: user + system, every thread) around each phase, so the
node's CPU is not in the figures:

* produce: 4 producers, batches of 100 messages of 1 KiB;
* lease+complete: 4 consumers, each leasing 100 and completing them in one call;
* worker: a ``Worker`` (concurrency 100, a handler that returns at once) over a
  queue filled beforehand (the filling is not counted), until it has finished
  every item.

Median of ``--runs`` runs, each with its own node.

Instructions. Each workload runs in a fresh Python process under ``valgrind
--tool=callgrind`` (total ``Ir``: every instruction of the process, the
interpreter's included), with ``--instr-messages`` and with twice as many, so
that start-up, imports and set-up cancel out: per message = (Ir(2N) - Ir(N)) / N.

* ``produce``, ``lease+complete``, ``lease+read+complete`` (every attribute of
  every item read once) and ``worker``: the real ``Client`` (and ``Worker``) over
  a stand-in for aiohttp's session that answers each call at once with a reply
  recorded beforehand from the node's own encoders: no socket and no HTTP
  parsing, only the client's work per message (building and packing the body,
  decoding and checking the reply, the objects the user gets);
* ``http produce`` and ``http lease+complete``: the same client against a real
  node over loopback (the node runs outside valgrind and is not counted), so
  aiohttp's share shows too.

    python benchmarks/bench_client_cpu.py [--messages 20000] [--runs 5]
        [--instr-messages 2000] [--skip-seconds] [--skip-instructions]

The machine is shared: seconds are indicative, instruction counts are stable.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402

from benchmarks.bench_node_cpu import lease_and_complete  # noqa: E402
from okq import wire  # noqa: E402
from okq.client import Client  # noqa: E402
from okq.worker import Worker  # noqa: E402
from tests.nodes import okq_node  # noqa: E402

BATCH = 100
WORKERS = 4
WORKER_CONCURRENCY = 100
PAYLOAD = b"x" * 1024
TOKEN = "v1." + "t" * 100  # about as long as a node's token


# -- seconds against a node ---------------------------------------------------------------


async def fill(client: Client, queue: str, total: int) -> None:
    await client.create_queue(queue)
    await asyncio.gather(*(
        client.produce(queue, [PAYLOAD] * BATCH) for _ in range(total // BATCH)))


async def drive(url: str, total: int) -> dict[str, float]:
    """This process's CPU per message for produce, lease+complete and the Worker."""
    total -= total % (WORKERS * BATCH)
    queue, worked = f"q{uuid.uuid4().hex[:8]}", f"w{uuid.uuid4().hex[:8]}"
    async with Client(url) as client:
        await client.create_queue(queue)

        async def producer() -> None:
            for _ in range(total // WORKERS // BATCH):
                await client.produce(queue, [PAYLOAD] * BATCH)

        cpu = time.process_time()
        await asyncio.gather(*(producer() for _ in range(WORKERS)))
        produce = time.process_time() - cpu
        cpu = time.process_time()
        await lease_and_complete(client, queue, total)
        consume = time.process_time() - cpu

        await fill(client, worked, total)

        async def handler(item: wire.LeasedItemOut) -> None:
            return None

        worker = Worker(client, worked, handler, concurrency=WORKER_CONCURRENCY, limit=total,
                        poll=0.5)
        cpu = time.process_time()
        stats = await worker.run()
        work = time.process_time() - cpu
        assert stats.completed == total, stats
    return {"produce": produce / total * 1e6, "lease+complete": consume / total * 1e6,
            "worker": work / total * 1e6}


def seconds(args: argparse.Namespace) -> dict[str, list[float]]:
    runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="okq-bench-client-") as name:
        tmp = Path(name)
        for r in range(args.runs):
            with okq_node(f"file://{tmp}/store-{r}", tmp) as node:
                got = asyncio.run(drive(node.url, args.messages))
            for phase, us in got.items():
                runs.setdefault(phase, []).append(us)
            print(f"  run {r + 1}: " + ", ".join(f"{p} {v:.1f} us/msg" for p, v in got.items()),
                  flush=True)
    return runs


# -- a stand-in for aiohttp's session: recorded replies, no socket ----------------------------


def leased(n: int, start: int) -> list[Any]:
    """What the engine says of ``n`` leased items (``okq.leases.LeasedItem``)."""
    from okq.leases import LeasedItem  # the node's, as the reply's encoder takes it

    return [LeasedItem(f"{start + i:026d}", "q", f"{TOKEN}{start + i:08d}", 1,
                       1_764_669_600_123, PAYLOAD, 1_764_669_500_456 + (start + i) // 50)
            for i in range(n)]


def packed(value: Any) -> bytes:
    return bytes(msgpack.packb(value, use_bin_type=True))


class Replies:
    """The node's msgpack replies, built with the node's own encoders, one per call."""

    def __init__(self) -> None:
        self.leases = 0
        self.info = packed({"name": "q", "lease_timeout": 30.0, "retention": 86400.0,
                            "max_attempts": 5, "dead_queue": None,
                            "retention_dead_letter": False,
                            "created_at": "2026-12-01T00:00:00+00:00", "segments": 0,
                            "produced": 0})
        self.ids = packed({"queue_name": "q", "ids": [f"{i:026d}" for i in range(BATCH)]})
        self.lease_cache: dict[int, bytes] = {}

    def lease(self, n: int) -> bytes:
        if n not in self.lease_cache:
            # The node's encoder, imported here: a client does not load it.
            from okq.server.codec import lease_reply_plain

            self.lease_cache[n] = lease_reply_plain("q", leased(n, 0))
        return self.lease_cache[n]

    def answer(self, path: str, body: dict[str, Any]) -> bytes:
        if path == "queue.produce":
            return self.ids
        if path == "queue.lease":
            return self.lease(int(body["batch_size"]))
        if path == "queue.complete":
            return packed({"queue_name": "q", "completed": len(body["tokens"]),
                           "output_ids": None})
        if path == "queues.info":
            return self.info
        raise ValueError(path)


class FakeResponse:
    status = 200
    headers: dict[str, str] = {}  # noqa: RUF012

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    async def __aenter__(self) -> FakeResponse:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        return None

    async def read(self) -> bytes:
        return self.raw


class FakeSession:
    """Answers ``post`` as a node would, at once; the body is decoded only where the
    reply depends on it (a lease's batch size, a complete's tokens)."""

    closed = False

    def __init__(self) -> None:
        self.replies = Replies()

    def post(self, url: object, *, data: bytes, **_: Any) -> FakeResponse:
        path = str(url).rsplit("/", 1)[1]
        body = msgpack.unpackb(data) if path in ("queue.lease", "queue.complete") else {}
        return FakeResponse(self.replies.answer(path, body))

    async def close(self) -> None:
        return None


def read_all(item: wire.LeasedItemOut) -> int:
    """Read every attribute a user sees, once."""
    seen = (item.id, item.token, item.attempts, item.lease_deadline, item.produced_at,
            item.enqueue_at, item.bytes, item.utf8, item.meta)
    return len(seen)


async def fake_workload(kind: str, messages: int) -> None:
    client = Client("http://fake", session=FakeSession())  # type: ignore[arg-type]
    if kind == "worker":
        async def handler(item: wire.LeasedItemOut) -> None:
            return None

        await Worker(client, "q", handler, concurrency=WORKER_CONCURRENCY, limit=messages).run()
        return
    for _ in range(messages // BATCH):
        if kind == "produce":
            await client.produce("q", [PAYLOAD] * BATCH)
            continue
        items = await client.lease("q", BATCH)
        if kind == "lease+read+complete":
            for item in items:
                read_all(item)
        await client.complete("q", [i.token for i in items])


async def http_workload(kind: str, messages: int, url: str, queue: str) -> None:
    async with Client(url) as client:
        if kind == "http produce":
            for _ in range(messages // BATCH):
                await client.produce(queue, [PAYLOAD] * BATCH)
            return
        done = 0
        while done < messages:
            items = await client.lease(queue, BATCH)
            await client.complete(queue, [i.token for i in items])
            done += len(items)


FAKE = ("produce", "lease+complete", "lease+read+complete", "worker")
HTTP = ("http produce", "http lease+complete")


# -- instructions ------------------------------------------------------------------------------


def counted(kind: str, messages: int, workdir: Path, url: str = "", queue: str = "") -> int:
    """The instructions of one run of ``kind`` under callgrind."""
    out = workdir / f"callgrind.{kind.replace(' ', '-')}.{messages}"
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            sys.executable, __file__, "--workload", kind, "--instr-messages", str(messages),
            "--url", url, "--queue", queue]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return int(found.group(1))


def per_message(count: Callable[[int], int], n: int) -> float:
    return (count(2 * n) - count(n)) / n


def instructions(args: argparse.Namespace) -> dict[str, float]:
    n = args.instr_messages
    got: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="okq-bench-client-instr-") as name:
        tmp = Path(name)
        for kind in FAKE:
            got[kind] = per_message(lambda m, k=kind: counted(k, m, tmp), n)
            print(f"  {kind}: {got[kind]:,.0f} instructions/msg", flush=True)
        with okq_node(f"file://{tmp}/store", tmp) as node:
            got["http produce"] = per_message(
                lambda m: counted("http produce", m, tmp, node.url, f"p{m}"), n)
            print(f"  http produce: {got['http produce']:,.0f} instructions/msg", flush=True)

            def consume(m: int) -> int:
                queue = f"c{m}"

                async def prepare() -> None:
                    async with Client(node.url) as client:
                        await fill(client, queue, m)

                asyncio.run(prepare())
                return counted("http lease+complete", m, tmp, node.url, queue)

            got["http lease+complete"] = per_message(consume, n)
            print(f"  http lease+complete: {got['http lease+complete']:,.0f} instructions/msg",
                  flush=True)
    return got


def run_workload(args: argparse.Namespace) -> None:
    coro: Coroutine[Any, Any, None]
    if args.workload in HTTP:
        if args.workload == "http produce":
            async def create() -> None:
                async with Client(args.url) as client:
                    await client.create_queue(args.queue)

            asyncio.run(create())
        coro = http_workload(args.workload, args.instr_messages, args.url, args.queue)
    else:
        coro = fake_workload(args.workload, args.instr_messages)
    asyncio.run(coro)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--instr-messages", type=int, default=2000)
    parser.add_argument("--skip-seconds", action="store_true")
    parser.add_argument("--skip-instructions", action="store_true")
    parser.add_argument("--workload", choices=FAKE + HTTP, help=argparse.SUPPRESS)
    parser.add_argument("--url", default="", help=argparse.SUPPRESS)
    parser.add_argument("--queue", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.workload:
        run_workload(args)
        return
    if args.instr_messages % BATCH:
        parser.error(f"--instr-messages: must be a multiple of {BATCH}")
    secs = {} if args.skip_seconds else seconds(args)
    if not args.skip_instructions and shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    instr = {} if args.skip_instructions else instructions(args)
    print(f"\nThe client's CPU per message, 1 KiB messages, batches of {BATCH}")
    if secs:
        print(f"\nSeconds (this process's CPU, {args.messages:,} messages a phase, median of "
              f"{args.runs} runs, each with a fresh node on the file store):")
        for phase, values in secs.items():
            print(f"  {phase:<16} {statistics.median(values):6.1f} us/msg  "
                  f"(runs: {', '.join(f'{v:.1f}' for v in values)})")
    if instr:
        print(f"\nInstructions (callgrind, N = {args.instr_messages:,}, (Ir(2N) - Ir(N)) / N):")
        for kind, value in instr.items():
            print(f"  {kind:<22} {value:>10,.0f} instructions/msg")


if __name__ == "__main__":
    main()
