"""The ``okq`` commands that talk to a node: items, queues, stats, dead letters,
export / import and shell workers.

Every command takes the group's ``--output json`` for scripts, exits non-zero
with a one-line message on errors, and never shows a traceback for a user
mistake (a bad flag, a missing queue, an unreachable node).

``context`` holds what they share (the context, output, errors), ``tables`` how
they show things; ``items``, ``queues`` and ``export_import`` the commands.
"""

from __future__ import annotations

import click

from okq.commands.context import Ctx
from okq.commands.export_import import export_, import_
from okq.commands.items import complete, items, lease, produce, retry, work
from okq.commands.keys import keys
from okq.commands.queues import dead, queues, stats

__all__ = ["Ctx", "register"]


def register(group: click.Group) -> None:
    for cmd in (produce, lease, complete, retry, queues, stats, items, dead, export_,
                import_, work, keys):
        group.add_command(cmd)
