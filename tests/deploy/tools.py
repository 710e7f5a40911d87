"""Shared pieces of the deploy/ tests: where the files are, the validators they run, and the
names of the series a real Metrics object exports.

A validator missing from this machine skips its test with the reason; where CI=true (as in
.ci/run, which installs them) it fails the test instead, so CI cannot go green unchecked.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonpatch
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from service.server.metrics import Metrics

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERT_TESTS = DEPLOY / "prometheus" / "tests" / "alerts_test.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "trident.json"
GRAFANA_PROVISIONING = DEPLOY / "grafana" / "provisioning"
K8S = DEPLOY / "k8s"
K8S_BASE = K8S / "base"
K8S_CPU = K8S / "overlays" / "cpu"
K8S_RANKS = K8S / "ranks"
SERVICE_MONITOR = K8S / "monitoring" / "servicemonitor.yaml"
KUSTOMIZATION = "kustomization.yaml"

METRIC_NAME = re.compile(r"\btrident_[A-Za-z0-9_]+")


def _missing(what: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} (required where CI=true; .ci/run installs it)")
    pytest.skip(what)


def find_binary(name: str) -> str | None:
    """The path of `name` on PATH or beside this Python (where pip puts console scripts)."""
    beside = Path(sys.executable).parent / name
    return shutil.which(name) or (str(beside) if beside.is_file() else None)


def require_binary(name: str, hint: str) -> str:
    path = find_binary(name)
    if path is None:
        _missing(f"{name} not found; {hint}")
    return path


def require_module(name: str, hint: str) -> ModuleType:
    try:
        return __import__(name)
    except ImportError:
        _missing(f"Python module {name} not importable; {hint}")
        raise  # unreachable: _missing skips or fails


def run(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run a validator; a non-zero exit fails the test with its command and output."""
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (
        f"{shlex.join(argv)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
    )
    return result


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_yaml_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def exported_series() -> set[str]:
    """Every series name Metrics() can expose: what a fresh one shows (histograms:
    _bucket/_sum/_count...), and the names of labelled families with no series yet (the RPC
    error counters appear with their first error)."""
    registry = CollectorRegistry()
    Metrics(registry)
    text = generate_latest(registry).decode()
    shown = {
        re.split(r"[{ ]", line, maxsplit=1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "gauge": ("",)}  # fmt: skip
    declared = {f"{family.name}{suffix}" for family in registry.collect()
                for suffix in suffixes.get(family.type, ("",))}  # fmt: skip
    return shown | declared


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def dashboard_targets(dashboard: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) for every query of the dashboard."""
    return [(panel, target) for panel in dashboard["panels"] for target in panel["targets"]]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    return instructions


def final_stage() -> dict[str, list[str]]:
    """The Dockerfile's last stage (the image): INSTRUCTION -> its arguments, in order."""
    instructions = dockerfile_instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    stage: dict[str, list[str]] = {}
    for keyword, args in instructions[last_from:]:
        stage.setdefault(keyword, []).append(args)
    return stage


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The manifests `kubectl kustomize directory` renders, for the kustomization features
    deploy/k8s uses: `resources` (files, or directories with their own kustomization) and
    `patches` of JSON 6902 operations on a target picked by kind and name. Any other field
    fails, so this twin of kustomize cannot skip what it does not know."""
    kustomization = load_yaml(directory / KUSTOMIZATION)
    known = {"apiVersion", "kind", "resources", "patches"}
    assert set(kustomization) <= known, f"{directory}: unknown {set(kustomization) - known}"
    assert kustomization["kind"] == "Kustomization"
    documents: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        path = (directory / resource).resolve()
        documents += kustomize(path) if path.is_dir() else load_yaml_all(path)
    for entry in kustomization.get("patches", []):
        assert set(entry) == {"target", "patch"} and set(entry["target"]) == {"kind", "name"}
        target = (entry["target"]["kind"], entry["target"]["name"])
        matches = [i for i, doc in enumerate(documents) if identity(doc) == target]
        assert matches, f"{directory}: nothing to patch is {target}"
        operations = jsonpatch.JsonPatch(yaml.safe_load(entry["patch"]))
        for index in matches:
            documents[index] = operations.apply(documents[index])
    return documents


def identity(doc: dict[str, Any]) -> tuple[str, str]:
    """(kind, name) of a manifest."""
    return doc["kind"], doc["metadata"]["name"]
