"""deploy/ files agree with each other and with the server: ports, the checkpoint path, config
variables that load, the health check, the GPU, the drain time, the datasource uid. Plain
Python over the parsed files, so it runs everywhere (the compose checks here are the structural
fallback where no compose binary validates the file).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from service.backend.rendezvous import Topology
from service.config import ConfigError, ServerConfig, load_config
from service.lobsim.env import observation_dim

from .tools import (
    COMPOSE,
    DASHBOARD,
    DEPLOY,
    GRAFANA_PROVISIONING,
    K8S_BASE,
    K8S_CPU,
    K8S_RANKS,
    PROMETHEUS,
    dashboard_targets,
    dockerfile_instructions,
    final_stage,
    identity,
    kustomize,
    load_yaml,
)

SERVER = ServerConfig()
CHECKPOINTS = "/checkpoints"
HEALTH = ["trident", "health", "--server", f"127.0.0.1:{SERVER.port}"]


def seconds(text: str) -> float:
    """'90s', '1m30s', '2m' -> seconds (compose durations)."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, text
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def unset_default(value: str) -> str:
    """`${VAR:-default}` as compose resolves it with VAR unset."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


def assert_config_env_loads(env: dict[str, str]) -> None:
    """Every TRIDENT_SECTION__KEY names a real setting with an allowed value."""
    names = {k: v for k, v in env.items() if k.startswith("TRIDENT_")}
    assert names
    config = load_config(env=names)
    if "TRIDENT_SERVER__HOST" in names:
        assert config.server.host == "0.0.0.0"  # reachable from outside a container or pod
    if "TRIDENT_CHECKPOINT__DIR" in names:
        assert config.checkpoint.dir == CHECKPOINTS


# --- Dockerfile ----------------------------------------------------------------------------


def test_dockerfile_runtime_contract() -> None:
    values = final_stage()
    env = dict(item.split("=", 1) for args in values["ENV"] for item in shlex.split(args))
    assert_config_env_loads(env)
    assert env["TRIDENT_SERVER__HOST"] == "0.0.0.0"
    assert env["TRIDENT_CHECKPOINT__DIR"] == CHECKPOINTS
    assert values["VOLUME"] == [CHECKPOINTS]
    assert set(values["EXPOSE"][0].split()) == {str(SERVER.port), str(SERVER.metrics_port)}
    (user,) = values["USER"]
    assert user.split(":")[0] not in ("0", "root")
    (healthcheck,) = values["HEALTHCHECK"]
    command = json.loads(healthcheck.split(" CMD ", 1)[1])
    assert command[: len(HEALTH)] == HEALTH
    assert json.loads(values["ENTRYPOINT"][0]) == ["trident", "serve"]


def test_dockerfile_variants() -> None:
    """One file, two images: a pinned CUDA 13 runtime for `cuda`, a slim Python for `cpu`."""
    instructions = dockerfile_instructions()
    froms = [args for keyword, args in instructions if keyword == "FROM"]
    assert froms[-1] == "runtime-${VARIANT}"
    assert any(f.startswith("python:") and f.endswith(" AS runtime-cpu") for f in froms)
    cuda = instructions.index(("FROM", "nvidia/cuda:13.0.2-runtime-ubuntu24.04 AS runtime-cuda"))
    # CuPy 14 JIT-compiles its own kernels against the CUDA runtime headers, which the runtime
    # image lacks
    assert "cuda-cudart-dev-13-0" in instructions[cuda + 1][1]
    copies = [args for keyword, args in instructions if keyword == "COPY"]
    assert "deploy/requirements-${VARIANT}.lock requirements.lock" in copies  # cuda: its extra


# --- compose -------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


def compose_services() -> dict[str, Any]:
    return compose()["services"]


# compose.yaml's server variants: service name -> (profile, image variant, backend)
VARIANTS = {"trident": ("gpu", "cuda", "auto"), "trident-cpu": ("cpu", "cpu", "numpy")}


@pytest.mark.parametrize("name", VARIANTS)
def test_compose_trident_service(name: str) -> None:
    profile, variant, backend = VARIANTS[name]
    trident = compose_services()[name]
    assert trident["profiles"] == [profile]
    assert trident["image"] == f"trident:{variant}"
    assert trident["build"]["args"]["VARIANT"] == variant
    assert trident["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (DEPLOY / trident["build"]["context"] / trident["build"]["dockerfile"]).is_file()
    devices = trident.get("deploy", {}).get("resources", {}).get("reservations", {})
    if variant == "cuda":
        (device,) = devices["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    else:
        assert not devices  # schedules on a host without a GPU
    assert f"checkpoints:{CHECKPOINTS}" in trident["volumes"]
    assert trident["healthcheck"]["test"][1 : 1 + len(HEALTH)] == HEALTH
    published = {p.rsplit(":", 1)[-1] for p in trident["ports"]}
    assert published == {str(SERVER.port), str(SERVER.metrics_port)}
    env = {key: unset_default(str(value)) for key, value in trident["environment"].items()}
    with pytest.raises(ConfigError, match=r"server\.auth_token"):  # no TRIDENT_TOKEN: no start
        load_config(env=env)
    env["TRIDENT_SERVER__AUTH_TOKEN"] = "a-token"
    assert_config_env_loads(env)
    assert load_config(env=env).server.auth_mode == "token"
    assert load_config(env=env).train.backend == backend
    grace = load_config(env=env).server.shutdown_grace_s
    assert seconds(trident["stop_grace_period"]) > grace + 30  # drain, then the final checkpoint


@pytest.mark.parametrize("name", [*VARIANTS, "actor"])
def test_compose_runs_the_image_read_only_as_kubernetes_does(name: str) -> None:
    """read_only, with tmpfs where the process writes (as the pods' emptyDirs), and the pods
    read-only too."""
    service = compose_services()[name]
    assert service["read_only"] is True
    assert set(service["tmpfs"]) == {"/tmp", "/home/trident"}
    for manifest in ("deployment.yaml", "actors.yaml"):
        text = (DEPLOY / "k8s" / "base" / manifest).read_text()
        assert "readOnlyRootFilesystem: true" in text and "mountPath: /home/trident" in text


def test_compose_variants_answer_as_trident() -> None:
    """Prometheus scrapes, and actors dial, the host name `trident`: the GPU service's name and
    the CPU service's alias. Nothing depends on one variant, so either profile starts the rest."""
    services = compose_services()
    assert services["trident-cpu"]["networks"]["default"]["aliases"] == ["trident"]
    for name in ("prometheus", "grafana", "actor"):
        assert not set(services[name].get("depends_on", {})) & set(VARIANTS), name
        assert set(services[name].get("profiles", [])) <= {"actors"}, name


def test_compose_mounts_the_deploy_files() -> None:
    services = compose()["services"]
    mounts = {
        name: dict(volume.split(":")[:2] for volume in service.get("volumes", []))
        for name, service in services.items()
    }
    for name, mount in mounts.items():
        for source in mount:
            if source.startswith("."):
                assert (DEPLOY / source).is_dir(), f"{name}: {source} missing"
    assert mounts["prometheus"]["./prometheus"] == "/etc/prometheus"
    grafana = mounts["grafana"]
    assert grafana["./grafana/provisioning"] == "/etc/grafana/provisioning"
    (provider,) = load_yaml(GRAFANA_PROVISIONING / "dashboards" / "trident.yml")["providers"]
    assert grafana["./grafana/dashboards"] == provider["options"]["path"]
    named = {src for mount in mounts.values() for src in mount if not src.startswith(".")}
    assert named <= set(compose()["volumes"])


# --- Prometheus and Grafana ----------------------------------------------------------------


def test_prometheus_scrapes_trident() -> None:
    config = load_yaml(PROMETHEUS)
    assert config["global"]["scrape_interval"] == "15s"
    assert config["rule_files"] == ["alerts.yml"]
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "trident"]
    (static,) = job["static_configs"]
    assert static["targets"] == [f"trident:{SERVER.metrics_port}"]
    assert "trident" in compose_services()  # the target's host name on the compose network


