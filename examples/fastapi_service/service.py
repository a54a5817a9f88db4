"""A FastAPI service that hands slow work to okq: ``POST /orders`` answers at once
with the order's item id, after okq has the item durably, and a worker
(``worker.py``) does the work later. The request's tenant and trace id travel
with the item as headers.

    okq serve                                            # a node on 127.0.0.1:7878
    cd examples/fastapi_service
    uvicorn service:app --port 8000                      # this service
    curl -s localhost:8000/orders -H 'x-tenant: acme' -H 'content-type: application/json' \
         -d '{"sku": "book-42", "quantity": 2}'
    python worker.py                                     # does the work

Settings (environment): OKQ_URL (default http://127.0.0.1:7878), OKQ_API_KEY.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Header, Request
from pydantic import BaseModel, Field

from okq.client import Client

QUEUE = "orders"


class Order(BaseModel):
    sku: str = Field(min_length=1, max_length=64)
    quantity: int = Field(ge=1, le=1000)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # One client (one connection pool) for the service's life.
    async with Client(os.environ.get("OKQ_URL", "http://127.0.0.1:7878"),
                      api_key=os.environ.get("OKQ_API_KEY")) as client:
        await client.create_queue(QUEUE, exist_ok=True, max_attempts=5)
        app.state.okq = client
        yield


app = FastAPI(lifespan=lifespan)


@app.post("/orders", status_code=202)
async def place_order(order: Order, request: Request,
                      x_tenant: str = Header("public"),
                      x_trace_id: str | None = Header(None)) -> dict[str, str]:
    trace = x_trace_id or uuid.uuid4().hex
    client: Client = request.app.state.okq
    [item_id] = await client.produce(QUEUE, [{
        "payload": order.model_dump_json(),
        "headers": {"tenant": x_tenant, "trace-id": trace},
    }])
    return {"item": item_id, "trace_id": trace}
