"""HTTP overhead: throughput through one okq node next to the engine alone, and
produce-to-lease latency. Not a test.

Both sides use a file:// store in a temporary directory and the same workload:
1 KiB messages, batch 100, 4 producers then 4 consumers (lease 100, complete
100), ``--messages`` per run, median of ``--repeat`` runs. The node is a real
``okq serve`` subprocess on loopback driven by okq's client (msgpack).

Latency: one producer sends single messages stamped with the send time, at
``--rate`` per second; one consumer long-polls for batches of 1 and completes.
Each sample is lease-return time minus produce-call time.

    python benchmarks/bench_node.py [--messages 10000] [--repeat 3] [--samples 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from okq import Engine, TokenSigner, generate_key
from okq.client import Client
from okq.store import FileStore
from tests.nodes import okq_node

BATCH = 100
WORKERS = 4
PAYLOAD = b"x" * 1024

Produce = Callable[[str, Sequence[bytes]], Awaitable[Any]]
Lease = Callable[[str, int, float], Awaitable[list[tuple[bytes, str]]]]
Complete = Callable[[str, list[str]], Awaitable[Any]]


class Side:
    def __init__(self, produce: Produce, lease: Lease, complete: Complete,
                 create: Callable[[str], Awaitable[Any]]) -> None:
        self.produce, self.lease, self.complete, self.create = produce, lease, complete, create


def engine_side(engine: Engine) -> Side:
    async def lease(q: str, n: int, wait: float) -> list[tuple[bytes, str]]:
        return [(i.payload, i.token) for i in await engine.lease(q, n, wait=wait)]

    async def complete(q: str, tokens: list[str]) -> None:
        await engine.complete(tokens, queue=q)

    return Side(engine.produce, lease, complete, engine.create_queue)


def client_side(client: Client) -> Side:
    async def lease(q: str, n: int, wait: float) -> list[tuple[bytes, str]]:
        return [(i.bytes, i.token) for i in await client.lease(q, n, request_timeout=wait)]

    return Side(client.produce, lease, client.complete, client.create_queue)


async def throughput(side: Side, queue: str, total: int) -> tuple[float, float]:
    await side.create(queue)
    total -= total % (WORKERS * BATCH)  # what the producers' whole batches add up to
    began = time.perf_counter()

    async def producer() -> None:
        for _ in range(total // WORKERS // BATCH):
            await side.produce(queue, [PAYLOAD] * BATCH)

    await asyncio.gather(*(producer() for _ in range(WORKERS)))
    produce_rate = total / (time.perf_counter() - began)
    done = 0
    began = time.perf_counter()

    async def consumer() -> None:
        nonlocal done
        while done < total:
            got = await side.lease(queue, BATCH, 0.5)
            if got:
                await side.complete(queue, [t for _, t in got])
                done += len(got)

    await asyncio.gather(*(consumer() for _ in range(WORKERS)))
    return produce_rate, total / (time.perf_counter() - began)


async def latency(side: Side, queue: str, samples: int, rate: float) -> list[float]:
    await side.create(queue)
    seen: list[float] = []

    async def consumer() -> None:
        while len(seen) < samples:
            got = await side.lease(queue, 1, 2.0)
            now = time.perf_counter()
            for payload, token in got:
                seen.append(now - struct.unpack("d", payload[:8])[0])
                await side.complete(queue, [token])

    task = asyncio.create_task(consumer())
    for _ in range(samples):
        await side.produce(queue, [struct.pack("d", time.perf_counter()) + PAYLOAD[8:]])
        await asyncio.sleep(1 / rate)
    await asyncio.wait_for(task, 60)
    return seen


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--rate", type=float, default=50.0)
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(FileStore(Path(tmp) / "engine"), TokenSigner([generate_key()]))
        await engine.start()
        with okq_node(f"file://{tmp}/node", Path(tmp)) as node:
            async with Client(node.url) as client:
                sides = {"engine": engine_side(engine), "node": client_side(client)}
                for r in range(args.repeat):
                    for name, side in sides.items():  # side by side, alternating
                        p, c = await throughput(side, f"t{r}", args.messages)
                        row = results.setdefault(name, {"produce": [], "consume": []})
                        row["produce"].append(p)
                        row["consume"].append(c)
                        print(f"  run {r + 1} {name}: produce {p:,.0f}/s, "
                              f"lease+complete {c:,.0f}/s", flush=True)
                lat = {name: await latency(side, "lat", args.samples, args.rate)
                       for name, side in sides.items()}
        await engine.close()
    print(f"\n1 KiB messages, batch {BATCH}, {WORKERS} producers / {WORKERS} consumers, "
          f"{args.messages:,} messages per run, median of {args.repeat} runs, file:// store\n")
    print(f"{'':<8} {'produce msg/s':>14} {'lease+complete msg/s':>21} "
          f"{'p50 ms':>8} {'p99 ms':>8}")
    for name in ("engine", "node"):
        row = results[name]
        print(f"{name:<8} {statistics.median(row['produce']):>14,.0f} "
              f"{statistics.median(row['consume']):>21,.0f} "
              f"{pct(lat[name], 0.5):>8.1f} {pct(lat[name], 0.99):>8.1f}")
    e, n = results["engine"], results["node"]
    produce_ratio = statistics.median(n["produce"]) / statistics.median(e["produce"])
    consume_ratio = statistics.median(n["consume"]) / statistics.median(e["consume"])
    print(f"\nnode / engine: produce {produce_ratio:.2f}, lease+complete {consume_ratio:.2f}"
          f"  (produce-to-lease latency from {args.samples} messages at {args.rate:.0f}/s)")


if __name__ == "__main__":
    asyncio.run(main())
