"""Helpers to build engines for tests."""

from __future__ import annotations

from okq import Engine, EngineOptions, TokenSigner
from okq.clock import Clock, ManualClock
from okq.store import Store

KEY = b"okq-test-signing-key-0123456789ab"


def make_engine(
    store: Store,
    clock: Clock | None = None,
    *,
    namespace: str = "default",
    keys: list[bytes] | None = None,
    **options: object,
) -> Engine:
    opts = EngineOptions(linger=options.pop("linger", 0.0), **options)  # type: ignore[arg-type]
    return Engine(
        store,
        TokenSigner(keys or [KEY]),
        namespace=namespace,
        clock=clock or ManualClock(),
        options=opts,
    )
