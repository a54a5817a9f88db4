"""Sequencer mode on real aiohttp nodes in this process, on loopback, sharing one
store: changes forwarded to the holder, errors carried back, the role claimed
when its holder dies, hangs or leaves, and idle long polls that cost the store
(almost) nothing. Real processes behind nginx on SeaweedFS: tests/acceptance/test_fleet.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import hashlib
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import msgpack
import pytest
from aiohttp import web
from aiohttp.client_reqrep import ConnectionKey

from okq import wire as s
from okq.client import Client
from okq.errors import (
    InvalidToken,
    LeaseLost,
    ObjectNotFound,
    QueueNotFound,
    StorageError,
    Unauthorized,
)
from okq.fleetwire import (
    FORWARD_PATH,
    FORWARD_VERSION,
    SIGNATURE_HEADER,
    ReplayGuard,
    port_refused,
    sign,
    verify,
)
from okq.publisher import NewItem, Produced
from okq.routing import Route
from okq.sequencer import RoleRecord, Sequencer, role_key, shard_of
from okq.server.app import create_app
from okq.server.state import ENGINE, PIPELINE, SEQUENCER, SERVICE, STORE, advertise
from okq.settings import Settings
from okq.store import CountingStore, MemoryStore, Store
from okq.store.faulty import FaultyStore

KEY = "sequencer-test-key-0123456789"


class InProcNode:
    """A node on a loopback port, in this process."""

    def __init__(self, app: web.Application, runner: web.AppRunner, url: str) -> None:
        self.app, self.runner, self.url = app, runner, url

    @property
    def seq(self) -> Sequencer:
        seq = self.app[SEQUENCER]
        assert seq is not None
        return seq

    @property
    def store(self) -> CountingStore:
        return self.app[STORE]

    async def crash(self) -> None:
        """Stop as a SIGKILL would, as far as others can tell: the port refuses
        connections and the role object stays as it was."""
        seq = self.seq

        async def no_release() -> None:
            if seq._renewer is not None:
                seq._renewer.cancel()
            if seq._session is not None:
                await seq._session.close()

        seq.stop = no_release  # type: ignore[method-assign]
        await self.runner.cleanup()

    async def stop(self) -> None:
        await self.runner.cleanup()


Start = Callable[..., Awaitable[InProcNode]]


@pytest.fixture
async def shared() -> Store:
    return MemoryStore()


@pytest.fixture
async def start_node(shared: Store) -> AsyncIterator[Start]:
    nodes: list[InProcNode] = []

    async def start(*, port: int = 0, store: Store | None = None,
                    **overrides: Any) -> InProcNode:
        """A node on ``port`` (any free one by default) over ``store`` (the shared one
        by default: a wrapper of it gives one node faults of its own)."""
        fields = {"store": "memory://", "signing_keys": KEY, "sequencer": True,
                  "self_check": False, "linger": 0.002, "report_interval": 0,
                  **overrides}  # no presence report: the idle costs counted are the queues'
        settings = Settings(**fields)
        app = create_app(settings, store or shared)
        runner = web.AppRunner(app, shutdown_timeout=1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        advertise(app, "127.0.0.1", port)
        node = InProcNode(app, runner, f"http://127.0.0.1:{port}")
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        await node.runner.cleanup()


def puts(node: InProcNode) -> int:
    return node.store.requests.get("put", 0)


async def forwarding(start_node: Start, queue: str,
                     **settings: Any) -> tuple[InProcNode, InProcNode]:
    """Two nodes and a new queue whose shard the second holds (its first produce went
    there): the first forwards every change of the queue to it."""
    a, b = await start_node(), await start_node()
    async with Client(a.url) as ca, Client(b.url) as cb:
        await ca.create_queue(queue, **settings)
        await cb.produce(queue, [b"first"])
    return a, b


async def test_changes_sent_to_any_node_are_written_by_the_holder(start_node: Start) -> None:
    a, b = await start_node(), await start_node()
    async with Client(a.url) as ca, Client(b.url) as cb:
        await ca.create_queue("jobs")
        await cb.produce("jobs", [b"first"])  # b routes first: b claims the role
        assert (b.seq.held(), a.seq.held()) == ([0], [])
        before = puts(a)
        await ca.produce("jobs", [b"x", b"y", b"z"])
        leased = await ca.lease("jobs", 4, lease_timeout=30)
        assert sorted(i.bytes for i in leased) == [b"first", b"x", b"y", b"z"]
        await ca.renew("jobs", leased[0].token, lease_timeout=60)
        await ca.complete("jobs", [leased[0].token, leased[1].token])
        assert await ca.retry("jobs", leased[2].token) is False  # released, not dead
        assert puts(a) == before, "a forwarded every change: it wrote nothing itself"
        assert a.seq.forwards["ok"] >= 5
        again = await cb.lease("jobs", 4)
        assert len(again) == 1  # the retried one; the fourth is still leased
        st = await cb.stats("jobs")
        assert (st.completed, st.in_flight) == (2, 2)


async def test_a_forwarded_produce_says_how_many_items_were_duplicates(
        start_node: Start) -> None:
    a, _ = await forwarding(start_node, "dups")
    async with Client(a.url) as ca:
        before = puts(a)
        items = [s.ProduceItem(utf8=f"item {n}", key=f"k{n}") for n in range(3)]
        first = await ca.produce_reply("dups", items[:2])
        again = await ca.produce_reply("dups", [*items, items[2]])  # k2 twice in one
        assert a.seq.forwards["ok"] >= 2 and puts(a) == before
    assert first.duplicates == 0
    assert again.duplicates == 3 and again.ids[:2] == first.ids and again.ids[2] == again.ids[3]


async def test_a_forwarded_produce_brings_each_items_sequence_number_back(
        start_node: Start) -> None:
    a, _ = await forwarding(start_node, "numbered")
    service, forwarded = a.app[SERVICE], a.seq.forwards.get("ok", 0)
    got = await service.produce("numbered", [NewItem(b"x", key="kx"), NewItem(b"y")])
    again = await service.produce("numbered", [NewItem(b"x again", key="kx")])
    assert a.seq.forwards["ok"] == forwarded + 2  # both produced on b
    assert isinstance(got, Produced) and isinstance(again, Produced)
    assert got.sequence == [(0, 1), (0, 2)]  # "first" is number 0
    assert again.sequence == [(0, 1)] and list(again) == got[:1]  # answered by its key


async def test_a_forwarded_retry_says_it_dead_lettered(start_node: Start) -> None:
    a, b = await forwarding(start_node, "last", max_attempts=1)
    async with Client(a.url) as ca, Client(b.url) as cb:
        before = puts(a)
        [item] = await ca.lease("last", 1)
        assert await ca.retry("last", item.token) is True  # its only attempt: dead-lettered
        assert a.seq.forwards["ok"] >= 2 and puts(a) == before
        assert (await cb.stats("last")).dead_lettered == 1  # dropped: no dead queue


async def test_errors_keep_their_kind_across_a_forward(start_node: Start) -> None:
    a, b = await start_node(), await start_node()
    async with Client(a.url) as ca, Client(b.url) as cb:
        await cb.create_queue("jobs")
        await cb.produce("jobs", [b"x"])
        (item,) = await cb.lease("jobs", 1)
        await ca.complete("jobs", [item.token])
        with pytest.raises(LeaseLost):
            await ca.renew("jobs", item.token)
        with pytest.raises(QueueNotFound):
            await ca.produce("nope", [b"x"])
        with pytest.raises(InvalidToken):
            await ca.complete("jobs", [item.token[:-4] + "AAAA"])


async def test_a_forwarded_complete_verifies_each_token_once(
        start_node: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sender carries the operation whole; the holder verifies each token once
    (before: once on the sender and twice on the holder)."""
    a, b = await start_node(), await start_node()
    async with Client(a.url) as ca, Client(b.url) as cb:
        await ca.create_queue("jobs")
        await ca.produce("jobs", [b"x", b"y"])  # a holds the role
        items = await cb.lease("jobs", 2)
        verified: list[str] = []
        for node in (a, b):
            signer = node.app[ENGINE].signer
            real = signer.verify_many

            def counting(tokens: list[str], *args: Any, _real: Any = real, **kw: Any) -> Any:
                verified.extend(tokens)
                return _real(tokens, *args, **kw)

            monkeypatch.setattr(signer, "verify_many", counting)
        await cb.complete("jobs", [i.token for i in items])
        assert sorted(verified) == sorted(i.token for i in items)
        assert b.seq.forwards["ok"] >= 2


