"""Start-up self-check: prove the store honours conditional writes.

Some S3 emulators accept ``If-Match`` and ``If-None-Match`` and ignore them;
running okq on one would silently lose updates. The check writes a scratch
object under ``.okq-selfcheck/`` and refuses to continue unless every
condition is enforced.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable

from okq.errors import CASConflict, ConditionalWritesUnsupported
from okq.store.base import Store

HINT = (
    "okq needs a store that enforces conditional writes (If-Match and "
    "If-None-Match on PUT), as AWS S3, MinIO, SeaweedFS and Cloudflare R2 do"
)


async def check_conditional_writes(store: Store) -> None:
    key = f".okq-selfcheck/{uuid.uuid4().hex}"
    try:
        first = await store.put(key, b"okq self-check 1", if_none_match=True)
        await _expect_conflict(store.put(key, b"okq self-check x", if_none_match=True),
                               store, "If-None-Match: * on an existing object")
        second = await store.put(key, b"okq self-check 2", if_match=first)
        await _expect_conflict(store.put(key, b"okq self-check y", if_match=first),
                               store, "If-Match with a stale ETag")
        blob = await store.get(key)
        if blob.data != b"okq self-check 2" or blob.etag != second:
            raise ConditionalWritesUnsupported(
                f"{store.url}: a refused conditional write changed the object. {HINT}",
                store=store.url,
            )
    finally:
        await store.delete(key)


async def _expect_conflict(write: Awaitable[str], store: Store, what: str) -> None:
    try:
        await write
    except CASConflict:
        return
    raise ConditionalWritesUnsupported(
        f"{store.url} accepted a write with {what} that it should have refused. {HINT}",
        store=store.url,
    )
