"""Message move tasks kept in the bucket, so that any node can answer for them and
resume one whose node stopped (the SQS API runs them: ``okq/sqs/moves.py``).

One object per task, ``{ns}/movetasks/{dead queue}/{seq}`` (``okq.keys``): created
create-only (so two nodes starting a task on one queue at once cannot both win),
then changed by compare-and-swap through :meth:`MoveTaskStore.update`, applying the
pure changes below. A task's runner holds a claim (``owner``, ``beat_ms``) that it
renews as it goes; a claim not renewed by ``beat_ms`` may be taken by any node.
The messages themselves move exactly once whoever runs the task (a redrive, or a
completion with outputs, each fenced by its lease), so two runners for a moment,
or a task resumed after its runner was killed, move nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from okq.errors import CASConflict, ObjectNotFound, StorageError, TaskLost
from okq.keys import move_task_key, move_tasks_prefix
from okq.model import MoveTask, decode_move_task, encode_move_task, new_nonce
from okq.store.base import Store

RUNNING, CANCELLING, CANCELLED, COMPLETED, FAILED = (
    "RUNNING", "CANCELLING", "CANCELLED", "COMPLETED", "FAILED")
#: States in which a task still has a runner to come (its own, or a resumer).
ACTIVE = (RUNNING, CANCELLING)
#: Tasks kept per dead-letter queue (SQS lists at most 10); older ones are deleted.
KEEP = 10
#: Lost compare-and-swaps on one task before an update gives up.
MAX_TRIES = 50


# -- pure changes: (task, now) -> the task changed, or TaskLost ---------------------------


def claim(owner: str, ttl_ms: int, hold_ms: int) -> Callable[[MoveTask, int], MoveTask]:
    """Take the task's claim: it is active and its claim is ours or has lapsed; the
    dead letters we lease may be held until ``hold_ms``."""

    def change(t: MoveTask, now: int) -> MoveTask:
        if t.status not in ACTIVE:
            raise TaskLost(f"the task is {t.status}")
        if t.owner not in ("", owner) and t.beat_ms > now:
            raise TaskLost("another node runs the task")
        return replace(t, owner=owner, beat_ms=now + ttl_ms, hold_ms=max(t.hold_ms, hold_ms))

    return change


def beat(owner: str, ttl_ms: int, moved: int, hold_ms: int = 0
         ) -> Callable[[MoveTask, int], MoveTask]:
    """Renew our claim, count ``moved`` more messages and note leases held until
    ``hold_ms``; TaskLost when the claim is another's now."""

    def change(t: MoveTask, now: int) -> MoveTask:
        if t.owner != owner or t.status not in ACTIVE:
            raise TaskLost("another node took the task over, or it was cancelled")
        return replace(t, beat_ms=now + ttl_ms, moved=t.moved + moved,
                       hold_ms=max(t.hold_ms, hold_ms))

    return change


def finish(owner: str, status: str, moved: int, failure: str | None = None
           ) -> Callable[[MoveTask, int], MoveTask]:
    """End the task (COMPLETED, CANCELLED or FAILED), counting ``moved`` more."""

    def change(t: MoveTask, now: int) -> MoveTask:
        if t.owner != owner or t.status not in ACTIVE:
            raise TaskLost("another node took the task over")
        return replace(t, status=status, moved=t.moved + moved, failure=failure,
                       beat_ms=now)

    return change


def cancel(t: MoveTask, now: int) -> MoveTask:
    """RUNNING -> CANCELLING, for its runner to stop; straight to CANCELLED when no
    runner holds the claim (nobody would finish it)."""
    if t.status != RUNNING:
        raise TaskLost(f"the task is {t.status}, not {RUNNING}")
    return replace(t, status=CANCELLED if t.beat_ms <= now else CANCELLING)


# -- the objects --------------------------------------------------------------------------


class MoveTaskStore:
    """The move tasks of one namespace in its store."""

    def __init__(self, store: Store, namespace: str) -> None:
        self.store = store
        self.ns = namespace

    async def of_queue(self, dead: str) -> list[MoveTask]:
        """The tasks of a dead-letter queue, newest first (one LIST, a GET each)."""
        page = await self.store.list(move_tasks_prefix(self.ns, dead))
        tasks = []
        for info in reversed(page.items):
            try:
                tasks.append(decode_move_task((await self.store.get(info.key)).data))
            except ObjectNotFound:  # pruned meanwhile
                continue
        return tasks

    async def active(self) -> list[MoveTask]:
        """Every task of the namespace that still has a runner to come: the newest
        of each queue, when active (one LIST, a GET per queue with tasks)."""
        newest: dict[str, str] = {}
        prefix = move_tasks_prefix(self.ns)
        start: str | None = None
        while True:
            page = await self.store.list(prefix, start_after=start)
            for info in page.items:
                newest[info.key[len(prefix):].rsplit("/", 1)[0]] = info.key
            if page.next_start_after is None:
                break
            start = page.next_start_after
        out = []
        for key in newest.values():
            try:
                t = decode_move_task((await self.store.get(key)).data)
            except ObjectNotFound:
                continue
            if t.status in ACTIVE:
                out.append(t)
        return out

    async def get(self, dead: str, seq: int) -> MoveTask | None:
        try:
            return decode_move_task((await self.store.get(move_task_key(self.ns, dead, seq)))
                                    .data)
        except ObjectNotFound:
            return None

    async def create(self, t: MoveTask) -> bool:
        """Write a new task create-only; False when its key was taken (another start
        won). An ambiguous write is settled by reading our nonce back."""
        t = replace(t, ver=1, nonce=new_nonce())
        key = move_task_key(self.ns, t.dead, t.seq)
        try:
            await self.store.put(key, encode_move_task(t), if_none_match=True)
        except CASConflict:
            return False
        except StorageError:
            landed = await self.get(t.dead, t.seq)
            if landed is None or landed.nonce != t.nonce:
                raise
        await self._prune(t.dead, t.seq)
        return True

    async def _prune(self, dead: str, newest: int) -> None:
        """Delete the queue's tasks older than the :data:`KEEP` newest (all finished:
        only the newest may be active)."""
        page = await self.store.list(move_tasks_prefix(self.ns, dead))
        for info in page.items[:-KEEP]:
            await self.store.delete(info.key)

    async def update(self, dead: str, seq: int,
                     change: Callable[[MoveTask, int], MoveTask], now: Callable[[], int]
                     ) -> MoveTask:
        """Apply ``change`` by compare-and-swap, re-reading after a lost race; the task
        as written. ObjectNotFound when there is no such task; TaskLost from the
        change."""
        key = move_task_key(self.ns, dead, seq)
        for _ in range(MAX_TRIES):
            blob = await self.store.get(key)
            old = decode_move_task(blob.data)
            new = replace(change(old, now()), ver=old.ver + 1, nonce=new_nonce())
            try:
                await self.store.put(key, encode_move_task(new), if_match=blob.etag)
                return new
            except CASConflict:
                continue
            except StorageError:
                landed = await self.get(dead, seq)
                if landed is not None and landed.nonce == new.nonce:
                    return new
                raise
        raise StorageError(f"move task {dead}/{seq}: lost {MAX_TRIES} compare-and-swaps")
