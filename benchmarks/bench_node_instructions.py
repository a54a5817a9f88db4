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
        [--batch 100] [--client]
"""

from __future__ import annotations

import argparse
import asyncio
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


async def drive(url: str, messages: int, node_pid: int, client_pid: int | None) -> None:
    """Warm up, then each phase alone with collection on in the node (and client)."""
    pids = [node_pid] + ([client_pid] if client_pid else [])
    async with Client(url, timeout=600) as client:
        queue = f"q{uuid.uuid4().hex[:8]}"
        await client.create_queue(queue)

        async def produce(n: int) -> None:
            for _ in range(n // BATCH):
                await client.produce(queue, [PAYLOAD] * BATCH)

        async def consume(n: int) -> None:
            done = 0
            while done < n:
                got = await client.lease(queue, BATCH, request_timeout=0.5)
                if got:
                    await client.complete(queue, [i.token for i in got])
                    done += len(got)

        await produce(5 * BATCH)  # warm-up: first calls, caches, the queue's first segments
        await consume(5 * BATCH)
        for phase, work in (("produce", produce), ("lease+complete", consume)):
            for pid in pids:
                control(pid, "-z")
                control(pid, "-i", "on")
            await work(messages)
            for pid in pids:
                control(pid, "-d", phase.replace("+", "-"))
                control(pid, "-i", "off")


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
    global BATCH
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--store", choices=("file", "memory"), default="file")
    parser.add_argument("--batch", type=int, default=BATCH,
                        help="messages per produce and per lease (default 100)")
    parser.add_argument("--client", action="store_true",
                        help="count the client's instructions too (the driver under callgrind)")
    parser.add_argument("--url", help=argparse.SUPPRESS)  # the driver's own run
    parser.add_argument("--node-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    BATCH = args.batch
    args.messages -= args.messages % BATCH
    if args.url:  # the driver, itself under callgrind
        asyncio.run(drive(args.url, args.messages, args.node_pid, os.getpid()))
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        store = "memory://" if args.store == "memory" else f"file://{work / 'store'}"
        node_out, log = work / "callgrind.node", work / "node.log"
        env = {**os.environ, "OKQ_SIGNING_KEYS": KEYS}
        with open(log, "wb") as sink:
            node = subprocess.Popen(
                callgrind(node_out, [sys.executable, "-m", "okq.cli", "serve", "--store", store,
                                     "--port", str(port), "--log-level", "WARNING"]),
                stdout=sink, stderr=subprocess.STDOUT, env=env)
        try:
            wait_healthy(url, node, log, 300)
            began = time.monotonic()
            client_out = work / "callgrind.client"
            if args.client:
                subprocess.run(callgrind(client_out, [
                    sys.executable, __file__, "--messages", str(args.messages), "--url", url,
                    "--batch", str(BATCH),
                    "--node-pid", str(node.pid)]), check=True, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)
            else:
                asyncio.run(drive(url, args.messages, node.pid, None))
            took = time.monotonic() - began
        finally:
            node.terminate()
            node.wait(60)
        print(f"{args.messages:,} messages, batches of {BATCH}, 1 KiB, {args.store} store "
              f"({took:.0f} s under callgrind)")
        print(f"{'phase':<16} {'node instr/msg':>15}" + (f" {'client instr/msg':>17}"
                                                         if args.client else ""))
        for phase in PHASES:
            name = phase.replace("+", "-")
            line = f"{phase:<16} {dumped(node_out, name) / args.messages:>15,.0f}"
            if args.client:
                line += f" {dumped(client_out, name) / args.messages:>17,.0f}"
            print(line)


if __name__ == "__main__":
    main()
