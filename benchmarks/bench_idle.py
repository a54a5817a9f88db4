"""What idle queues cost: object-store requests per second of a small fleet whose
queues are empty while consumers long-poll them. Not a test.

Two nodes in this process (each a real aiohttp app on a loopback port, each
counting its own store requests over one shared in-memory store), ``--queues``
empty queues, one consumer per queue per node long-polling (``request_timeout``
20 s) in a loop. After ``--warmup`` seconds the counters are reset and read
again after ``--seconds``. Three modes: direct with the 0.25 s look of earlier
versions (``--idle-poll-max 0.25``), direct with the default back-off, and
sequencer mode. Request counts are exact whatever the machine's load; the
monthly price is at S3 Standard prices (GET $0.0004, PUT/LIST $0.005 per 1,000).

    python benchmarks/bench_idle.py [--queues 100] [--seconds 60] [--warmup 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from okq.server.app import create_app
from okq.server.state import advertise
from okq.settings import Settings
from okq.store import CountingStore, MemoryStore, Store

KEY = "bench-idle-signing-key-0123456789"
MONTH = 30 * 86_400
PRICE = {"get": 0.0004 / 1000, "head": 0.0004 / 1000, "put": 0.005 / 1000,
         "list": 0.005 / 1000, "delete": 0.0}


async def _node(shared: Store, **settings: Any) -> tuple[web.AppRunner, CountingStore, str]:
    counting = CountingStore(shared)
    app = create_app(Settings(store="memory://", signing_keys=KEY, self_check=False,
                              **settings), counting)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    advertise(app, "127.0.0.1", port)
    return runner, counting, f"http://127.0.0.1:{port}"


async def _consume(session: aiohttp.ClientSession, url: str, queue: str) -> None:
    while True:
        async with session.post(f"{url}/v1/queue.lease",
                                json={"queue_name": queue, "request_timeout": 20}) as resp:
            await resp.read()


async def run(mode: str, queues: int, seconds: float, warmup: float) -> dict[str, float]:
    settings: dict[str, Any] = {"sequencer": mode == "sequencer"}
    if mode == "direct, 0.25 s looks":
        settings["idle_poll_max"] = 0.25
    shared = MemoryStore()
    nodes = [await _node(shared, **settings) for _ in range(2)]
    names = [f"q{n}" for n in range(queues)]
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        for name in names:
            async with session.post(f"{nodes[0][2]}/v1/queues.create",
                                    json={"name": name}) as resp:
                assert resp.status == 201, await resp.text()
        consumers = [asyncio.create_task(_consume(session, url, name))
                     for _, _, url in nodes for name in names]
        await asyncio.sleep(warmup)
        for _, counting, _ in nodes:
            counting.reset()
        await asyncio.sleep(seconds)
        counts: dict[str, float] = {}
        for _, counting, _ in nodes:
            for op, n in counting.requests.items():
                counts[op] = counts.get(op, 0) + n / seconds
        for task in consumers:
            task.cancel()
        for task in consumers:
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                await task
    for runner, _, _ in nodes:
        await runner.cleanup()
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--warmup", type=float, default=10)
    args = parser.parse_args()
    print(f"2 nodes, {args.queues} idle queues, 1 long poll per queue per node, "
          f"{args.seconds:g} s")
    print("| mode | GET/s | PUT/s | LIST/s | per idle queue /s | per month |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode in ("direct, 0.25 s looks", "direct (default)", "sequencer"):
        c = asyncio.run(run(mode, args.queues, args.seconds, args.warmup))
        total = sum(c.values())
        dollars = sum(PRICE.get(op, 0.0) * n for op, n in c.items()) * MONTH
        print(f"| {mode} | {c.get('get', 0) + c.get('head', 0):.2f} | {c.get('put', 0):.3f} "
              f"| {c.get('list', 0):.3f} | {total / args.queues:.4f} | ${dollars:,.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