async def test_a_dead_holders_role_is_claimed_and_writes_resume(start_node: Start) -> None:
    a, b, c = await start_node(), await start_node(), await start_node()
    async with Client(a.url) as ca, Client(b.url) as cb, Client(c.url) as cc:
        await ca.create_queue("jobs")
        await ca.produce("jobs", [b"x", b"y"])
        assert a.seq.held() == [0]
        await cb.produce("jobs", [b"z"])  # b and c become members of a's role
        await cc.produce("jobs", [b"w"])
        leased = await cb.lease("jobs", 4, lease_timeout=30)
        await a.seq._renew(0, a.seq._shards[0])  # the members reach the role object
        await a.crash()
        began = time.monotonic()
        ids = await cc.produce("jobs", [b"after"])
        took = time.monotonic() - began
        assert ids and took < 2, f"writes resumed after {took:.2f} s"
        assert (b.seq.held() + c.seq.held()) == [0], "exactly one of b and c took the role"
        await cc.complete("jobs", [i.token for i in leased])  # leased before the death
        (later,) = await cb.lease("jobs", 4)
        assert later.bytes == b"after"
        assert (await cb.stats("jobs")).completed == 4


async def test_the_first_claimant_is_the_first_in_turn(start_node: Start) -> None:
    a, b, c = await start_node(), await start_node(), await start_node()
    rec = RoleRecord(holder=a.seq.id, url=a.url, epoch=7,
                     members={a.seq.id: a.url, b.seq.id: b.url, c.seq.id: c.url})
    turns = sorted([b.seq._turn(rec), c.seq._turn(rec)])
    assert turns == [0, 1], "the dead holder is skipped; b and c take distinct turns"
    stranger = await start_node()
    assert stranger.seq._turn(rec) == 2  # not a member: after them


