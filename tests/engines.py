"""Helpers to build engines for tests."""

from __future__ import annotations

import os

from okq import Engine, EngineOptions, TokenSigner
from okq.clock import Clock, ManualClock
from okq.store import Store

KEY = b"okq-test-signing-key-0123456789ab"
CHUNK = 3  # segments per manifest chunk in tests' engines


def make_engine(
    store: Store,
    clock: Clock | None = None,
    *,
    namespace: str = "default",
    keys: list[bytes] | None = None,
    **options: object,
) -> Engine:
    # Chunks of a few segments: every test that lists more than that reads and writes
    # manifests in chunks (the default, 128, leaves most tests' manifests whole).
    options.setdefault("manifest_chunk", CHUNK)
    opts = EngineOptions(linger=options.pop("linger", 0.0), **options)  # type: ignore[arg-type]
    return Engine(
        store,
        TokenSigner(keys or [KEY]),
        namespace=namespace,
        clock=clock or ManualClock(),
        options=opts,
    )


def property_examples(short: int, long: int) -> int:
    """A property test's example count: ``short`` in the suite, ``long`` with
    ``OKQ_PROPERTY_EXAMPLES=long``, or the number it names."""
    value = os.environ.get("OKQ_PROPERTY_EXAMPLES", "")
    if value == "long":
        return long
    return int(value or "0") or short
