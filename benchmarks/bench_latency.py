"""Where produce-to-lease latency goes, on one node. Not a test.

One producer sends a batch of ``--batch`` messages every ``1/--calls`` seconds
(open loop); four consumers long-poll for up to 100 and complete what they get.
Each message's latency is split in two: the produce call (the node lingers for
more items, writes the segment, then the manifest, and answers) and the rest
(the long poll's wake-up, the lease-object write, the reply). Runs each store
with the node's default linger and with ``--linger 0``, side by side.

    python benchmarks/bench_latency.py [--seconds 10] [--calls 10] [--batch 100]
        [--stores file,seaweedfs]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from okq.client import Client
from okq.dev.servers import SeaweedServer
from tests.nodes import okq_node
from tests.servers import ensure_dummy_credentials

STAMP = struct.Struct("dI")  # call time, call number
PAD = b"\xff" * (1024 - STAMP.size)


@contextlib.contextmanager
def node(store: str, tmp: Path, linger: float | None) -> Iterator[str]:
    extra = [] if linger is None else ["--linger", str(linger)]
    if store == "file":
        with okq_node(f"file://{tmp}/store", tmp, extra=extra) as n:
            yield n.url
        return
    with SeaweedServer() as sw, okq_node(f"s3://{sw.bucket}/lat", tmp,
                                         endpoint_url=sw.endpoint, extra=extra) as n:
        yield n.url


async def measure(url: str, seconds: float, calls: float, batch: int
                  ) -> tuple[list[float], list[float]]:
    """(produce-call times, total latencies) in ms, one of each per message."""
    returned: dict[int, float] = {}
    call_ms: list[float] = []
    total_ms: list[float] = []
    sent = int(seconds * calls) * batch
    async with Client(url) as c:
        await c.create_queue("lat")

        async def consumer() -> None:
            while len(total_ms) < sent:
                got = await c.lease("lat", 100, request_timeout=1.0)
                now = time.perf_counter()
                for item in got:
                    began, n = STAMP.unpack(item.bytes[:STAMP.size])
                    total_ms.append((now - began) * 1000)
                    call_ms.append((returned.get(n, now) - began) * 1000)
                if got:
                    await c.complete("lat", [i.token for i in got])

        async def produce(n: int) -> None:
            began = time.perf_counter()
            await c.produce("lat", [STAMP.pack(began, n) + PAD] * batch)
            returned[n] = time.perf_counter()

        consumers = [asyncio.create_task(consumer()) for _ in range(4)]
        sends = []
        for n in range(int(seconds * calls)):
            sends.append(asyncio.create_task(produce(n)))
            await asyncio.sleep(1 / calls)
        await asyncio.gather(*sends)
        await asyncio.wait_for(asyncio.gather(*consumers), 60)
    return call_ms, total_ms


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--calls", type=float, default=10, help="produce calls per second")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--stores", default="file,seaweedfs")
    args = parser.parse_args()
    ensure_dummy_credentials()  # loopback servers only: never a real identity
    print(f"# {' '.join(sys.argv)}  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    print(f"{args.calls * args.batch:,.0f} msg/s offered as {args.calls:g} calls of "
          f"{args.batch}; 4 consumers long-polling for 100\n")
    print("| store | linger | produce call p50 / p99 ms | after the call p50 ms "
          "| produce-to-lease p50 / p99 ms |")
    print("|---|---|---:|---:|---:|")
    for store in args.stores.split(","):
        for linger in (None, 0.0):
            with tempfile.TemporaryDirectory() as tmp, node(store, Path(tmp), linger) as url:
                calls, totals = await measure(url, args.seconds, args.calls, args.batch)
            rest = statistics.median(t - c for c, t in zip(calls, totals, strict=True))
            name = "default" if linger is None else f"{linger:g} s"
            print(f"| {store} | {name} | {pct(calls, 0.5):.1f} / {pct(calls, 0.99):.1f} | "
                  f"{rest:.1f} | {pct(totals, 0.5):.1f} / {pct(totals, 0.99):.1f} |",
                  flush=True)


if __name__ == "__main__":
    asyncio.run(main())
