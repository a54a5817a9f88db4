"""Queue administration: the manifest's life and its configuration.

Creating writes a manifest create-only; every other change is a manifest
operation (okq/manifest_ops.py) applied through the queue's cell. A dead queue
must exist and lead to no loop; a queue that is another's dead queue cannot be
deleted (docs/DESIGN.md, "Dead queues and redrive").
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from okq.changes import Unchanged
from okq.errors import (
    CASConflict,
    InvalidRequest,
    ObjectNotFound,
    QueueExists,
    QueueInUse,
)
from okq.keys import (
    manifest_key,
    manifests_prefix,
    split_partition,
)
from okq.manifest_ops import Purge, UpdateConfig, merged_config
from okq.model import (
    Manifest,
    QueueConfig,
    encode_manifest,
    manifest_config,
    new_nonce,
    new_request_id,
)
from okq.store.base import list_all

if TYPE_CHECKING:
    from okq.runtime import Runtime


@dataclass(frozen=True)
class _Revert:
    """Put a queue's ``dead_queue`` back to ``before``, if it is still ``dead``."""

    dead: str
    before: str | None

    def apply(self, m: Manifest, now: int) -> Manifest | Unchanged:
        if m.config.dead_queue != self.dead:
            return Unchanged(m)
        m.config = merged_config(m.config, {"dead_queue": self.before})
        return m


@dataclass
class QueueInfo:
    name: str
    config: QueueConfig
    created_ms: int
    segments: int
    produced: int
    purged_ms: int = 0  # when the queue was last purged (0: never)


