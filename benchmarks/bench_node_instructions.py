"""Instructions per message in a node and in the client, counted by callgrind.
Not a test.

``okq serve`` runs under ``valgrind --tool=callgrind`` with collection off; the
driver (this process, okq's ``Client`` over msgpack) warms the node up, then
switches instrumentation on with ``callgrind_control`` for each phase alone
and dumps the phase's count:

* produce: one producer, batches of 100 messages of 1 KiB;
* lease+complete: one consumer leasing batches of 100 and completing them.

The node's count is every instruction its process ran in the phase (aiohttp,
the event loop, the store's threads and the kernel-call wrappers included; the
kernel's own work is not counted). With ``--client``, the driver runs in a
second process under callgrind too, switched on and off around the same
phases: the client's own instructions per message.

Counts do not move with the machine's load, so two checkouts compare by running
this in each. Under valgrind a node is about 50 times slower: a run takes one
to three minutes.

    python benchmarks/bench_node_instructions.py [--messages 2000] [--store file|memory]
        [--batch 100] [--lease-batch N] [--client] [--partitions 1] [--sequencer]
        [--nodes 1] [--workers 1] [--event-loop auto|uvloop|asyncio]

``--lease-batch`` leases batches of another size than the produce's, the
segments staying the same: counts at two lease batches split lease+complete's
instructions into a part per message and a part per request pair (a lease and
its complete), the latter holding the work each write does over its whole
lease object.

With ``--nodes 2 --sequencer --partitions 2 --workers 4`` it counts a fleet of two
nodes serving one queue of two partitions (each node claims the partition it first
writes), against ``--nodes 1 --sequencer --workers 4`` for one node.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from okq.client import Client
from okq.dev.servers import free_port

BATCH = 100  # --batch
LEASE_BATCH = BATCH  # --lease-batch
PAYLOAD = b"x" * 1024
KEYS = "bench-signing-key-0123456789abcdef"
PHASES = ("produce", "lease+complete")


def control(pid: int, *args: str) -> None:
    """``callgrind_control`` on ``pid``: ``-i on``, ``-i off``, ``-d NAME``, ``-z``."""
    subprocess.run(["callgrind_control", *args, str(pid)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def dumped(out: Path, name: str) -> int:
    """The instruction total of the dump called ``name`` of a callgrind output file."""
    for path in sorted(out.parent.glob(out.name + ".*")):
        text = path.read_text(errors="replace")
        if re.search(rf"^desc: Trigger: dump {re.escape(name)}$", text, re.M):
            found = re.search(r"^summary: (\d+)", text, re.M)
            if found:
                return int(found.group(1))
    raise RuntimeError(f"no callgrind dump {name!r} beside {out}")


async def claim(clients: list[Client], queue: str, urls: list[str]) -> None:
    """Two produces through each node in turn: in sequencer mode a node that finds the
    queue's partition held takes the next unheld one (okq.partitions). Says who holds
    what."""
    for _ in range(2):
        for c in clients:
            await c.produce(queue, [PAYLOAD] * BATCH)
    if len(urls) > 1:
        for url in urls:
            with urllib.request.urlopen(f"{url}/health", timeout=60) as r:
                print(f"{url}: roles {json.loads(r.read()).get('roles')}")


async def drive(urls: list[str], messages: int, node_pids: list[int],
                client_pid: int | None, partitions: int = 1, workers: int = 1) -> None:
    """Warm up, then each phase alone with collection on in the nodes (and client):
    ``workers`` producers, then as many consumers, worker k calling node k (mod the
    nodes)."""
    pids = node_pids + ([client_pid] if client_pid else [])
    clients = [Client(url, timeout=600) for url in urls]
    try:
        queue = f"q{uuid.uuid4().hex[:8]}"
        await clients[0].create_queue(queue, partitions=partitions)

        async def produce(n: int) -> None:
            async def producer(k: int) -> None:
                for _ in range(n // BATCH // workers):
                    await clients[k % len(clients)].produce(queue, [PAYLOAD] * BATCH)
            await asyncio.gather(*(producer(k) for k in range(workers)))

        async def consume(n: int) -> None:
            done = 0

            async def consumer(k: int) -> None:
                nonlocal done
                client = clients[k % len(clients)]
                while done < n:
                    got = await client.lease(queue, LEASE_BATCH, request_timeout=0.5)
                    if got:
                        await client.complete(queue, [i.token for i in got])
                        done += len(got)
            await asyncio.gather(*(consumer(k) for k in range(workers)))

        # warm-up: first calls, caches, the queue's first segments; with several
        # nodes in sequencer mode each claims the partition it first finds unheld
        await claim(clients, queue, urls)
        await produce(5 * BATCH * workers)
        await consume(5 * BATCH * workers)
        for phase, work in (("produce", produce), ("lease+complete", consume)):
            for pid in pids:
                control(pid, "-z")
                control(pid, "-i", "on")
            await work(messages)
            for pid in pids:
                control(pid, "-d", phase.replace("+", "-"))
                control(pid, "-i", "off")
    finally:
        for c in clients:
            await c.close()


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the node exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the node did not answer within {timeout:.0f} s")


def callgrind(out: Path, argv: list[str]) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={out}", *argv]


def main() -> None:
    global BATCH, LEASE_BATCH
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--store", choices=("file", "memory"), default="file")
    parser.add_argument("--batch", type=int, default=BATCH,
                        help="messages per produce and per lease (default 100)")
    parser.add_argument("--lease-batch", type=int, default=None,
                        help="messages per lease, when not --batch")
    parser.add_argument("--client", action="store_true",
                        help="count the client's instructions too (the driver under callgrind)")
    parser.add_argument("--partitions", type=int, default=1,
                        help="the queue's partitions (okq.partitions; default 1)")
    parser.add_argument("--sequencer", action="store_true",
                        help="the node in sequencer mode with a shard per partition (it "
                        "holds them all)")
    parser.add_argument("--nodes", type=int, default=1,
                        help="nodes on one store (several: with --sequencer), each under "
                        "callgrind; the count is the fleet's")
    parser.add_argument("--workers", type=int, default=1,
                        help="producers, then consumers, worker k on node k (default 1)")
    parser.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                        help="the nodes' --event-loop (default auto: uvloop where installed)")
    parser.add_argument("--url", action="append", help=argparse.SUPPRESS)  # the driver's run
    parser.add_argument("--node-pid", type=int, action="append", help=argparse.SUPPRESS)
    args = parser.parse_args()
    BATCH = args.batch
    LEASE_BATCH = args.lease_batch or BATCH
    args.messages -= args.messages % BATCH
    if args.url:  # the driver, itself under callgrind
        asyncio.run(drive(args.url, args.messages, args.node_pid, os.getpid(),
                          args.partitions, args.workers))
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = "memory://" if args.store == "memory" else f"file://{work / 'store'}"
        env = {**os.environ, "OKQ_SIGNING_KEYS": KEYS}
        nodes: list[subprocess.Popen[bytes]] = []
        urls: list[str] = []
        outs: list[Path] = []
        try:
            for k in range(args.nodes):
                port = free_port()
                urls.append(f"http://127.0.0.1:{port}")
                outs.append(work / f"callgrind.node{k}")
                log = work / f"node{k}.log"
                with open(log, "wb") as sink:
                    nodes.append(subprocess.Popen(
                        callgrind(outs[k], [
                            sys.executable, "-m", "okq.cli", "serve", "--store", store,
                            "--port", str(port), "--log-level", "WARNING",
                            "--event-loop", args.event_loop,
                            *(["--sequencer", "--sequencer-shards", str(args.partitions)]
                              if args.sequencer else [])]),
                        stdout=sink, stderr=subprocess.STDOUT, env=env))
                wait_healthy(urls[k], nodes[k], log, 300)
            began = time.monotonic()
            client_out = work / "callgrind.client"
            pids = [n.pid for n in nodes]
            if args.client:
                subprocess.run(callgrind(client_out, [
                    sys.executable, __file__, "--messages", str(args.messages),
                    "--batch", str(BATCH), "--lease-batch", str(LEASE_BATCH),
                    "--partitions", str(args.partitions),
                    "--workers", str(args.workers),
                    *(a for url in urls for a in ("--url", url)),
                    *(a for pid in pids for a in ("--node-pid", str(pid)))]),
                    check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            else:
                asyncio.run(drive(urls, args.messages, pids, None, args.partitions,
                                  args.workers))
            took = time.monotonic() - began
        finally:
            for node in nodes:
                node.terminate()
                node.wait(60)
        leases = f" (leases of {LEASE_BATCH})" if LEASE_BATCH != BATCH else ""
        print(f"{args.messages:,} messages, batches of {BATCH}{leases}, 1 KiB, {args.store} store, "
              f"{args.nodes} node(s), {args.partitions} partition(s)"
              f"{', sequencer' if args.sequencer else ''}, {args.workers} producer(s) then "
              f"consumer(s), event loop {args.event_loop} ({took:.0f} s under callgrind)")
        each = " / ".join(f"node {k + 1}" for k in range(args.nodes))
        print(f"{'phase':<16} {'node instr/msg':>15}"
              + (f"  ({each})" if args.nodes > 1 else "")
              + (f" {'client instr/msg':>17}" if args.client else ""))
        for phase in PHASES:
            name = phase.replace("+", "-")
            counts = [dumped(out, name) / args.messages for out in outs]
            line = f"{phase:<16} {sum(counts):>15,.0f}"
            if args.nodes > 1:
                line += "  (" + " / ".join(f"{c:,.0f}" for c in counts) + ")"
            if args.client:
                line += f" {dumped(client_out, name) / args.messages:>17,.0f}"
            print(line)

if __name__ == "__main__":
    main()
