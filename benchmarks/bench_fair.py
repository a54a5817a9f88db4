"""Fair sharing between message groups on a standard queue (issue 23). Not a test.

One engine on a file store, a standard queue, 1 KiB messages. One group ("big")
holds ``--ratio`` times the backlog of each of nine others:

* ``first``: big's whole backlog is produced first, then the nine's (a tenant
  that flooded the queue before the others came);
* ``mixed``: the ten groups produce side by side, big ``--ratio`` times as often.

Then 4 consumers lease batches of 10 and complete what they got, until the queue
is empty. Each layout runs with its items in groups (fair sharing) and again with
the same items without groups (the plain walk: ready time order), in turns, for
``--rounds`` rounds. Printed, medians of the rounds:

* the nine's share of the deliveries while all ten groups had items left (their
  fair share is 9 in 10), and the least any one of them got (fair: 1 in 10);
* how many deliveries it took until the nine's last item was handed out;
* lease+complete messages per second over the whole drain, with and without
  groups: what fair sharing costs.

    python benchmarks/bench_fair.py [--small 100] [--ratio 100] [--rounds 3]
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from okq import Engine, EngineOptions, TokenSigner, generate_key
from okq.model import QueueConfig, group_of
from okq.publisher import NewItem
from okq.store import FileStore

CONSUMERS = 4
PRODUCE_BATCH = 100
LEASE_BATCH = 10
PAYLOAD = b"x" * 1024
NINE = [f"small-{i}" for i in range(9)]


def batches(layout: str, small: int, ratio: int) -> list[list[str]]:
    """The groups of each produce call's items, in order."""
    big = small * ratio
    if layout == "first":
        items = ["big"] * big + [g for g in NINE for _ in range(small)]
    else:  # side by side: big ratio times as often as each of the nine
        items = []
        for _ in range(small):
            items += ["big"] * ratio + NINE
    return [items[i:i + PRODUCE_BATCH] for i in range(0, len(items), PRODUCE_BATCH)]


async def one(root: Path, layout: str, grouped: bool, small: int, ratio: int
              ) -> dict[str, float]:
    store = FileStore(root / uuid.uuid4().hex)
    engine = Engine(store, TokenSigner([generate_key()]), options=EngineOptions(linger=0.002))
    await engine.start()
    try:
        queue = f"fair-{uuid.uuid4().hex[:6]}"
        await engine.create_queue(queue, QueueConfig(lease_timeout=60))
        total = 0
        for groups in batches(layout, small, ratio):
            # Without groups the group rides in the payload, for the count only.
            await engine.produce(queue, [
                NewItem(PAYLOAD + g.encode(), meta={"group": g} if grouped else None)
                for g in groups])
            total += len(groups)
        order: list[str] = []

        async def consumer() -> None:
            while len(order) < total:
                items = await engine.lease(queue, LEASE_BATCH, wait=0.2)
                order.extend(group_of(i.meta) or i.payload[len(PAYLOAD):].decode()
                             for i in items)
                if items:
                    await engine.complete([i.token for i in items])

        began = time.perf_counter()
        await asyncio.gather(*(consumer() for _ in range(CONSUMERS)))
        rate = total / (time.perf_counter() - began)
    finally:
        await engine.close()
    last_small = max(i for i, g in enumerate(order) if g != "big") + 1
    # While all ten had items left: until the first of the nine ran out.
    seen: Counter[str] = Counter()
    both = 0
    for n, g in enumerate(order, 1):
        seen[g] += 1
        if g != "big" and seen[g] == small:
            both = n
            break
    window = Counter(order[:both])
    return {"nine": sum(window[g] for g in NINE) / both,
            "least": min(window[g] for g in NINE) / both,
            "last_small": last_small, "rate": rate}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=100, help="each of the nine's backlog")
    ap.add_argument("--ratio", type=int, default=100, help="big's backlog over one of the nine's")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    setups = [(layout, grouped) for layout in ("first", "mixed") for grouped in (True, False)]
    results: dict[tuple[str, bool], list[dict[str, float]]] = {s: [] for s in setups}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for layout, grouped in setups:
                res = await one(Path(tmp), layout, grouped, args.small, args.ratio)
                results[layout, grouped].append(res)
                print(f"round {r + 1}: {layout:>5} {'groups' if grouped else 'plain':>6}: "
                      f"nine {res['nine']:.2f}, least {res['least']:.3f}, nine done after "
                      f"{res['last_small']:.0f}, {res['rate']:.0f} msg/s", flush=True)
    total = args.small * (args.ratio + 9)
    print(f"\nbig: {args.small * args.ratio} items, nine others {args.small} each "
          f"({total} in all); {CONSUMERS} consumers leasing {LEASE_BATCH} at a time; "
          f"medians of {args.rounds} rounds")
    print("| layout | items | nine's share while all had items | least of the nine | "
          "deliveries until the nine were done | lease+complete msg/s |")
    print("|---|---|---:|---:|---:|---:|")
    for layout, grouped in setups:
        res = results[layout, grouped]

        def med(k: str, res: list[dict[str, float]] = res) -> float:
            return statistics.median(r[k] for r in res)

        print(f"| {layout} | {'in groups' if grouped else 'no groups'} | {med('nine'):.2f} | "
              f"{med('least'):.3f} | {med('last_small'):,.0f} | {med('rate'):,.0f} |")


if __name__ == "__main__":
    asyncio.run(main())