async def test_a_holder_that_stops_renewing_is_replaced_after_the_ttl(start_node: Start) -> None:
    a, b = await start_node(role_ttl=3), await start_node(role_ttl=3)
    async with Client(a.url) as ca, Client(b.url) as cb:
        await ca.create_queue("jobs")
        await ca.produce("jobs", [b"x"])
        assert a.seq.held() == [0]
        assert a.seq._renewer is not None
        a.seq._renewer.cancel()  # a hangs as far as the role goes, but still answers
        await cb.produce("jobs", [b"y"])  # forwarded to a while the role is live
        assert b.seq.held() == []
        await asyncio.sleep(3.3)
        await cb.produce("jobs", [b"z"])
        assert b.seq.held() == [0], "b claimed the lapsed role"
        # Both believe they hold it now: contention, nothing else.
        await asyncio.gather(ca.produce("jobs", [b"from a"]), cb.produce("jobs", [b"from b"]))
        got = await ca.lease("jobs", 10)
        assert sorted(i.bytes for i in got) == [b"from a", b"from b", b"x", b"y", b"z"]


async def test_a_clean_shutdown_gives_the_role_up(start_node: Start, shared: Store) -> None:
    a, b = await start_node(), await start_node()
    async with Client(a.url) as ca:
        await ca.create_queue("jobs")
        await ca.produce("jobs", [b"x"])
    assert a.seq.held() == [0]
    await a.stop()
    with pytest.raises(ObjectNotFound):
        await shared.get(role_key("default", 0))
    async with Client(b.url) as cb:
        began = time.monotonic()
        await cb.produce("jobs", [b"y"])
        assert time.monotonic() - began < 1
    assert b.seq.held() == [0]


