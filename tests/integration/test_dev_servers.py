"""The development servers' own start-up (okq/dev/servers.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from okq.dev import servers
from okq.dev.servers import HOST, SeaweedServer, ServerMissing, weed_binary


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port another process holds (listening) for the test's length."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_seaweedfs_starts_on_fresh_ports_when_one_was_taken_meanwhile(
        taken_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ports are free when chosen and may be taken before weed binds them (another
    test's server, on a busy machine): the start is tried again on fresh ones."""
    try:
        weed_binary()
    except ServerMissing as exc:
        pytest.skip(str(exc))
    real = servers.free_port_pairs
    chosen: list[list[int]] = []

    def first_one_taken(count: int) -> list[int]:
        ports = real(count)
        if not chosen:
            ports[0] = taken_port  # the master's port, bound by someone else
        chosen.append(ports)
        return ports

    monkeypatch.setattr(servers, "free_port_pairs", first_one_taken)
    weed = SeaweedServer("okq", 60).start()
    try:
        assert len(chosen) == 2, chosen
        assert weed.ports["master"] != taken_port
    finally:
        weed.stop()
