"""deploy/ holds together, checked statically: no Docker and no cluster are needed.

Docker cannot run here, so the compose file, the nginx, Prometheus and Grafana
configuration and the Helm chart are checked as files: every YAML file parses and
passes yamllint; every ``OKQ_*`` variable they set is a setting okq or the
compactor really reads, with a value the real ``Settings`` accepts; the dashboard
queries only metrics okq's code exports; nginx and Prometheus name exactly the
compose node services. The chart is rendered twice when Helm's Go SDK is
installed (``helm-python-sdk``): by Helm itself, and by the small subset renderer
below, which knows only the template constructs the chart uses and fails on any
other; the two must agree. Debian's ``nginx -t`` and ``promtool`` check the
nginx configuration, the Prometheus configuration and every dashboard query when
they are installed.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import secrets
import shutil
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from compactor import cli as compactor_cli
from compactor.cli import Metrics as CompactorMetrics
from okq.server.health import PROBE_TIMEOUT
from okq.server.metrics import Metrics as NodeMetrics
from okq.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "okq"
COMPOSE = DEPLOY / "docker-compose.yml"
NGINX = DEPLOY / "nginx" / "nginx.conf"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
PROVISIONING = DEPLOY / "grafana" / "provisioning"

#: Metrics issue 10 names for the sequencer, which the lead's sequencer work adds to
#: the node; until they are in the code the dashboard may already chart them.
SEQUENCER_METRICS = frozenset({"okq_sequencer_roles", "okq_sequencer_forwards_total"})
#: A signing key for rendering and validation only (never used to sign anything).
TEST_KEY = secrets.token_hex(16)
ENV_NAME = re.compile(r"\bOKQ_[A-Z0-9_]*[A-Z0-9]\b")


def load_yaml(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


# -- the settings okq and the compactor read --------------------------------------------


def env_prefix() -> str:
    return str(Settings.model_config.get("env_prefix", ""))


def node_settings() -> frozenset[str]:
    """Every field of ``Settings`` as its environment variable: what a node reads."""
    return frozenset(env_prefix() + name.upper() for name in Settings.model_fields)


def compactor_settings() -> frozenset[str]:
    """What the compactor uses: the Settings fields it has flags for, plus any other
    variable its options document (``--metrics-host`` falls back to OKQ_HOST)."""
    names = {env_prefix() + name.upper() for name in compactor_cli.SETTINGS}
    for param in compactor_cli.main.params:
        names.update(ENV_NAME.findall(getattr(param, "help", None) or ""))
    return frozenset(names)


def test_the_allowed_sets_come_from_the_code() -> None:
    nodes, compactor = node_settings(), compactor_settings()
    assert {"OKQ_STORE", "OKQ_SEQUENCER", "OKQ_ADVERTISE_URL"} <= nodes
    assert "OKQ_STORE" in compactor
    assert "OKQ_SEQUENCER" not in compactor
    assert compactor <= nodes  # the compactor reads them through the same Settings


def validated(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Build the real ``Settings`` from exactly ``env``, as a process would."""
    with monkeypatch.context() as m:
        for name in list(os.environ):
            if name.startswith(env_prefix()):
                m.delenv(name)
        for name, value in env.items():
            m.setenv(name, value)
        settings = Settings()
        if settings.signing_keys is not None:
            settings.keys()  # valid signing keys: 16+ characters each
        return settings


def test_every_okq_name_in_deploy_is_a_setting() -> None:
    """Every OKQ_* name anywhere under deploy/ (files, comments, README) is real."""
    known = node_settings() | compactor_settings()
    unknown = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted(DEPLOY.rglob("*")) if path.is_file()
        for name in ENV_NAME.findall(path.read_text())
        if name not in known
    }
    assert not unknown, sorted(unknown)


# -- YAML everywhere ----------------------------------------------------------------------


