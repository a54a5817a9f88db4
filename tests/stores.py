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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from okq.store import Store

#: ``await make(kind)`` -> a fresh, empty store (the ``store_factory`` fixture).
StoreFactory = Callable[[str], Awaitable[Store]]

ALL_STORES = ["memory", "file", "moto", "seaweed"]
ATOMIC_STORES = ["memory", "file", "seaweed"]
S3_STORES = ["moto", "seaweed"]

MOTO_NOT_ATOMIC = (
    "moto's S3 server is not atomic under concurrency: its conditional-write check "
    "and its write are not under one lock (BRIEF.md: 2 of 6 runs of 20 concurrent "
    "writers lost updates), so moto runs the functional checks only"
)
