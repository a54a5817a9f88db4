"""The item commands: produce, lease, renew, complete, retry, items (browse) and
work (shell workers)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING

import click

from okq.commands.context import BATCH, Ctx, batches, emit, err, out, progress, run, when
from okq.commands.tables import items_table, show_payload

if TYPE_CHECKING:
    from okq import wire as s
    from okq.client import Client


def parse_headers(ctx: click.Context, param: click.Parameter,
                  value: tuple[str, ...]) -> dict[str, str] | None:
    """``--header K=V`` options as headers (None: none given), checked as the node would."""
    from okq.headers import check_headers

    headers = {}
    for given in value:
        name, eq, text = given.partition("=")
        if not eq:
            raise click.BadParameter(f"{given!r} is not NAME=VALUE", ctx, param)
        headers[name] = text
    try:
        return check_headers(headers) or None
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _merged(headers: dict[str, str], item: s.ProduceItem, lineno: int) -> dict[str, str]:
    """A JSON line's headers over ``--header``'s, checked (a ValueError names the line)."""
    from okq.headers import check_headers

    try:
        return check_headers({**headers, **(item.headers or {})})
    except ValueError as exc:
        raise ValueError(f"line {lineno}: headers: {exc}") from None


def read_items(payloads: tuple[str, ...], file: str | None, jsonl: bool,
               key: str | None, enqueue_at: datetime | None,
               headers: dict[str, str] | None = None,
               group: str | None = None) -> Iterator[s.ProduceItem]:
    """Items from arguments, or one per line of a file or stdin ('-'); ``headers`` on
    each (a JSON line's own headers win over them), and ``group`` on each (unless a
    JSON line names its own)."""
    from okq import wire as s

    if payloads:
        for n, p in enumerate(payloads):
            yield s.ProduceItem(utf8=p, enqueue_at=enqueue_at, headers=headers, group=group,
                                key=f"{key}:{n}" if key and len(payloads) > 1 else key)
        return
    stream = sys.stdin if file in (None, "-") else open(file, encoding="utf-8")
    with stream:
        for lineno, line in enumerate(stream, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if jsonl:
                item = parse_jsonl_item(line, lineno)
                if item.enqueue_at is None and enqueue_at is not None:
                    item.enqueue_at = enqueue_at
                if headers:
                    item = item.model_copy(update={"headers": _merged(headers, item, lineno)})
                if group is not None and item.group is None:
                    item.group = group
                yield item
            else:
                yield s.ProduceItem(utf8=line, enqueue_at=enqueue_at, headers=headers,
                                    group=group, key=f"{key}:{lineno}" if key else None)


def parse_jsonl_item(line: str, lineno: int) -> s.ProduceItem:
    from pydantic import ValidationError

    from okq import wire as s

    try:
        raw = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"line {lineno}: not JSON: {exc}") from None
    if isinstance(raw, str):
        return s.ProduceItem(utf8=raw)
    if not isinstance(raw, dict):
        raise ValueError(f"line {lineno}: expected an object or a string")
    item = {k: raw[k] for k in ("utf8", "bytes", "enqueue_at", "key", "headers", "group")
            if k in raw}
    if not item.keys() & {"utf8", "bytes"}:
        item["utf8"] = json.dumps(raw)  # a plain JSON record: the record is the payload
    try:
        return s.ProduceItem.model_validate(item)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"line {lineno}: {'.'.join(map(str, first['loc']))}: "
                         f"{first['msg']}") from None


@click.command()
@click.argument("queue")
@click.argument("payloads", nargs=-1)
@click.option("--file", "-f", help="read items from a file, one per line ('-': stdin)")
@click.option("--jsonl", is_flag=True,
              help="lines are JSON: an item {utf8|bytes, enqueue_at, key, headers, group} or "
              "any record")
@click.option("--key", help="idempotency key (with several items: KEY:N)")
@click.option("--at", "at", help="deliver no earlier than this (RFC 3339, or +SECONDS)")
@click.option("--header", "headers", multiple=True, callback=parse_headers,
              metavar="NAME=VALUE", help="a header on every item (repeatable)")
@click.option("--group", help="the message group of every item (an ordered queue hands "
              "out a group's items in order)")
@run
async def produce(ctx: Ctx, c: Client, queue: str, payloads: tuple[str, ...],
                  file: str | None, jsonl: bool, key: str | None, at: str | None,
                  headers: dict[str, str] | None, group: str | None) -> None:
    """Produce items from arguments, a file or stdin."""
    if not payloads and file is None and sys.stdin.isatty():
        raise click.UsageError("give payloads as arguments, --file, or pipe them to stdin")
    enqueue_at = when(at, "--at")
    jsonl = jsonl or bool(file and file.endswith(".jsonl"))
    # Read and check every item first: a bad line fails the command before anything
    # is produced, so fixing the file and running again duplicates nothing.
    if group is not None:
        from okq.wire import check_group

        try:
            check_group(group)
        except ValueError as exc:  # checked as the node would
            raise click.BadParameter(str(exc), param_hint="--group") from None
    all_items = list(read_items(payloads, file, jsonl, key, enqueue_at, headers, group))
    if not all_items:
        raise click.UsageError("nothing to produce: the input holds no items")
    bar = progress(ctx, len(all_items), "producing")
    ids: list[str] = []
    try:
        for batch in batches(iter(all_items), BATCH):
            got = await c.produce(queue, batch)
            ids.extend(got)
            bar.advance(len(batch))
    finally:
        bar.close()
    emit(ctx, {"queue_name": queue, "ids": ids},
         lambda: out.print(f"produced {len(ids)} item{'s' * (len(ids) != 1)} to {queue}"))


@click.command()
@click.argument("queue")
@click.option("-n", "--batch-size", type=int, default=1, show_default=True)
@click.option("--lease-timeout", type=float, help="seconds (default: the queue's)")
@click.option("--wait", type=float, default=0.0, show_default=True,
              help="long poll: seconds to wait for items")
@run
async def lease(ctx: Ctx, c: Client, queue: str, batch_size: int,
                lease_timeout: float | None, wait: float) -> None:
    """Lease items; prints each item's id, attempts, token and payload."""
    items = await c.lease(queue, batch_size, lease_timeout=lease_timeout, request_timeout=wait)

    def text() -> None:
        if not items:
            out.print("no items ready")
            return
        for i in items:
            out.print(f"{i.id}  attempts={i.attempts}  deadline={i.lease_deadline:%H:%M:%S}"
                      f"  {show_payload(i)}", highlight=False)
            out.print(f"  token {i.token}", highlight=False, soft_wrap=True)
            if i.headers:
                out.print("  headers " + " ".join(f"{k}={v}" for k, v in i.headers.items()),
                          highlight=False, soft_wrap=True)

    emit(ctx, items, text)


