"""The SQS API's message move tasks: start, list and cancel them. Each task lives
in the bucket (okq/movetasks.py); this node runs those it holds (okq/sqs/moves.py).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from okq.errors import ObjectNotFound, TaskLost
from okq.model import MoveTask
from okq.movetasks import ACTIVE, cancel
from okq.sqs.errors import SqsError, invalid
from okq.sqs.params import Call, int_param, sqs_errors, str_param
from okq.sqs.queue_actions import QueueActions
from okq.sqs.queues import SQS_NAME


class MoveActions(QueueActions):
    """The move task actions."""

    # -- moving dead letters (the tasks live in the bucket: okq/sqs/moves.py) -------------
    async def do_StartMessageMoveTask(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        source_arn = str_param(params, "SourceArn")
        dead = call.names.queue_of_arn(source_arn, "SourceArn")
        await self.info(call, dead)
        with sqs_errors():
            if not any(i.config.dead_queue == dead for i in await call.service.queues()):
                raise invalid("Source queue must be configured as a Dead Letter Queue.")
        destination = params.get("DestinationArn")
        target = call.names.queue_of_arn(destination, "DestinationArn") \
            if destination else None
        if target is not None:
            await self.info(call, target)
        rate = int_param(params, "MaxNumberOfMessagesPerSecond", 1, 500, 0) \
            if params.get("MaxNumberOfMessagesPerSecond") is not None else None
        with sqs_errors():
            tasks = await self._tasks(call, dead)
            if tasks and tasks[0].status in ACTIVE:
                raise _task_running()
            to_move = (await call.service.stats(dead)).available
            now = call.service.now_ms()
            task = MoveTask(dead, tasks[0].seq + 1 if tasks else 1, source_arn, destination,
                            target, rate, to_move, started_ms=now, owner=self.moves.owner,
                            beat_ms=now + self.moves.ttl_ms, hold_ms=self.moves.hold_ms(now))
            if not await call.service.start_move_task(task):
                raise _task_running()  # another node started one at the same moment
        self.moves.start(call.names.namespace, call.service.background(), task)
        return {"TaskHandle": _handle(task)}

    async def _tasks(self, call: Call, dead: str) -> list[MoveTask]:
        """A queue's tasks, newest first; the newest resumed here if its node stopped."""
        tasks = await call.service.move_tasks_of(dead)
        if tasks:
            await self.moves.resume(call.names.namespace, call.service.background(), tasks[0])
        return tasks

    async def do_ListMessageMoveTasks(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        source_arn = str_param(params, "SourceArn")
        dead = call.names.queue_of_arn(source_arn, "SourceArn")
        limit = int_param(params, "MaxResults", 1, 10, 1)
        with sqs_errors():
            tasks = await self._tasks(call, dead)
        return {"Results": [_describe(t) for t in tasks[:limit]]}

    async def do_CancelMessageMoveTask(self, call: Call,
                                       params: dict[str, Any]) -> dict[str, Any]:
        handle = str_param(params, "TaskHandle")
        found = _task_of_handle(handle)
        missing_task = SqsError("ResourceNotFoundException", "The resource that you "
                                "specified for the TaskHandle parameter doesn't exist.")
        if found is None:
            raise missing_task
        with sqs_errors():
            try:
                task = await call.service.update_move_task(*found, cancel)
            except ObjectNotFound:
                raise missing_task from None
            except TaskLost as exc:
                raise SqsError("UnsupportedOperation", exc.message) from None
        return {"ApproximateNumberOfMessagesMoved": task.moved}


def _task_running() -> SqsError:
    return invalid("There is already a task running. Only one active task is allowed for "
                   "each source queue arn at a given time.")


def _handle(task: MoveTask) -> str:
    """A task's handle: its queue and number (bound to the namespace it is read in)."""
    raw = json.dumps({"q": task.dead, "n": task.seq}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _task_of_handle(handle: str) -> tuple[str, int] | None:
    try:
        raw = json.loads(base64.urlsafe_b64decode(handle.encode()))
        dead, seq = raw["q"], raw["n"]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        return None
    if not isinstance(dead, str) or not SQS_NAME.fullmatch(dead) or type(seq) is not int \
            or not 0 < seq < 10**10:
        return None
    return dead, seq


def _describe(t: MoveTask) -> dict[str, Any]:
    out: dict[str, Any] = {"TaskHandle": _handle(t), "Status": t.status,
                           "SourceArn": t.source_arn,
                           "ApproximateNumberOfMessagesMoved": t.moved,
                           "ApproximateNumberOfMessagesToMove": t.to_move,
                           "StartedTimestamp": t.started_ms}
    if t.destination_arn:
        out["DestinationArn"] = t.destination_arn
    if t.rate:
        out["MaxNumberOfMessagesPerSecond"] = t.rate
    if t.failure:
        out["FailureReason"] = t.failure
    return out
