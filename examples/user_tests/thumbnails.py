"""The code under test: a service that asks for thumbnails through okq, and the
handler its workers run. Nothing here knows about tests."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from okq.client import Client
from okq.wire import LeasedItemOut
from okq.worker import DeadLetter, Outputs

SIZES = {"small": 64, "large": 512}


async def request_thumbnail(client: Client, queue: str, image: str, size: str,
                            *, user: str) -> str:
    """Queue one thumbnail job; the job's item id."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}")
    [item_id] = await client.produce(queue, [{
        "payload": json.dumps({"image": image, "px": SIZES[size]}),
        "headers": {"user": user},
    }])
    return item_id


def make_handler(done_queue: str) -> Callable[[LeasedItemOut], Awaitable[Outputs]]:
    """The worker's handler: "renders" a thumbnail and produces a note of it to
    ``done_queue`` in the same step; an image that is not a PNG is dead-lettered."""

    async def handle(item: LeasedItemOut) -> Outputs:
        job = json.loads(item.bytes)
        if not job["image"].endswith(".png"):
            raise DeadLetter(f"not a PNG: {job['image']}")
        note = f"{item.headers['user']}:{job['image']}@{job['px']}px"
        return Outputs(done_queue, [note.encode()])

    return handle
