"""``--s3-timeout`` bounds each S3 request, for both S3 clients: one request that
never answers stalls a queue for that long, not for a client library's own
timeout (obstore's was 30 s, and not configurable).

A real ``okq serve`` talks to moto's S3 server through the fault proxy
(tests/s3proxy.py), which lets a produce's manifest write land and then holds
its reply: the node gives up on it after ``--s3-timeout``, re-reads the
manifest, finds its own write there and acknowledges the produce, once.
docs/OPERATIONS.md has the figures this measures.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from okq.client import Client
from okq.retrying import NO_RETRIES
from tests.nodes import okq_node
from tests.s3proxy import Rule, S3Proxy
from tests.servers import BUCKET

pytestmark = pytest.mark.s3
TIMEOUT = 1.0


@pytest.mark.parametrize("client", ["obstore", "aioboto3"])
async def test_a_request_that_never_answers_stalls_a_queue_for_s3_timeout_at_most(
        client: str, moto_endpoint: str, tmp_path: Path) -> None:
    store = f"s3://{BUCKET}/{uuid.uuid4().hex}?client={client}"
    with S3Proxy(moto_endpoint) as proxy, okq_node(
            store, tmp_path, endpoint_url=proxy.endpoint,
            extra=["--s3-timeout", str(TIMEOUT), "--no-self-check"]) as node:
        async with Client(node.url, backoff=NO_RETRIES) as c:
            await c.create_queue("stall")
            await c.produce("stall", ["warm-up"])
            held = proxy.add(Rule(method="PUT", path=r"/manifests/stall$", hold=True,
                                  hold_timeout=60))
            began = time.monotonic()
            try:
                ids = await c.produce("stall", ["held"])
                stalled = time.monotonic() - began
            finally:
                held.release()
            print(f"\n{client}: a produce whose manifest write never answered took "
                  f"{stalled:.2f} s with --s3-timeout {TIMEOUT:g}")
            assert len(held.matched) == 1
            assert TIMEOUT * 0.9 <= stalled < TIMEOUT + 4, stalled
            items = (await c.list_items("stall")).items
            assert [i.utf8 for i in items] == ["warm-up", "held"]
            assert items[1].id == ids[0]