async def test_idle_long_polls_cost_the_store_almost_nothing(start_node: Start) -> None:
    a, b = await start_node(), await start_node()
    async with Client(a.url) as ca, Client(b.url) as cb:
        await ca.create_queue("jobs")
        await ca.produce("jobs", [b"x"])
        await cb.complete("jobs", [i.token for i in await cb.lease("jobs", 1)])
        assert a.seq.held() == [0]
        polls = [asyncio.ensure_future(c.lease("jobs", 1, request_timeout=20))
                 for c in (ca, ca, cb, cb)]
        await asyncio.sleep(0.3)
        before = a.store.total + b.store.total
        await asyncio.sleep(3)
        idle = a.store.total + b.store.total - before
        assert idle <= 1, f"{idle} store requests in 3 s of idle long polls"
        began = time.monotonic()
        await cb.produce("jobs", [b"wake"])  # through the other node
        done, _ = await asyncio.wait(polls, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        woke = time.monotonic() - began
        assert done and woke < 0.5, f"a waiting lease woke after {woke:.3f} s"
        for p in polls:
            p.cancel()
        await asyncio.gather(*polls, return_exceptions=True)


async def test_purge_through_another_node_empties_the_holders_view(start_node: Start) -> None:
    a, b = await start_node(), await start_node()
    async with Client(a.url) as ca, Client(b.url) as cb:
        await ca.create_queue("jobs")
        await ca.produce("jobs", [b"x", b"y"])
        await cb.purge("jobs")
        assert await ca.lease("jobs", 10) == []
        info = await cb.update_queue("jobs", lease_timeout=12)
        assert info.lease_timeout == 12
        await cb.delete_queue("jobs")
        with pytest.raises(QueueNotFound):
            await ca.produce("jobs", [b"z"])


async def test_queues_spread_over_shards(start_node: Start) -> None:
    a, b = await start_node(sequencer_shards=4), await start_node(sequencer_shards=4)
    names = [f"q{n}" for n in range(12)]
    assert {shard_of(n, 4) for n in names} == {0, 1, 2, 3}
    async with Client(a.url) as ca, Client(b.url) as cb:
        for name in names:
            await ca.create_queue(name)
            await (ca if shard_of(name, 4) % 2 else cb).produce(name, [b"x"])
    assert a.seq.held() == [1, 3] and b.seq.held() == [0, 2]


async def test_forwards_must_be_signed_by_the_fleet(start_node: Start) -> None:
    a = await start_node()
    body = msgpack.packb({"op": "purge", "q": "jobs", "a": {}})
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {SIGNATURE_HEADER: sign(b"another-fleet-key-000000", body)}):
            async with http.post(a.url + FORWARD_PATH, data=body, headers=headers) as resp:
                assert resp.status == 401, await resp.text()
    assert isinstance(a.app[PIPELINE].admit.inner.inner, Route)  # the node runs in sequencer mode


def test_signatures_accept_any_fleet_key_and_refuse_old_ones() -> None:
    body = b"payload"
    header = sign(b"old-key-0123456789", body, now=1000.0)
    verify([b"new-key-0123456789", b"old-key-0123456789"], body, header, now=1001.0)
    with pytest.raises(Unauthorized, match="too old"):
        verify([b"old-key-0123456789"], body, header, now=1000.0 + 3600)
    with pytest.raises(Unauthorized, match="bad fleet signature"):
        verify([b"old-key-0123456789"], b"other", header, now=1001.0)


async def test_a_refused_forward_is_written_directly(start_node: Start) -> None:
    a = await start_node()
    b = await start_node(signing_keys="a-fleet-key-that-a-does-not-know")
    async with Client(a.url) as ca, Client(b.url) as cb:
        await ca.create_queue("jobs")
        await ca.produce("jobs", [b"x"])  # a holds the role
        await cb.produce("jobs", [b"y"])  # a refuses b's signature: b writes itself
        assert b.seq.forwards.get("refused") == 1 and b.seq.forwards.get("direct") == 1
        # b's lease is refused by a as well and walks the store itself: it sees both
        # (a, trusting its cache, would see b's write within trusted_max_age).
        assert sorted(i.bytes for i in await cb.lease("jobs", 5)) == [b"x", b"y"]