def yaml_files() -> list[Path]:
    """Every YAML file under deploy/ except the chart's templates (rendered below)."""
    templates = CHART / "templates"
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in {".yml", ".yaml"}
                  and templates not in p.parents)


YAMLLINT_CONFIG = """
extends: default
rules:
  line-length: {max: 120}
  document-start: disable
  truthy: {check-keys: false}
  comments: {min-spaces-from-content: 1}
  indentation: {indent-sequences: consistent}
"""


def yamllint_problems(text: str) -> list[str]:
    from yamllint import linter  # type: ignore[import-untyped]
    from yamllint.config import YamlLintConfig  # type: ignore[import-untyped]

    config = YamlLintConfig(YAMLLINT_CONFIG)
    return [f"{p.line}:{p.column} {p.level} {p.message} ({p.rule})"
            for p in linter.run(text, config) if p.level == "error"]


def test_there_is_yaml_to_check() -> None:
    names = {p.relative_to(DEPLOY).as_posix() for p in yaml_files()}
    assert {"docker-compose.yml", "prometheus/prometheus.yml", "helm/okq/values.yaml",
            "helm/okq/Chart.yaml"} <= names
    assert any(n.startswith("grafana/provisioning/datasources/") for n in names)
    assert any(n.startswith("grafana/provisioning/dashboards/") for n in names)


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_yaml_parses_and_lints(path: Path) -> None:
    assert load_yaml(path), f"{path} holds no YAML document"
    problems = yamllint_problems(path.read_text())
    assert not problems, problems


# -- docker-compose.yml ---------------------------------------------------------------------

