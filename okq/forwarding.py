"""The sender's side of a forward (sequencer mode): one operation carried whole to
the node that holds its queue's role, and its typed result or error brought back.

The message (``okq.fleetwire``): msgpack ``{v, ns, to, seq, op, rid, from, url}``
where ``op`` is the operation's wire form (``okq.ops.to_wire``) and ``rid`` the
request's id, signed with the fleet's first key. The reply carries the result
in the operation's result wire form (``ok``) or the okq error (``err``: code,
message, details; raised here as the same class), and what the holder vouches
for its role (``held``, ``for``, ``nonce``).

A forward that has waited ``PROBE_AFTER``, or any forward to a holder that
answered nothing for that long, makes the sender ping the holder; a holder
that does not answer within ``PROBE_TIMEOUT`` is hung: its role is
claimed and the caller gets ``OutcomeUnknown`` (docs/DESIGN.md, "Sequencer mode").
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, TypeVar

import aiohttp
import msgpack

from okq import ops
from okq.errors import BY_CODE, OkqError, OutcomeUnknown
from okq.fleetwire import (
    FORWARD_PATH,
    FORWARD_VERSION,
    MISDIRECTED,
    PING_PATH,
    REFUSALS,
    SIGNATURE_HEADER,
    Unreachable,
    port_refused,
    sign,
)
from okq.sequencer import RoleRecord, Sequencer

R = TypeVar("R")

#: A forward that has waited this long makes the sender ask the holder whether it
#: still answers at all (``PING_PATH``, no store work), and again this often after;
#: a forward to a holder that has not answered anything for this long asks at once.
PROBE_AFTER = 0.5
#: A holder that does not answer a ping in this long is hung (SIGSTOP, a frozen VM,
#: a half-open connection): its role is claimed as a dead holder's would be.
PROBE_TIMEOUT = 1.5
#: Seconds to connect to a holder before writing directly instead.
CONNECT_TIMEOUT = 2.0


def raise_error(err: Any) -> None:
    """Raise the okq error a reply's ``err`` describes, as its own class."""
    fields = err if isinstance(err, dict) else {}
    cls = BY_CODE.get(str(fields.get("code")), OkqError)
    raise cls(str(fields.get("message")), **dict(fields.get("details") or {}))


class Forwarder:
    """This node's forwards to the holders of the roles its ``Sequencer`` knows."""

    def __init__(self, seq: Sequencer) -> None:
        self.seq = seq
        self._probes: dict[str, tuple[float, asyncio.Future[bool]]] = {}  # url -> last ping
        self._heard: dict[str, float] = {}  # url -> when it last answered a forward or ping

    async def forward(self, holder: RoleRecord, op: ops.Op[R], wire: dict[str, Any],
                      rid: str, timeout: float) -> R:
        """Run ``op`` (``wire``: its wire form) on ``holder``; its result, or the okq
        error it raised.

        Unreachable when nobody or another node answers at the holder's address
        (nothing was run: safe to do it elsewhere); OutcomeUnknown when the request
        was sent and no answer came, or the holder stopped answering pings meanwhile
        (hung: its role is then claimed).
        """
        seq, queue = self.seq, op.queue
        post = asyncio.ensure_future(self._post(holder, op.name, queue, wire, rid, timeout))
        try:
            # A holder heard from lately is pinged only if the forward is slow; one
            # quiet for PROBE_AFTER (this node had no traffic for it, or its
            # forwards wait) at once, alongside: a hang is then found PROBE_TIMEOUT
            # after the first forward that meets it.
            wait = PROBE_AFTER if self._heard_lately(holder.url) else 0.0
            while not (await asyncio.wait({post}, timeout=wait))[0]:
                wait = PROBE_AFTER
                probe = self._probe(holder.url)
                either: set[asyncio.Future[Any]] = {post, probe}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if not post.done() and not probe.result():
                    post.cancel()
                    seq.count("hung")
                    seq.holder_unreachable(queue, holder, f"answers no ping in {PROBE_TIMEOUT} s")
                    raise OutcomeUnknown(
                        f"the sequencer node stopped answering while handling this {op.name}: "
                        "its outcome is unknown; retrying is safe (produce with idempotency "
                        "keys)", queue=queue)
        finally:
            if not post.done():
                post.cancel()
        reply = post.result()
        self._heard[holder.url] = time.monotonic()
        if reply.get("held"):
            seq.vouched_for(queue, holder, float(reply.get("for", 0.0)), str(reply.get("nonce")))
        else:
            seq.stale_view(queue)
        if "err" in reply:
            seq.count("error")
            raise_error(reply["err"])
        seq.count("ok")
        return op.unpack_result(reply.get("ok"))

    async def _post(self, holder: RoleRecord, name: str, queue: str, wire: dict[str, Any],
                    rid: str, timeout: float) -> dict[str, Any]:
        seq = self.seq
        session = seq.session
        seq.sent += 1
        body = msgpack.packb({"v": FORWARD_VERSION, "ns": seq.ns, "to": holder.holder,
                              "seq": seq.sent, "op": wire, "rid": rid, "from": seq.id,
                              "url": seq.url})
        headers = {SIGNATURE_HEADER: sign(seq.keys[0], body),
                   "Content-Type": "application/msgpack"}
        limits = aiohttp.ClientTimeout(total=timeout, sock_connect=CONNECT_TIMEOUT)
        try:
            async with session.post(holder.url + FORWARD_PATH, data=body,
                                    headers=headers, timeout=limits) as resp:
                if resp.status in REFUSALS or resp.status == MISDIRECTED:
                    seq.count("refused")  # refused before running: nothing was done
                    raise Unreachable(f"{holder.url} refused the forward: HTTP {resp.status} "
                                      f"{resp.reason}", refused=resp.status == MISDIRECTED)
                reply = msgpack.unpackb(await resp.read())
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            seq.count("unreachable")
            raise Unreachable(str(exc), refused=port_refused(exc)) from exc
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            seq.count("unknown")
            raise OutcomeUnknown(
                f"the sequencer node went away while handling this {name}: its outcome is "
                "unknown; retrying is safe (produce with idempotency keys)", queue=queue,
            ) from exc
        if not isinstance(reply, dict):
            raise OutcomeUnknown(f"the sequencer node answered this {name} with no reply",
                                 queue=queue)
        return reply

    def _heard_lately(self, url: str) -> bool:
        """Whether the node at ``url`` answered a forward or a ping within PROBE_AFTER."""
        return time.monotonic() - self._heard.get(url, -PROBE_AFTER) < PROBE_AFTER

    def _probe(self, url: str) -> asyncio.Future[bool]:
        """Whether the node at ``url`` answers a ping: one ping at a time per node,
        shared by every forward waiting on it, and at most one per PROBE_AFTER."""
        last = self._probes.get(url)
        if last is None or (last[1].done() and time.monotonic() - last[0] >= PROBE_AFTER):
            last = (time.monotonic(), asyncio.ensure_future(self._ping(url)))
            self._probes[url] = last
        return last[1]

    async def _ping(self, url: str) -> bool:
        try:
            async with self.seq.session.get(url + PING_PATH,
                                            timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT)):
                self._heard[url] = time.monotonic()
                return True  # any answer: its event loop runs
        except TimeoutError:
            return False
        except aiohttp.ClientError:
            return True  # gone or refusing: the forward itself finds that out