async def test_another_forward_version_is_refused_before_running(start_node: Start) -> None:
    a = await start_node()
    body = msgpack.packb({"v": 99, "op": "purge", "q": "jobs", "a": {}})
    async with aiohttp.ClientSession() as http:
        headers = {SIGNATURE_HEADER: sign(KEY.encode(), body)}
        async with http.post(a.url + FORWARD_PATH, data=body, headers=headers) as resp:
            assert resp.status == 409, await resp.text()


def test_a_sequencer_lingers_longer_unless_told() -> None:
    assert Settings().engine_options().linger == 0.005
    assert Settings(sequencer=True).engine_options().linger == 0.01
    assert Settings(sequencer=True, linger=0.002).engine_options().linger == 0.002


# -- forwards between tenants and replays (issue: safe between tenants) -----------------


class Recorder:
    """Keeps what a node sends to other nodes' forward endpoint, as an observer of
    the fleet's network would see it: the body and its headers."""

    def __init__(self, node: InProcNode) -> None:
        self.sent: list[tuple[str, bytes, dict[str, str]]] = []
        session = node.seq._session
        assert session is not None
        real = session.post

        def post(url: str, *, data: bytes, headers: dict[str, str], **kw: Any) -> Any:
            self.sent.append((url, data, dict(headers)))
            return real(url, data=data, headers=headers, **kw)

        session.post = post  # type: ignore[method-assign]


async def test_a_forward_reaching_another_namespaces_node_is_refused(start_node: Start) -> None:
    """The holder of namespace x dies, and a node of namespace y comes up on its
    address (a reused pod IP) with the same fleet key: x's produce must not land in
    y's queue of the same name; x's node claims the role and writes itself."""
    x1 = await start_node(namespace="x")
    x2 = await start_node(namespace="x")
    async with Client(x1.url) as c1, Client(x2.url) as c2:
        await c1.create_queue("jobs")
        await c1.produce("jobs", [b"first"])  # x1 holds x's role
        await c2.produce("jobs", [b"second"])  # forwarded to x1
        assert x1.seq.held() == [0]
        port = int(x1.url.rsplit(":", 1)[1])
        await x1.crash()
        y = await start_node(namespace="y", port=port)
        assert y.url == x1.url
        async with Client(y.url) as cy:
            await cy.create_queue("jobs")
            await c2.produce("jobs", [b"third"])
            assert (await cy.stats("jobs")).available == 0, "x's item landed in y's queue"
        assert x2.seq.held() == [0], "x2 found x1 gone from its address and took the role"
        assert sorted(i.bytes for i in await c2.lease("jobs", 10)) == [
            b"first", b"second", b"third"]


async def test_a_captured_forward_cannot_be_replayed(start_node: Start) -> None:
    """Replayed to the node it was meant for, a forward is refused (401); replayed to
    any other node of the fleet, it is misdirected (421): nothing runs twice."""
    a, b, c = await start_node(), await start_node(), await start_node()
    async with Client(a.url) as ca, Client(b.url) as cb:
        await ca.create_queue("jobs")
        await ca.produce("jobs", [b"x"])  # a holds the role
        seen = Recorder(b)
        await cb.produce("jobs", [b"y"])
        await cb.purge("jobs")
        await ca.produce("jobs", [b"after the purge"])
        leased = await cb.lease("jobs", 1, lease_timeout=30)
        assert [i.bytes for i in leased] == [b"after the purge"]
        await cb.complete("jobs", [leased[0].token])
        await ca.produce("jobs", [b"still here"])
        forwards = [(u, d, h) for u, d, h in seen.sent if u.endswith(FORWARD_PATH)]
        assert len(forwards) == 4  # produce, purge, lease, complete
        async with aiohttp.ClientSession() as http:
            for url, data, headers in forwards:
                async with http.post(url, data=data, headers=headers) as resp:
                    assert resp.status == 401, await resp.text()
                async with http.post(c.url + FORWARD_PATH, data=data, headers=headers) as resp:
                    assert resp.status == 421, await resp.text()
        st = await ca.stats("jobs")
        assert (st.available, st.in_flight, st.completed) == (1, 0, 1)
        assert [i.bytes for i in await ca.lease("jobs", 10)] == [b"still here"]


