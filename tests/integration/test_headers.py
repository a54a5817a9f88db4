"""Item headers through a real node (in process, on loopback, file store): produced
by the Python client and the CLI, leased, kept through a retry, a dead letter, a
redrive and an export and import; refused with a 400 naming the field; and a
produce's ``delay`` counted by the node's clock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from click.testing import CliRunner

from okq.cli import main
from okq.client import Client
from okq.errors import InvalidRequest
from okq.server.app import create_app
from okq.settings import Settings
from okq.store import FileStore

HEADERS = {"trace-id": "t-1", "Content.Type": "application/json", "tenant": "äçmé"}


@pytest.fixture
async def url(tmp_path: Path) -> AsyncIterator[str]:
    settings = Settings(store=f"file://{tmp_path}", signing_keys="headers-test-key-0123456789",
                        self_check=False, linger=0.002)
    runner = web.AppRunner(create_app(settings, FileStore(tmp_path)), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def okq(url: str, *args: str, stdin: str | None = None, code: int = 0) -> Any:
    """``okq -o json ARGS`` against the node, run in a thread (the node serves on
    this loop); its JSON output (or, when it must fail with ``code``, its output)."""
    result = await asyncio.to_thread(CliRunner().invoke, main,
                                     ["--url", url, "-o", "json", *args], input=stdin)
    assert result.exit_code == code, result.output
    return json.loads(result.output) if code == 0 else result.output


async def test_headers_kept_through_retry_dead_letter_redrive_export_import(
        url: str, tmp_path: Path) -> None:
    async with Client(url) as c:
        await c.create_queue("dlq")
        await c.create_queue("jobs", dead_queue="dlq", lease_timeout=600)
        await c.create_queue("copy")
        [first] = await c.produce("jobs", [{"payload": b"\xffjob", "headers": HEADERS,
                                            "key": "job-1"}])
        [leased] = await c.lease("jobs")
        assert (leased.id, leased.headers, leased.meta) == (first, HEADERS, None)

        await c.retry("jobs", leased.token, error="try again")
        [again] = await c.lease("jobs")
        assert (again.id, again.attempts, again.headers) == (first, 2, HEADERS)

        await c.retry("jobs", again.token, dead=True, error="poison")
        [dead] = (await c.list_items("dlq")).items
        assert dead.headers == HEADERS and dead.meta is not None
        assert dead.meta["source_queue"] == "jobs" and "headers" not in dead.meta

        assert await c.redrive("dlq") == 1
        [back] = await c.lease("jobs")
        assert back.headers == HEADERS and back.bytes == b"\xffjob"
        assert back.meta is not None and back.meta["redriven_from"] == "dlq"
        await c.retry("jobs", back.token, count_attempt=False)

        exported = tmp_path / "jobs.jsonl"
        assert (await okq(url, "export", "jobs", str(exported)))["exported"] == 1
        assert json.loads(exported.read_text())["headers"] == HEADERS
        assert (await okq(url, "import", "copy", str(exported)))["imported"] == 1
        [copied] = await okq(url, "lease", "copy")
        assert copied["headers"] == HEADERS and copied["utf8"] is None


async def test_cli_produce_with_headers(url: str) -> None:
    async with Client(url) as c:
        await c.create_queue("cli")
    got = await okq(url, "produce", "cli", "one", "two", "--header", "a=1",
                    "--header", "b=x=y")
    assert len(got["ids"]) == 2
    items = await okq(url, "items", "cli")
    assert [(i["utf8"], i["headers"]) for i in items] == [
        ("one", {"a": "1", "b": "x=y"}), ("two", {"a": "1", "b": "x=y"})]
    bad = await okq(url, "produce", "cli", "x", "--header", "AWS.x=1", code=2)
    assert "'AWS.x' is not a header name" in bad

    lines = ['{"utf8": "own", "headers": {"b": "mine", "c": "3"}}', '"plain"']
    await okq(url, "produce", "cli", "--jsonl", "--header", "a=1", "--header", "b=2",
              stdin="\n".join(lines))
    items = await okq(url, "items", "cli")
    assert [i["headers"] for i in items[2:]] == [{"a": "1", "b": "mine", "c": "3"},
                                                 {"a": "1", "b": "2"}]
    many = json.dumps({"utf8": "x", "headers": {f"h{n}": "v" for n in range(9)}})
    bad = await okq(url, "produce", "cli", "--jsonl", "--header", "a=1", "--header", "b=2",
                    stdin=f'"fine"\n{many}\n', code=1)
    assert "line 2: headers: holds 11 headers; the limit is 10" in bad
    assert len(await okq(url, "items", "cli")) == 4  # nothing of the refused input


async def test_bad_headers_over_http_and_delay(url: str) -> None:
    async with Client(url) as c:
        await c.create_queue("q")
        with pytest.raises(InvalidRequest) as err:
            await c.produce("q", [b"fine", {"payload": "x", "headers": {"n": 1}}])
        assert err.value.details["field"] == "items[1].headers"
        with pytest.raises(InvalidRequest) as err:
            await c.produce("q", [{"payload": "x",
                                   "headers": {f"h{n}": "v" for n in range(11)}}])
        assert err.value.details["field"] == "items[0].headers"
        assert (await c.stats("q")).available == 0  # nothing of either produce

        await c.produce("q", [{"payload": "later", "delay": 3600}, {"payload": "now"}])
        page = (await c.list_items("q")).items
        assert sorted(i.state for i in page) == ["available", "scheduled"]
        later = next(i for i in page if i.state == "scheduled")
        assert later.ready_at is not None
        assert 3590 < (later.ready_at - later.produced_at).total_seconds() < 3610
