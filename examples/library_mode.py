"""okq as a library: an engine in this process, no server.

A queue with retries and a dead-letter queue, a producer, and a Worker that
sends "emails", failing on a bad address until the item is dead-lettered.
Runs on ``memory://`` by default; give a store URL to keep the state:

    python examples/library_mode.py                    # memory://, gone at exit
    python examples/library_mode.py file://./okq-data  # a local folder
"""

from __future__ import annotations

import asyncio
import sys

from okq import Engine, QueueConfig, TokenSigner, generate_key, open_store
from okq.wire import LeasedItemOut
from okq.worker import DeadLetter, EngineQueues, Worker

ADDRESSES = ["ada@example.com", "grace@example.com", "not-an-address", "alan@example.com"]


async def send_email(item: LeasedItemOut) -> None:
    address = item.utf8 or ""
    if "@" not in address:
        raise DeadLetter(f"not an e-mail address: {address!r}")
    print(f"sent to {address} (attempt {item.attempts})")


async def main(store_url: str) -> None:
    signer = TokenSigner([generate_key()])
    async with Engine(open_store(store_url), signer) as engine:
        await engine.create_queue("emails-dead", exist_ok=True)
        await engine.create_queue(
            "emails", QueueConfig(lease_timeout=30, max_attempts=3, dead_queue="emails-dead"),
            exist_ok=True)
        await engine.produce("emails", [a.encode() for a in ADDRESSES])

        worker = Worker(EngineQueues(engine), "emails", send_email, limit=len(ADDRESSES))
        stats = await worker.run()
        dead = await engine.lease("emails-dead", batch=10)
        print(f"completed {stats.completed}, dead-lettered {stats.dead}: "
              + ", ".join(repr(item.payload.decode()) for item in dead))
        await engine.complete([item.token for item in dead])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "memory://"))