@click.command()
@click.argument("queue")
@click.argument("token")
@click.option("--lease-timeout", type=float, help="seconds from now (default: the queue's)")
@run
async def renew(ctx: Ctx, c: Client, queue: str, token: str, lease_timeout: float | None) -> None:
    """Extend a lease: it lasts from now for --lease-timeout seconds."""
    deadline = await c.renew(queue, token, lease_timeout)
    emit(ctx, {"queue_name": queue, "lease_deadline": deadline.isoformat()},
         lambda: out.print(f"leased until {deadline:%Y-%m-%d %H:%M:%S}"))


@click.command()
@click.argument("queue")
@click.argument("tokens", nargs=-1, required=True)
@run
async def complete(ctx: Ctx, c: Client, queue: str, tokens: tuple[str, ...]) -> None:
    """Complete leased items."""
    n = await c.complete(queue, list(tokens))
    emit(ctx, {"queue_name": queue, "completed": n}, lambda: out.print(f"completed {n}"))


@click.command()
@click.argument("queue")
@click.argument("token")
@click.option("--at", "at", help="ready again at this time (RFC 3339 or +SECONDS)")
@click.option("--dead", is_flag=True, help="move to the dead-letter queue")
@click.option("--error", help="recorded as the item's last error")
@run
async def retry(ctx: Ctx, c: Client, queue: str, token: str, at: str | None, dead: bool,
                error: str | None) -> None:
    """Release a leased item for a retry (or to the dead-letter queue)."""
    moved = await c.retry(queue, token, retry_at=when(at, "--at"), dead=dead, error=error)
    said = ("moved to the dead-letter queue" if dead else "dead-lettered: out of attempts") \
        if moved else "released"
    emit(ctx, {"queue_name": queue, "retried": 1, "dead_lettered": int(moved)},
         lambda: out.print(said))


