"""The store wrappers (CountingStore, FaultyStore) and the start-up self-check."""

from __future__ import annotations

import time

import pytest

from okq.errors import (
    CASConflict,
    ConditionalWritesUnsupported,
    ObjectNotFound,
    OkqError,
    StorageError,
)
from okq.store import (
    CountingStore,
    FaultyStore,
    MemoryStore,
    SimulatedCrash,
    Store,
    check_conditional_writes,
    list_all,
)
from okq.store.base import Blob, ListPage, ObjectInfo
from tests.stores import StoreFactory

# -- CountingStore ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "file"])
async def test_counting_store_counts_requests_and_bytes(
    kind: str, store_factory: StoreFactory
) -> None:
    inner = await store_factory(kind)
    store = CountingStore(inner)
    assert store.url == inner.url

    etag = await store.put("a/1", b"x" * 10)
    await store.put("a/2", b"y" * 20, if_none_match=True)
    await store.put("a/1", b"z" * 5, if_match=etag)
    await store.get("a/1")
    await store.get("a/2")
    await store.head("a/2")
    await store.list("a/", limit=1)
    await store.list("a/")
    await store.delete("a/2")

    assert dict(store.requests) == {"put": 3, "get": 2, "head": 1, "list": 2, "delete": 1}
    assert store.bytes_in["put"] == 35
    assert store.bytes_out["get"] == 5 + 20
    assert store.put_class == 5  # PUT and LIST are billed alike
    assert store.total == 9

    # Failed requests are still requests (and still billed); they move no bytes out.
    with pytest.raises(ObjectNotFound):
        await store.get("a/2")
    with pytest.raises(CASConflict):
        await store.put("a/1", b"lost", if_match="0" * 32)
    assert store.requests["get"] == 3
    assert store.requests["put"] == 4
    assert store.bytes_out["get"] == 25
    assert store.bytes_in["put"] == 39

    store.reset()
    assert store.total == 0
    assert store.put_class == 0
    assert not store.bytes_in
    assert not store.bytes_out
    # The wrapper is transparent: the data is in the inner store.
    assert (await inner.get("a/1")).data == b"z" * 5


async def test_counting_store_counts_list_all_pages() -> None:
    store = CountingStore(MemoryStore())
    for i in range(25):
        await store.put(f"k/{i:02d}", b"")
    store.reset()
    assert len([info async for info in list_all(store, "k/", page=10)]) == 25
    assert store.requests == {"list": 3}


# -- FaultyStore ------------------------------------------------------------------


async def test_error_mode_fails_without_writing() -> None:
    inner = MemoryStore()
    store = FaultyStore(inner)
    store.inject("put", "error", key="seg/")

    with pytest.raises(StorageError) as got:
        await store.put("seg/1", b"data")
    assert not isinstance(got.value, CASConflict)
    with pytest.raises(ObjectNotFound):
        await inner.get("seg/1")
    assert store.injected == [("put", "seg/1", "error")]

    # times=1: the rule is spent, and the same write now lands.
    await store.put("seg/1", b"data")
    assert (await inner.get("seg/1")).data == b"data"
    assert store.calls == [("put", "seg/1"), ("put", "seg/1")]


async def test_rules_match_op_and_key() -> None:
    inner = MemoryStore()
    store = FaultyStore(inner)
    store.inject("get", "error", key=lambda k: k.endswith("/manifest"), times=-1)

    await store.put("q/manifest", b"m")  # a put does not match a get rule
    await store.put("q/other", b"o")
    assert (await store.get("q/other")).data == b"o"
    for _ in range(3):  # times=-1 keeps the rule forever
        with pytest.raises(StorageError):
            await store.get("q/manifest")

    store.clear()
    assert (await store.get("q/manifest")).data == b"m"

    store.inject("*", "error", key="q/", times=2)
    with pytest.raises(StorageError):
        await store.list("q/")
    with pytest.raises(StorageError):
        await store.delete("q/other")
    assert (await inner.get("q/other")).data == b"o"  # the failed delete did nothing
    await store.delete("q/other")  # the rule is spent
    with pytest.raises(ObjectNotFound):
        await inner.get("q/other")


async def test_ambiguous_mode_writes_then_fails() -> None:
    inner = MemoryStore()
    store = FaultyStore(inner)
    store.inject("put", "ambiguous")

    with pytest.raises(StorageError) as got:
        await store.put("m/manifest", b"v1", if_none_match=True)
    assert not isinstance(got.value, CASConflict)
    assert (await inner.get("m/manifest")).data == b"v1"  # it landed
    # The caller retries blindly: the retry now loses its own condition, exactly the
    # ambiguity okq resolves by re-reading.
    with pytest.raises(CASConflict):
        await store.put("m/manifest", b"v1", if_none_match=True)

    store.inject("delete", "ambiguous")
    with pytest.raises(StorageError):
        await store.delete("m/manifest")
    with pytest.raises(ObjectNotFound):
        await inner.get("m/manifest")


