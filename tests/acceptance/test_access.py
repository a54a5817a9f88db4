"""Access control against a real ``okq serve`` node started with an operator key.

One node (file store, ``--api-keys OPERATOR --api-key-cache 0.5``) serves every
test of the file, in several namespaces at once. Requests go over plain HTTP with
JSON bodies, so each test reads the status and the error body a client reads.

- **Roles**: every ``/v1`` endpoint is called with a key of each role. The table of
  what each role may call is written out here from docs/SECURITY.md, not imported
  from ``okq.auth``: a change to the code's table fails here until it is meant.
  An allowed call must succeed (2xx) on state prepared for it; a refused one is
  403 ``forbidden`` and leaves the queue, the queue list and the key list as they
  were.
- **Keys**: no key, a malformed, unknown, tampered or deleted key: 401.
- **Namespaces**: a key of one namespace neither sees nor changes another's
  queues, items, deliveries or keys, in both directions, on the one node.
- **Prefixes**: a key limited to ``orders-`` acts on those queues only, including
  a completion's outputs, a dead-letter queue, and the keys it makes.
- **Storage**: the store keeps a key's hash, never its secret.
- **The CLI** makes, lists and deletes keys.
- **The fleet's internal endpoint** opens to the fleet's signature only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest

from okq.fleetwire import FORWARD_VERSION, SIGNATURE_HEADER, sign
from okq.ops import Produce, to_wire
from okq.publisher import NewItem
from okq.server.routes import ROUTES
from tests import cliforks
from tests.nodes import KEYS, Node, okq_node

OPERATOR = f"operator-{secrets.token_urlsafe(24)}"
CACHE = 0.5  # --api-key-cache: seconds a node remembers a key it looked up
KEY_RE = re.compile(r"okq_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")

# -- the expected table (docs/SECURITY.md, "The roles") ------------------------------

OPS = (
    "queue.produce", "queue.lease", "queue.renew", "queue.complete", "queue.retry",
    "queue.stats", "queue.purge", "queues.create", "queues.list", "queues.info",
    "queues.update", "queues.delete", "items.list", "dead.redrive", "keys.create",
    "keys.list", "keys.delete", "auth.whoami", "fleet.status",
)
READS = frozenset({"queue.stats", "queues.list", "queues.info", "items.list", "auth.whoami",
                   "fleet.status"})
MAY: dict[str, frozenset[str]] = {
    "admin": frozenset(OPS),
    "producer": READS | {"queue.produce"},
    "consumer": READS | {"queue.lease", "queue.renew", "queue.complete", "queue.retry"},
    "read-only": READS,
}
#: Operations whose call needs a delivery's token, leased before the call.
NEEDS_TOKEN = frozenset({"queue.renew", "queue.complete", "queue.retry"})
#: The status of a successful call (201 for what it creates).
CREATED = frozenset({"queues.create", "keys.create"})


# -- talking to the node ----------------------------------------------------------------


@dataclass
class Answer:
    status: int
    body: Any

    @property
    def code(self) -> str | None:
        return self.body.get("code") if isinstance(self.body, dict) else None

    @property
    def field(self) -> str | None:
        details = self.body.get("details") if isinstance(self.body, dict) else None
        return details.get("field") if isinstance(details, dict) else None


def post(url: str, path: str, data: bytes, headers: dict[str, str]) -> Answer:
    """POST ``data``; the status and the body (JSON when it parses, else bytes)."""
    req = urllib.request.Request(url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            status, raw = exc.code, exc.read()
    try:
        return Answer(status, json.loads(raw) if raw else None)
    except ValueError:
        return Answer(status, raw)


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


@dataclass
class Api:
    """``call(op, body)`` as one caller: its key (None: none) and namespace header."""

    url: str
    key: str | None = None
    namespace: str | None = None

    def call(self, op: str, body: dict[str, Any]) -> Answer:
        headers = {"Content-Type": "application/json"}
        if self.key is not None:
            headers["Authorization"] = f"Bearer {self.key}"
        if self.namespace is not None:
            headers["X-Okq-Namespace"] = self.namespace
        return post(self.url, f"/v1/{op}", json.dumps(body).encode(), headers)

    def ok(self, op: str, body: dict[str, Any]) -> Any:
        """The body of a call that must succeed."""
        answer = self.call(op, body)
        assert 200 <= answer.status < 300, f"{op} {body}: {answer}"
        return answer.body

    def as_(self, key: str | None, namespace: str | None = None) -> Api:
        return Api(self.url, key, namespace)

    def make_key(self, role: str, prefixes: list[str] | None = None) -> tuple[str, str]:
        """(key, id) of a new key of this caller's namespace."""
        made = self.ok("keys.create", {"role": role, "prefixes": prefixes or [],
                                       "name": f"test {role}"})
        return made["key"], made["id"]

    def seed(self, queue: str, items: list[str], **settings: Any) -> None:
        self.ok("queues.create", {"name": queue, **settings})
        if items:
            self.ok("queue.produce", {"queue_name": queue,
                                      "items": [{"utf8": i} for i in items]})

    def lease_one(self, queue: str) -> dict[str, Any]:
        items = self.ok("queue.lease", {"queue_name": queue, "batch_size": 1})["items"]
        assert len(items) == 1, f"nothing to lease in {queue}"
        item: dict[str, Any] = items[0]
        return item

    def stats(self, queue: str) -> dict[str, Any]:
        """Counts by state (without the oldest item's age, which moves with time)."""
        found: dict[str, Any] = self.ok("queue.stats", {"queue_name": queue})
        found.pop("oldest_age", None)
        return found

    def queue_names(self) -> list[str]:
        return sorted(q["name"] for q in self.ok("queues.list", {})["queues"])

    def key_ids(self) -> list[str]:
        return sorted(k["id"] for k in self.ok("keys.list", {})["keys"])