def test_dashboard_uses_the_provisioned_datasource() -> None:
    (datasource,) = load_yaml(GRAFANA_PROVISIONING / "datasources" / "prometheus.yml")[
        "datasources"
    ]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel, target in dashboard_targets(dashboard):
        for ref in (panel["datasource"], target["datasource"]):
            assert ref == {"type": "prometheus", "uid": datasource["uid"]}, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
    refs = [(panel["id"], target["refId"]) for panel, target in dashboard_targets(dashboard)]
    assert len(refs) == len(set(refs))


def test_dashboard_has_the_issue_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = " ".join(target["expr"] for _, target in dashboard_targets(dashboard))
    for needle in (
        "histogram_quantile(0.99, sum by (le) (rate(trident_step_duration_seconds_bucket",
        "rate(trident_samples_total",
        "trident_loss",
        "trident_grad_norm",
        "trident_skipped_updates_total",
        "trident_act_duration_seconds_bucket",
        "trident_act_batch_size",
        "time() - (trident_checkpoint_timestamp_seconds",
        "trident_checkpoint_bytes",
        "sum by (code) (rate(trident_rpc_errors_total",
        "trident_device_memory_bytes",
    ):
        assert needle in exprs


# --- Kubernetes ----------------------------------------------------------------------------


def manifest(kind: str, name: str, directory: Path = K8S_BASE) -> dict[str, Any]:
    """One manifest as `kubectl kustomize directory` renders it."""
    (doc,) = [d for d in kustomize(directory) if identity(d) == (kind, name)]
    return doc


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def test_deployment_contract() -> None:
    pod = manifest("Deployment", "trident")["spec"]["template"]
    spec = pod["spec"]
    (container,) = spec["containers"]
    env = {item["name"]: item.get("value", "token") for item in container["env"]}
    assert_config_env_loads(env)
    config = load_config(env=env)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"grpc": config.server.port, "metrics": config.server.metrics_port}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == config.server.port, probe
    # the drain plus the final checkpoint fit before SIGKILL
    assert spec["terminationGracePeriodSeconds"] >= config.server.shutdown_grace_s + 60
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = spec["volumes"]
    claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in volumes}
    assert mounts["checkpoints"] == config.checkpoint.dir
    assert claims["checkpoints"] == "trident-checkpoints"
    assert manifest("PersistentVolumeClaim", "trident-checkpoints")
    (user,) = [a for k, a in dockerfile_instructions() if k == "USER"]
    assert spec["securityContext"]["runAsUser"] == int(user.split(":")[0])
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(config.server.metrics_port)