async def test_ambiguous_mode_does_not_apply_to_reads() -> None:
    inner = MemoryStore()
    await inner.put("k", b"v")
    store = FaultyStore(inner)
    store.inject("get", "ambiguous")
    assert (await store.get("k")).data == b"v"


@pytest.mark.parametrize("kind", ["memory", "file"])
async def test_overtaken_mode_lands_then_another_writer_writes_then_fails(
    kind: str, store_factory: StoreFactory
) -> None:
    inner = await store_factory(kind)
    store = FaultyStore(inner)
    seen: list[tuple[str, bytes]] = []

    async def other_writer(key: str) -> None:
        # Runs after our write landed and before we see the error: it finds our
        # version and writes on top of it, by CAS, through the same faulty store
        # (the rule does not fire on its own hook's write).
        blob = await store.get(key)
        seen.append((key, blob.data))
        await store.put(key, b"theirs", if_match=blob.etag)

    store.inject("put", "overtaken", key="/manifest", then=other_writer)
    with pytest.raises(StorageError) as got:
        await store.put("q/manifest", b"ours", if_none_match=True)
    assert not isinstance(got.value, CASConflict)
    assert "another writer" in str(got.value)
    assert seen == [("q/manifest", b"ours")]  # ours landed first
    assert (await inner.get("q/manifest")).data == b"theirs"  # the re-read finds theirs
    assert store.injected == [("put", "q/manifest", "overtaken")]
    assert store.calls == [("put", "q/manifest"), ("get", "q/manifest"), ("put", "q/manifest")]

    # times=1: spent; the next write is untouched.
    etag = (await inner.get("q/manifest")).etag
    await store.put("q/manifest", b"again", if_match=etag)
    assert (await inner.get("q/manifest")).data == b"again"
    assert len(seen) == 1


@pytest.mark.parametrize("kind", ["memory", "file"])
async def test_overtaken_delete_is_followed_by_the_hook(
    kind: str, store_factory: StoreFactory
) -> None:
    inner = await store_factory(kind)
    await inner.put("q/lease", b"old")
    store = FaultyStore(inner)
    existed: list[bool] = []

    async def recreate(key: str) -> None:
        try:
            await inner.head(key)
            existed.append(True)
        except ObjectNotFound:
            existed.append(False)
        await inner.put(key, b"recreated", if_none_match=True)

    store.inject("delete", "overtaken", key="q/", then=recreate)
    with pytest.raises(StorageError):
        await store.delete("q/lease")
    assert existed == [False]  # the delete had landed when the other writer came
    assert (await inner.get("q/lease")).data == b"recreated"


async def test_overtaken_rule_never_fires_inside_its_own_hook() -> None:
    inner = MemoryStore()
    store = FaultyStore(inner)
    hooked: list[str] = []

    async def rewrite(key: str) -> None:
        hooked.append(key)
        await store.put(key, b"theirs")  # matches the rule, which is held back

    store.inject("put", "overtaken", key="k/", times=-1, then=rewrite)
    for n in range(2):
        with pytest.raises(StorageError):
            await store.put(f"k/{n}", b"ours")
        assert (await inner.get(f"k/{n}")).data == b"theirs"
    assert hooked == ["k/0", "k/1"]
    assert [m for _, _, m in store.injected] == ["overtaken", "overtaken"]
    # Only writes are overtaken: a read that matches the rule proceeds, no hook.
    store.clear()
    store.inject("*", "overtaken", key="k/0", then=rewrite)
    assert (await store.get("k/0")).data == b"theirs"
    assert hooked == ["k/0", "k/1"]


async def test_overtaken_hook_failure_reaches_the_caller() -> None:
    inner = MemoryStore()
    store = FaultyStore(inner)

    async def broken(key: str) -> None:
        raise RuntimeError(f"the other writer failed on {key}")

    store.inject("put", "overtaken", then=broken)
    with pytest.raises(RuntimeError, match="other writer failed on a"):
        await store.put("a", b"ours")
    assert (await inner.get("a")).data == b"ours"  # it landed before the hook ran


async def test_only_overtaken_takes_a_hook() -> None:
    store = FaultyStore(MemoryStore())

    async def hook(key: str) -> None:
        return None

    with pytest.raises(ValueError, match="overtaken"):
        store.inject("put", "overtaken")
    with pytest.raises(ValueError, match="overtaken"):
        store.inject("put", "ambiguous", then=hook)
    assert store.rules == []


async def test_crash_mode_raises_before_the_call() -> None:
    inner = MemoryStore()
    store = FaultyStore(inner)
    store.inject("put", "crash", key="seg/")

    with pytest.raises(SimulatedCrash):
        await store.put("seg/1", b"data")
    # A crash is not an error okq may catch and handle.
    assert not issubclass(SimulatedCrash, Exception)
    assert not issubclass(SimulatedCrash, OkqError)
    with pytest.raises(ObjectNotFound):
        await inner.get("seg/1")
    assert store.injected == [("put", "seg/1", "crash")]