INTERPOLATION = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` gives its default; ``${VAR:?message}`` (a value the
    user must give) gets a test value; ``$$`` is a dollar sign."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.groups()
        if op == "-":
            return arg
        if op == "?":
            return TEST_KEY
        raise AssertionError(f"${{{name}}} has neither a default nor an error message")

    return INTERPOLATION.sub(one, value).replace("$$", "$")


@cache
def compose() -> dict[str, Any]:
    [doc] = load_yaml(COMPOSE)
    assert isinstance(doc, dict)
    return doc


def service_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): interpolate(str(v)) for k, v in env.items()}


def is_okq(service: dict[str, Any]) -> bool:
    build = service.get("build") or {}
    return isinstance(build, dict) and build.get("dockerfile") == "deploy/Dockerfile"


def is_compactor(service: dict[str, Any]) -> bool:
    return "okq-compactor" in json.dumps([service.get("entrypoint"), service.get("command")])


def okq_services(compactors: bool) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose()["services"].items()
            if is_okq(s) and is_compactor(s) == compactors}


def test_compose_has_three_sequencer_nodes_and_a_compactor() -> None:
    nodes = okq_services(compactors=False)
    assert len(nodes) == 3
    assert len(okq_services(compactors=True)) == 1
    for name, service in nodes.items():
        env = service_env(service)
        assert env["OKQ_SEQUENCER"] == "true"
        port = env.get("OKQ_PORT", str(Settings.model_fields["port"].default))
        assert env["OKQ_ADVERTISE_URL"] == f"http://{name}:{port}"


def test_compose_sets_only_real_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes may set any Settings field; the compactor only what it uses; the other
    services none. Every okq service's environment passes the real Settings."""
    stores = set()
    for name, service in compose()["services"].items():
        env = service_env(service)
        okq_vars = {k for k in env if k.startswith(env_prefix())}
        if not is_okq(service):
            assert not okq_vars, f"{name} is no okq service but sets {okq_vars}"
            continue
        allowed = compactor_settings() if is_compactor(service) else node_settings()
        assert okq_vars <= allowed, f"{name}: not settings: {okq_vars - allowed}"
        settings = validated(env, monkeypatch)
        if not is_compactor(service):
            assert settings.signing_keys is not None, f"{name}: no signing keys"
        stores.add((settings.store, settings.endpoint_url, settings.namespace))
    assert len(stores) == 1, f"the okq services disagree on their store: {stores}"


def test_compose_nodes_wait_for_the_bucket() -> None:
    services = compose()["services"]
    [maker] = [n for n, s in services.items() if "mc mb" in json.dumps(s.get("entrypoint"))]
    for name, service in {**okq_services(False), **okq_services(True)}.items():
        assert service["depends_on"][maker]["condition"] == "service_completed_successfully", name


def test_dockerfile_installs_the_project() -> None:
    """The image copies what ``pip install .`` needs (pyproject's readme and every
    package it finds) and runs a node, as the compose file and the chart expect."""
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    copied = {word for line in re.findall(r"^COPY (.+)$", text, re.M)
              for word in line.split()[:-1]}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert {"pyproject.toml", project["project"]["readme"], *packages} <= copied
    assert all((ROOT / name).exists() for name in copied)
    assert re.search(r"pip install \.", text)
    entry = re.search(r"^ENTRYPOINT (.+)$", text, re.M)
    assert entry is not None
    assert json.loads(entry.group(1)) == ["okq", "serve", "--host", "0.0.0.0"]
    assert {"okq", "okq-compactor"} <= set(project["project"]["scripts"])


# -- nginx ----------------------------------------------------------------------------------


def nginx_directives(name: str) -> list[str]:
    text = re.sub(r"#.*", "", NGINX.read_text())
    return [m.strip() for m in re.findall(rf"^\s*{name}\s+([^;{{}}]+);", text, re.M)]


def test_nginx_balances_the_compose_nodes_round_robin() -> None:
    servers = {s.split()[0] for s in nginx_directives("server")}
    nodes = {f"{n}:{service_env(s).get('OKQ_PORT', Settings.model_fields['port'].default)}"
             for n, s in okq_services(compactors=False).items()}
    assert servers == nodes
    for sticky in ("ip_hash", "hash", "sticky", "least_conn", "random"):
        assert not nginx_directives(sticky), f"{sticky}: the balancing must be round-robin"


def size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    match = re.fullmatch(r"(\d+)([kmg]?)", text.lower())
    assert match is not None, text
    return int(match.group(1)) * units[match.group(2)]


def test_nginx_limits_match_the_node_defaults() -> None:
    fields = Settings.model_fields
    [body] = nginx_directives("client_max_body_size")
    assert size(body) == fields["max_body_bytes"].default
    reads = [int(r.removesuffix("s")) for r in nginx_directives("proxy_read_timeout")]
    assert max(reads) > fields["max_wait"].default  # a lease's long poll
    assert min(reads) <= 5  # other calls: a node that does not answer is left out soon
    [retry] = nginx_directives("proxy_next_upstream")
    assert set(retry.split()) == {"error", "timeout"}  # never non_idempotent: no POST replays


def test_nginx_serves_no_internal_endpoint() -> None:
    """Nodes forward to each other directly: clients never reach /internal/."""
    text = NGINX.read_text()
    block = text[text.index("location /internal/"):]
    assert block[:block.index("}")].split("{")[1].split() == ["return", "404;"]


def test_nginx_accepts_the_config(tmp_path: Path) -> None:
    """Debian's ``nginx -t`` on the config, the compose host names mapped to loopback."""
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    if nginx is None:
        pytest.skip("nginx is not installed (Debian package nginx)")
    conf = tmp_path / "nginx.conf"
    conf.write_text(re.sub(r"server\s+\w+:", "server 127.0.0.1:", NGINX.read_text()))
    result = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(conf), "-g", f"pid {tmp_path}/nginx.pid;"],
        capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


# -- Prometheus -----------------------------------------------------------------------------


def scrape_targets(job_filter: Callable[[str], bool]) -> set[str]:
    [config] = load_yaml(PROMETHEUS)
    return {t for job in config["scrape_configs"] if job_filter(job["job_name"])
            for static in job.get("static_configs", []) for t in static["targets"]}


def test_prometheus_scrapes_every_node_and_the_compactor() -> None:
    nodes = {f"{n}:{service_env(s).get('OKQ_PORT', Settings.model_fields['port'].default)}"
             for n, s in okq_services(compactors=False).items()}
    assert scrape_targets(lambda job: "node" in job) == nodes
    [(name, compactor)] = okq_services(compactors=True).items()
    command = compactor["command"]
    port = command[command.index("--metrics-port") + 1]
    assert scrape_targets(lambda job: "compactor" in job) == {f"{name}:{port}"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    return path


def test_promtool_accepts_the_config() -> None:
    result = subprocess.run([promtool(), "check", "config", "--syntax-only", str(PROMETHEUS)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# -- Grafana --------------------------------------------------------------------------------


def dashboards() -> list[dict[str, Any]]:
    found = [json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))]
    assert found, "no dashboard"
    return found


def queries() -> list[str]:
    return [t["expr"] for d in dashboards() for p in d["panels"] for t in p.get("targets", [])]


def exposed(name: str, kind: str) -> set[str]:
    """The sample names a metric family shows in the Prometheus text format."""
    base = name.removesuffix("_total")
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
                "summary": ["", "_sum", "_count"]}.get(kind, [""])
    return {base + s for s in suffixes}


KINDS = {"Counter": "counter", "CounterMetricFamily": "counter", "Gauge": "gauge",
         "GaugeMetricFamily": "gauge", "Histogram": "histogram",
         "HistogramMetricFamily": "histogram", "Summary": "summary",
         "SummaryMetricFamily": "summary", "Info": "info", "Enum": "stateset"}


def literal_metrics(root: Path) -> Iterator[tuple[str, str]]:
    """(name, kind) of every metric built with a literal name in the code under root."""
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            first = node.args[0]
            if (called in KINDS and isinstance(first, ast.Constant)
                    and isinstance(first.value, str) and first.value.startswith("okq_")):
                yield first.value, KINDS[called]


@cache
def code_metrics() -> frozenset[str]:
    """Every sample name okq's nodes and the compactor export: their registries, plus
    the families built at scrape time (found in the source)."""
    families = [(f.name, f.type) for m in (NodeMetrics(), CompactorMetrics())
                for f in m.registry.collect()]
    families += [pair for pkg in ("okq", "compactor") for pair in literal_metrics(ROOT / pkg)]
    return frozenset(n for name, kind in families for n in exposed(name, kind))


def test_code_metrics_are_found() -> None:
    names = code_metrics()
    assert {"okq_items_total", "okq_http_request_seconds_bucket", "okq_queue_items",
            "okq_store_requests_total", "okq_cas_conflicts_total",
            "okq_compactor_passes_total"} <= names


def test_dashboard_queries_only_real_metrics() -> None:
    used = {m for q in queries() for m in re.findall(r"\bokq_\w+", q)}
    unknown = used - code_metrics() - SEQUENCER_METRICS
    assert not unknown, f"metrics no code exports: {sorted(unknown)}"
    wanted = ["okq_queue_items", "okq_items_total", "okq_http_request_seconds_bucket",
              "okq_store_requests_total", "okq_cas_conflicts_total", "okq_sequencer_roles"]
    assert set(wanted) <= used


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    """Each query as a recording rule, with Grafana's $__rate_interval given a value."""
    tool = promtool()
    rules = [{"record": f"okq:dashboard:{n}", "expr": q.replace("$__rate_interval", "1m")}
             for n, q in enumerate(queries())]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([tool, "check", "rules", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_provisioning_matches_compose() -> None:
    [datasources] = load_yaml(next((PROVISIONING / "datasources").glob("*.yml")))
    uids = {d["uid"] for d in datasources["datasources"]}
    used = {p["datasource"]["uid"] for d in dashboards() for p in d["panels"]}
    assert used <= uids
    [providers] = load_yaml(next((PROVISIONING / "dashboards").glob("*.yml")))
    paths = {p["options"]["path"] for p in providers["providers"]}
    mounts = dict(v.rsplit(":", 2)[:2] for v in compose()["services"]["grafana"]["volumes"])
    assert mounts["./grafana/dashboards"] in paths
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"


# -- the Helm chart: a subset renderer ------------------------------------------------------


class Unsupported(AssertionError):
    """The chart uses a template construct the subset renderer does not know."""


def _quote(value: Any) -> str:
    return json.dumps("" if value is None else str(value))


def _required(message: str, value: Any) -> Any:
    if value in (None, ""):
        raise ValueError(message)
    return value


def _to_yaml(value: Any) -> str:
    return str(yaml.safe_dump(value, default_flow_style=False)).rstrip("\n")


def _nindent(width: int, text: str) -> str:
    return "\n" + "\n".join(" " * width + line if line else line for line in text.split("\n"))


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quote": _quote,
    "required": _required,
    "default": lambda fallback, value: value if value not in (None, "") else fallback,
    "toYaml": _to_yaml,
    "nindent": _nindent,
    "trunc": lambda n, text: str(text)[:n],
    "trimSuffix": lambda suffix, text: str(text).removesuffix(suffix),
    "printf": lambda fmt, *args: fmt % args,
}

TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[^\s"]+')
ACTION = re.compile(r"\{\{(.*?)\}\}", re.S)


class SubsetRenderer:
    """Renders the few Go-template constructs the chart uses: value paths, ``$vars``,
    pipes into the functions above, ``include``, ``define`` and ``range $k, $v :=``
    over a map. Anything else raises ``Unsupported``."""

    def __init__(self, chart: Path, values: dict[str, Any], release: str) -> None:
        meta = load_yaml(chart / "Chart.yaml")[0]
        self.root = {
            "Values": values,
            "Chart": {"Name": meta["name"], "Version": meta["version"],
                      "AppVersion": meta.get("appVersion")},
            "Release": {"Name": release, "Namespace": "default", "Service": "Helm"},
        }
        self.defines: dict[str, str] = {}
        for helper in chart.glob("templates/_*.tpl"):
            text = self.prepare(helper.read_text())
            self.defines.update(re.findall(r'\{\{define "([^"]+)"\}\}(.*?)\{\{end\}\}', text, re.S))

    @staticmethod
    def prepare(text: str) -> str:
        """Apply ``{{-`` / ``-}}`` whitespace trimming and drop ``{{/* */}}`` comments."""
        text = re.sub(r"\s*\{\{-\s+", "{{", text)
        text = re.sub(r"\s+-\}\}\s*", "}}", text)
        text = re.sub(r"\{\{\s*", "{{", text)
        text = re.sub(r"\s*\}\}", "}}", text)
        return re.sub(r"\{\{/\*.*?\*/\}\}", "", text, flags=re.S)

    def render(self, text: str) -> str:
        return self.expand(self.prepare(text), {})

    def expand(self, text: str, scope: dict[str, Any]) -> str:
        ranges = re.compile(r"\{\{range \$(\w+), \$(\w+) := ([^}]+)\}\}(.*?)\{\{end\}\}", re.S)

        def one_range(m: re.Match[str]) -> str:
            mapping = self.value(m.group(3), scope)
            return "".join(self.expand(m.group(4), {**scope, m.group(1): k, m.group(2): v})
                           for k, v in sorted(mapping.items()))

        text = ranges.sub(one_range, text)
        return ACTION.sub(lambda m: str(self.pipeline(m.group(1), scope)), text)

    def pipeline(self, source: str, scope: dict[str, Any]) -> Any:
        commands = [TOKEN.findall(part) for part in source.split("|")]
        result = self.command(commands[0], scope, [])
        for tokens in commands[1:]:
            result = self.command(tokens, scope, [result])
        return result

    def command(self, tokens: list[str], scope: dict[str, Any], piped: list[Any]) -> Any:
        head, args = tokens[0], [self.value(t, scope) for t in tokens[1:]]
        if head == "include":
            name, context = args
            if context is not self.root:
                raise Unsupported("include with a context other than the root")
            return self.expand(self.defines[name], scope)
        if head in FUNCTIONS:
            return FUNCTIONS[head](*args, *piped)
        if piped or args:
            raise Unsupported(f"unknown function {head!r}")
        return self.value(head, scope)

    def value(self, token: str, scope: dict[str, Any]) -> Any:
        if token.startswith('"'):
            return json.loads(token)
        if token.isdigit():
            return int(token)
        if token.startswith("$"):
            return scope[token[1:]]
        if token == ".":
            return self.root
        if token.startswith("."):
            found: Any = self.root
            for part in token[1:].split("."):
                found = found.get(part) if isinstance(found, dict) else None
            return found
        raise Unsupported(f"unknown construct {token!r}")


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if both else value
    return out


OVERRIDES = {"secrets": {"signingKeys": TEST_KEY}}
RELEASE = "okq"


def render_subset(overrides: dict[str, Any]) -> dict[str, str]:
    values = merged(load_yaml(CHART / "values.yaml")[0], overrides)
    renderer = SubsetRenderer(CHART, values, RELEASE)
    return {p.name: renderer.render(p.read_text()) for p in sorted(CHART.glob("templates/*.yaml"))}


def helm() -> Any:
    try:
        return importlib.import_module("helm_python")
    except ImportError:
        pytest.skip("Helm's Go SDK is not installed (PyPI package helm-python-sdk)")


def render_helm(overrides: dict[str, Any]) -> dict[str, str]:
    with helm().Chart.load(str(CHART)) as chart:
        rendered = chart.render(overrides, name=RELEASE, namespace="default")
    return {Path(k).name: v for k, v in rendered.items() if k.endswith(".yaml")}


RENDERERS = {"subset": render_subset, "helm": render_helm}


@cache
def manifests(renderer: str) -> tuple[dict[str, Any], ...]:
    texts = RENDERERS[renderer](OVERRIDES)
    return tuple(doc for text in texts.values() for doc in yaml.safe_load_all(text) if doc)


@pytest.fixture(params=sorted(RENDERERS))
def chart(request: pytest.FixtureRequest) -> tuple[dict[str, Any], ...]:
    return manifests(request.param)


def of_kind(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return list(deployment["spec"]["template"]["spec"]["containers"])


def by_component(docs: tuple[dict[str, Any], ...], component: str) -> dict[str, Any]:
    [found] = [d for d in of_kind(docs, "Deployment")
               if d["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    return found


def pod_env(docs: tuple[dict[str, Any], ...], container: dict[str, Any]) -> dict[str, str]:
    """A container's environment as Kubernetes builds it: envFrom first, env on top,
    ``$(VAR)`` expanded from the variables before it (the pod IP is a loopback
    stand-in: the value is only parsed, never contacted)."""
    sources = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    env: dict[str, str] = {}
    for ref in container.get("envFrom", []):
        kind, key = ("ConfigMap", "configMapRef") if "configMapRef" in ref else ("Secret",
                                                                               "secretRef")
        source = sources[(kind, ref[key]["name"])]
        env.update(source.get("data") or source.get("stringData") or {})
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], var["value"])
        elif var["valueFrom"].get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[var["name"]] = "127.0.0.1"
    return env


def test_chart_has_every_object(chart: tuple[dict[str, Any], ...]) -> None:
    kinds = sorted(d["kind"] for d in chart)
    assert kinds == sorted(["Deployment", "Deployment", "Service", "Secret", "ConfigMap",
                            "PodDisruptionBudget"])
    [pdb] = of_kind(chart, "PodDisruptionBudget")
    node = by_component(chart, "node")
    labels = node["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    [service] = of_kind(chart, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert by_component(chart, "compactor")["spec"]["replicas"] == 1


def test_chart_sets_only_real_settings(chart: tuple[dict[str, Any], ...],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    [configmap] = of_kind(chart, "ConfigMap")
    assert set(configmap["data"]) <= node_settings()
    [node] = containers(by_component(chart, "node"))
    env = pod_env(chart, node)
    assert {k for k in env if k.startswith(env_prefix())} <= node_settings()
    settings = validated(env, monkeypatch)
    assert settings.signing_keys is not None
    assert settings.sequencer, "the chart turns the sequencer on by default"
    assert settings.advertise_url == f"http://127.0.0.1:{settings.port}"
    [compactor] = containers(by_component(chart, "compactor"))
    own = {v["name"] for v in compactor.get("env", []) if v["name"].startswith(env_prefix())}
    assert own <= compactor_settings()
    assert validated(pod_env(chart, compactor), monkeypatch).store == settings.store


def test_chart_probes_use_health(chart: tuple[dict[str, Any], ...]) -> None:
    [node] = containers(by_component(chart, "node"))
    for probe in ("readinessProbe", "livenessProbe"):
        assert node[probe]["httpGet"]["path"] == "/health", probe
    for deployment in of_kind(chart, "Deployment"):
        for container in containers(deployment):
            assert container["resources"]["requests"], container["name"]
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                if probe in container:
                    assert container[probe]["httpGet"]["path"] == "/health"


def test_chart_probes_drop_a_node_that_does_not_answer(
        chart: tuple[dict[str, Any], ...]) -> None:
    """A node that accepts connections but never answers leaves the Service's
    endpoints within seconds; a probe of a live node is never cut by the timeout
    (its own store request, when it makes one, is bounded below it); a store
    outage (every node 503) does not restart the fleet for two minutes."""
    [node] = containers(by_component(chart, "node"))
    ready, live = node["readinessProbe"], node["livenessProbe"]
    for probe in (ready, live):
        assert PROBE_TIMEOUT < probe["timeoutSeconds"] <= 2, probe
    hung_for = ready["periodSeconds"] * ready["failureThreshold"] + ready["timeoutSeconds"]
    assert hung_for <= 8, ready  # before: 2 x 5 s + 6 s
    assert live["periodSeconds"] * live["failureThreshold"] >= 120, live


def test_chart_pods_get_no_service_links(chart: tuple[dict[str, Any], ...]) -> None:
    """A Service called ``okq`` would inject OKQ_PORT=tcp://... into every pod of its
    namespace, which Settings would refuse: the pods turn service links off."""
    for deployment in of_kind(chart, "Deployment"):
        assert deployment["spec"]["template"]["spec"]["enableServiceLinks"] is False


def test_chart_requires_signing_keys() -> None:
    with pytest.raises(ValueError, match="signingKeys"):
        render_subset({})


def test_subset_renderer_refuses_unknown_constructs() -> None:
    renderer = SubsetRenderer(CHART, {}, RELEASE)
    with pytest.raises(Unsupported):
        renderer.render("{{ .Values.x | b64enc }}")
    with pytest.raises(Unsupported):
        renderer.render("{{ if .Values.x }}y{{ end }}")


def test_helm_renders_what_the_subset_renders() -> None:
    assert manifests("helm") == manifests("subset")


def test_helm_lint_and_required_keys() -> None:
    module = helm()
    report = module.lint(str(CHART))
    assert not report["errors"], report
    assert not [m for m in report["messages"] if m["severity"] > 1], report
    with pytest.raises(module.HelmError, match="signingKeys"):
        render_helm({})


def test_chart_version_matches_okq() -> None:
    chart = load_yaml(CHART / "Chart.yaml")[0]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
