"""A node's CPU per message with and without uvloop, and with either S3 client.
Not a test.

Each run starts a fresh ``okq serve`` subprocess and drives it from this
process with okq's client (msgpack): 1 KiB messages, batches of 100, 4
producers, then 4 consumers leasing 100 and completing them. The node's CPU is
read from ``/proc/<pid>/stat`` (utime + stime, every thread) before and after
each phase. Configurations, run alternately, median of ``--runs``:

* store: the file store, SeaweedFS through aioboto3, SeaweedFS through obstore
  (``s3://...?client=obstore``);
* event loop: ``--event-loop asyncio`` or ``--event-loop uvloop`` (the default
  where uvloop is installed, okq/loops.py).

    python benchmarks/bench_node_cpu.py [--messages 20000] [--runs 3]
        [--stores file,seaweed,seaweed-obstore]

The machine is shared: the figures are indicative; compare columns of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from okq.client import Client
from okq.dev.fleet import store_requests_of
from tests.nodes import okq_node
from tests.servers import BUCKET, SeaweedServer, ensure_dummy_credentials

BATCH = 100
WORKERS = 4
PAYLOAD = b"x" * 1024
TICK = os.sysconf("SC_CLK_TCK")

#: The node's event loop: ``okq serve --event-loop`` (okq/loops.py).
LOOPS = ("asyncio", "uvloop")


@dataclass
class Run:
    produce_us: float  # node CPU per message produced
    consume_us: float  # node CPU per message leased and completed
    produce_rate: float
    consume_rate: float
    rss_mib: float  # the node's peak RSS
    requests: dict[str, float] = field(default_factory=dict)  # store requests per message


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


@contextmanager
def node(loop: str, store: str, endpoint: str | None, tmp: Path) -> Iterator[tuple[int, str]]:
    """``okq serve`` on ``loop``: yields its pid and URL once it answers /health."""
    with okq_node(store, tmp, endpoint_url=endpoint, extra=["--event-loop", loop]) as n:
        yield n.proc.pid, n.url


def store_requests(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        return store_requests_of(resp.read().decode())


async def lease_and_complete(client: Client, queue: str, total: int) -> None:
    """``WORKERS`` consumers leasing ``BATCH`` and completing them until ``total`` are done."""
    done = 0

    async def consumer() -> None:
        nonlocal done
        while done < total:
            got = await client.lease(queue, BATCH, request_timeout=0.5)
            if got:
                await client.complete(queue, [i.token for i in got])
                done += len(got)

    await asyncio.gather(*(consumer() for _ in range(WORKERS)))


async def drive(pid: int, url: str, total: int) -> Run:
    """Produce ``total`` messages, then lease and complete them all; CPU per phase."""
    queue = f"q{uuid.uuid4().hex[:8]}"
    total -= total % (WORKERS * BATCH)
    async with Client(url) as client:
        await client.create_queue(queue)
        before_requests = store_requests(url)
        cpu, began = cpu_seconds(pid), time.perf_counter()

        async def producer() -> None:
            for _ in range(total // WORKERS // BATCH):
                await client.produce(queue, [PAYLOAD] * BATCH)

        await asyncio.gather(*(producer() for _ in range(WORKERS)))
        produce_cpu, produce_wall = cpu_seconds(pid) - cpu, time.perf_counter() - began
        cpu, began = cpu_seconds(pid), time.perf_counter()
        await lease_and_complete(client, queue, total)
        consume_cpu, consume_wall = cpu_seconds(pid) - cpu, time.perf_counter() - began
    after = store_requests(url)
    requests = {op: (after.get(op, 0) - before_requests.get(op, 0)) / total for op in after}
    return Run(produce_cpu / total * 1e6, consume_cpu / total * 1e6, total / produce_wall,
               total / consume_wall, peak_rss_mib(pid), requests)


def store_url(kind: str, tmp: Path) -> str:
    name = uuid.uuid4().hex[:8]
    if kind == "file":
        return f"file://{tmp}/store-{name}"
    client = "obstore" if kind.endswith("-obstore") else "aioboto3"
    return f"s3://{BUCKET}/bench-{name}?client={client}"


async def run_all(args: argparse.Namespace, tmp: Path,
                  endpoint: str | None) -> dict[tuple[str, str], list[Run]]:
    results: dict[tuple[str, str], list[Run]] = {}
    for r in range(args.runs):
        for kind in args.stores:
            loops = list(LOOPS) if r % 2 == 0 else list(reversed(LOOPS))  # alternate
            for loop in loops:
                s3 = endpoint if kind != "file" else None
                with node(loop, store_url(kind, tmp), s3, tmp) as (pid, url):
                    run = await drive(pid, url, args.messages)
                results.setdefault((kind, loop), []).append(run)
                print(f"  run {r + 1} {kind:<16} {loop:<8} produce {run.produce_us:5.0f} us/msg "
                      f"({run.produce_rate:7,.0f}/s), lease+complete {run.consume_us:5.0f} "
                      f"us/msg ({run.consume_rate:7,.0f}/s), peak RSS {run.rss_mib:.0f} MiB",
                      flush=True)
    return results


def med(runs: list[Run], attr: str) -> float:
    return statistics.median(float(getattr(run, attr)) for run in runs)


def report(results: dict[tuple[str, str], list[Run]], args: argparse.Namespace) -> None:
    print(f"\nNode CPU per message (utime+stime of the node process, all threads), "
          f"{args.messages:,} x 1 KiB messages, batch {BATCH}, {WORKERS} producers then "
          f"{WORKERS} consumers, median of {args.runs} alternating runs\n")
    print("| store | loop | produce us/msg | lease+complete us/msg | produce msg/s | "
          "lease+complete msg/s | peak RSS MiB | store requests/msg |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (kind, loop), runs in results.items():
        reqs = runs[-1].requests
        req_text = ", ".join(f"{op} {v:.4f}" for op, v in sorted(reqs.items()) if v)
        print(f"| {kind} | {loop} | {med(runs, 'produce_us'):.0f} | {med(runs, 'consume_us'):.0f}"
              f" | {med(runs, 'produce_rate'):,.0f} | {med(runs, 'consume_rate'):,.0f} | "
              f"{med(runs, 'rss_mib'):.0f} | {req_text} |")
    print("\nuvloop / asyncio (CPU per message; below 1 means uvloop spends less):")
    for kind in args.stores:
        base, uv = results[(kind, "asyncio")], results[(kind, "uvloop")]
        print(f"  {kind}: produce {med(uv, 'produce_us') / med(base, 'produce_us'):.2f}, "
              f"lease+complete {med(uv, 'consume_us') / med(base, 'consume_us'):.2f}")
    if "seaweed" in args.stores and "seaweed-obstore" in args.stores:
        print("obstore / aioboto3 on SeaweedFS (CPU per message):")
        for loop in LOOPS:
            a, o = results[("seaweed", loop)], results[("seaweed-obstore", loop)]
            print(f"  {loop}: produce {med(o, 'produce_us') / med(a, 'produce_us'):.2f}, "
                  f"lease+complete {med(o, 'consume_us') / med(a, 'consume_us'):.2f}")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="okq-bench-cpu-") as name:
        tmp = Path(name)
        if any(kind != "file" for kind in args.stores):
            with SeaweedServer() as weed:
                results = await run_all(args, tmp, weed.endpoint)
        else:
            results = await run_all(args, tmp, None)
    report(results, args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--stores", type=lambda text: text.split(","),
                        default=["file", "seaweed", "seaweed-obstore"])
    arguments = parser.parse_args()
    ensure_dummy_credentials()
    asyncio.run(main(arguments))
