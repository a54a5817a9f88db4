"""How the nodes of a sequencer-mode fleet talk to each other: the internal paths,
the forward message's version, the fleet signature over it, the receiver's guard
against replays, and what a failed forward says about the holder it was meant for
(docs/DESIGN.md, "Sequencer mode"; docs/SECURITY.md, "Internal endpoints").

A forward is ``POST FORWARD_PATH``, msgpack ``{v, ns, to, seq, op, rid, from, url}``
(``op``: the operation's wire form, ``okq.ops.to_wire``; ``rid``: the request's id),
signed with HMAC-SHA256 of ``timestamp \n body`` under the fleet's first signing key
(``SIGNATURE_HEADER: ts.mac``); the receiver verifies it with any of the keys, within
``SIGNATURE_WINDOW`` of its clock, refuses one meant for another node or namespace
(``MISDIRECTED``) and one whose ``(from, seq)`` it has accepted before (401).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import math
import time

import aiohttp

from okq.errors import Unauthorized

FORWARD_PATH = "/internal/v1/forward"
PING_PATH = "/internal/v1/ping"
#: The forward message's format; a node answers another version with a refusal
#: that makes the sender write directly (mixed versions during an upgrade). Version 2
#: names the namespace, the node it is meant for and a per-sender sequence number;
#: version 3 carries the operation whole (its own versioned wire form) and a request id;
#: version 4 brings a produce's result back with how many of its items were duplicates;
#: version 5 a leased item with its sequence number (ordered delivery);
#: version 6 a retry's result with how many of its items were dead-lettered;
#: version 7 a produce's result with each item's sequence number.
FORWARD_VERSION = 7
SIGNATURE_HEADER = "X-Okq-Fleet-Signature"
#: A signed forward older or newer than this (seconds, by the receiver's clock) is refused:
#: twice the clock bound (two nodes' clocks may be 120 s apart, docs/DESIGN.md "Clocks")
#: and a margin, so that nodes at the bound still forward to each other (the fault
#: campaign saw them refused at exactly 120 s and write directly).
SIGNATURE_WINDOW = 150.0
#: Answers of a node that refused a forward before running it: another fleet key
#: or a replay (401), no sequencer mode there (404), another forward version (409).
REFUSALS = (401, 404, 409)
#: The answer of a node that is not the one the forward was meant for (another
#: namespace's node, or a node restarted on the holder's address): the holder the
#: sender knows is gone from that address.
MISDIRECTED = 421
#: Out-of-order forwards from one sender accepted behind the highest seen (a
#: sequence number further behind, or seen already, is refused as a replay).
REPLAY_WINDOW = 4096


class Unreachable(Exception):
    """No connection to the holder: nothing was sent. ``refused`` when its port
    refused it or another node answers there (the holder's process is gone), not
    when connecting timed out or failed otherwise (a partition, a name that does not
    resolve, a TLS error, a busy host: it may be alive)."""

    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused


class Misdirected(Exception):
    """A forward meant for another node or namespace than the one it reached."""


def port_refused(exc: aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError) -> bool:
    """Whether a failed connection proves nothing listens there: the port refused it
    (ECONNREFUSED). A name that does not resolve, an unreachable host or network, a
    TLS failure or a timeout prove nothing of the process behind the address."""
    if not isinstance(exc, aiohttp.ClientConnectorError) or isinstance(
            exc, aiohttp.ClientConnectorDNSError | aiohttp.ClientSSLError):
        return False
    return exc.os_error.errno == errno.ECONNREFUSED


# -- signing ----------------------------------------------------------------------


def sign(key: bytes, body: bytes, now: float | None = None) -> str:
    ts = f"{now if now is not None else time.time():.3f}"
    mac = hmac.new(key, ts.encode() + b"\n" + body, hashlib.sha256).hexdigest()
    return f"{ts}.{mac}"


def verify(keys: list[bytes], body: bytes, header: str, now: float | None = None) -> None:
    """Unauthorized unless ``header`` signs ``body`` with one of ``keys``, lately."""
    if not header.isascii():
        raise Unauthorized("bad fleet signature")
    ts, _, mac = header.rpartition(".")
    try:
        when = float(ts)
    except ValueError:
        raise Unauthorized("fleet signature required") from None
    age = (now if now is not None else time.time()) - when
    if not (math.isfinite(when) and abs(age) <= SIGNATURE_WINDOW):
        raise Unauthorized("fleet signature too old or from the future")
    msg = ts.encode() + b"\n" + body
    if not any(hmac.compare_digest(mac, hmac.new(k, msg, hashlib.sha256).hexdigest())
               for k in keys):
        raise Unauthorized("bad fleet signature")


class ReplayGuard:
    """Refuses a forward seen before: each sender numbers its forwards (its id is new
    at every start), and the receiver keeps, per sender, the highest number seen and
    a window of the ones just below it (as IPsec does). A signed forward is accepted
    at most ``SIGNATURE_WINDOW`` from its signing by the receiver's clock, so a sender
    is forgotten twice that long after it was last heard from: any forward of its
    that could still be replayed is refused by its signature's age by then."""

    def __init__(self, window: int = REPLAY_WINDOW) -> None:
        self.window = window
        self._senders: dict[str, tuple[int, int, float]] = {}  # id -> (top, seen bits, heard)
        self._pruned = time.monotonic()

    def check(self, sender: str, seq: int, now: float | None = None) -> None:
        """Unauthorized when ``sender``'s forward number ``seq`` came before."""
        now = time.monotonic() if now is None else now
        if now - self._pruned > 10:
            self._forget(now)
        top, bits, _ = self._senders.get(sender, (-1, 0, now))
        if seq > top:
            shift = seq - top
            bits = ((bits << shift) | 1) & ((1 << self.window) - 1) if shift < self.window else 1
            top = seq
        else:
            behind = top - seq
            if seq < 0 or behind >= self.window or bits >> behind & 1:
                raise Unauthorized("replayed fleet forward")
            bits |= 1 << behind
        self._senders[sender] = (top, bits, now)

    def _forget(self, now: float) -> None:
        self._pruned = now
        for sender, (_, _, heard) in list(self._senders.items()):
            if now - heard > 2 * SIGNATURE_WINDOW + 10:
                del self._senders[sender]