def refused(answer: Answer, field: str | None = None) -> None:
    """A 403 ``forbidden`` (naming ``field`` when given)."""
    assert answer.status == 403 and answer.code == "forbidden", answer
    if field is not None:
        assert answer.field == field, answer


@dataclass
class Served:
    node: Node
    store: Path

    @property
    def operator(self) -> Api:
        return Api(self.node.url, OPERATOR)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("access")
    store = tmp / "store"
    extra = ["--api-keys", OPERATOR, "--api-key-cache", str(CACHE), "--max-wait", "2"]
    with okq_node(f"file://{store}", tmp, extra=extra) as node:
        yield Served(node, store)
    assert "Traceback" not in node.output(), node.output()[-4000:]


@pytest.fixture(scope="module")
def role_keys(served: Served) -> dict[str, str]:
    """A key of each role in the node's own namespace, every queue."""
    return {role: served.operator.make_key(role)[0] for role in MAY}


# -- roles ------------------------------------------------------------------------------


def test_the_table_covers_every_endpoint() -> None:
    """A new endpoint fails here until its row of the table is written."""
    assert {r.path.removeprefix("/v1/") for r in ROUTES} == set(OPS)


@dataclass
class Cell:
    """State prepared by the operator for one (role, operation) call."""

    queue: str
    dead: str
    token: str
    victim: str  # the id of a key to delete


def prepare(admin: Api, role: str, op: str) -> Cell:
    queue = f"m-{role}-{op}"
    dead = f"{queue}-dead"
    admin.seed(dead, [])
    admin.seed(queue, ["one", "two", "three"], dead_queue=dead, max_attempts=3)
    token = admin.lease_one(queue)["token"] if op in NEEDS_TOKEN else ""
    victim = admin.make_key("read-only")[1]
    return Cell(queue, dead, token, victim)


def body_of(op: str, c: Cell) -> dict[str, Any]:
    bodies: dict[str, dict[str, Any]] = {
        "queue.produce": {"queue_name": c.queue, "items": [{"utf8": "by the role"}]},
        "queue.lease": {"queue_name": c.queue, "batch_size": 1},
        "queue.renew": {"queue_name": c.queue, "token": c.token},
        "queue.complete": {"queue_name": c.queue, "tokens": [c.token]},
        "queue.retry": {"queue_name": c.queue, "items": [{"token": c.token}]},
        "queue.stats": {"queue_name": c.queue},
        "queue.purge": {"queue_name": c.queue},
        "queues.create": {"name": f"{c.queue}-new"},
        "queues.list": {},
        "queues.info": {"name": c.queue},
        "queues.update": {"name": c.queue, "max_attempts": 7},
        "queues.delete": {"name": c.queue},
        "items.list": {"queue_name": c.queue},
        "dead.redrive": {"queue_name": c.dead},
        "keys.create": {"role": "read-only", "name": "made by the role"},
        "keys.list": {},
        "keys.delete": {"id": c.victim},
        "auth.whoami": {},
        "fleet.status": {},
    }
    return bodies[op]