def test_service_routes_to_the_pod() -> None:
    service = manifest("Service", "trident")
    deployment = manifest("Deployment", "trident")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    names = {port["name"] for port in container["ports"]}
    assert {port["targetPort"] for port in service["spec"]["ports"]} == names


def test_cpu_overlay_changes_only_the_device() -> None:
    """The CPU overlay drops the GPU request, runs the NumPy backend on the CPU image, and
    leaves every other field of the base as it is."""
    base = manifest("Deployment", "trident")
    cpu = manifest("Deployment", "trident", K8S_CPU)
    server = container(cpu)
    assert server["image"] == "trident:cpu"
    assert "nvidia.com/gpu" not in json.dumps(cpu)
    assert server["resources"]["requests"]["cpu"]
    env = {item["name"]: item.get("value", "token") for item in server["env"]}
    assert_config_env_loads(env)
    assert load_config(env=env).train.backend == "numpy"
    assert container(manifest("Deployment", "trident-actor", K8S_CPU))["image"] == "trident:cpu"
    original = container(base)
    assert [item for item in server["env"] if item["name"] != "TRIDENT_TRAIN__BACKEND"] == (
        original["env"]
    )
    changed = ("image", "resources", "env")
    assert {k: v for k, v in server.items() if k not in changed} == {
        k: v for k, v in original.items() if k not in changed
    }
    cpu["spec"]["template"]["spec"]["containers"] = base["spec"]["template"]["spec"]["containers"]
    assert cpu == base  # outside the container, nothing changed


def test_actors_reach_the_service_and_fit_the_model() -> None:
    """Compose's and Kubernetes' actors name the server's service and gRPC port, and the
    server's model is shaped for LobSim (`trident actor` refuses a misfit at start)."""
    lobsim_obs_dim = observation_dim(load_config(env={}).lobsim)
    server = manifest("Deployment", "trident")["spec"]["template"]["spec"]["containers"][0]
    k8s_env = {item["name"]: item.get("value", "token") for item in server["env"]}
    compose_env = {
        k: unset_default(str(v)) for k, v in compose_services()["trident"]["environment"].items()
    }
    compose_env["TRIDENT_SERVER__AUTH_TOKEN"] = "token"  # TRIDENT_TOKEN set, as it must be
    for env in (k8s_env, compose_env):
        assert load_config(env=env).model.obs_dim == lobsim_obs_dim

    (actor,) = manifest("Deployment", "trident-actor")["spec"]["template"]["spec"]["containers"]
    assert f"--server=trident:{SERVER.port}" in actor["args"]
    assert "--env=lobsim" in actor["args"]
    assert "trident actor" in actor["command"][-2]

    service = compose_services()["actor"]
    assert service["command"][:2] == ["--server", f"trident:{SERVER.port}"]
    assert service["healthcheck"] == {"disable": True}
    assert service["profiles"] == ["actors"]
    assert service["restart"] == "on-failure"  # a server away past --reconnect-timeout
    assert service["image"] == "trident:cpu" and service["build"]["args"]["VARIANT"] == "cpu"


