"""Instructions per message through the engine, counted by valgrind's callgrind.
Not a test.

Seconds move with whatever else a shared machine runs; instruction counts do
not. Each workload runs in a fresh Python process under ``valgrind
--tool=callgrind`` (its total ``Ir``, every instruction the process ran, the
interpreter's included), twice: with ``--messages`` and with twice as many, so
that start-up, imports and the queue's creation cancel out:

* produce: one producer, batches of 100 messages of 1 KiB, into a new queue;
* cycle: the same produce, then one consumer leasing batches of 100 and
  completing them until the queue is empty.

produce per message = (produce(2N) - produce(N)) / N;
lease+complete per message = ((cycle(2N) - produce(2N)) - (cycle(N) - produce(N))) / N.

The store is ``memory://`` (no file system calls in the counts) unless
``--store file``. Compare two checkouts by running this in each, one after the
other: the counts are comparable across runs of one machine and Python.
``--hot-path both`` counts each workload twice, on the compiled hot path and
with ``OKQ_PURE=1`` (okq/native.py), and prints them side by side; ``pure`` or
``compiled`` counts one (the default, ``as-installed``, is what the process
chooses by itself).

    python benchmarks/bench_instructions.py [--messages 2000] [--store memory|file]
    python benchmarks/bench_instructions.py --hot-path both
    python benchmarks/bench_instructions.py --workload produce  # one run, uncounted
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BATCH = 100
PAYLOAD = b"x" * 1024


async def workload(kind: str, messages: int, store_url: str) -> None:
    """``produce`` or ``cycle`` (produce, then lease and complete everything)."""
    from okq import Engine, EngineOptions, TokenSigner, generate_key
    from okq.store import open_store

    store = open_store(store_url)
    engine = Engine(store, TokenSigner([generate_key()]), options=EngineOptions())
    await engine.start()
    try:
        await engine.create_queue("bench")
        for _ in range(messages // BATCH):
            await engine.produce("bench", [PAYLOAD] * BATCH)
        if kind == "cycle":
            done = 0
            while done < messages:
                items = await engine.lease("bench", BATCH, wait=0.5)
                await engine.complete([i.token for i in items])
                done += len(items)
    finally:
        await engine.close()
        await store.close()


def counted(kind: str, messages: int, store: str, workdir: Path, hot_path: str) -> int:
    """The instructions of one run of ``kind`` under callgrind, on ``hot_path``."""
    out = workdir / f"callgrind.{kind}.{messages}.{hot_path}"
    where = workdir / f"{kind}-{messages}-{hot_path}"
    store_url = "memory://" if store == "memory" else f"file://{where}"
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            sys.executable, __file__, "--workload", kind, "--messages", str(messages),
            "--store-url", store_url, "--expect", hot_path]
    env = {k: v for k, v in os.environ.items() if k != "OKQ_PURE"}
    if hot_path == "pure":
        env["OKQ_PURE"] = "1"
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--store", choices=("memory", "file"), default="memory")
    parser.add_argument("--workload", choices=("produce", "cycle"),
                        help="run one workload in this process, uncounted")
    parser.add_argument("--hot-path", choices=("as-installed", "pure", "compiled", "both"),
                        default="as-installed", help="which hot path to count (okq/native.py)")
    parser.add_argument("--store-url", default="memory://", help=argparse.SUPPRESS)
    parser.add_argument("--expect", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.messages % BATCH:
        parser.error(f"--messages: must be a multiple of {BATCH}")
    if args.workload:
        check_hot_path(args.expect)
        asyncio.run(workload(args.workload, args.messages, args.store_url))
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    n = args.messages
    paths = ["compiled", "pure"] if args.hot_path == "both" else [args.hot_path]
    with tempfile.TemporaryDirectory(prefix="okq-instr-") as tmp:
        ir = {(kind, m, path): counted(kind, m, args.store, Path(tmp), path)
              for path in paths for kind in ("produce", "cycle") for m in (n, 2 * n)}
    print(f"store {args.store}, batches of {BATCH}, 1 KiB messages, N = {n:,}")
    for (kind, m, path), count in sorted(ir.items()):
        print(f"  {kind:<8} {m:>7,} messages, {path:<12}: {count:>15,} instructions")
    per = {path: per_message(ir, n, path) for path in paths}
    print(f"{'instructions per message':<26}" + "".join(f"{p:>14}" for p in paths))
    for i, row in enumerate(("produce", "lease+complete")):
        print(f"{row:<26}" + "".join(f"{per[p][i]:>14,.0f}" for p in paths))


def per_message(ir: dict[tuple[str, int, str], int], n: int, path: str) -> tuple[float, float]:
    produce = (ir["produce", 2 * n, path] - ir["produce", n, path]) / n
    consume = ((ir["cycle", 2 * n, path] - ir["produce", 2 * n, path])
               - (ir["cycle", n, path] - ir["produce", n, path])) / n
    return produce, consume


def check_hot_path(expected: str | None) -> None:
    """Refuse to count the hot path asked for when this process runs the other one."""
    from okq import native

    if expected in ("pure", "compiled") and native.COMPILED != (expected == "compiled"):
        sys.exit(f"asked for the {expected} hot path, but {native.describe()}")


if __name__ == "__main__":
    main()