def snapshot(admin: Api, c: Cell) -> tuple[Any, ...]:
    """What a refused call must leave unchanged."""
    info = admin.ok("queues.info", {"name": c.queue})
    return admin.stats(c.queue), info, admin.queue_names(), admin.key_ids()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("role", list(MAY))
def test_each_role_on_each_endpoint(served: Served, role_keys: dict[str, str], role: str,
                                    op: str) -> None:
    admin = served.operator
    cell = prepare(admin, role, op)
    before = snapshot(admin, cell)
    answer = admin.as_(role_keys[role]).call(op, body_of(op, cell))
    if op in MAY[role]:
        expected = 201 if op in CREATED else 200
        assert answer.status == expected, f"a {role} key calling {op}: {answer}"
        if op == "keys.delete":
            assert answer.body["deleted"] is True
    else:
        refused(answer)
        assert role in answer.body["message"] and op in answer.body["message"], answer
        assert snapshot(admin, cell) == before, f"a refused {op} changed something"


# -- who the caller is ------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_no_key_is_401_on_every_endpoint(served: Served, op: str) -> None:
    answer = Api(served.node.url).call(op, {"queue_name": "q", "name": "q"})
    assert answer.status == 401 and answer.code == "unauthorized", answer


def _bad_keys(real: str) -> dict[str, str]:
    """Authorization header values that name no live key."""
    m = KEY_RE.fullmatch(real)
    assert m is not None, real
    other_secret = secrets.token_urlsafe(32)
    return {
        "garbage": "Bearer not-a-key",
        "unknown id": f"Bearer okq_{secrets.token_hex(8)}_{m[2]}",
        "wrong secret": f"Bearer okq_{m[1]}_{other_secret}",
        "key cut short": f"Bearer {real[:-1]}",
        "operator key and more": f"Bearer {OPERATOR}x",
        "no scheme": real,
        "basic scheme": f"Basic {real}",
        "empty bearer": "Bearer ",
    }


def test_malformed_unknown_or_tampered_keys_are_401(served: Served,
                                                    role_keys: dict[str, str]) -> None:
    real = role_keys["admin"]
    assert Api(served.node.url, real).call("queues.list", {}).status == 200
    for what, header in _bad_keys(real).items():
        answer = post(served.node.url, "/v1/queues.list", b"{}",
                      {"Content-Type": "application/json", "Authorization": header})
        assert answer.status == 401 and answer.code == "unauthorized", (what, answer)


def test_a_deleted_key_is_401_within_the_cache_time(served: Served) -> None:
    admin = served.operator
    key, key_id = admin.make_key("consumer")
    holder = admin.as_(key)
    assert holder.call("queues.list", {}).status == 200  # now in the node's cache
    assert admin.ok("keys.delete", {"id": key_id}) == {"id": key_id, "deleted": True}
    began = time.monotonic()
    while holder.call("queues.list", {}).status != 401:
        assert time.monotonic() - began < CACHE + 3, "the deleted key still works"
        time.sleep(0.05)
    time.sleep(CACHE * 2)  # the cache forgot it again: still refused, everywhere
    for op in ("queues.list", "queue.lease", "keys.list"):
        answer = holder.call(op, {"queue_name": "q"} if op == "queue.lease" else {})
        assert answer.status == 401 and answer.code == "unauthorized", (op, answer)
    assert key_id not in admin.key_ids()
    assert admin.ok("keys.delete", {"id": key_id})["deleted"] is False


def test_health_metrics_and_openapi_are_open(served: Served) -> None:
    for path in ("/health", "/metrics", "/openapi.json"):
        status, _ = get(served.node.url + path)
        assert status == 200, path
    doc = json.loads(get(served.node.url + "/openapi.json")[1])
    assert {p.removeprefix("/v1/") for p in doc["paths"] if p.startswith("/v1/")} == set(OPS)
    assert "/v1/keys.create" in doc["paths"]