def test_the_replay_guard_accepts_each_number_once_in_any_order() -> None:
    guard = ReplayGuard(window=8)
    for seq in (1, 3, 2, 10, 5):
        guard.check("n1", seq, now=0.0)
    guard.check("n2", 1, now=0.0)  # another sender numbers its own
    for seq in (1, 3, 10, 2, 0, -1):  # seen, or too far behind the highest (10)
        with pytest.raises(Unauthorized, match="replayed"):
            guard.check("n1", seq, now=1.0)
    guard.check("n1", 4, now=1.0)  # unseen and within the window: late, not replayed


def test_signatures_refuse_nan_times_and_foreign_characters() -> None:
    key, body = b"fleet-key-0123456789", b"payload"
    for ts in ("nan", "inf", "-inf", "NaN"):
        mac = hmac.new(key, ts.encode() + b"\n" + body, hashlib.sha256).hexdigest()
        with pytest.raises(Unauthorized, match="too old"):
            verify([key], body, f"{ts}.{mac}")
    with pytest.raises(Unauthorized, match="bad fleet signature"):
        verify([key], body, sign(key, body)[:-1] + "é")


async def test_a_non_ascii_fleet_signature_is_a_401(start_node: Start) -> None:
    a = await start_node()
    body = msgpack.packb({"v": FORWARD_VERSION, "op": "purge", "q": "jobs", "a": {}})
    host, port = a.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST " + FORWARD_PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                 + f"{SIGNATURE_HEADER}: {time.time():.3f}.".encode() + b"\xc3\xa9\xff\r\n"
                 + b"Content-Length: " + str(len(body)).encode() + b"\r\n"
                 + b"Connection: close\r\n\r\n" + body)
    status = (await reader.readline()).split()[1]
    writer.close()
    assert status == b"401"


# -- holders that are gone, cut off or hung --------------------------------------------


async def test_a_node_restarted_on_the_holders_address_takes_the_role_at_once(
        start_node: Start) -> None:
    """The holder dies and comes back on the same address with a new id: neither it
    nor the others forward to 'it' until the role lapses; the role moves at once."""
    a, b = await start_node(), await start_node()
    async with Client(a.url) as ca, Client(b.url) as cb:
        await ca.create_queue("jobs")
        await ca.produce("jobs", [b"x"])
        await cb.produce("jobs", [b"y"])  # b knows a as the holder
        port = int(a.url.rsplit(":", 1)[1])
        await a.crash()
        again = await start_node(port=port)
        async with Client(again.url) as cagain:
            began = time.monotonic()
            await cagain.produce("jobs", [b"z"])
            assert again.seq.held() == [0], "it claimed its old self's role"
            assert again.seq.forwards.get("ok", 0) == 0, "it never forwarded to itself"
            await cb.produce("jobs", [b"w"])
            assert time.monotonic() - began < 3
        assert b.seq.held() == []
        assert sorted(i.bytes for i in await cb.lease("jobs", 10)) == [b"w", b"x", b"y", b"z"]


