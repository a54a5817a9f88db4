"""The queue and dead-letter commands: queues create|list|info|update|delete,
stats [--watch], purge, dead list|redrive."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from okq.commands.context import Ctx, emit, out, plain, run
from okq.commands.items import browse
from okq.commands.tables import info_table, items_table, stats_line, stats_table

if TYPE_CHECKING:
    from okq import wire as s
    from okq.client import Client


def _partition_list(ctx: click.Context, param: click.Parameter,
                    value: str | None) -> list[int] | None:
    """``--read-only 2,3``: partition numbers; '' for none."""
    if value is None:
        return None
    try:
        return [int(p) for p in value.replace(" ", "").split(",") if p]
    except ValueError:
        raise click.BadParameter(f"partition numbers separated by commas; got {value!r}",
                                 ctx, param) from None


def queue_settings(fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed([
        click.option("--lease-timeout", type=float, help="seconds a lease lasts"),
        click.option("--retention", type=float, help="seconds items are kept"),
        click.option("--max-attempts", type=int, help="deliveries before dead-lettering "
                     "(0: unlimited)"),
        click.option("--dead-queue", help="the dead-letter queue"),
        click.option("--retention-dead-letter/--no-retention-dead-letter", default=None,
                     help="move expired items to the dead-letter queue"),
        click.option("--partitions", type=int, help="partitions the queue is spread over, "
                     "so that several nodes serve it (raised, never lowered)"),
        click.option("--read-only", callback=_partition_list, metavar="P,P,...",
                     help="partitions that take no new items and are drained ('' for none)"),
    ]):
        fn = opt(fn)
    return fn


@click.group()
def queues() -> None:
    """Create, list, inspect, change and delete queues."""


@queues.command("create")
@click.argument("name")
@queue_settings
@click.option("--fifo", is_flag=True, default=None,
              help="ordered delivery: a message group's items are handed out in order, one "
              "handout at a time (set at create, never changed)")
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


async def _all_stats(c: Client, names: tuple[str, ...]) -> list[s.StatsResponse]:
    """The counts of the queues named, or of every queue (read again each time: a
    queue made since shows up)."""
    if not names:
        names = tuple(q.name for q in await c.list_queues())
    return [await c.stats(q) for q in names]


def _show_stats(rows: list[s.StatsResponse]) -> None:
    out.print(stats_table(rows) if rows else "no queues")


@click.command()
@click.argument("queues_", metavar="[QUEUE]...", nargs=-1)
@click.option("--watch", "-w", is_flag=True, help="refresh until interrupted")
@click.option("--interval", type=float, default=2.0, show_default=True)
@run
async def stats(ctx: Ctx, c: Client, queues_: tuple[str, ...], watch: bool,
                interval: float) -> None:
    """Counts by state of the queues named, or of every queue: a table, or JSON
    (a list, one object per queue)."""
    import asyncio

    from rich.live import Live

    rows = await _all_stats(c, queues_)
    if not watch:
        emit(ctx, rows, lambda: _show_stats(rows))
        return
    if ctx.json:  # one JSON document per refresh, for a pipe
        try:
            while True:
                click.echo(json.dumps(plain(rows)))
                await asyncio.sleep(interval)
                rows = await _all_stats(c, queues_)
        except asyncio.CancelledError:  # Ctrl-C
            return
    if not out.is_terminal:  # a pipe or a file: a line per queue per refresh, as a log
        await _watch_lines(c, queues_, rows, interval)
        return
    with Live(stats_table(rows), console=out, auto_refresh=False) as live:
        try:
            while True:
                await asyncio.sleep(interval)
                rows = await _all_stats(c, queues_)
                live.update(stats_table(rows), refresh=True)
        except asyncio.CancelledError:
            return


async def _watch_lines(c: Client, queues_: tuple[str, ...], rows: list[s.StatsResponse],
                       interval: float) -> None:
    """``stats --watch`` when stdout is not a terminal: rich's live table draws
    nothing there, so each refresh prints its lines and flushes them at once."""
    import asyncio

    try:
        while True:
            for r in rows:
                click.echo(stats_line(r))
            sys.stdout.flush()
            await asyncio.sleep(interval)
            rows = await _all_stats(c, queues_)
    except asyncio.CancelledError:  # Ctrl-C
        return
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@click.command()
@click.argument("queue")
@click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation")
@run
async def purge(ctx: Ctx, c: Client, queue: str, yes: bool) -> None:
    """Drop every item of a queue (asks first, unless --yes)."""
    if not yes:  # anything but y (or no terminal to ask on) leaves it: "Aborted!", exit 1
        click.confirm(f"drop every item of {queue}?", abort=True, err=True)
    await c.purge(queue)
    emit(ctx, {"queue_name": queue, "purged": True}, lambda: out.print(f"purged {queue}"))


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