# -- namespaces ----------------------------------------------------------------------------


@dataclass
class Tenant:
    namespace: str
    admin: Api
    consumer: Api
    admin_id: str


@pytest.fixture(scope="module")
def tenants(served: Served) -> dict[str, Tenant]:
    """Two namespaces on the one node, each with an admin and a consumer key, each
    with a queue of its own and a queue named like the other's."""
    out = {}
    for ns in ("ns-a", "ns-b"):
        op = served.operator.as_(OPERATOR, ns)
        admin_key, admin_id = op.make_key("admin")
        consumer_key, _ = op.make_key("consumer")
        admin = Api(served.node.url, admin_key)
        assert admin.ok("keys.list", {})["keys"][0]["namespace"] == ns
        admin.seed(f"only-{ns}", [f"secret of {ns} {i}" for i in range(3)])
        admin.seed("shared", [f"secret of {ns} {i}" for i in range(3)])
        out[ns] = Tenant(ns, admin, Api(served.node.url, consumer_key), admin_id)
    return out


DIRECTIONS = [("ns-a", "ns-b"), ("ns-b", "ns-a")]


def _payloads(api: Api, queue: str) -> list[str]:
    return [i["utf8"] for i in api.ok("items.list", {"queue_name": queue})["items"]]


@pytest.mark.parametrize(("own", "other"), DIRECTIONS)
def test_a_key_cannot_read_another_namespace(tenants: dict[str, Tenant], own: str,
                                             other: str) -> None:
    mine, theirs = tenants[own], tenants[other]
    for them in (theirs.admin, theirs.consumer):
        names = them.queue_names()
        assert f"only-{own}" not in names and f"only-{other}" in names, names
        assert not [p for p in _payloads(them, "shared") if own in p]
        for op, body in (("queue.stats", {"queue_name": f"only-{own}"}),
                         ("items.list", {"queue_name": f"only-{own}"}),
                         ("queues.info", {"name": f"only-{own}"})):
            answer = them.call(op, body)
            assert answer.status == 404 and answer.code == "queue_not_found", (op, answer)
    assert _payloads(mine.admin, "shared") == [f"secret of {own} {i}" for i in range(3)]


@pytest.mark.parametrize(("own", "other"), DIRECTIONS)
def test_a_key_cannot_lease_or_complete_in_another_namespace(
        tenants: dict[str, Tenant], own: str, other: str) -> None:
    mine, theirs = tenants[own], tenants[other]
    queue = f"cross-{own}"
    mine.admin.seed(queue, [f"work of {own}"])
    theirs.admin.seed(queue, [])
    answer = theirs.consumer.call("queue.lease", {"queue_name": f"only-{own}"})
    assert answer.status == 404 and answer.code == "queue_not_found", answer
    assert theirs.consumer.ok("queue.lease", {"queue_name": queue})["items"] == []
    token = mine.consumer.lease_one(queue)["token"]
    before = mine.admin.stats(queue)
    assert before["in_flight"] == 1
    for op, body in (("queue.complete", {"queue_name": queue, "tokens": [token]}),
                     ("queue.renew", {"queue_name": queue, "token": token}),
                     ("queue.retry", {"queue_name": queue, "items": [{"token": token}]})):
        answer = theirs.consumer.call(op, body)
        assert 400 <= answer.status < 500, (op, answer)
        assert answer.code in {"invalid_token", "lease_lost", "forbidden"}, (op, answer)
    assert mine.admin.stats(queue) == before
    assert theirs.admin.stats(queue)["completed"] == 0
    done = mine.consumer.ok("queue.complete", {"queue_name": queue, "tokens": [token]})
    assert done["completed"] == 1


@pytest.mark.parametrize(("own", "other"), DIRECTIONS)
def test_the_namespace_header_cannot_leave_a_keys_namespace(
        tenants: dict[str, Tenant], own: str, other: str) -> None:
    mine = tenants[own]
    for api in (mine.admin, mine.consumer):
        elsewhere = Api(api.url, api.key, other)
        for op, body in (("queues.list", {}), ("queue.stats", {"queue_name": "shared"}),
                         ("queue.lease", {"queue_name": "shared"})):
            answer = elsewhere.call(op, body)
            refused(answer, "X-Okq-Namespace")  # the details name what to fix
            assert (answer.body["details"]["namespace"],
                    answer.body["details"]["key_namespace"]) == (other, own), answer
        at_home = Api(api.url, api.key, own)
        assert f"only-{own}" in at_home.queue_names()
    refused(Api(mine.admin.url, mine.admin.key, other).call(
        "keys.create", {"role": "admin"}))


