"""The Prometheus and Grafana deploy files against a real server and a real Prometheus.

A `trident serve` process (small NumPy model) and a `prometheus` process run on loopback, with
deploy/prometheus/prometheus.yml rewritten only where a test must differ from a deployment: the
`trident` job scrapes the server's metrics port, every interval is 1 s, and nothing but that job
(no other targets, no Alertmanager) is configured. Then: `trident_steps_total` rises through
Prometheus as Steps arrive, every PromQL expression of the dashboard and of the alert rules
evaluates without error, names only series the server exports, and the rules see data.

Without the `prometheus` binary the Prometheus tests skip, except where CI=true: there they fail.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import yaml
from conftest import free_port, fresh_seed, random_rollout, running_server

from service.client.client import TridentClient
from service.testing.serverproc import ServerProcess, scrape

from .tools import exported_series

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
PROMETHEUS_YML = PROMETHEUS_DIR / "prometheus.yml"
ALERTS_YML = PROMETHEUS_DIR / "alerts.yml"
DASHBOARD_JSON = ROOT / "deploy" / "grafana" / "dashboards" / "trident.json"

JOB = "trident"
DEPLOY_TARGET = "trident:9464"  # the compose service name and the default --metrics-port
INTERVAL = "1s"
STEPS = 4  # Steps sent over gRPC
READY_TIMEOUT_S = 30.0
SCRAPE_TIMEOUT_S = 30.0  # for a sample to travel server -> scrape -> query
HTTP_TIMEOUT_S = 10.0
# Grafana's built-in variables, as concrete durations (rate windows hold >= 2 scrapes at 1 s).
GRAFANA_BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__range": "1m",
    "__interval_ms": "60000",
    "__range_ms": "60000",
    "__range_s": "60",
}
# Series Prometheus makes itself, which rules and panels may name besides the server's own.
PROMETHEUS_SERIES = frozenset(
    {
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "scrape_samples_post_metric_relabeling",
        "scrape_series_added",
        "ALERTS",
        "ALERTS_FOR_STATE",
    }
)
PROMQL_KEYWORDS = frozenset(
    {
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "and",
        "or",
        "unless",
        "atan2",
        "inf",
        "nan",
    }
)
T = TypeVar("T")


# --------------------------------------------------------------------------- deploy files
@dataclass(frozen=True)
class Query:
    """One PromQL expression of the deploy files and where it comes from."""

    where: str
    expr: str


@dataclass(frozen=True)
class Deploy:
    """The parsed deploy files."""

    prometheus: dict[str, Any]
    rule_files: dict[Path, dict[str, Any]]  # relative path -> parsed YAML
    dashboard: dict[str, Any]

    def rule_queries(self) -> list[Query]:
        found = []
        for path, document in self.rule_files.items():
            for group in document.get("groups") or []:
                for rule in group.get("rules") or []:
                    name = rule.get("alert") or rule.get("record") or "?"
                    found.append(
                        Query(
                            f"{path} group {group.get('name')!r} rule {name!r}",
                            str(rule.get("expr", "")),
                        )
                    )
        return found

    def recorded_names(self) -> set[str]:
        return {
            rule["record"]
            for document in self.rule_files.values()
            for group in document.get("groups") or []
            for rule in group.get("rules") or []
            if "record" in rule
        }

    def dashboard_queries(self) -> list[Query]:
        variables = grafana_variables(self.dashboard)
        return [
            Query(f"{DASHBOARD_JSON.name}: {where}", substitute(expr, variables))
            for where, expr in expr_fields(self.dashboard, "")
        ]


def read_deploy() -> Deploy:
    """Parse the three deploy files; fail naming any that is missing or malformed."""
    missing = [
        str(p.relative_to(ROOT))
        for p in (PROMETHEUS_YML, ALERTS_YML, DASHBOARD_JSON)
        if not p.is_file()
    ]
    if missing:
        pytest.fail(f"deploy files missing: {', '.join(missing)}")
    prometheus = yaml.safe_load(PROMETHEUS_YML.read_text())
    assert isinstance(prometheus, dict), f"{PROMETHEUS_YML}: expected a YAML mapping"
    patterns = prometheus.get("rule_files") or []
    rule_files: dict[Path, dict[str, Any]] = {}
    for pattern in patterns:
        matches = sorted(PROMETHEUS_DIR.glob(pattern))
        assert matches, f"{PROMETHEUS_YML}: rule_files entry {pattern!r} matches no file"
        for path in matches:
            document = yaml.safe_load(path.read_text())
            assert isinstance(document, dict), f"{path}: expected a YAML mapping with `groups`"
            rule_files[path.relative_to(PROMETHEUS_DIR)] = document
    assert ALERTS_YML.relative_to(PROMETHEUS_DIR) in rule_files, (
        f"{PROMETHEUS_YML}: rule_files {patterns!r} does not load {ALERTS_YML.name}"
    )
    dashboard = json.loads(DASHBOARD_JSON.read_text())
    assert isinstance(dashboard, dict), f"{DASHBOARD_JSON}: expected a JSON object"
    return Deploy(prometheus, rule_files, dashboard)


def expr_fields(node: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every string `expr` field in a JSON document, with a path naming panels by title."""
    if isinstance(node, dict):
        if isinstance(node.get("title"), str):
            title = repr(node["title"])
            where = f"{where} ({title})" if where else title
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield f"{where}.expr", value
            else:
                yield from expr_fields(value, f"{where}.{key}" if where else key)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from expr_fields(item, f"{where}[{index}]")


