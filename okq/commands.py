"""The ``okq`` commands that talk to a node: items, queues, stats, dead letters,
export / import and shell workers.

Every command takes the group's ``--output json`` for scripts, exits non-zero
with a one-line message on errors, and never shows a traceback for a user
mistake (a bad flag, a missing queue, an unreachable node).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import json
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.live import Live
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from okq import wire as s
from okq.client import Client
from okq.errors import OkqError, Unauthorized

T = TypeVar("T")
BATCH = 500


@dataclass
class Ctx:
    url: str
    api_key: str | None
    output: str
    timeout: float

    @property
    def json(self) -> bool:
        return self.output == "json"

    def client(self) -> Client:
        return Client(self.url, timeout=self.timeout, api_key=self.api_key)


# Nothing okq prints is markup: payloads, file names and errors are shown as they are.
# Piped output is not cut to 80 columns: ids and tokens must survive a pipe.
out = Console(markup=False, highlight=False,
              width=None if sys.stdout.isatty() else max(200, Console().width))
err = Console(stderr=True, markup=False, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 1) -> None:
    err.print(Text("error:", style="red"), " ".join(message.split()))
    sys.exit(code)


def run(fn: Callable[..., Awaitable[T]]) -> Callable[..., T | None]:
    """Run an async command body with a client; turn okq's errors into messages."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T | None:
        ctx: Ctx = click.get_current_context().find_object(Ctx)  # type: ignore[assignment]

        async def body() -> T:
            async with ctx.client() as client:
                return await fn(ctx, client, *args, **kwargs)

        try:
            return asyncio.run(body())
        except Unauthorized as exc:
            fail(f"{exc.message}; give it with --api-key or OKQ_API_KEY")
        except OkqError as exc:
            field = exc.details.get("field")
            hint = " (check --url or OKQ_URL)" if exc.details.get("not_okq") else ""
            fail(f"{exc.message}{hint}" + (f" (field: {field})" if field and field not in
                                           exc.message else ""))
        except ValidationError as exc:
            first = exc.errors()[0]
            fail(f"{'.'.join(map(str, first['loc']))}: {first['msg']}")
        except (OSError, ValueError) as exc:
            fail(str(exc))
        return None

    return wrapper


def emit(ctx: Ctx, data: Any, text: Callable[[], None]) -> None:
    if ctx.json:
        click.echo(json.dumps(_plain(data), indent=None))
    else:
        text()


def _plain(data: Any) -> Any:
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")
    if isinstance(data, list):
        return [_plain(d) for d in data]
    if isinstance(data, dict):
        return {k: _plain(v) for k, v in data.items()}
    return data


def when(value: str | None, field: str) -> datetime | None:
    """An RFC 3339 time, or +SECONDS from now."""
    if value is None:
        return None
    try:
        if value.startswith("+"):
            parsed = datetime.now(UTC) + timedelta(seconds=float(value[1:]))
        else:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            parsed = parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except (ValueError, OverflowError):
        raise click.BadParameter(f"{value!r} is not an RFC 3339 time or +SECONDS",
                                 param_hint=field) from None
    if not s.MIN_TIME <= parsed <= s.MAX_TIME:
        raise click.BadParameter(f"{value!r} is outside 1970-01-01 .. 9000-01-01",
                                 param_hint=field)
    return parsed


def show_payload(item: s.LeasedItemOut | s.ItemOut) -> str:
    if item.utf8 is not None:
        return item.utf8 if len(item.utf8) <= 60 else item.utf8[:57] + "..."
    return f"<{len(item.bytes)} bytes>"


# -- items -----------------------------------------------------------------------------


def read_items(payloads: tuple[str, ...], file: str | None, jsonl: bool,
               key: str | None, enqueue_at: datetime | None) -> Iterator[s.ProduceItem]:
    """Items from arguments, or one per line of a file or stdin ('-')."""
    if payloads:
        for n, p in enumerate(payloads):
            yield s.ProduceItem(utf8=p, enqueue_at=enqueue_at,
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
                yield item
            else:
                yield s.ProduceItem(utf8=line, enqueue_at=enqueue_at,
                                    key=f"{key}:{lineno}" if key else None)


def parse_jsonl_item(line: str, lineno: int) -> s.ProduceItem:
    try:
        raw = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"line {lineno}: not JSON: {exc}") from None
    if isinstance(raw, str):
        return s.ProduceItem(utf8=raw)
    if not isinstance(raw, dict):
        raise ValueError(f"line {lineno}: expected an object or a string")
    item = {k: raw[k] for k in ("utf8", "bytes", "enqueue_at", "key") if k in raw}
    if not item.keys() & {"utf8", "bytes"}:
        item["utf8"] = json.dumps(raw)  # a plain JSON record: the record is the payload
    try:
        return s.ProduceItem.model_validate(item)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"line {lineno}: {'.'.join(map(str, first['loc']))}: "
                         f"{first['msg']}") from None


