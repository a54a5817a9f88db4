"""The SQS API's queue actions: create, find, list, delete, purge, read and change
attributes and tags of queues (docs/SQS.md)."""

from __future__ import annotations

import re
import time
from typing import Any

from okq.admin import QueueInfo
from okq.errors import PurgeInProgress, QueueExists
from okq.model import QueueConfig
from okq.sqs import queues as qa
from okq.sqs.errors import SqsError, invalid, invalid_value, missing, no_queue
from okq.sqs.moves import Moves
from okq.sqs.params import (
    PURGE_INTERVAL_MS,
    Call,
    names_param,
    page_of,
    sqs_errors,
    str_param,
)


class QueueActions:
    """The actions on queues; ``info`` and ``queue_of`` serve every action."""

    moves: Moves

    # -- queues --------------------------------------------------------------------------
    def queue_of(self, call: Call, params: dict[str, Any]) -> str:
        """The queue a ``QueueUrl`` names (any host: the path is /<namespace>/<queue>),
        or a bare queue name, which SQS also accepts as a QueueUrl."""
        url = str_param(params, "QueueUrl")
        path = re.sub(r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/]*", "", url).strip("/").split("/")
        if len(path) == 1 and path[0] and "/" not in url:
            return path[0]
        if len(path) != 2 or path[0] != call.names.namespace or not path[1]:
            raise no_queue()
        return path[1]

    async def info(self, call: Call, queue: str, max_age: float = 0) -> QueueInfo:
        with sqs_errors():
            return await call.service.queue(queue, max_age)

    async def do_CreateQueue(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        attributes = params.get("Attributes") or {}
        changes = qa.changes(attributes, call.names, creating=True)
        name = qa.check_queue_name(str_param(params, "QueueName"), changes.get("fifo", False))
        qa.check_fifo_settings(None, changes)
        tags = qa.tag_changes({}, params.get("tags"), None) if params.get("tags") else {}
        await self._check_redrive(call, name, changes, changes.get("fifo", False))
        kept = {k: v for k, v in {**changes.pop("attributes", {}), **tags}.items()
                if v is not None}
        if changes.get("fifo") and kept.get("DeduplicationScope") != "messageGroup":
            # deduplication over the whole queue needs its keys in one partition
            changes["partitions"] = 1
        config = QueueConfig.model_validate({**changes, "attributes": kept})
        exists = False
        with sqs_errors():
            try:
                await call.service.create_queue(name, config)
            except QueueExists:
                exists = True
        if exists:
            await self._same_queue(call, name, attributes)
        return {"QueueUrl": call.names.url(name)}

    async def _same_queue(self, call: Call, name: str, attributes: dict[str, Any]) -> None:
        """An existing queue is answered with its URL if the attributes asked agree."""
        info = await self.info(call, name)
        have = qa.render(info, call.names, [a for a in attributes if a in qa.ALL], None)
        for key, value in attributes.items():
            if key == "FifoQueue":
                continue  # the name says it: only a FIFO queue's ends with .fifo
            if not qa.same_value(key, have.get(key, qa.KEPT.get(key, ("",))[0]), str(value)):
                raise SqsError("QueueNameExists", f"A queue already exists with the same name "
                               f"and a different value for attribute {key}")

    async def _check_redrive(self, call: Call, source: str, changes: dict[str, Any],
                             fifo: bool) -> None:
        """A redrive policy's dead-letter queue must exist, allow this source and be of
        its type (FIFO or standard)."""
        dead = changes.get("dead_queue")
        if dead is None:
            return
        if dead == source:
            raise invalid("Value for parameter RedrivePolicy is invalid. Reason: a queue "
                          "cannot be its own dead-letter queue.")
        try:
            info = await self.info(call, dead)
        except SqsError:
            raise invalid("Value for parameter RedrivePolicy is invalid. Reason: Dead-letter "
                          "target does not exist.") from None
        if not qa.redrive_allowed(info, call.names.arn(source)):
            raise invalid("Value for parameter RedrivePolicy is invalid. Reason: the "
                          "dead-letter queue's RedriveAllowPolicy does not allow this queue.")
        if info.config.fifo != fifo:
            raise invalid("Value for parameter RedrivePolicy is invalid. Reason: Dead-letter "
                          "queue must be same type of queue as the source.")

    async def do_GetQueueUrl(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        name = str_param(params, "QueueName")
        owner = params.get("QueueOwnerAWSAccountId")
        if owner not in (None, "", call.names.namespace):
            raise no_queue()
        await self.info(call, name)
        return {"QueueUrl": call.names.url(name)}

    async def do_ListQueues(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        prefix = params.get("QueueNamePrefix") or ""
        if not isinstance(prefix, str):
            raise invalid_value("QueueNamePrefix", prefix, "it must be a string")
        with sqs_errors():
            names = sorted(n for n in await call.service.queue_names()
                           if n.startswith(prefix))
        page, token = page_of(names, params)
        out: dict[str, Any] = {"QueueUrls": [call.names.url(n) for n in page]} if page else {}
        if token:
            out["NextToken"] = token
        return out

    async def do_DeleteQueue(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        with sqs_errors():
            await call.service.delete_queue(queue)
        return {}

    async def do_PurgeQueue(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        """SQS allows one purge per queue in 60 s. The last purge's time is in the
        queue's manifest and checked inside the purge's own CAS, so every node of a
        fleet refuses alike, and two purges racing through two nodes cannot both run."""
        queue = self.queue_of(call, params)
        try:
            with sqs_errors():
                await call.service.purge(queue, not_within=PURGE_INTERVAL_MS / 1000)
        except PurgeInProgress:
            raise SqsError("PurgeQueueInProgress", f"Only one PurgeQueue operation on {queue} "
                           f"is allowed every {PURGE_INTERVAL_MS // 1000} seconds.") from None
        return {}

    async def do_GetQueueAttributes(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        asked = names_param(params, "AttributeNames")
        wanted = list(qa.ALL) if "All" in asked else list(dict.fromkeys(asked))
        unknown = [a for a in wanted if a not in qa.ALL]
        if unknown:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {unknown[0]}.")
        info = await self.info(call, queue)
        counts = None
        if any(a in qa.COUNTS for a in wanted):
            with sqs_errors():
                st = await call.service.stats(queue)
            counts = {"ApproximateNumberOfMessages": st.available,
                      "ApproximateNumberOfMessagesNotVisible": st.in_flight,
                      "ApproximateNumberOfMessagesDelayed": st.scheduled + st.waiting_retry}
        attributes = qa.render(info, call.names, wanted, counts)
        return {"Attributes": attributes} if attributes else {}

    async def do_SetQueueAttributes(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_of(call, params)
        attributes = params.get("Attributes")
        if not attributes:
            raise missing("Attributes")
        info = await self.info(call, queue)
        changes = qa.changes(attributes, call.names, creating=False, fifo=info.config.fifo)
        qa.check_fifo_settings(info, changes)
        await self._check_redrive(call, queue, changes, info.config.fifo)
        changes.setdefault("attributes", {})["LastModifiedTimestamp"] = str(int(time.time()))
        with sqs_errors():
            await call.service.update_queue(queue, **changes)
        return {}

    async def do_ListDeadLetterSourceQueues(self, call: Call,
                                            params: dict[str, Any]) -> dict[str, Any]:
        dead = self.queue_of(call, params)
        await self.info(call, dead)
        with sqs_errors():
            sources = sorted(i.name for i in await call.service.queues()
                             if i.config.dead_queue == dead)
        page, token = page_of(sources, params)
        out: dict[str, Any] = {"queueUrls": [call.names.url(n) for n in page]}
        if token:
            out["NextToken"] = token
        return out

    async def do_TagQueue(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        return await self._retag(call, params, "Tags")

    async def do_UntagQueue(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        return await self._retag(call, params, "TagKeys")

    async def _retag(self, call: Call, params: dict[str, Any], member: str) -> dict[str, Any]:
        """Add ``Tags`` or remove ``TagKeys``: one change of the queue's attributes."""
        queue = self.queue_of(call, params)
        if not params.get(member):
            raise missing(member)
        info = await self.info(call, queue)
        add, remove = (params[member], None) if member == "Tags" else (None, params[member])
        changes = qa.tag_changes(qa.tags(info), add, remove)
        with sqs_errors():
            await call.service.update_queue(queue, attributes=changes)
        return {}

    async def do_ListQueueTags(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        info = await self.info(call, self.queue_of(call, params))
        tags = qa.tags(info)
        return {"Tags": tags} if tags else {}

    async def do_AddPermission(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        raise SqsError("UnsupportedOperation", "okq keeps no SQS access policies: an access "
                       "key acts in its own namespace (docs/SQS.md)")

    do_RemovePermission = do_AddPermission
