"""Ordered (fifo) queues against a standard queue, one engine on a file store. Not a test.

For each setup, in turns (``--rounds``), on a fresh queue:

* produce ``--messages`` 1 KiB messages in batches of 100 by 4 producers, item i
  of the whole run in group ``i % groups``: on the fifo queues, and on a standard
  queue (``fair``: groups order nothing there, they share leases out fairly),
  against a standard queue whose items name no group (``standard``);
* lease+complete them: 4 consumers, each leasing batches of 10 (a long poll of
  up to 0.5 s: a completion on an ordered queue wakes it) and completing what it
  got, until every message is done; on an ordered queue each consumer also checks
  that no group is handed out twice at once and that each producer's items of a
  group come out in the order it produced them (the run fails loudly otherwise).

Prints the median lease+complete messages per second of each setup and its ratio
to the standard queue's, side by side from one run, and the long polls that ended
empty per message (a consumer that found every group held for 0.5 s).

    python benchmarks/bench_fifo.py [--messages 20000] [--groups 1,10,1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from okq import Engine, EngineOptions, TokenSigner, generate_key
from okq.model import QueueConfig, group_of
from okq.publisher import NewItem
from okq.store import FileStore

PRODUCERS = CONSUMERS = 4
PRODUCE_BATCH = 100
LEASE_BATCH = 10
PAYLOAD = b"x" * 1024


@dataclass
class Result:
    rates: list[float] = field(default_factory=list)
    empty: list[float] = field(default_factory=list)


async def produce(engine: Engine, queue: str, total: int, groups: int) -> None:
    per = total // PRODUCERS

    async def producer(p: int) -> None:
        for start in range(p * per, (p + 1) * per, PRODUCE_BATCH):
            await engine.produce(queue, [
                NewItem(PAYLOAD + i.to_bytes(4, "big"),
                    meta={"group": f"g{i % groups}"} if groups else None)
                for i in range(start, min(start + PRODUCE_BATCH, (p + 1) * per))])

    await asyncio.gather(*(producer(p) for p in range(PRODUCERS)))


async def consume(engine: Engine, queue: str, total: int, fifo: bool) -> tuple[float, int]:
    done = 0
    empty = 0
    in_flight: set[str] = set()
    # (group, producer) -> the last number handed out: a producer's produces follow
    # one another, so within a group its numbers only grow (producers run side by
    # side, so numbers of different producers interleave in any order)
    last: dict[tuple[str, int], int] = {}
    per = total // PRODUCERS

    async def consumer() -> None:
        nonlocal done, empty
        while done < total:
            items = await engine.lease(queue, LEASE_BATCH, wait=0.5)  # a long poll
            if not items:
                empty += 1
                continue
            mine = {group_of(i.meta) or "" for i in items}
            if fifo:
                assert not mine & in_flight, f"a group handed out twice at once: {mine & in_flight}"
                in_flight.update(mine)
                for i in items:
                    group, n = group_of(i.meta) or "", int.from_bytes(i.payload[-4:], "big")
                    assert n > last.get((group, n // per), -1), f"group {group} out of order"
                    last[group, n // per] = n
            await engine.complete([i.token for i in items])
            if fifo:
                in_flight.difference_update(mine)
            done += len(items)

    began = time.perf_counter()
    await asyncio.gather(*(consumer() for _ in range(CONSUMERS)))
    return total / (time.perf_counter() - began), empty


async def one(root: Path, setup: str, groups: int, total: int) -> tuple[float, float]:
    store = FileStore(root / uuid.uuid4().hex)
    engine = Engine(store, TokenSigner([generate_key()]),
                    options=EngineOptions(linger=0.002))
    await engine.start()
    try:
        fifo = setup.startswith("fifo")
        queue = f"bench-{setup}-{uuid.uuid4().hex[:6]}"
        await engine.create_queue(queue, QueueConfig(fifo=fifo, lease_timeout=60))
        await produce(engine, queue, total, groups)
        rate, empty = await consume(engine, queue, total, fifo)
        return rate, empty / total
    finally:
        await engine.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--groups", default="1,10,1000")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    counts = [int(g) for g in args.groups.split(",")]
    setups = [("standard", 0), ("fair", max(counts))] + [(f"fifo-{g}", g) for g in counts]
    results = {name: Result() for name, _ in setups}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, groups in setups:
                rate, empty = await one(Path(tmp), name, groups, args.messages)
                results[name].rates.append(rate)
                results[name].empty.append(empty)
                print(f"round {r + 1}: {name:>14}: {rate:8.0f} msg/s lease+complete, "
                      f"{empty:.3f} empty leases per message", flush=True)
    base = statistics.median(results["standard"].rates)
    print(f"\n{args.messages} messages, file store, one engine, {CONSUMERS} consumers "
          f"leasing {LEASE_BATCH} at a time; medians of {args.rounds} rounds")
    print("| queue | groups | lease+complete msg/s | vs standard | empty leases / msg |")
    print("|---|---:|---:|---:|---:|")
    for name, groups in setups:
        res = results[name]
        rate = statistics.median(res.rates)
        print(f"| {name.split('-')[0]} | {groups} | {rate:,.0f} | {rate / base:.2f}x | "
              f"{statistics.median(res.empty):.3f} |")


if __name__ == "__main__":
    asyncio.run(main())
