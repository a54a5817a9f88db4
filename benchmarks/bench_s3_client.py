"""The S3 client's own cost: aioboto3's store next to obstore's, call by call.
Not a test.

Both stores (okq/store/s3.py and okq/store/obstore.py) run in this process,
one after the other for each operation, against the same server: SeaweedFS,
and moto too with ``--moto``. Both servers run as subprocesses, so the
process CPU measured here (``time.process_time``: user + system, every thread,
obstore's Rust runtime included) is the client's alone.

Operations: GET 1 KiB, GET 100 KiB, PUT 100 KiB with If-Match (each call
chains on the ETag the last returned; each concurrent worker on its own key),
PUT 100 KiB create-only (a fresh key each call), LIST a prefix holding 100
keys. Each runs ``--calls`` times sequentially and then from 8 concurrent
tasks. Figures: CPU per call (the whole process, and the event loop's thread
alone: obstore does its work on Rust threads, aiobotocore on the loop), wall
latency p50 per call, calls per second.

    python benchmarks/bench_s3_client.py [--calls 500] [--moto] [--uvloop]

The machine is shared: the figures are indicative, the ratios more than the
absolute values.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from okq.dev.servers import port_answers
from okq.store import Store, open_store
from tests.nodes import free_port
from tests.servers import BUCKET, SeaweedServer, create_bucket, ensure_dummy_credentials

CLIENTS = ("aioboto3", "obstore")
CONCURRENCY = 8
SMALL = os.urandom(1024)
LARGE = os.urandom(100 * 1024)
LISTED = 100

#: One call: given the worker number and the call number, do one request.
Call = Callable[[int, int], Awaitable[object]]


@dataclass
class Result:
    cpu_us: float  # process CPU per call, every thread
    loop_us: float  # CPU per call of the event loop's thread (this one)
    p50_ms: float  # wall latency of one call, median
    rate: float  # calls per second


@contextmanager
def moto_subprocess() -> Iterator[str]:
    """moto's server in its own process, so its CPU is not counted as the client's."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_answers(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("moto's server did not start")
            time.sleep(0.05)
        endpoint = f"http://127.0.0.1:{port}"
        create_bucket(endpoint)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


async def prepare(store: Store) -> dict[str, Call]:
    """The objects the operations read, and one call per operation."""
    await store.put("get/small", SMALL)
    await store.put("get/large", LARGE)
    await asyncio.gather(*(store.put(f"list/{i:03d}", b"v") for i in range(LISTED)))
    etags = {w: await store.put(f"cas/{w}", LARGE) for w in range(CONCURRENCY)}
    fresh = itertools.count()

    async def cas(w: int, _: int) -> None:
        etags[w] = await store.put(f"cas/{w}", LARGE, if_match=etags[w])

    async def create(_: int, __: int) -> None:
        await store.put(f"new/{next(fresh)}", LARGE, if_none_match=True)

    async def listing(_: int, __: int) -> None:
        page = await store.list("list/")
        assert len(page.items) == LISTED, len(page.items)

    return {
        "GET 1 KiB": lambda w, i: store.get("get/small"),
        "GET 100 KiB": lambda w, i: store.get("get/large"),
        "PUT 100 KiB If-Match": cas,
        "PUT 100 KiB create-only": create,
        "LIST 100 keys": listing,
    }


async def measure(call: Call, calls: int, workers: int) -> Result:
    """``calls`` calls spread over ``workers`` tasks: CPU, p50 latency and rate."""
    latencies: list[float] = []

    async def worker(w: int) -> None:
        for i in range(calls // workers):
            began = time.perf_counter()
            await call(w, i)
            latencies.append(time.perf_counter() - began)

    cpu, loop, wall = time.process_time(), time.thread_time(), time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    cpu, loop = time.process_time() - cpu, time.thread_time() - loop
    wall = time.perf_counter() - wall
    done = len(latencies)
    return Result(cpu / done * 1e6, loop / done * 1e6, statistics.median(latencies) * 1000,
                  done / wall)


async def run_server(name: str, endpoint: str, calls: int) -> dict[tuple[str, str, str], Result]:
    stores = {c: open_store(f"s3://{BUCKET}/bench-{uuid.uuid4().hex[:8]}?client={c}",
                            endpoint_url=endpoint, region="us-east-1") for c in CLIENTS}
    results: dict[tuple[str, str, str], Result] = {}
    try:
        ops = {c: await prepare(s) for c, s in stores.items()}
        for op in ops[CLIENTS[0]]:
            for mode, workers in (("sequential", 1), (f"{CONCURRENCY} concurrent", CONCURRENCY)):
                for client in CLIENTS:  # side by side: one client, then the other
                    await measure(ops[client][op], 20, workers)  # warm the pool
                    res = await measure(ops[client][op], calls, workers)
                    results[(op, mode, client)] = res
                    print(f"  {name} {op:<24} {mode:<13} {client:<8} "
                          f"{res.cpu_us:6.0f} us CPU/call ({res.loop_us:5.0f} on the loop)  "
                          f"p50 {res.p50_ms:6.2f} ms  {res.rate:5.0f} calls/s", flush=True)
    finally:
        for store in stores.values():
            await store.close()
    return results


def table(name: str, results: dict[tuple[str, str, str], Result]) -> str:
    a, o = CLIENTS
    lines = [
        f"\n### {name}\n",
        f"| operation | mode | CPU us/call {a} | CPU us/call {o} | CPU ratio | "
        f"loop-thread us/call {a} / {o} | p50 ms {a} / {o} | calls/s {a} / {o} |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (op, mode, client), res in results.items():
        if client != a:
            continue
        other = results[(op, mode, o)]
        lines.append(
            f"| {op} | {mode} | {res.cpu_us:,.0f} | {other.cpu_us:,.0f} | "
            f"{res.cpu_us / other.cpu_us:.1f}x | {res.loop_us:,.0f} / {other.loop_us:,.0f} | "
            f"{res.p50_ms:.2f} / {other.p50_ms:.2f} | {res.rate:,.0f} / {other.rate:,.0f} |"
        )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    tables: list[str] = []
    with SeaweedServer() as weed:
        tables.append(table("SeaweedFS", await run_server("SeaweedFS", weed.endpoint,
                                                          args.calls)))
    if args.moto:
        with moto_subprocess() as endpoint:
            tables.append(table("moto", await run_server("moto", endpoint, args.calls)))
    loop = type(asyncio.get_running_loop()).__module__
    print(f"\nS3 client cost, {args.calls} calls per cell, event loop {loop}; CPU is this "
          "process's user+system time per call (the servers run in other processes)")
    for text in tables:
        print(text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--moto", action="store_true", help="moto's server as well")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop's event loop")
    arguments = parser.parse_args()
    ensure_dummy_credentials()
    if arguments.uvloop:
        import uvloop

        uvloop.install()
    asyncio.run(main(arguments))