@pytest.mark.parametrize(("own", "other"), DIRECTIONS)
def test_keys_of_another_namespace_are_neither_listed_nor_deleted(
        tenants: dict[str, Tenant], own: str, other: str) -> None:
    mine, theirs = tenants[own], tenants[other]
    listed = mine.admin.ok("keys.list", {})["keys"]
    assert listed and {k["namespace"] for k in listed} == {own}
    assert theirs.admin_id not in {k["id"] for k in listed}
    assert mine.admin.ok("keys.delete", {"id": theirs.admin_id})["deleted"] is False
    assert theirs.admin.call("keys.list", {}).status == 200


def test_an_operator_key_acts_where_the_header_says(served: Served,
                                                    tenants: dict[str, Tenant]) -> None:
    url = served.node.url
    for ns in tenants:
        names = Api(url, OPERATOR, ns).queue_names()
        assert f"only-{ns}" in names and not [n for n in names
                                              if n.startswith("only-") and n != f"only-{ns}"]
    own = Api(url, OPERATOR).queue_names()  # no header: the node's own namespace
    assert not [n for n in own if n.startswith("only-")], own
    Api(url, OPERATOR, "ns-c").seed("made-by-operator", ["x"])
    assert "made-by-operator" not in tenants["ns-a"].admin.queue_names()
    assert "made-by-operator" not in Api(url, OPERATOR).queue_names()
    answer = Api(url, OPERATOR, "_auth").call("queues.list", {})
    assert answer.status == 400 and answer.field == "X-Okq-Namespace", answer


def test_one_node_serves_both_namespaces(served: Served, tenants: dict[str, Tenant]) -> None:
    assert len({t.admin.url for t in tenants.values()}) == 1
    for ns in tenants:
        assert (served.store / ns / "manifests" / f"only-{ns}").is_file()
    assert served.node.proc.poll() is None


# -- queue prefixes ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def orders(served: Served) -> tuple[Api, Api, Api]:
    """(operator, an admin of orders-*, a consumer of orders-*) in namespace ns-p."""
    op = Api(served.node.url, OPERATOR, "ns-p")
    op.seed("billing", [])
    op.seed("orders-eu", ["order 1", "order 2"])
    op.seed("orders-out", [])
    admin = Api(served.node.url, op.make_key("admin", ["orders-"])[0])
    consumer = Api(served.node.url, op.make_key("consumer", ["orders-"])[0])
    return op, admin, consumer


def test_a_prefixed_key_acts_on_its_queues_only(orders: tuple[Api, Api, Api]) -> None:
    op, admin, consumer = orders
    admin.ok("queue.produce", {"queue_name": "orders-eu", "items": [{"utf8": "order 3"}]})
    assert admin.stats("orders-eu")["available"] >= 1
    billing = op.stats("billing")
    for api in (admin, consumer):
        for name, field, body in (
            ("queue.produce", "queue_name", {"queue_name": "billing",
                                             "items": [{"utf8": "x"}]}),
            ("queue.lease", "queue_name", {"queue_name": "billing"}),
            ("queue.stats", "queue_name", {"queue_name": "billing"}),
            ("items.list", "queue_name", {"queue_name": "billing"}),
            ("queues.info", "name", {"name": "billing"}),
        ):
            if name in MAY["admin" if api is admin else "consumer"]:
                refused(api.call(name, body), field)
        names = api.queue_names()
        assert names == sorted(n for n in op.queue_names() if n.startswith("orders-"))
        assert "orders-eu" in names and "billing" not in names
    for name, field, change in (
        ("queue.purge", "queue_name", {"queue_name": "billing"}),
        ("dead.redrive", "queue_name", {"queue_name": "billing"}),
        ("dead.redrive", "destination", {"queue_name": "orders-eu", "destination": "billing"}),
        ("queues.delete", "name", {"name": "billing"}),
        ("queues.update", "name", {"name": "billing", "max_attempts": 2}),
        ("queues.create", "name", {"name": "billing-2"}),
        ("queues.create", "dead_queue", {"name": "orders-x", "dead_queue": "billing"}),
        ("queues.update", "dead_queue", {"name": "orders-eu", "dead_queue": "billing"}),
    ):
        refused(admin.call(name, change), field)
    assert op.stats("billing") == billing
    assert "billing-2" not in op.queue_names() and "orders-x" not in op.queue_names()
    assert admin.ok("queues.info", {"name": "orders-eu"})["dead_queue"] is None
    assert admin.call("queues.create", {"name": "orders-us"}).status == 201


