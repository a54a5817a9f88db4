"""Which stores the suite runs on, and why the lists differ.

* ``ALL_STORES`` — every backend the conformance suite covers: the in-memory
  store, the file store (the embedded default), moto's S3 server and
  SeaweedFS's real S3 server. Functional behaviour (get/put/list, conditional
  writes one at a time, error mapping) must be identical on all four.
* ``ATOMIC_STORES`` — the stores whose conditional writes are atomic under
  concurrency. moto's server is NOT among them: its If-Match / If-None-Match
  check and its write are not under one lock, and on this machine 2 of 6 runs
  of 20 concurrent read-modify-write writers lost updates (see BRIEF.md,
  "Facts measured"). So moto is for functional tests only; every test that
  proves atomicity, fencing or "nothing lost under concurrency" runs on
  ``ATOMIC_STORES``: memory, file and SeaweedFS.
* ``OBSTORE_STORES`` — the same two S3 servers through the other S3 client,
  obstore (``s3://...?client=obstore``, okq/store/obstore.py). The conformance
  suite runs on them too (moto again for the functional checks only). The
  engine suites build the aioboto3 store directly; the nodes that the
  acceptance tests start open theirs by URL, so they run on the default,
  obstore.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from okq.store import Store

#: ``await make(kind)`` -> a fresh, empty store (the ``store_factory`` fixture).
StoreFactory = Callable[[str], Awaitable[Store]]

ALL_STORES = ["memory", "file", "moto", "seaweed"]
ATOMIC_STORES = ["memory", "file", "seaweed"]
S3_STORES = ["moto", "seaweed"]
OBSTORE_STORES = ["moto-obstore", "seaweed-obstore"]
#: Every kind the conformance suite runs on.
CONFORMANCE_STORES = ALL_STORES + OBSTORE_STORES
ATOMIC_CONFORMANCE_STORES = [*ATOMIC_STORES, "seaweed-obstore"]


def on_s3(kind: str) -> bool:
    """Whether a store kind needs a real S3 server (and so the ``s3`` mark)."""
    return kind in S3_STORES or kind in OBSTORE_STORES

MOTO_NOT_ATOMIC = (
    "moto's S3 server is not atomic under concurrency: its conditional-write check "
    "and its write are not under one lock (BRIEF.md: 2 of 6 runs of 20 concurrent "
    "writers lost updates), so moto runs the functional checks only"
)
