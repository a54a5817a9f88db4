"""Engine throughput and object-store requests per message. Not a test.

For each store (file://, moto's S3 server, SeaweedFS; the servers are started on
loopback by this script) and each repetition:

* produce: 4 producers, each calling ``produce`` with batches of 100 messages
  of 1 KiB, until ``--messages`` are in the queue;
* lease+complete: 4 consumers, each leasing batches of 100 and completing them,
  until the queue is empty.

Prints messages per second (median of the repetitions) and object-store
requests per message by operation, counted by okq's CountingStore.

    python benchmarks/bench_engine.py [--messages 20000] [--repeat 3] [--stores file,moto,seaweed]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from okq import Engine, EngineOptions, TokenSigner, generate_key
from okq.store import CountingStore, FileStore, S3Store, Store
from tests.servers import (
    BUCKET,
    MotoServer,
    SeaweedServer,
    ensure_dummy_credentials,
)

PRODUCERS = CONSUMERS = 4
BATCH = 100
PAYLOAD = b"x" * 1024


@dataclass
class Phase:
    rates: list[float] = field(default_factory=list)
    requests: Counter[str] = field(default_factory=Counter)
    messages: int = 0

    def per_message(self, op: str) -> float:
        return self.requests[op] / self.messages if self.messages else 0.0


async def produce_phase(engines: list[Engine], queue: str, total: int) -> None:
    per_producer = total // PRODUCERS

    async def producer(engine: Engine) -> None:
        for _ in range(per_producer // BATCH):
            await engine.produce(queue, [PAYLOAD] * BATCH)

    await asyncio.gather(*(producer(engines[n % len(engines)]) for n in range(PRODUCERS)))


async def consume_phase(engines: list[Engine], queue: str, total: int) -> None:
    done = 0

    async def consumer(engine: Engine) -> None:
        nonlocal done
        while done < total:
            items = await engine.lease(queue, BATCH, wait=0.5)
            if not items:
                continue
            await engine.complete([i.token for i in items])
            done += len(items)

    await asyncio.gather(*(consumer(engines[n % len(engines)]) for n in range(CONSUMERS)))


async def run_store(
    name: str, store: Store, total: int, repeat: int, nodes: int
) -> tuple[Phase, Phase]:
    """``nodes`` engines share the store, as that many okq nodes would; the
    producers and consumers are spread over them."""
    counting = CountingStore(store)
    signer = TokenSigner([generate_key()])
    engines = [Engine(counting, signer, options=EngineOptions()) for _ in range(nodes)]
    engine = engines[0]
    await engine.start()
    produce, consume = Phase(), Phase()
    for r in range(repeat):
        queue = f"bench-{r}-{uuid.uuid4().hex[:6]}"
        await engine.create_queue(queue)
        counting.reset()
        began = time.perf_counter()
        await produce_phase(engines, queue, total)
        produce.rates.append(total / (time.perf_counter() - began))
        produce.requests.update(counting.requests)
        produce.messages += total
        counting.reset()
        began = time.perf_counter()
        await consume_phase(engines, queue, total)
        consume.rates.append(total / (time.perf_counter() - began))
        consume.requests.update(counting.requests)
        consume.messages += total
        print(f"  {name} run {r + 1}: produce {produce.rates[-1]:,.0f}/s, "
              f"lease+complete {consume.rates[-1]:,.0f}/s", flush=True)
    for e in engines:
        await e.close()
    await store.close()
    return produce, consume


def report(results: dict[str, tuple[Phase, Phase]], total: int, repeat: int) -> None:
    print(f"\n1 KiB messages, batch {BATCH}, {PRODUCERS} producers, {CONSUMERS} consumers, "
          f"{total:,} messages per run, median of {repeat} runs; 'x4' rows spread them "
          f"over 4 engines (4 nodes, no sequencer)\n")
    head = (f"{'store':<11} {'phase':<15} {'msg/s':>8} {'PUT':>7} {'GET':>7} {'LIST':>7} "
            f"{'DELETE':>7} {'PUT-class':>9} {'total':>7}  (requests per message)")
    print(head)
    print("-" * len(head))
    for name, phases in results.items():
        for label, phase in zip(("produce", "lease+complete"), phases, strict=True):
            ops = {op: phase.per_message(op) for op in ("put", "get", "list", "delete", "head")}
            print(f"{name:<11} {label:<15} {statistics.median(phase.rates):>8,.0f} "
                  f"{ops['put']:>7.4f} {ops['get'] + ops['head']:>7.4f} {ops['list']:>7.4f} "
                  f"{ops['delete']:>7.4f} {ops['put'] + ops['list']:>9.4f} "
                  f"{sum(ops.values()):>7.4f}")
        both = Counter(phases[0].requests) + Counter(phases[1].requests)
        msgs = phases[0].messages
        put_class = (both["put"] + both["list"]) / msgs
        print(f"{name:<11} {'end to end':<15} {'':>8} {'':>7} {'':>7} {'':>7} {'':>7} "
              f"{put_class:>9.4f} {sum(both.values()) / msgs:>7.4f}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stores", default="file,moto,seaweed")
    parser.add_argument("--nodes", default="1,4", help="engine counts to run, e.g. 1,4")
    args = parser.parse_args()
    ensure_dummy_credentials()
    results: dict[str, tuple[Phase, Phase]] = {}
    with ExitStack() as stack:
        for name in args.stores.split(","):
            if name == "file":
                tmp = stack.enter_context(tempfile.TemporaryDirectory())
                store: Store = FileStore(tmp)
            elif name == "moto":
                server = stack.enter_context(MotoServer(BUCKET))
                store = S3Store(f"s3://{BUCKET}/bench", endpoint_url=server.endpoint)
            elif name == "seaweed":
                sw = stack.enter_context(SeaweedServer(BUCKET))
                store = S3Store(f"s3://{BUCKET}/bench", endpoint_url=sw.endpoint)
            else:
                raise SystemExit(f"unknown store {name!r}")
            for nodes in (int(n) for n in args.nodes.split(",")):
                if nodes > 1 and name == "moto":
                    # moto's conditional writes are not atomic under concurrency:
                    # several engines racing on one manifest can lose updates there.
                    print("  moto: skipping multi-engine runs (moto is not atomic)")
                    continue
                label = name if nodes == 1 else f"{name} x{nodes}"
                results[label] = await run_store(label, store, args.messages, args.repeat, nodes)
    report(results, args.messages, args.repeat)


if __name__ == "__main__":
    asyncio.run(main())
