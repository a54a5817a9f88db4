"""The worker of ``service.py``: leases orders from okq, "ships" each, and reads
the tenant and trace id the service put in the item's headers. A failure is
retried with a backoff (the queue's max attempts, then its dead-letter queue).

    python worker.py            # runs until Ctrl-C
    python worker.py --limit 3  # stops after three orders
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from okq.client import Client
from okq.wire import LeasedItemOut
from okq.worker import Worker

QUEUE = "orders"


async def ship(item: LeasedItemOut) -> None:
    order = json.loads(item.bytes)
    tenant, trace = item.headers.get("tenant"), item.headers.get("trace-id")
    print(f"shipped {order['quantity']} x {order['sku']} for {tenant} (trace {trace})",
          flush=True)


async def main(limit: int | None) -> None:
    async with Client(os.environ.get("OKQ_URL", "http://127.0.0.1:7878"),
                      api_key=os.environ.get("OKQ_API_KEY")) as client:
        stats = await Worker(client, QUEUE, ship, concurrency=8, poll=1, limit=limit).run()
    print(f"done: {stats.completed} shipped, {stats.dead} dead-lettered")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=None)
    asyncio.run(main(parser.parse_args().limit))