def test_whoami_tells_the_console_what_a_key_may_do(orders: tuple[Api, Api, Api]) -> None:
    _, admin, consumer = orders
    me = consumer.ok("auth.whoami", {})
    assert (me["role"], me["namespace"], me["prefixes"]) == ("consumer", "ns-p", ["orders-"])
    assert set(me["operations"]) == MAY["consumer"]
    assert set(admin.ok("auth.whoami", {})["operations"]) == set(OPS)


def test_outputs_outside_the_prefixes_are_refused(orders: tuple[Api, Api, Api]) -> None:
    op, _, consumer = orders
    token = consumer.lease_one("orders-eu")["token"]
    billing = op.stats("billing")
    answer = consumer.call("queue.complete", {
        "queue_name": "orders-eu", "tokens": [token],
        "outputs": {"queue_name": "billing", "items": [{"utf8": "leaked"}]}})
    refused(answer, "outputs.queue_name")
    assert op.stats("billing") == billing
    done = consumer.ok("queue.complete", {
        "queue_name": "orders-eu", "tokens": [token],
        "outputs": {"queue_name": "orders-out", "items": [{"utf8": "shipped"}]}})
    assert done["completed"] == 1 and len(done["output_ids"]) == 1


def test_a_prefixed_admin_makes_only_narrower_keys(orders: tuple[Api, Api, Api]) -> None:
    op, admin, _ = orders
    for wider in ([], ["billing-"], ["orders-", "billing-"], ["order"]):
        refused(admin.call("keys.create", {"role": "producer", "prefixes": wider}),
                "prefixes")
    same = admin.ok("keys.create", {"role": "producer", "prefixes": ["orders-"]})
    narrow = admin.ok("keys.create", {"role": "producer", "prefixes": ["orders-eu"]})
    assert narrow["prefixes"] == ["orders-eu"] and narrow["namespace"] == "ns-p"
    assert same["prefixes"] == ["orders-"]
    narrow_api = Api(admin.url, narrow["key"])
    narrow_api.ok("queue.produce", {"queue_name": "orders-eu", "items": [{"utf8": "n"}]})
    refused(narrow_api.call("queue.produce", {"queue_name": "orders-us",
                                              "items": [{"utf8": "n"}]}), "queue_name")
    wide_key, wide_id = op.make_key("read-only")
    listed = {k["id"] for k in admin.ok("keys.list", {})["keys"]}
    assert narrow["id"] in listed and same["id"] in listed and wide_id not in listed
    refused(admin.call("keys.delete", {"id": wide_id}), "id")
    assert Api(admin.url, wide_key).call("queues.list", {}).status == 200
    assert admin.ok("keys.delete", {"id": narrow["id"]})["deleted"] is True


# -- keys at rest --------------------------------------------------------------------------


def test_keys_are_stored_as_hashes(served: Served) -> None:
    key, key_id = served.operator.make_key("producer", ["hashed-"])
    m = KEY_RE.fullmatch(key)
    assert m is not None and m[1] == key_id
    secret = m[2]
    stored = (served.store / "_auth" / "keys" / key_id).read_bytes()
    assert hashlib.sha256(secret.encode()).hexdigest().encode() in stored
    assert secret.encode() not in stored and key.encode() not in stored
    for path in served.store.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert secret not in served.node.output()


# -- the CLI ------------------------------------------------------------------------------


def okq(served: Served, *args: str, key: str | None = OPERATOR) -> subprocess.CompletedProcess[str]:
    auth = ["--api-key", key] if key is not None else []
    return cliforks.run(["--url", served.node.url, *auth, *args], env=os.environ, timeout=60)