def grafana_variables(dashboard: dict[str, Any]) -> dict[str, str]:
    """Dashboard template variables -> a value to query with (the current one, else `.*`)."""
    values = dict(GRAFANA_BUILTINS)
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        current = (variable.get("current") or {}).get("value")
        if isinstance(current, list):
            current = current[0] if len(current) == 1 else None
        usable = isinstance(current, str) and current and not current.startswith("$")
        values[variable["name"]] = current if usable else ".*"
    return values


VARIABLE = re.compile(
    r"\$\{([A-Za-z_]\w*)(?::[\w]+)?\}|\[\[([A-Za-z_]\w*)(?::[\w]+)?\]\]|\$([A-Za-z_]\w*)"
)


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Replace Grafana variables ($x, ${x}, ${x:fmt}, [[x]]) with concrete values."""

    def replace(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group)
        if name not in variables:
            raise AssertionError(
                f"Grafana variable ${name} is neither built in nor defined "
                f"in the dashboard's templating: {expr!r}"
            )
        return variables[name]

    return VARIABLE.sub(replace, expr)


# --------------------------------------------------------------------------- PromQL text
STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
NAME_MATCHER = re.compile(r"__name__\s*=\s*(\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*')")
LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
IDENTIFIER = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions (followed
    by `(`), keywords, label names (inside `{}` or by/without/on/ignoring/group_* lists),
    durations or string contents; plus exact `__name__="..."` matchers."""
    names = {match.group(1)[1:-1] for match in NAME_MATCHER.finditer(expr)}
    text = STRING.sub('""', expr)
    text = re.sub(r"#[^\n]*", "", text)  # comments
    text = re.sub(r"\{[^{}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\[\]]*\]", "", text)  # range and subquery windows
    text = LABEL_LIST.sub("", text)
    for match in IDENTIFIER.finditer(text):
        name, call = match.groups()
        if call is None and name.lower() not in PROMQL_KEYWORDS:
            names.add(name)
    return names


def measured_side(expr: str) -> str | None:
    """`X` of an expression `X <cmp> [bool] NUMBER` (comparison at the top level), else None:
    the series an alert threshold is applied to."""
    depth, quote, last = 0, "", None
    index = 0
    while index < len(expr):
        char = expr[index]
        if quote:
            if char == "\\":
                index += 1
            elif char == quote:
                quote = ""
        elif char in "\"'`":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0 and char in "<>=!":
            operator = expr[index : index + 2]
            if operator in ("==", "!=", ">=", "<="):
                last = (index, index + 2)
                index += 1
            elif char in "<>":
                last = (index, index + 1)
        index += 1
    if last is None:
        return None
    right = re.sub(r"^\s*bool\s+", "", expr[last[1] :]).strip()
    try:
        float(right)
    except ValueError:
        return None
    return expr[: last[0]].strip()


# --------------------------------------------------------------------------- processes

def local_config(deploy: dict[str, Any], metrics_port: int) -> dict[str, Any]:
    """The deployed config with the `trident` job scraping 127.0.0.1:`metrics_port` every 1 s,
    rules evaluated every 1 s, and no other jobs, Alertmanagers or remote storage."""
    config = copy.deepcopy(deploy)
    jobs = [job for job in config.get("scrape_configs") or [] if job.get("job_name") == JOB]
    assert len(jobs) == 1, f"{PROMETHEUS_YML}: expected one scrape job named {JOB!r}"
    job = jobs[0]
    static = job.get("static_configs") or []
    targets = [target for entry in static for target in entry.get("targets") or []]
    assert targets == [DEPLOY_TARGET], (
        f"{PROMETHEUS_YML}: job {JOB!r} targets {targets}, expected [{DEPLOY_TARGET!r}]"
    )
    labels = {k: v for entry in static for k, v in (entry.get("labels") or {}).items()}
    local = {"targets": [f"127.0.0.1:{metrics_port}"]}
    job["static_configs"] = [{**local, "labels": labels} if labels else local]
    job["scrape_interval"] = job["scrape_timeout"] = INTERVAL
    glob = config.setdefault("global", {}) or {}
    glob.update(scrape_interval=INTERVAL, scrape_timeout=INTERVAL, evaluation_interval=INTERVAL)
    config["global"] = glob
    config["scrape_configs"] = [job]
    for key in ("alerting", "remote_write", "remote_read"):
        config.pop(key, None)
    return config


