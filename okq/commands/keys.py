"""API keys: keys create|list|delete (an admin's key, or an operator's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from okq.commands.context import Ctx, emit, out, run
from okq.commands.tables import keys_table

if TYPE_CHECKING:
    from okq.client import Client


@click.group()
def keys() -> None:
    """Make, list and delete API keys of a namespace (docs/SECURITY.md)."""


@keys.command("create")
@click.option("--role", required=True,
              type=click.Choice(["admin", "producer", "consumer", "read-only"]),
              help="what the key may do")
@click.option("--prefix", "prefixes", multiple=True,
              help="a queue-name prefix the key acts on (repeat; none: every queue)")
@click.option("--name", default="", help="a label: who or what holds the key")
@run
async def keys_create(ctx: Ctx, c: Client, role: str, prefixes: tuple[str, ...],
                      name: str) -> None:
    """Make a key; prints it once (only its hash is kept)."""
    made = await c.create_key(role, prefixes, name)

    def text() -> None:
        out.print(made.key)
        out.print(f"id {made.id}, {made.role} in namespace {made.namespace}; keep the key "
                  "now: it is not shown again", style="dim")

    emit(ctx, made, text)


@keys.command("list")
@run
async def keys_list(ctx: Ctx, c: Client) -> None:
    """The namespace's keys (never their secrets)."""
    found = await c.list_keys()
    emit(ctx, found, lambda: out.print(keys_table(found)))


@keys.command("delete")
@click.argument("key_id")
@run
async def keys_delete(ctx: Ctx, c: Client, key_id: str) -> None:
    """Delete a key: every node refuses it within --api-key-cache seconds."""
    deleted = await c.delete_key(key_id)
    emit(ctx, {"id": key_id, "deleted": deleted},
         lambda: out.print(f"deleted {key_id}" if deleted else f"no key {key_id}"))
