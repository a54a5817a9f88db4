"""The route table: every endpoint with its handler, request and response models.

The app registers it (``okq.server.app``) and the OpenAPI document is built from
it (``okq.server.openapi``); this module imports neither.
"""

from __future__ import annotations

from typing import NamedTuple

from pydantic import BaseModel

from okq import wire as s
from okq.server import console
from okq.server import handlers as h
from okq.server.middleware import Handler


class Route(NamedTuple):
    path: str
    handler: Handler
    request: type[BaseModel]
    response: type[BaseModel]
    summary: str


#: The POST endpoints of the API, and the source of the OpenAPI document.
ROUTES: list[Route] = [
    Route("/v1/queue.produce", h.produce, s.ProduceRequest, s.ProduceResponse,
          "Produce items; returns their ids once durable."),
    Route("/v1/queue.lease", h.lease, s.LeaseRequest, s.LeaseResponse,
          "Lease up to batch_size ready items; long-polls up to request_timeout."),
    Route("/v1/queue.renew", h.renew, s.RenewRequest, s.RenewResponse, "Extend a lease."),
    Route("/v1/queue.complete", h.complete, s.CompleteRequest, s.CompleteResponse,
          "Complete leased items."),
    Route("/v1/queue.retry", h.retry, s.RetryRequest, s.RetryResponse,
          "Release leased items for a retry, or dead-letter them."),
    Route("/v1/queue.stats", h.stats, s.QueueRequest, s.StatsResponse, "Counts by state."),
    Route("/v1/queue.purge", h.purge, s.QueueRequest, s.PurgeResponse, "Drop every item."),
    Route("/v1/queues.create", h.queues_create, s.QueueCreate, s.QueueInfoOut,
          "Create a queue."),
    Route("/v1/queues.list", h.queues_list, s.QueuesListRequest, s.QueuesListResponse,
          "List queues."),
    Route("/v1/queues.info", h.queues_info, s.QueueNameRequest, s.QueueInfoOut,
          "A queue's configuration."),
    Route("/v1/queues.update", h.queues_update, s.QueueUpdate, s.QueueInfoOut,
          "Change a queue's configuration; omitted fields keep their values."),
    Route("/v1/queues.delete", h.queues_delete, s.QueueNameRequest, s.DeleteResponse,
          "Delete a queue and its items."),
    Route("/v1/items.list", h.items_list, s.ItemsListRequest, s.ItemsListResponse,
          "Browse live items without leasing them."),
    Route("/v1/dead.redrive", h.dead_redrive, s.RedriveRequest, s.RedriveResponse,
          "Move dead-lettered items back to their source queues."),
    Route("/v1/keys.create", h.keys_create, s.KeyCreate, s.KeyCreated,
          "Make an API key of this namespace (admin); its secret is shown once."),
    Route("/v1/keys.list", h.keys_list, s.KeysListRequest, s.KeysListResponse,
          "The namespace's API keys, without their secrets (admin)."),
    Route("/v1/keys.delete", h.keys_delete, s.KeyDelete, s.KeyDeleteResponse,
          "Delete an API key; every node stops accepting it within --api-key-cache s."),
    Route("/v1/auth.whoami", console.whoami, console.WhoamiRequest, console.WhoamiResponse,
          "The calling key: its role, namespace, prefixes and the operations it may call."),
    Route("/v1/fleet.status", console.fleet_status, console.FleetStatusRequest,
          console.FleetStatusResponse,
          "The processes reporting in the namespace, sequencer roles, store requests and "
          "their price."),
]

#: The GET endpoints outside the API (``/openapi.json`` is added by the app).
OPERATIONS: list[tuple[str, Handler]] = [
    ("/health", h.health),
    ("/metrics", h.metrics),
]