async def test_latency_mode_delays_then_proceeds() -> None:
    inner = MemoryStore()
    store = FaultyStore(inner)
    store.inject("put", "latency", delay=0.2)

    began = time.monotonic()
    await store.put("k", b"v")
    assert time.monotonic() - began >= 0.19
    assert (await inner.get("k")).data == b"v"

    began = time.monotonic()
    await store.put("k", b"w")  # spent
    assert time.monotonic() - began < 0.19
    assert [m for _, _, m in store.injected] == ["latency"]


Chaos = tuple[list[tuple[str, str, str]], list[str], list[tuple[str, bytes]]]


async def _chaos(seed: int) -> Chaos:
    inner = MemoryStore()
    store = FaultyStore(inner, seed=seed, error_rate=0.2, ambiguous_rate=0.2, max_latency=0.001)
    outcomes: list[str] = []
    for i in range(60):
        key = f"k/{i % 7}"
        try:
            if i % 3 == 2:
                await store.get(key)
            else:
                await store.put(key, f"{i}".encode())
            outcomes.append("ok")
        except ObjectNotFound:
            outcomes.append("missing")
        except StorageError as exc:
            outcomes.append(type(exc).__name__)
    contents = [(info.key, (await inner.get(info.key)).data) async for info in list_all(inner, "")]
    return [(op, key, mode) for op, key, mode in store.injected], outcomes, contents


async def test_seeded_random_faults_are_reproducible() -> None:
    first = await _chaos(seed=42)
    again = await _chaos(seed=42)
    other = await _chaos(seed=7)

    assert first == again
    assert first != other
    modes = {mode for _, _, mode in first[0]}
    assert modes == {"error", "ambiguous"}
    # Ambiguous faults hit writes only.
    assert all(op == "put" for op, _, mode in first[0] if mode == "ambiguous")


# -- the self-check ---------------------------------------------------------------


class IgnoresConditions:
    """An emulator that accepts If-Match / If-None-Match and ignores them."""

    def __init__(self, inner: Store, *, honour_if_none_match: bool = False) -> None:
        self.inner = inner
        self.url = "s3://lax-emulator/okq"
        self.honour_if_none_match = honour_if_none_match

    async def get(self, key: str) -> Blob:
        return await self.inner.get(key)

    async def head(self, key: str) -> ObjectInfo:
        return await self.inner.head(key)

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False,
        want_etag: bool = True,
    ) -> str:
        keep = if_none_match and self.honour_if_none_match
        return await self.inner.put(key, data, if_none_match=keep)

    async def delete(self, key: str, *, if_match: str | None = None) -> None:
        await self.inner.delete(key)

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int = 1000
    ) -> ListPage:
        return await self.inner.list(prefix, start_after=start_after, limit=limit)

    async def close(self) -> None:
        await self.inner.close()


class RefusesButWrites(IgnoresConditions):
    """Honours If-None-Match; on a stale If-Match reports the conflict but has
    written the object anyway."""

    async def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False,
        want_etag: bool = True,
    ) -> str:
        if if_match is None:
            return await self.inner.put(key, data, if_none_match=if_none_match)
        try:
            current: str | None = (await self.inner.head(key)).etag
        except ObjectNotFound:
            current = None
        etag = await self.inner.put(key, data)
        if current != if_match:
            raise CASConflict("changed (but written all the same)")
        return etag


async def test_self_check_refuses_a_store_that_ignores_conditions() -> None:
    inner = MemoryStore()
    lax = IgnoresConditions(inner)
    assert isinstance(lax, Store)

    with pytest.raises(ConditionalWritesUnsupported) as got:
        await check_conditional_writes(lax)
    message = str(got.value)
    assert "s3://lax-emulator/okq" in message
    assert "If-None-Match" in message
    assert "enforces conditional writes" in message
    assert isinstance(got.value, StorageError)
    assert [info async for info in list_all(inner, "")] == []  # scratch object removed


async def test_self_check_refuses_a_store_that_ignores_only_if_match() -> None:
    inner = MemoryStore()
    lax = IgnoresConditions(inner, honour_if_none_match=True)

    with pytest.raises(ConditionalWritesUnsupported) as got:
        await check_conditional_writes(lax)
    assert "If-Match with a stale ETag" in str(got.value)
    assert [info async for info in list_all(inner, "")] == []


async def test_self_check_refuses_a_store_whose_refusals_still_write() -> None:
    inner = MemoryStore()
    sneaky = RefusesButWrites(inner)

    with pytest.raises(ConditionalWritesUnsupported) as got:
        await check_conditional_writes(sneaky)
    assert "a refused conditional write changed the object" in str(got.value)


async def test_self_check_passes_through_the_wrappers() -> None:
    inner = MemoryStore()
    counting = CountingStore(FaultyStore(inner))
    await check_conditional_writes(counting)
    # The check is cheap: 4 puts (2 refused), 1 get, 1 delete.
    assert dict(counting.requests) == {"put": 4, "get": 1, "delete": 1}
