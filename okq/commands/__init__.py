"""The ``okq`` commands: serve (a node), fleet (a local fleet), and those that talk
to a node: items, queues, stats, dead letters, export / import, shell workers, keys.

Every client command takes the group's ``--output json`` for scripts, exits non-zero
with a one-line message on errors, and never shows a traceback for a user
mistake (a bad flag, a missing queue, an unreachable node).

``context`` holds what they share (the context, output, errors), ``tables`` how
they show things; ``items``, ``queues``, ``export_import``, ``keys``, ``serve`` and
``fleet`` the commands. Each is loaded when it is asked for (``LazyGroup``): a
command's start-up pays only for its own module.
"""

from __future__ import annotations

import importlib

import click

#: Each command's name and where it lives (module, attribute).
COMMANDS = {
    "produce": ("okq.commands.items", "produce"),
    "lease": ("okq.commands.items", "lease"),
    "complete": ("okq.commands.items", "complete"),
    "retry": ("okq.commands.items", "retry"),
    "items": ("okq.commands.items", "items"),
    "work": ("okq.commands.items", "work"),
    "queues": ("okq.commands.queues", "queues"),
    "stats": ("okq.commands.queues", "stats"),
    "dead": ("okq.commands.queues", "dead"),
    "export": ("okq.commands.export_import", "export_"),
    "import": ("okq.commands.export_import", "import_"),
    "keys": ("okq.commands.keys", "keys"),
    "serve": ("okq.commands.serve", "serve"),
    "fleet": ("okq.commands.fleet", "fleet"),
}


class LazyGroup(click.Group):
    """A group whose commands (``COMMANDS``) are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name]
            command: click.Command = getattr(importlib.import_module(module), attr)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)