def batches(items: Iterator[T], size: int) -> Iterator[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class _NullProgress:
    def advance(self, n: int) -> None: ...
    def close(self) -> None: ...


class _RichProgress:
    def __init__(self, total: int | None, what: str) -> None:
        self.p = Progress(console=err)
        self.p.start()
        self.task = self.p.add_task(what, total=total)

    def advance(self, n: int) -> None:
        self.p.advance(self.task, n)

    def close(self) -> None:
        self.p.stop()


def _progress(ctx: Ctx, total: int | None, what: str) -> Any:
    """A progress bar on a terminal for large inputs; nothing otherwise."""
    if ctx.json or not err.is_terminal or (total is not None and total < 1000):
        return _NullProgress()
    return _RichProgress(total, what)


def _count_lines(file: str | None) -> int | None:
    if file is None or file == "-":
        return None
    with open(file, "rb") as fh:
        return sum(1 for _ in fh)


@click.command()
@click.argument("queue")
@click.argument("payloads", nargs=-1)
@click.option("--file", "-f", help="read items from a file, one per line ('-': stdin)")
@click.option("--jsonl", is_flag=True,
              help="lines are JSON: an item {utf8|bytes, enqueue_at, key} or any record")
@click.option("--key", help="idempotency key (with several items: KEY:N)")
@click.option("--at", "at", help="deliver no earlier than this (RFC 3339, or +SECONDS)")
@run
async def produce(ctx: Ctx, c: Client, queue: str, payloads: tuple[str, ...],
                  file: str | None, jsonl: bool, key: str | None, at: str | None) -> None:
    """Produce items from arguments, a file or stdin."""
    if not payloads and file is None and sys.stdin.isatty():
        raise click.UsageError("give payloads as arguments, --file, or pipe them to stdin")
    enqueue_at = when(at, "--at")
    jsonl = jsonl or bool(file and file.endswith(".jsonl"))
    # Read and check every item first: a bad line fails the command before anything
    # is produced, so fixing the file and running again duplicates nothing.
    all_items = list(read_items(payloads, file, jsonl, key, enqueue_at))
    if not all_items:
        raise click.UsageError("nothing to produce: the input holds no items")
    bar = _progress(ctx, len(all_items), "producing")
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

    emit(ctx, items, text)


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
    await c.retry(queue, token, retry_at=when(at, "--at"), dead=dead, error=error)
    emit(ctx, {"queue_name": queue, "retried": 1},
         lambda: out.print("moved to the dead-letter queue" if dead else "released"))


# -- queues ----------------------------------------------------------------------------


def queue_settings(fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed([
        click.option("--lease-timeout", type=float, help="seconds a lease lasts"),
        click.option("--retention", type=float, help="seconds items are kept"),
        click.option("--max-attempts", type=int, help="deliveries before dead-lettering "
                     "(0: unlimited)"),
        click.option("--dead-queue", help="the dead-letter queue"),
        click.option("--retention-dead-letter/--no-retention-dead-letter", default=None,
                     help="move expired items to the dead-letter queue"),
    ]):
        fn = opt(fn)
    return fn


def info_table(infos: list[s.QueueInfoOut]) -> Table:
    t = Table("queue", "lease timeout", "retention", "max attempts", "dead queue", "produced")
    for i in infos:
        t.add_row(i.name, f"{i.lease_timeout:g}s", f"{i.retention:g}s",
                  str(i.max_attempts or "unlimited"), i.dead_queue or "-", str(i.produced))
    return t


@click.group()
def queues() -> None:
    """Create, list, inspect, change and delete queues."""


@queues.command("create")
@click.argument("name")
@queue_settings
@run
async def queues_create(ctx: Ctx, c: Client, name: str, **settings: Any) -> None:
    """Create a queue."""
    info = await c.create_queue(name, **{k: v for k, v in settings.items() if v is not None})
    emit(ctx, info, lambda: out.print(info_table([info])))


@queues.command("list")
@run
async def queues_list(ctx: Ctx, c: Client) -> None:
    """List queues."""
    infos = await c.list_queues()
    emit(ctx, infos, lambda: out.print(info_table(infos) if infos else "no queues"))


@queues.command("info")
@click.argument("name")
@run
async def queues_info(ctx: Ctx, c: Client, name: str) -> None:
    """Show a queue's configuration."""
    info = await c.queue_info(name)
    emit(ctx, info, lambda: out.print(info_table([info])))


@queues.command("update")
@click.argument("name")
@queue_settings
@run
async def queues_update(ctx: Ctx, c: Client, name: str, **settings: Any) -> None:
    """Change a queue's configuration; settings not given keep their values."""
    changes = {k: v for k, v in settings.items() if v is not None}
    if not changes:
        raise click.UsageError("give at least one setting to change")
    info = await c.update_queue(name, **changes)
    emit(ctx, info, lambda: out.print(info_table([info])))


@queues.command("delete")
@click.argument("name")
@run
async def queues_delete(ctx: Ctx, c: Client, name: str) -> None:
    """Delete a queue and its items."""
    await c.delete_queue(name)
    emit(ctx, {"name": name}, lambda: out.print(f"deleted {name}"))


# -- stats and browsing -------------------------------------------------------------------

STAT_COLUMNS = ("available", "in_flight", "scheduled", "waiting_retry", "dead", "completed")


def stats_table(rows: list[s.StatsResponse]) -> Table:
    t = Table("queue", *(c.replace("_", " ") for c in STAT_COLUMNS), "oldest")
    for r in rows:
        t.add_row(r.queue_name, *(str(getattr(r, c)) for c in STAT_COLUMNS),
                  f"{r.oldest_age:.1f}s")
    return t


@click.command()
@click.argument("queues_", metavar="QUEUE...", nargs=-1, required=True)
@click.option("--watch", "-w", is_flag=True, help="refresh until interrupted")
@click.option("--interval", type=float, default=2.0, show_default=True)
@run
async def stats(ctx: Ctx, c: Client, queues_: tuple[str, ...], watch: bool,
                interval: float) -> None:
    """Counts by state: a readable table, or JSON."""
    rows = [await c.stats(q) for q in queues_]
    if not watch:
        emit(ctx, rows, lambda: out.print(stats_table(rows)))
        return
    if ctx.json:  # one JSON document per refresh, for a pipe
        try:
            while True:
                click.echo(json.dumps(_plain(rows)))
                await asyncio.sleep(interval)
                rows = [await c.stats(q) for q in queues_]
        except asyncio.CancelledError:  # Ctrl-C
            return
    if not out.is_terminal:  # a pipe or a file: a line per queue per refresh, as a log
        await _watch_lines(c, queues_, rows, interval)
        return
    with Live(stats_table(rows), console=out, auto_refresh=False) as live:
        try:
            while True:
                await asyncio.sleep(interval)
                rows = [await c.stats(q) for q in queues_]
                live.update(stats_table(rows), refresh=True)
        except asyncio.CancelledError:
            return


def stats_line(r: s.StatsResponse) -> str:
    """One queue's counts on one line: ``12:00:01 jobs available=3 in_flight=1 ...``."""
    counts = " ".join(f"{c}={getattr(r, c)}" for c in STAT_COLUMNS)
    return f"{datetime.now():%H:%M:%S} {r.queue_name} {counts} oldest={r.oldest_age:.1f}s"


async def _watch_lines(c: Client, queues_: tuple[str, ...], rows: list[s.StatsResponse],
                       interval: float) -> None:
    """``stats --watch`` when stdout is not a terminal: rich's live table draws
    nothing there, so each refresh prints its lines and flushes them at once."""
    try:
        while True:
            for r in rows:
                click.echo(stats_line(r))
            sys.stdout.flush()
            await asyncio.sleep(interval)
            rows = [await c.stats(q) for q in queues_]
    except asyncio.CancelledError:  # Ctrl-C
        return
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def items_table(items: list[s.ItemOut], dead: bool = False) -> Table:
    cols = ["id", "state", "attempts", "produced"] + (["from", "error"] if dead else []) + [
        "payload"]
    t = Table(*cols)
    for i in items:
        row = [i.id, i.state, str(i.attempts), f"{i.produced_at:%Y-%m-%d %H:%M:%S}"]
        if dead:
            meta = i.meta or {}
            row += [str(meta.get("source_queue", "-")), str(meta.get("error") or "-")]
        t.add_row(*row, show_payload(i))
    return t


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


@click.group()
def dead() -> None:
    """Look at and redrive dead-lettered items."""


@dead.command("list")
@click.argument("dead_queue")
@click.option("--limit", "-n", type=int, default=100, show_default=True)
@run
async def dead_list(ctx: Ctx, c: Client, dead_queue: str, limit: int) -> None:
    """Items in a dead-letter queue, with where they came from and why."""
    got = await browse(c, dead_queue, limit)
    emit(ctx, got, lambda: out.print(items_table(got, dead=True) if got else "no dead items"))


@dead.command("redrive")
@click.argument("dead_queue")
@click.option("--limit", "-n", type=int, default=1000, show_default=True)
@run
async def dead_redrive(ctx: Ctx, c: Client, dead_queue: str, limit: int) -> None:
    """Move dead-lettered items back to the queues they came from."""
    moved = await c.redrive(dead_queue, limit)
    emit(ctx, {"queue_name": dead_queue, "moved": moved},
         lambda: out.print(f"moved {moved} item{'s' * (moved != 1)} back"))


# -- export / import ---------------------------------------------------------------------------


def _export_record(i: s.ItemOut) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": i.id}
    if i.utf8 is not None:
        rec["utf8"] = i.utf8
    else:
        rec["bytes"] = base64.b64encode(i.bytes).decode()
    if i.state == "scheduled" and i.ready_at is not None:
        rec["enqueue_at"] = i.ready_at.isoformat()
    if i.meta:
        rec["meta"] = i.meta
    return rec


def _last_exported_id(path: Path) -> str | None:
    last = None
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                try:
                    last = json.loads(line)["id"]
                except (ValueError, KeyError, TypeError):
                    break  # a torn last line: continue after the previous one
    return last


@click.command("export")
@click.argument("queue")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--resume", is_flag=True, help="append to FILE after its last exported item")
@run
async def export_(ctx: Ctx, c: Client, queue: str, file: str, resume: bool) -> None:
    """Write a queue's live items to a JSON Lines file (without leasing them)."""
    path = Path(file)
    after = _last_exported_id(path) if resume and path.exists() else None
    if path.exists() and not resume:
        raise click.UsageError(f"{file} exists: use --resume to continue it")
    if resume and path.exists():
        _trim_torn_line(path)
    total = (await c.stats(queue)).available
    bar = _progress(ctx, total, "exporting")
    n = 0
    try:
        with path.open("a", encoding="utf-8") as fh:
            while True:
                page = await c.list_items(queue, limit=1000, start_after=after)
                for item in page.items:
                    fh.write(json.dumps(_export_record(item)) + "\n")
                fh.flush()
                n += len(page.items)
                bar.advance(len(page.items))
                after = page.next_start_after
                if after is None:
                    break
    finally:
        bar.close()
    emit(ctx, {"queue_name": queue, "exported": n, "file": file},
         lambda: out.print(f"exported {n} item{'s' * (n != 1)} to {file}"))


def _trim_torn_line(path: Path) -> None:
    """End the file after its last complete record: finish a record that lacks only
    its newline, drop one that was cut short."""
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    start = data.rfind(b"\n") + 1
    try:
        json.loads(data[start:])
    except ValueError:
        path.write_bytes(data[:start])
    else:
        path.write_bytes(data + b"\n")


@click.command("import")
@click.argument("queue")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@run
async def import_(ctx: Ctx, c: Client, queue: str, file: str) -> None:
    """Produce the items of a JSON Lines file (as written by export).

    Safe to run again after an interruption: a checkpoint file beside FILE
    records the lines already produced, and every item carries an idempotency
    key made of the file's hash and its line number.
    """
    path = Path(file)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    checkpoint = path.with_name(path.name + f".okq-import-{queue}")
    done = 0
    if checkpoint.exists():
        saved = checkpoint.read_text().split()
        if len(saved) == 2 and saved[0] == digest and saved[1].isdigit():
            done = int(saved[1])  # lines up to this one were produced by an earlier run
    lines = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if line.strip()]
    todo = [(n, line) for n, line in lines if n > done]
    parsed = []  # every line is checked before anything is produced
    for n, line in todo:
        item = parse_jsonl_item(line, n)
        item.key = item.key or f"import:{digest}:{n}"
        parsed.append((n, item))
    bar = _progress(ctx, len(todo), "importing")
    produced = 0
    try:
        for batch in batches(iter(parsed), BATCH):
            items = [item for _, item in batch]
            await c.produce(queue, items)
            produced += len(items)
            checkpoint.write_text(f"{digest} {batch[-1][0]}\n")
            bar.advance(len(items))
    finally:
        bar.close()
    checkpoint.unlink(missing_ok=True)
    skipped = len(lines) - len(todo)
    emit(ctx, {"queue_name": queue, "imported": produced, "skipped": skipped},
         lambda: out.print(f"imported {produced} item{'s' * (produced != 1)}"
                           + (f" ({skipped} already imported)" if skipped else "")))


# -- shell workers ----------------------------------------------------------------------


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("-q", "--queue", required=True, help="lease from this queue")
@click.option("-Q", "--out-queue", help="produce each stdout line to this queue")
@click.option("-c", "--command", "shell", help="a shell command line instead of ARGV")
@click.option("--concurrency", "-j", type=int, default=1, show_default=True)
@click.option("--lease-timeout", type=float, default=60.0, show_default=True)
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
               concurrency: int, lease_timeout: float, backoff: float, grace: float,
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
    await c.queue_info(queue)
    if out_queue:
        await c.queue_info(out_queue)
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


def register(group: click.Group) -> None:
    for cmd in (produce, lease, complete, retry, queues, stats, items, dead, export_,
                import_, work):
        group.add_command(cmd)