async def browse(c: Client, queue: str, limit: int | None) -> list[s.ItemOut]:
    got: list[s.ItemOut] = []
    after: str | None = None
    while limit is None or len(got) < limit:
        size = 1000 if limit is None else min(1000, limit - len(got))
        page = await c.list_items(queue, limit=size, start_after=after)
        got.extend(page.items)
        after = page.next_start_after
        if after is None:
            break
    return got


@click.command()
@click.argument("queue")
@click.option("--limit", "-n", type=int, default=100, show_default=True)
@click.option("--all", "all_", is_flag=True, help="every live item")
@run
async def items(ctx: Ctx, c: Client, queue: str, limit: int, all_: bool) -> None:
    """Browse live items without leasing them."""
    got = await browse(c, queue, None if all_ else limit)
    emit(ctx, got, lambda: out.print(items_table(got) if got else "no live items"))


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("-q", "--queue", required=True, help="lease from this queue")
@click.option("-Q", "--out-queue", help="produce each stdout line to this queue")
@click.option("-c", "--command", "shell", help="a shell command line instead of ARGV")
@click.option("--concurrency", "-j", type=int, default=1, show_default=True)
@click.option("--lease-timeout", type=float, default=None,
              help="seconds each item is leased for, renewed at half of it while its "
              "command runs [default: the queue's]")
@click.option("--backoff", type=float, default=1.0, show_default=True,
              help="first retry delay in seconds; doubles with each attempt")
@click.option("--grace", type=float, default=30.0, show_default=True,
              help="seconds running commands may finish after SIGTERM")
@click.option("--limit", type=click.IntRange(min=1),
              help="stop once this many items are finished: completed or dead-lettered "
              "(a retry does not count: the item comes back)")
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
@run
async def work(ctx: Ctx, c: Client, queue: str, out_queue: str | None, shell: str | None,
               concurrency: int, lease_timeout: float | None, backoff: float, grace: float,
               limit: int | None, argv: tuple[str, ...]) -> None:
    """Run a command for each item: okq work -q IN [-Q OUT] -- COMMAND [ARG...]

    The payload is the command's stdin. Exit 0 completes the item and produces
    each stdout line to OUT in the same step; another exit status retries it with
    a backoff, keeping the end of stderr as its error, until the queue's
    max_attempts dead-letters it. SIGTERM stops leasing and lets running
    commands finish (or releases their items after --grace). With --limit N
    it exits once N items are finished (completed or dead-lettered).
    """
    from okq.shellwork import ShellWorker, WorkOptions

    if bool(shell) == bool(argv):
        raise click.UsageError("give a command after -- or with -c, not both")
    if concurrency < 1:
        raise click.BadParameter("must be at least 1", param_hint="--concurrency")
    worker = ShellWorker(c, WorkOptions(
        queue=queue, out_queue=out_queue, argv=[shell] if shell else list(argv),
        shell=bool(shell), concurrency=concurrency, lease_timeout=lease_timeout,
        backoff_base=backoff, grace=grace, limit=limit))
    worker.install_signals()
    result = await worker.run()
    summary = {"completed": result.completed, "retried": result.retried, "dead": result.dead,
               "released": result.released, "outputs": result.outputs}
    emit(ctx, summary, lambda: err.print(
        "work: " + ", ".join(f"{v} {k}" for k, v in summary.items()), highlight=False))