@dataclass
class Prometheus:
    """A running `prometheus` process and its HTTP API."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def log_tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def api(self, path: str, **params: str) -> dict[str, Any]:
        """GET /api/v1/`path`: the JSON body, also for error answers (400, 422, 503)."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
                body = response.read()
        except urllib.error.HTTPError as error:
            body = error.read()
        return json.loads(body)

    def query(self, expr: str) -> dict[str, Any]:
        return self.api("query", query=expr)

    def vector(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's series; fails on an error answer or a non-vector result."""
        answer = self.query(expr)
        assert answer.get("status") == "success", f"query {expr!r} failed: {answer}"
        data = answer["data"]
        assert data["resultType"] == "vector", f"query {expr!r}: {data['resultType']} result"
        return data["result"]

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_prometheus(binary: str, config: Path, workdir: Path) -> Prometheus:
    """Start prometheus on a free loopback port and wait for /-/ready (a port lost to a race
    is retried on another)."""
    for attempt in range(3):
        port = free_port()
        log = workdir / f"prometheus-{attempt}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / f'data-{attempt}'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        prometheus = Prometheus(proc, f"http://127.0.0.1:{port}", log)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            if ready(prometheus.url):
                return prometheus
            time.sleep(0.1)
        exited = proc.poll() is not None
        prometheus.terminate()
        tail = prometheus.log_tail()
        if "address already in use" not in tail:
            break
    why = f"exited with {proc.returncode}" if exited else f"not ready in {READY_TIMEOUT_S} s"
    raise RuntimeError(f"prometheus on {prometheus.url} {why}; the end of its log:\n{tail}")


def poll(
    fetch: Callable[[], T],
    done: Callable[[T], bool],
    what: str,
    timeout: float = SCRAPE_TIMEOUT_S,
    context: Callable[[], str] = lambda: "",
) -> T:
    """`fetch()` until `done(answer)`; fail with the last answer after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        answer = fetch()
        if done(answer):
            return answer
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s; last answer: {answer!r}\n{context()}")
        time.sleep(0.25)


def scalar(series: list[dict[str, Any]]) -> float:
    """The one sample of a one-series vector (NaN when there is none)."""
    return float(series[0]["value"][1]) if len(series) == 1 else math.nan


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def deploy() -> Deploy:
    return read_deploy()


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        reason = "the `prometheus` binary is not on PATH (Debian/Ubuntu: apt install prometheus)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}, and CI must test the deploy files against it")
        pytest.skip(reason)
    return binary


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("server")) as running:
        yield running


@pytest.fixture(scope="module")
def prometheus(
    prometheus_binary: str,
    deploy: Deploy,
    server: ServerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Prometheus]:
    workdir = tmp_path_factory.mktemp("prometheus")
    config = workdir / PROMETHEUS_YML.name
    config.write_text(
        yaml.safe_dump(local_config(deploy.prometheus, server.metrics_port), sort_keys=False)
    )
    for relative, document in deploy.rule_files.items():
        local = copy.deepcopy(document)
        for group in local.get("groups") or []:
            group.pop("interval", None)  # evaluate at the global 1 s
        (workdir / relative).parent.mkdir(parents=True, exist_ok=True)
        (workdir / relative).write_text(yaml.safe_dump(local, sort_keys=False))
    running = start_prometheus(prometheus_binary, config, workdir)
    try:
        yield running
    finally:
        running.terminate()


@dataclass(frozen=True)
class Sent:
    """What the `stepped` fixture did: `trident_steps_total` as Prometheus saw it before, and
    how many Steps it then sent."""

    before: float
    steps: int


@pytest.fixture(scope="module")
def stepped(server: ServerProcess, prometheus: Prometheus) -> Sent:
    """Wait for Prometheus's first scrape, then send Steps (and an Act and a checkpoint, so
    those series move too)."""
    series = poll(
        lambda: prometheus.vector(f'trident_steps_total{{job="{JOB}"}}'),
        lambda found: len(found) == 1,
        "first scrape of trident_steps_total",
        context=prometheus.log_tail,
    )
    before = scalar(series)
    rng = np.random.default_rng(fresh_seed())
    with TridentClient(server.target, timeout_s=30) as client:
        replies = [client.step(random_rollout(rng, T=4, N=5)) for _ in range(STEPS)]
        client.act(rng.standard_normal((3, 6)).astype(np.float32))
        client.checkpoint("prometheus-test")
    assert all(reply.updates_applied > 0 for reply in replies), replies
    return Sent(before, STEPS)


# --------------------------------------------------------------------------- tests
def test_steps_total_rises_through_prometheus(
    server: ServerProcess, prometheus: Prometheus, stepped: Sent
) -> None:
    target = stepped.before + stepped.steps
    series = poll(
        lambda: prometheus.vector(f'trident_steps_total{{job="{JOB}"}}'),
        lambda found: scalar(found) >= target,
        f"trident_steps_total to reach {target} (from {stepped.before}) through Prometheus",
        context=prometheus.log_tail,
    )
    assert scalar(series) == target, series
    up = prometheus.vector(f'up{{job="{JOB}"}}')
    assert len(up) == 1, up
    assert up[0]["metric"].get("instance") == f"127.0.0.1:{server.metrics_port}", up
    assert float(up[0]["value"][1]) == 1, f"target down: {up}"


def test_every_query_evaluates(deploy: Deploy, prometheus: Prometheus, stepped: Sent) -> None:
    queries = deploy.dashboard_queries() + deploy.rule_queries()
    assert deploy.dashboard_queries(), f"{DASHBOARD_JSON}: no `expr` fields"
    assert deploy.rule_queries(), f"{ALERTS_YML}: no rules"
    failures = []
    for query in queries:
        if not query.expr.strip():
            failures.append(f"{query.where}: empty expr")
            continue
        answer = prometheus.query(query.expr)
        if answer.get("status") != "success":
            failures.append(
                f"{query.where}: {query.expr!r} -> {answer.get('errorType')}: {answer.get('error')}"
            )
    assert not failures, "queries Prometheus refused:\n" + "\n".join(failures)


def test_queries_name_only_exported_series(deploy: Deploy, server: ServerProcess) -> None:
    exported = {name for name, _ in scrape(server)}
    assert "trident_steps_total" in exported, sorted(exported)
    known = exported | exported_series() | PROMETHEUS_SERIES | deploy.recorded_names()
    failures = []
    for query in deploy.dashboard_queries() + deploy.rule_queries():
        names = metric_names(query.expr)
        if not names:
            failures.append(f"{query.where}: {query.expr!r} names no metric")
        for name in sorted(names - known):
            failures.append(f"{query.where}: {name!r} is not exported ({query.expr!r})")
    assert not failures, "\n".join(failures) + f"\nexported: {sorted(exported)}"


def test_rules_load_evaluate_and_see_data(
    deploy: Deploy, prometheus: Prometheus, stepped: Sent
) -> None:
    expected = len(deploy.rule_queries())

    def rules() -> list[dict[str, Any]]:
        answer = prometheus.api("rules")
        assert answer.get("status") == "success", answer
        return [rule for group in answer["data"]["groups"] for rule in group["rules"]]

    loaded = poll(
        rules,
        lambda found: (
            len(found) == expected and all(rule.get("health") != "unknown" for rule in found)
        ),
        f"{expected} rules loaded and evaluated once",
        context=prometheus.log_tail,
    )
    broken = [f"{r['name']}: {r.get('lastError')}" for r in loaded if r.get("health") != "ok"]
    assert not broken, "rules failing to evaluate:\n" + "\n".join(broken)

    candidates = []
    for query in deploy.rule_queries():
        candidates.append(query.expr)
        side = measured_side(query.expr)
        if side:
            candidates.append(side)

    def first_with_data() -> str | None:
        return next((expr for expr in candidates if prometheus.vector(expr)), None)

    poll(
        first_with_data,
        lambda found: found is not None,
        "a rule expression (or the measured side of its threshold) returning series "
        f"after {stepped.steps} Steps; tried {candidates}",
    )


def test_metric_names_tokenizer() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, head) (rate(trident_step_duration_seconds_bucket"
        '{job="trident", head=~"q|pi"}[1m]))) > bool 1e-3 and on (instance) group_left (x) '
        'label_replace(up offset 5m, "dst", "$1", "instance", "(.*)") unless '
        '{__name__="trident_loss"} # trident_not_a_metric'
    )
    assert metric_names(expr) == {"trident_step_duration_seconds_bucket", "up", "trident_loss"}
    assert metric_names("sum(increase(trident_steps_total[5m:1m])) without (job) == 0") == {
        "trident_steps_total"
    }
    assert measured_side('rate(x{a=">"}[5m]) > 0.5') == 'rate(x{a=">"}[5m])'
    assert measured_side("x > bool 1") == "x"
    assert measured_side("x > y") is None
    variables = grafana_variables(
        {"templating": {"list": [{"name": "job", "current": {"value": "trident"}}]}}
    )
    assert substitute('rate(a{job="$job"}[$__rate_interval])', variables) == (
        'rate(a{job="trident"}[1m])'
    )
