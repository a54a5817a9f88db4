"""Partitions' pure parts (okq/partitions.py, okq/keys.py, okq/sequencer.py): where
an idempotency key goes, which partition a token names, partitions' names and shards."""

from __future__ import annotations

import base64
from collections import Counter

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from okq import keys, native
from okq.errors import InvalidRequest
from okq.limits import PARTITIONS_MAX
from okq.partitions import jump_hash, key_partition, token_queue
from okq.sequencer import shard_of

KEY = b"okq-test-signing-key-0123456789ab"
SEG = "018b5e3c2a00-0123456789"
#: A few thousand keys, the same on every run: the counts below are exact, not sampled.
KEYS = [f"order-{n}" for n in range(4000)]
NAMES = st.from_regex(keys.NAME_RE, fullmatch=True)


# -- jump_hash and key_partition ----------------------------------------------------------


@pytest.mark.parametrize(("key", "buckets", "bucket"), [
    (1, 1, 0), (42, 57, 43), (0xDEAD10CC, 1, 0), (0xDEAD10CC, 666, 361), (256, 1024, 520),
    (0, 60, 0), (1, 60, 55), (2, 60, 46),
])
def test_jump_hash_matches_the_papers_algorithm(key: int, buckets: int, bucket: int) -> None:
    """Published vectors of Lamping and Veach's jump hash (go-jump, ClickHouse, the
    jump_consistent_hash crate): other implementations place keys as okq does."""
    assert jump_hash(key, buckets) == bucket


@given(key=st.integers(0, 2**64 - 1), buckets=st.integers(1, 1000))
def test_jump_hash_stays_in_range_and_moves_keys_only_to_a_new_bucket(key: int,
                                                                      buckets: int) -> None:
    """0 <= bucket < buckets, the same every time; one more bucket keeps the key
    where it was or moves it to the new bucket, never elsewhere."""
    b = jump_hash(key, buckets)
    assert 0 <= b < buckets
    assert jump_hash(key, buckets) == b
    assert jump_hash(key, buckets + 1) in (b, buckets)


@given(key=st.text(max_size=40), partitions=st.integers(1, PARTITIONS_MAX))
def test_key_partition_stays_in_range(key: str, partitions: int) -> None:
    p = key_partition(key, partitions)
    assert 0 <= p < partitions
    assert key_partition(key, partitions) == p
    assert key_partition(key, 1) == 0


def test_key_partition_is_the_same_in_every_process_and_version() -> None:
    """Fixed values: a key's partition never depends on the process (no ``hash()``,
    which Python salts per process) nor changes between versions, or a key produced
    again through another node or after an upgrade would land twice."""
    got = {k: [key_partition(k, n) for n in (2, 3, 8, 64)]
           for k in ("k", "order-1", "order-2", "é", "")}
    assert got == {"k": [0, 0, 0, 17], "order-1": [1, 2, 5, 19], "order-2": [1, 1, 1, 39],
                   "é": [0, 2, 2, 2], "": [0, 2, 5, 62]}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 15, 63])
def test_raising_partitions_moves_only_keys_to_the_new_one(n: int) -> None:
    """From n to n + 1 partitions: every key that moves goes to partition n, and
    about 1/(n + 1) of them move; the keys are spread evenly over the partitions."""
    before = [key_partition(k, n) for k in KEYS]
    after = [key_partition(k, n + 1) for k in KEYS]
    moved = [(b, a) for b, a in zip(before, after, strict=True) if a != b]
    assert all(a == n for _, a in moved)
    share = len(moved) / len(KEYS)
    assert abs(share - 1 / (n + 1)) < 0.03, share
    counts = Counter(after)
    assert set(counts) == set(range(n + 1))
    expected = len(KEYS) / (n + 1)
    assert all(abs(c - expected) < max(5 * expected ** 0.5, 0.3 * expected)
               for c in counts.values()), counts