class Admin:
    """Queue administration: create, read, change, delete, list, purge."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def create_queue(
        self, name: str, config: QueueConfig | None = None, *, exist_ok: bool = False
    ) -> QueueInfo:
        """Create a queue. With ``exist_ok`` an existing queue is left as it is
        (its configuration unchanged) and its info returned."""
        q = self.rt.queue(name)
        config = config or QueueConfig()
        await self._check_dead_queue(name, config)
        m = Manifest(name, self.rt.clock.now_ms(), config, ver=1, nonce=new_nonce())
        try:
            await self.rt.store.put(q.manifest.key, encode_manifest(m), if_none_match=True)
        except CASConflict:
            if exist_ok:
                return await self.get_queue(name)
            raise QueueExists(f"queue {name!r} already exists", queue=name) from None
        q.manifest.forget()
        return self._info(m)

    async def get_queue(self, name: str, max_age: float = 0) -> QueueInfo:
        """The queue's info, read no longer than ``max_age`` seconds ago."""
        return self._info(await self.rt.manifest(self.rt.queue(name), max_age))

    async def update_queue(self, name: str, **changes: Any) -> QueueInfo:
        """Change settings; those not named keep their values. A new ``dead_queue`` is
        checked first, as at create (it must exist and must not lead back here)."""
        q = self.rt.queue(name)
        current = await self.rt.manifest(q, 0)
        dead = changes.get("dead_queue")
        if dead is not None:
            await self._check_dead_queue(name, merged_config(current.config, changes))
        m: Manifest = await q.manifest.update(UpdateConfig(changes).apply)
        if dead is not None and dead != current.config.dead_queue:
            await self._recheck_loop(name, dead, current.config.dead_queue)
        return self._info(m)

    async def _recheck_loop(self, name: str, dead: str, before: str | None) -> None:
        """Walk the chain again now that ``dead`` has landed: an update of another
        queue checked before this one landed may have closed a loop. The walk reads
        every manifest afresh after this write, so of two racing updates that close
        a loop the one that landed last sees the other's; it puts its own queue's
        ``dead_queue`` back (unless changed since) and is refused with the loop."""
        try:
            await self._check_dead_queue(name, QueueConfig(dead_queue=dead))
        except InvalidRequest as exc:
            if "loop" not in exc.details:
                return  # the dead queue was deleted since: the dead-letter path copes
            await self.rt.queue(name).manifest.update(_Revert(dead, before).apply)
            raise InvalidRequest(f"{exc.message} (another update landed at the same "
                                 "time); this queue's dead_queue is unchanged",
                                 **exc.details) from None

    async def delete_queue(self, name: str) -> None:
        """Delete the manifest; the compactor collects the queue's objects.

        Refused with QueueInUse (409) while another queue of the namespace names
        this one as its ``dead_queue``: its dead letters would have nowhere to go.
        The user points those queues' ``dead_queue`` elsewhere (or deletes them)
        first; there is no ``force``. The check costs a listing of the namespace's
        manifests and one GET per queue: deletes are rare, and a dead queue that
        vanishes under its users is worse. A ``dead_queue`` set by an update that
        races this delete is not seen here; the dead-letter path copes with a dead
        queue that is gone.
        """
        q = self.rt.queue(name)
        await self.rt.manifest(q, 0)
        # No queue names a partition as its dead queue (okq.keys.check_name refuses it).
        users = await self._dead_queue_users(name) if not split_partition(name)[1] else []
        if users:
            named = ", ".join(repr(u) for u in users)
            raise QueueInUse(
                f"queue {name!r} is the dead_queue of {named}: point their dead_queue "
                f"elsewhere or delete them first; nothing was deleted",
                queue=name, used_by=users,
            )
        await self.rt.store.delete(q.manifest.key)
        self.rt.queues.pop(name, None)

    async def _dead_queue_users(self, name: str) -> list[str]:
        """The queues whose ``dead_queue`` is ``name``, read fresh, 32 GETs at a time."""
        others = [other for other in await self.list_queues()
                  if other != name and not split_partition(other)[1]]
        users: list[str] = []
        for start in range(0, len(others), 32):
            chunk = others[start : start + 32]
            found = await asyncio.gather(*(self._read_config(o) for o in chunk))
            users += [o for o, c in zip(chunk, found, strict=True)
                      if c is not None and c.dead_queue == name]
        return users

    async def _read_config(self, name: str) -> QueueConfig | None:
        """A queue's config read fresh from its manifest, or None if there is none
        (without creating a runtime for the queue in this engine, or reading its
        manifest's chunks)."""
        try:
            blob = await self.rt.store.get(manifest_key(self.rt.ns, name))
        except ObjectNotFound:
            return None
        return manifest_config(blob.data)

    async def list_queues(self) -> list[str]:
        prefix = manifests_prefix(self.rt.ns)
        return [info.key[len(prefix) :] async for info in list_all(self.rt.store, prefix)]

    async def _check_dead_queue(self, name: str, config: QueueConfig) -> None:
        """Refuse a ``dead_queue`` that is the queue itself, does not exist, or leads
        back to the queue (a -> b -> a, or longer) by following each queue's
        ``dead_queue`` through the existing manifests: one GET per hop.

        A loop would send an item round between queues for ever, and nothing may
        follow a chain without end. Two updates racing could each pass this check
        before the other landed: ``update_queue`` walks again after its write and
        undoes a change that closed a loop. Nothing else relies on this: stats
        looks one level down only. A queue further down the chain whose dead
        queue is gone ends the walk; that is its own setting's problem, not this one's.
        """
        dead = config.dead_queue
        if dead is None:
            return
        if dead == name:
            raise InvalidRequest("dead_queue cannot be the queue itself", field="dead_queue")
        chain = [name]
        hop: str | None = dead
        while hop is not None:
            if hop in chain:
                loop = " -> ".join([*chain, hop])
                raise InvalidRequest(f"dead_queue {dead!r} would make a loop: {loop}",
                                     field="dead_queue", loop=[*chain, hop])
            found = await self._read_config(hop)
            if found is None and hop == dead:
                raise InvalidRequest(f"dead_queue {dead!r} does not exist: create it first",
                                     field="dead_queue")
            chain.append(hop)
            hop = found.dead_queue if found is not None else None

    @staticmethod
    def _info(m: Manifest) -> QueueInfo:
        return QueueInfo(m.queue, m.config, m.created_ms, len(m.segments), m.produced,
                         m.purged_ms)

    async def purge(self, queue: str, not_within: float = 0.0) -> None:
        """Drop every item: the manifest stops referencing the queue's segments, so
        nothing in them is leased again (the compactor deletes them). A late
        completion or renewal of an item leased before the purge still lands on its
        lease object and changes nothing visible."""
        q = self.rt.queue(queue)
        await self.rt.manifest(q, 0)
        await q.manifest.update(Purge(new_request_id(), round(not_within * 1000)).apply)
        q.summaries.clear()