def test_the_cli_makes_lists_and_deletes_keys(served: Served) -> None:
    made = okq(served, "keys", "create", "--role", "producer", "--prefix", "jobs-")
    assert made.returncode == 0, made.stderr
    key = made.stdout.splitlines()[0].strip()
    m = KEY_RE.fullmatch(key)
    assert m is not None, made.stdout
    served.operator.seed("jobs-1", [])
    produced = okq(served, "produce", "jobs-1", "hello", key=key)
    assert produced.returncode == 0, produced.stderr
    assert served.operator.stats("jobs-1")["available"] == 1
    leased = okq(served, "lease", "jobs-1", key=key)
    assert leased.returncode != 0 and "may not call queue.lease" in leased.stderr, leased
    assert served.operator.stats("jobs-1")["available"] == 1
    listed = okq(served, "-o", "json", "keys", "list")
    assert listed.returncode == 0, listed.stderr
    mine = [k for k in json.loads(listed.stdout) if k["id"] == m[1]]
    assert mine and mine[0]["role"] == "producer" and mine[0]["prefixes"] == ["jobs-"]
    assert m[2] not in listed.stdout and "key" not in mine[0]
    deleted = okq(served, "keys", "delete", m[1])
    assert deleted.returncode == 0 and m[1] in deleted.stdout, deleted
    assert m[1] not in served.operator.key_ids()
    time.sleep(CACHE + 0.3)
    gone = okq(served, "produce", "jobs-1", "again", key=key)
    assert gone.returncode != 0 and "--api-key" in gone.stderr, gone


def test_the_cli_makes_keys_in_the_namespace_it_names(served: Served) -> None:
    made = okq(served, "--namespace", "ns-cli", "-o", "json", "keys", "create", "--role",
               "admin")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["namespace"] == "ns-cli"
    no_key = okq(served, "keys", "list", key=None)
    assert no_key.returncode != 0 and "--api-key" in no_key.stderr, no_key


# -- the fleet's internal endpoint ------------------------------------------------------------


def _forward_body(url: str, to: str = "") -> bytes:
    """A well-formed forward: produce one item to ``fwd``, meant for node ``to``."""
    op = to_wire(Produce("fwd", [NewItem(b"forwarded")]))
    body: bytes = msgpack.packb({"v": FORWARD_VERSION, "ns": "default", "to": to, "seq": 1,
                                 "op": op, "rid": "test-1", "from": "test", "url": url})
    return body


def test_the_forward_endpoint_is_closed_without_sequencer_mode(served: Served) -> None:
    answer = post(served.node.url, "/internal/v1/forward", _forward_body(served.node.url),
                  {"Content-Type": "application/msgpack", "Authorization": f"Bearer {OPERATOR}"})
    assert answer.status >= 400 and answer.status < 500, answer


def test_the_forward_endpoint_needs_the_fleet_signature(tmp_path: Path) -> None:
    extra = ["--api-keys", OPERATOR, "--sequencer"]
    with okq_node(f"file://{tmp_path / 'store'}", tmp_path, extra=extra) as node:
        Api(node.url, OPERATOR).seed("fwd", [])
        with urllib.request.urlopen(f"{node.url}/health", timeout=10) as resp:
            node_id = str(json.load(resp)["node"])
        body = _forward_body(node.url, node_id)
        plain = {"Content-Type": "application/msgpack"}
        for what, headers in {
            "no signature": plain,
            "operator key": {**plain, "Authorization": f"Bearer {OPERATOR}"},
            "another key's signature": {**plain, SIGNATURE_HEADER: sign(b"x" * 32, body)},
            "an old signature": {**plain, SIGNATURE_HEADER: sign(KEYS.encode(), body,
                                                                 time.time() - 3600)},
            "garbage": {**plain, SIGNATURE_HEADER: "signed, honestly"},
        }.items():
            answer = post(node.url, "/internal/v1/forward", body, headers)
            assert answer.status == 401, (what, answer)
        assert Api(node.url, OPERATOR).stats("fwd")["available"] == 0
        signed = post(node.url, "/internal/v1/forward", body,
                      {**plain, SIGNATURE_HEADER: sign(KEYS.encode(), body)})
        assert signed.status == 200, signed  # the control: the fleet's own signature works
        assert Api(node.url, OPERATOR).stats("fwd")["available"] == 1
