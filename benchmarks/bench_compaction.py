"""Bucket footprint and lease latency with a long history, before and after
compaction. Not a test.

1. Footprint: produce ``--items`` (default 100,000) 1 KiB items in batches of
   1,000, lease and complete them all, leave ``--live`` items live, then run
   the compactor; print the bucket's objects and bytes before and after.
2. Lease latency: lease+complete of single items, median and p99 over
   ``--samples`` operations, on a fresh queue and on the queue above (its history
   compacted away), and on an uncompacted twin with the same history, side by
   side in one run.

    python benchmarks/bench_compaction.py [--items 100000] [--store file|seaweed]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compactor import Compactor, CompactorOptions
from okq import Engine, EngineOptions, TokenSigner, generate_key
from okq.store import CountingStore, FileStore, S3Store, Store, list_all
from tests.servers import BUCKET, SeaweedServer, ensure_dummy_credentials

PAYLOAD = b"x" * 1024
BATCH = 1000


async def footprint(store: Store, prefix: str) -> tuple[int, int]:
    objects = size = 0
    async for info in list_all(store, prefix):
        objects += 1
        size += info.size
    return objects, size


async def history(engine: Engine, queue: str, items: int, live: int) -> None:
    await engine.create_queue(queue)
    for _ in range(items // BATCH):
        await engine.produce(queue, [PAYLOAD] * BATCH)
    done = 0
    while done < items - live:
        got = await engine.lease(queue, min(BATCH, items - live - done))
        await engine.complete([i.token for i in got])
        done += len(got)


async def latency(engine: Engine, store: CountingStore, queue: str,
                  samples: int) -> tuple[float, float, float]:
    await engine.produce(queue, [PAYLOAD] * samples)
    times = []
    store.reset()
    for _ in range(samples):
        began = time.perf_counter()
        (item,) = await engine.lease(queue, 1)
        await engine.complete([item.token])
        times.append(time.perf_counter() - began)
    times.sort()
    per_op = store.total / samples
    return statistics.median(times) * 1000, times[int(0.99 * len(times))] * 1000, per_op


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--live", type=int, default=0)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--store", default="file", choices=["file", "seaweed"])
    args = parser.parse_args()
    with ExitStack() as stack:
        if args.store == "file":
            raw: Store = FileStore(stack.enter_context(tempfile.TemporaryDirectory()))
        else:
            ensure_dummy_credentials()
            server = stack.enter_context(SeaweedServer(BUCKET))
            raw = S3Store(f"s3://{BUCKET}/bench", endpoint_url=server.endpoint)
        store = CountingStore(raw)
        engine = Engine(store, TokenSigner([generate_key()]), options=EngineOptions(linger=0))
        await engine.start()
        began = time.perf_counter()
        await history(engine, "history", args.items, args.live)
        await history(engine, "uncompacted", args.items, args.live)
        print(f"built two queues of {args.items:,} produced items, {args.live} left live, "
              f"in {time.perf_counter() - began:.0f}s")
        before = await footprint(raw, "default/")
        only_history = await footprint(raw, "default/segments/history/"), await footprint(
            raw, "default/leases/history/")
        await asyncio.sleep(1.1)  # let the objects age past the 1 s safety age below
        # Nothing else works on this store, so short ages are safe here; a fleet keeps
        # the defaults (1 h safety age, 60 s lease grace, 180 s minimum segment age).
        compactor = Compactor(engine, options=CompactorOptions(safety_age=1, lease_grace=1,
                                                               min_age=0))
        report = await compactor.compact_queue("history")
        after = await footprint(raw, "default/")
        after_history = await footprint(raw, "default/segments/history/"), await footprint(
            raw, "default/leases/history/")
        keys = [i.key async for i in list_all(raw, "default/") if "/history" in i.key]
        print(f"\ncompaction of 'history': {report.segments_folded} segments folded, "
              f"{report.segments_merged} merged, {report.objects_deleted} objects "
              f"({report.bytes_reclaimed:,} bytes) deleted in {report.seconds:.1f}s")
        for label, fp in (("before", only_history), ("after", after_history)):
            (segs, seg_bytes), (leases, lease_bytes) = fp
            print(f"  'history' {label:<6}: {segs} segment objects ({seg_bytes:,} bytes), "
                  f"{leases} lease objects ({lease_bytes:,} bytes)")
        print(f"  whole namespace: {before[0]} objects / {before[1]:,} bytes before, "
              f"{after[0]} objects / {after[1]:,} bytes after "
              f"(the uncompacted twin accounts for the rest)")
        print("  what is left of 'history':", ", ".join(keys) or "nothing")
        await engine.create_queue("fresh")
        n = f"{args.items // 1000}k" if args.items >= 1000 else str(args.items)
        queues = {"fresh queue": "fresh", f"{n} history, compacted": "history",
                  f"{n} history, not compacted": "uncompacted"}
        runs: dict[str, list[tuple[float, float, float]]] = {k: [] for k in queues}
        for _ in range(args.rounds):  # interleaved, so drift and noise hit all alike
            for label, queue in queues.items():
                runs[label].append(await latency(engine, store, queue, args.samples))
        print(f"\nlease+complete of one item, {args.samples} operations per round, "
              f"median of {args.rounds} interleaved rounds, {args.store} store, "
              f"one engine (warm)")
        print(f"{'queue':<30} {'p50 ms':>8} {'p99 ms':>8} {'requests/op':>12}")
        for label, results in runs.items():
            p50 = statistics.median(r[0] for r in results)
            p99 = statistics.median(r[1] for r in results)
            reqs = statistics.median(r[2] for r in results)
            print(f"{label:<30} {p50:>8.2f} {p99:>8.2f} {reqs:>12.2f}")
        cold = Engine(store, TokenSigner([generate_key()]))
        for name in ("fresh", "history", "uncompacted"):
            await engine.produce(name, [PAYLOAD])
            store.reset()
            began = time.perf_counter()
            await cold.lease(name, 1)
            print(f"first lease from a cold engine on {name!r}: "
                  f"{(time.perf_counter() - began) * 1000:.1f} ms, {store.total} requests")
        await engine.close()
        await raw.close()


if __name__ == "__main__":
    asyncio.run(main())