# -- token_queue --------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["pure", "compiled"])
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("queue", ["q", "orders~3", "a.b_c-d~63"])
def test_token_queue_reads_a_signed_tokens_queue(impl: str, version: int, queue: str) -> None:
    """A token of either format, signed by either implementation, names its queue
    (the partition): no key is needed to read it."""
    tokens = native.implementations("tokens").get(impl)
    if tokens is None:
        pytest.skip(f"no compiled hot path in this install: {native.CHOICE.reason}")
    signer = tokens.TokenSigner([KEY], version)
    token = signer.sign(tokens.Delivery("default", queue, SEG, 17, 3))
    assert token.count(".") == {1: 1, 2: 3}[version]
    assert token_queue(token) == queue
    assert token_queue(token.partition(".")[0]) == queue  # its head alone says it too


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.mark.parametrize("garbage", [
    "", ".", "nope", "a.b.c.d", "!!!.x", "é", "\x00", "=" * 8,
    b64(b"\xc1") + ".x",  # not msgpack
    b64(msgpack.packb({"q": "orders"})) + ".1.2.mac",  # a map, not a list
    b64(msgpack.packb(["kid", "ns", "orders"])) + ".1.2.mac",  # too short
    b64(msgpack.packb([b"kid", "ns", 7, "seg"])) + ".1.2.mac",  # no queue name
    b64(msgpack.packb("orders")) + ".x",
])
def test_token_queue_is_none_for_what_is_no_token(garbage: str) -> None:
    assert token_queue(garbage) is None


@given(st.text(max_size=60))
def test_token_queue_never_raises(text: str) -> None:
    got = token_queue(text)
    assert got is None or isinstance(got, str)


# -- partitions' names --------------------------------------------------------------------


@given(queue=NAMES, p=st.integers(0, PARTITIONS_MAX - 1))
def test_partition_name_and_split_partition_round_trip(queue: str, p: int) -> None:
    name = keys.partition_name(queue, p)
    assert keys.split_partition(name) == (queue, p)
    assert keys.check_queue(name, "queue") == name
    assert (name == queue) == (p == 0)  # partition 0 is the queue itself


def test_partition_names() -> None:
    assert keys.partition_name("orders", 0) == "orders"
    assert keys.partition_name("orders", 3) == "orders~3"
    assert keys.split_partition("orders") == ("orders", 0)
    assert keys.split_partition("orders~12") == ("orders", 12)


@pytest.mark.parametrize("name", ["q~3", "q~1", "orders.dlq~63", "x~999"])
def test_check_queue_accepts_a_partition_but_check_name_refuses_it(name: str) -> None:
    """The engine serves partitions by name; no user may name a queue so."""
    assert keys.check_queue(name, "queue_name") == name
    with pytest.raises(InvalidRequest) as info:
        keys.check_name(name, "queue_name")
    assert info.value.details["field"] == "queue_name"


@pytest.mark.parametrize("name", ["q~0", "q~", "q~01", "~3", "q~1~2", "q~1000", "q~-1", "q~a",
                                  "", "-q~1"])
def test_check_queue_refuses_what_names_no_partition(name: str) -> None:
    """Partition 0 is the queue's own name, so ``q~0`` names nothing."""
    with pytest.raises(InvalidRequest) as info:
        keys.check_queue(name, "queue_name")
    assert info.value.details["field"] == "queue_name"


# -- shards -------------------------------------------------------------------------------


@given(queue=NAMES, p=st.integers(0, PARTITIONS_MAX - 1), shards=st.integers(1, 200))
def test_partition_p_is_p_shards_after_partition_0(queue: str, p: int, shards: int) -> None:
    base = shard_of(queue, shards)
    assert 0 <= base < shards
    assert shard_of(keys.partition_name(queue, p), shards) == (base + p) % shards


def test_a_queues_partitions_fall_on_distinct_shards() -> None:
    """P partitions on P or more shards: each on a shard of its own (and so a
    holder of its own once the fleet has as many)."""
    for shards in (4, 16, 64):
        for queue in ("orders", "jobs", "q"):
            got = {shard_of(keys.partition_name(queue, p), shards) for p in range(shards)}
            assert got == set(range(shards))
    assert shard_of("orders~5", 1) == 0