# --- deploy/README.md ----------------------------------------------------------------------


def readme_commands() -> list[str]:
    """deploy/README.md's shell commands, continuation lines joined, comments dropped."""
    text = (DEPLOY / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    joined = "\n".join(blocks).replace("\\\n", " ")
    return [line.split(" #", 1)[0].strip() for line in joined.splitlines() if line.strip()]


def test_docker_run_examples_require_a_token() -> None:
    """Every `docker run` of the server publishes gRPC with a token it insists on."""
    commands = readme_commands()
    servers = [c for c in commands if c.startswith("docker run") and "--entrypoint" not in c]
    assert len(servers) == 2
    for command in servers:
        argv = shlex.split(command.replace('"$TRIDENT_TOKEN"', "a-token"))
        env = dict(argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "-e")
        assert env["TRIDENT_SERVER__AUTH_MODE"] == "token", command
        assert load_config(env=env).server.auth_token == "a-token", command
        with pytest.raises(ConfigError, match=r"server\.auth_token"):  # empty $TRIDENT_TOKEN
            load_config(env={**env, "TRIDENT_SERVER__AUTH_TOKEN": ""})


def test_the_secret_the_pods_read_is_created_as_required() -> None:
    """deploy/README.md creates the Secret every secretKeyRef names, and does not call it
    optional: without it the pods do not start."""
    refs = [
        item["valueFrom"]["secretKeyRef"]
        for directory in (K8S_BASE, K8S_CPU, K8S_RANKS)
        for doc in kustomize(directory)
        if doc["kind"] in ("Deployment", "StatefulSet")
        for item in container(doc).get("env", [])
        if "secretKeyRef" in item.get("valueFrom", {})
    ]
    assert len(refs) == 5  # the server's and the actors' in both kustomizations, the ranks'
    assert all(ref == {"name": "trident", "key": "token"} for ref in refs), refs  # not optional
    text = (DEPLOY / "README.md").read_text()
    lines = [line for line in text.splitlines() if "kubectl create secret" in line]
    assert len(lines) == 2  # before `apply -k` of the base (or overlay) and of the ranks
    for line in lines:
        assert "--from-literal=token=" in line and "generic trident " in line
        assert "optional" not in line


def test_the_ranks_statefulset_forms_one_world() -> None:
    """deploy/k8s/ranks: pod i is rank i of replicas ranks, all find rank 0 through the
    headless Service, the settings load with data_shards a multiple of the world, the client
    Service reaches rank 0 alone, and the ranks start together."""
    ranks = manifest("StatefulSet", "trident-ranks", K8S_RANKS)
    spec, pod = ranks["spec"], ranks["spec"]["template"]["spec"]
    (trident,) = pod["containers"]
    values = {item["name"]: item.get("value") for item in trident["env"]}
    rank = next(item for item in trident["env"] if item["name"] == "TRIDENT_RANK")
    assert rank["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    place = {k: v for k, v in values.items() if k in ("TRIDENT_WORLD_SIZE", "TRIDENT_RENDEZVOUS")}
    topology = Topology.from_env({**place, "TRIDENT_RANK": "0"})
    assert topology.world_size == spec["replicas"] and spec["podManagementPolicy"] == "Parallel"
    headless = manifest("Service", "trident-ranks", K8S_RANKS)
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"]
    assert topology.host == f"{ranks['metadata']['name']}-0.{spec['serviceName']}"
    assert spec["serviceName"] == headless["metadata"]["name"]
    ports = {port["name"]: port["containerPort"] for port in trident["ports"]}
    assert ports["ranks"] == topology.port == headless["spec"]["ports"][0]["port"]
    settings = {k: v for k, v in values.items() if "__" in k and v is not None}
    settings["TRIDENT_SERVER__AUTH_TOKEN"] = "a-token"
    assert_config_env_loads(settings)
    assert load_config(env=settings).train.data_shards % topology.world_size == 0
    client = manifest("Service", "trident", K8S_RANKS)
    assert client["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == (
        f"{ranks['metadata']['name']}-0"
    )
    assert {m["mountPath"] for m in trident["volumeMounts"]} >= {CHECKPOINTS, "/tmp"}
    assert trident["securityContext"]["readOnlyRootFilesystem"] is True
