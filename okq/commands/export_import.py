"""export and import: a queue's live items to a JSON Lines file and back,
both resumable."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from okq.commands.context import BATCH, Ctx, batches, emit, out, progress, run
from okq.commands.items import parse_jsonl_item

if TYPE_CHECKING:
    from okq import wire as s
    from okq.client import Client


def _export_record(i: s.ItemOut) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": i.id}
    if i.utf8 is not None:
        rec["utf8"] = i.utf8
    else:
        rec["bytes"] = base64.b64encode(i.bytes).decode()
    if i.state == "scheduled" and i.ready_at is not None:
        rec["enqueue_at"] = i.ready_at.isoformat()
    if i.headers:
        rec["headers"] = i.headers
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
    bar = progress(ctx, total, "exporting")
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


def _read_checkpoint(checkpoint: Path, digest: str, file: str, queue: str) -> int:
    """The number of lines an earlier, interrupted import of this content produced (0:
    none, or the checkpoint is of another content of the file). A checkpoint that
    cannot be read is a ValueError, not a fresh start: the idempotency keys stop a second
    copy only within the node's idempotency window, and after it a restart from line 1
    would add every line already produced again."""
    if not checkpoint.exists():
        return 0
    text = checkpoint.read_text(encoding="utf-8", errors="replace")
    saved = text.split()
    if len(saved) == 2 and len(saved[0]) == len(digest) and saved[1].isdigit():
        return int(saved[1]) if saved[0] == digest else 0
    raise ValueError(
        f"the checkpoint {checkpoint} of an interrupted import of {file} into {queue} is "
        f"unreadable ({text[:40]!r}), so how far that import got is unknown. Its items "
        "carry idempotency keys: delete the checkpoint and rerun within the nodes' "
        "idempotency window (--idem-window, 5 minutes by default) and nothing is produced "
        f"twice; later, check what {queue} holds (okq items {queue}) before deleting it")


def _write_checkpoint(checkpoint: Path, digest: str, line: int) -> None:
    """Record that the lines up to ``line`` were produced; replaced atomically, so a
    kill leaves the previous checkpoint or this one, never a torn file."""
    from okq.store.file import atomic_write

    atomic_write(checkpoint, f"{digest} {line}\n".encode())


@click.command("import")
@click.argument("queue")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@run
async def import_(ctx: Ctx, c: Client, queue: str, file: str) -> None:
    """Produce the items of a JSON Lines file (as written by export).

    Safe to run again after an interruption: a checkpoint file beside FILE
    records the lines already produced (replaced atomically, never torn), and
    every item carries an idempotency key made of the file's hash and its line
    number. A checkpoint that cannot be read stops the import: delete it to
    start from the first line (the keys stop duplicates only within the nodes'
    idempotency window, 5 minutes by default).
    """
    path = Path(file)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    checkpoint = path.with_name(path.name + f".okq-import-{queue}")
    done = _read_checkpoint(checkpoint, digest, file, queue)
    lines = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if line.strip()]
    todo = [(n, line) for n, line in lines if n > done]
    parsed = []  # every line is checked before anything is produced
    for n, line in todo:
        item = parse_jsonl_item(line, n)
        item.key = item.key or f"import:{digest}:{n}"
        parsed.append((n, item))
    bar = progress(ctx, len(todo), "importing")
    added = duplicates = 0
    try:
        for batch in batches(iter(parsed), BATCH):
            items = [item for _, item in batch]
            reply = await c.produce_reply(queue, items)
            dup = reply.duplicates or 0  # an older node does not say: none, as before
            added, duplicates = added + len(items) - dup, duplicates + dup
            _write_checkpoint(checkpoint, digest, batch[-1][0])
            bar.advance(len(items))
    finally:
        bar.close()
    checkpoint.unlink(missing_ok=True)
    skipped = len(lines) - len(todo)
    emit(ctx, {"queue_name": queue, "imported": added, "duplicates": duplicates,
               "skipped": skipped}, lambda: out.print(_import_summary(added, duplicates, skipped)))


def _import_summary(added: int, duplicates: int, skipped: int) -> str:
    """``imported 0 items (2500 produced before: their idempotency keys were taken)``."""
    notes = [f"{duplicates} produced before: their idempotency keys were taken"] \
        if duplicates else []
    notes += [f"{skipped} already imported"] if skipped else []
    return f"imported {added} item{'s' * (added != 1)}" + (f" ({'; '.join(notes)})"
                                                          if notes else "")