async def test_a_holder_cut_off_from_the_store_is_replaced_within_the_ttl(
        start_node: Start, shared: Store) -> None:
    """The holder's store calls fail at once (revoked credentials, a refused route)
    while the others reach the store: it stops vouching for its role when it can
    no longer renew it, and another node holds the role within ``role_ttl``."""
    cut = FaultyStore(shared)
    a = await start_node(store=cut, role_ttl=3)
    b = await start_node(role_ttl=3)
    async with Client(a.url) as ca, Client(b.url) as cb:
        await ca.create_queue("jobs")
        await ca.produce("jobs", [b"x"])
        await cb.produce("jobs", [b"y"])
        await a.seq._renew(0, a.seq._shards[0])  # b never reads this version: a vouches
        await cb.produce("jobs", [b"y2"])
        cut.inject("*", "error", times=-1)
        began = time.monotonic()
        failures = 0
        while time.monotonic() - began < 8:
            try:
                await cb.produce("jobs", [b"z"])
                break
            except StorageError:
                failures += 1
                await asyncio.sleep(0.2)
        took = time.monotonic() - began
        assert b.seq.held() == [0], f"b never took the role ({failures} failed produces)"
        assert took < 3 + 2, f"writes resumed after {took:.1f} s"
        assert a.seq.held() == [], "a stepped down"
        assert sorted(i.bytes for i in await cb.lease("jobs", 10)) == [b"x", b"y", b"y2", b"z"]


async def test_forwarded_leases_keep_the_first_lease_time(start_node: Start) -> None:
    a, b = await start_node(), await start_node()
    async with Client(a.url) as ca:
        await ca.create_queue("jobs")
        await ca.produce("jobs", [b"x"])  # a holds the role
    service = b.app[SERVICE]
    (first,) = await service.lease("jobs", 1, lease_timeout=0.5)
    assert first.first_leased_ms is not None
    await asyncio.sleep(0.7)
    (again,) = await service.lease("jobs", 1, lease_timeout=30)
    assert again.attempts == 2 and again.first_leased_ms == first.first_leased_ms
    assert b.seq.forwards["ok"] >= 2


def test_only_a_refused_port_proves_a_holder_gone() -> None:
    key = ConnectionKey("10.0.0.1", 7878, False, True, None, None, None)
    refused = aiohttp.ClientConnectorError(key, OSError(errno.ECONNREFUSED, "refused"))
    assert port_refused(refused)
    for exc in (aiohttp.ClientConnectorError(key, OSError(errno.EHOSTUNREACH, "no route")),
                aiohttp.ClientConnectorError(key, OSError(errno.ENETUNREACH, "no net")),
                aiohttp.ClientConnectorDNSError(key, OSError(-2, "Name does not resolve")),
                aiohttp.ClientConnectorSSLError(key, OSError(errno.ECONNREFUSED, "tls")),
                aiohttp.ConnectionTimeoutError("connect timed out")):
        assert not port_refused(exc), exc


async def test_a_holder_behind_a_tls_error_keeps_its_role(start_node: Start) -> None:
    """A forward that fails on TLS (here: https to a plain-HTTP port) proves nothing
    of the holder: the sender writes directly and claims nothing."""
    a, b = await start_node(), await start_node()
    async with Client(a.url) as ca, Client(b.url) as cb:
        await ca.create_queue("jobs")
        await ca.produce("jobs", [b"x"])
        record = a.seq._shards[0].record
        assert record is not None
        a.seq._shards[0].record = dataclasses.replace(record, url=a.url.replace("http", "https"))
        await a.seq._renew(0, a.seq._shards[0])
        await cb.produce("jobs", [b"y"])
        assert b.seq.forwards.get("direct") == 1 and b.seq.held() == [] and a.seq.held() == [0]


async def test_a_holder_found_hung_is_not_revived_by_a_renewal_from_before(
        start_node: Start) -> None:
    """A node that trusted the holder's answers never read its last renewals: when it
    finds the holder hung, the role object it then reads is newer than the one it
    knew, yet says nothing of the holder being alive since. It claims the role."""
    a, b = await start_node(), await start_node()
    async with Client(a.url) as ca, Client(b.url) as cb:
        await ca.create_queue("jobs")
        await ca.produce("jobs", [b"x"])
        await cb.produce("jobs", [b"y"])  # b learns a's role, then trusts its answers
        await a.seq._renew(0, a.seq._shards[0])  # a renews; b does not read it
        record = b.seq._shards[0].record
        assert record is not None and record.holder == a.seq.id
        b.seq.holder_unreachable("jobs", record, "answers no ping (test)")
        assert await b.seq.route("jobs") is None, "b forwarded to the hung holder again"
        assert b.seq.held() == [0]
