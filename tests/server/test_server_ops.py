"""What an operator sees: /metrics, GetStatus, UpdateHyperparams, checkpoints, the CLI,
reflection and health, all against one running server."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import random_rollout, running_server
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc
from service.client.client import TridentClient, step_request
from service.server.step_log import SUMMARY_S, StepSummary
from service.testing.serverproc import Samples, ServerProcess, scrape, trident_cli, value
from service.types import ActMode, StepResult

Code = grpc.StatusCode

OVERRIDES = ("optim.lr=0.0005", "train.gamma=0.97")
ERRORS = "trident_rpc_errors_total"
METRICS = (
    "trident_step_duration_seconds",
    "trident_loss",
    "trident_steps_total",
    "trident_samples_total",
    "trident_grad_norm",
    "trident_skipped_updates_total",
    "trident_act_duration_seconds",
    "trident_act_batch_size",
    "trident_checkpoint_duration_seconds",
    "trident_checkpoint_bytes",
    ERRORS,
    "trident_device_memory_bytes",
    "trident_policy_lag",
    "trident_approx_kl",
    "trident_clip_fraction",
    "trident_c51_support_clip_ratio",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("ops"), *OVERRIDES) as running:
        yield running


@pytest.fixture
def client(server: ServerProcess) -> Iterator[TridentClient]:
    with TridentClient(server.target) as connected:
        yield connected


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


def histogram_count(samples: Samples, name: str) -> float:
    return value(samples, f"{name}_count")


def test_metrics_expose_every_series_and_move(
    server: ServerProcess, client: TridentClient, rng: np.random.Generator
) -> None:
    before = scrape(server)
    exposed = names(before)
    for metric in METRICS:
        if metric == ERRORS:  # its series appear with the first error (below)
            continue
        assert metric in exposed or f"{metric}_count" in exposed, metric
    for head in ("q", "pi", "v", "bce", "aux", "total"):
        assert ("trident_loss", (("head", head),)) in before
    assert value(before, "trident_device_memory_bytes") > 0

    rollouts = [random_rollout(rng, T=4, N=5) for _ in range(3)]
    replies = [client.step(rollout) for rollout in rollouts]
    client.act(rng.standard_normal((7, 6)).astype(np.float32))
    bad = step_request(rollouts[0])
    bad.actions.data = bad.actions.data[:-1]
    with pytest.raises(grpc.RpcError) as caught:
        client.stub.Step(bad, timeout=10)
    assert caught.value.code() == Code.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError):
        client.restore("no-such-checkpoint")
    saved = client.checkpoint("metrics")

    after = scrape(server)
    steps = value(after, "trident_steps_total") - value(before, "trident_steps_total")
    samples = value(after, "trident_samples_total") - value(before, "trident_samples_total")
    assert steps == 3 and samples == 3 * 4 * 5
    assert (
        histogram_count(after, "trident_step_duration_seconds")
        - histogram_count(before, "trident_step_duration_seconds")
        == 3
    )
    last = replies[-1]
    for head, loss in last.losses.items():
        assert value(after, "trident_loss", head=head) == pytest.approx(loss, rel=1e-6)
    assert value(after, "trident_grad_norm") == pytest.approx(last.grad_norm, rel=1e-6)
    assert value(after, "trident_approx_kl") == pytest.approx(last.approx_kl, rel=1e-6, abs=1e-9)
    assert value(after, "trident_clip_fraction") == pytest.approx(last.clip_fraction, rel=1e-6)
    assert 0 <= value(after, "trident_c51_support_clip_ratio") <= 1
    assert histogram_count(after, "trident_act_duration_seconds") > histogram_count(
        before, "trident_act_duration_seconds"
    )
    assert (
        value(after, "trident_act_batch_size_sum") - value(before, "trident_act_batch_size_sum")
        == 7
    )
    for method, code, moved in (
        ("Step", "INVALID_ARGUMENT", 1),
        ("Restore", "NOT_FOUND", 1),
        ("Act", "INVALID_ARGUMENT", 0),
        ("Step", "RESOURCE_EXHAUSTED", 0),
    ):
        # an error series appears with its first error: absent counts as 0
        series = (ERRORS, (("code", code), ("method", method)))
        assert after.get(series, 0.0) - before.get(series, 0.0) == moved, (method, code)
    assert ERRORS in names(after)
    assert value(after, "trident_checkpoint_bytes") == saved.size_bytes > 0
    assert histogram_count(after, "trident_checkpoint_duration_seconds") >= 1
    assert value(after, "trident_skipped_updates_total") == value(
        before, "trident_skipped_updates_total"
    )


def test_get_status(server: ServerProcess, client: TridentClient) -> None:
    status = client.status()
    assert status.backend == "numpy" and status.device == "cpu"
    assert status.kernel_abi_version == 0  # no CUDA kernels on the NumPy backend
    assert not status.inference_only
    assert len(status.param_digest) == 64 and int(status.param_digest, 16) >= 0
    assert status.step_queue_depth == 0 and status.version
    config = json.loads(status.config_json)
    assert config["model"]["obs_dim"] == 6 and config["model"]["hidden_dim"] == 16
    assert config["train"]["gamma"] == 0.97 and config["optim"]["lr"] == 0.0005
    assert config["server"]["port"] == 0 and config["server"]["max_message_mb"] == 64
    assert Path(config["checkpoint"]["dir"]) == server.checkpoint_dir
    (serving,) = server.events("serving")
    assert serving["host"] == "127.0.0.1" and serving["backend"] == "numpy"
    assert serving["tls"] is False and serving["inference_only"] is False


def test_update_hyperparams(client: TridentClient) -> None:
    config = json.loads(client.update_hyperparams({"optim.lr": 0.002, "ppo.clip_eps": 0.1}))
    assert config["optim"]["lr"] == 0.002 and config["ppo"]["clip_eps"] == 0.1
    status_config = json.loads(client.status().config_json)
    assert status_config["optim"]["lr"] == 0.002 and status_config["ppo"]["clip_eps"] == 0.1
    digest = client.status().param_digest
    for values, text in (
        ({"model.hidden_dim": 24}, "model.hidden_dim"),
        ({"optim.lr": 0.01, "train.gamma": 2.0}, "train.gamma"),
        ({"no.such_key": 1.0}, "no.such_key"),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            client.update_hyperparams(values)
        assert caught.value.code() == Code.INVALID_ARGUMENT
        assert text in caught.value.details() and "expected" in caught.value.details()
    after = client.status()
    assert json.loads(after.config_json)["optim"]["lr"] == 0.002  # all or nothing
    assert json.loads(after.config_json)["model"]["hidden_dim"] == 16
    assert after.param_digest == digest
    client.update_hyperparams({"optim.lr": 0.0005})


@pytest.mark.parametrize("key", ["optim.lr", "optim.max_grad_norm", "ppo.ent_coef"])
def test_update_hyperparams_rejects_infinity(client: TridentClient, key: str) -> None:
    before = json.loads(client.status().config_json)
    section, name = key.split(".")
    try:
        with pytest.raises(grpc.RpcError) as caught:
            client.update_hyperparams({key: math.inf})
        assert caught.value.code() == Code.INVALID_ARGUMENT
    finally:  # never leave the shared server with an infinite setting
        client.update_hyperparams({key: before[section][name]})


def test_list_checkpoints_newest_first(client: TridentClient, rng: np.random.Generator) -> None:
    names = []
    for i in range(3):
        client.step(random_rollout(rng, T=3, N=4))
        names.append(client.checkpoint(f"listed-{i}").name)
    listed = client.list_checkpoints()
    ours = [c.name for c in listed if c.name.startswith("listed-")]
    assert ours == names[::-1]
    steps = [c.global_step for c in listed]
    assert steps == sorted(steps, reverse=True)
    assert all(c.size_bytes > 0 and c.created_unix > 0 for c in listed)
    default = client.checkpoint()
    assert default.name == f"step-{default.global_step:010d}"
    assert client.list_checkpoints()[0].name == default.name


def test_restore_brings_back_the_digest(client: TridentClient, rng: np.random.Generator) -> None:
    client.step(random_rollout(rng, T=3, N=4))
    saved_status = client.status()
    info = client.checkpoint("restore-point")
    client.step(random_rollout(rng, T=3, N=4))
    assert client.status().param_digest != saved_status.param_digest
    restored = client.restore("restore-point")
    assert restored.param_digest == saved_status.param_digest
    assert restored.checkpoint.name == info.name
    assert restored.checkpoint.global_step == saved_status.global_step
    status = client.status()
    assert status.param_digest == saved_status.param_digest
    assert status.global_step == saved_status.global_step


def run_cli(server: ServerProcess, *args: str) -> object:
    done = trident_cli(*args, "--server", server.target, "--timeout", "20")
    assert done.returncode == 0, (args, done.stderr)
    return json.loads(done.stdout)


def test_cli_against_a_running_server(
    server: ServerProcess, client: TridentClient, tmp_path: Path, rng: np.random.Generator
) -> None:
    health = trident_cli("health", "--server", server.target)
    assert health.returncode == 0 and health.stdout.strip() == "SERVING"

    status = run_cli(server, "status", "--json", "--config")
    assert isinstance(status, dict)
    assert status["backend"] == "numpy" and status["device"] == "cpu"
    assert status["param_digest"] == client.status().param_digest
    assert status["config"]["train"]["gamma"] == 0.97
    # int64 fields print as JSON numbers (protobuf's own JSON mapping makes them strings)
    assert status["global_step"] == client.status().global_step
    assert type(status["global_step"]) is int and type(status["replay_size"]) is int
    assert status["auth_mode"] == "none" and status["auth_token_set"] is False
    assert "auth_token" not in status["config"]["server"]

    obs = rng.standard_normal((5, 6)).astype(np.float32)
    np.save(tmp_path / "obs.npy", obs)
    acted = run_cli(server, "act", str(tmp_path / "obs.npy"), "--mode", "greedy_pi")
    assert isinstance(acted, dict)
    expected = client.act(obs, ActMode.GREEDY_PI)
    assert acted["actions"] == expected.actions.tolist()
    np.testing.assert_allclose(acted["values"], expected.values, rtol=1e-6)
    assert acted["policy_version"] == expected.policy_version
    np.save(tmp_path / "obs64.npy", obs.astype(np.float64))  # converted, and said so
    converted = trident_cli("act", str(tmp_path / "obs64.npy"), "--mode", "greedy_pi",
                            "--server", server.target)  # fmt: skip
    assert converted.returncode == 0, converted.stderr
    assert json.loads(converted.stdout)["actions"] == acted["actions"]
    assert "holds float64 observations; sending them as float32" in converted.stderr

    saved = run_cli(server, "checkpoint", "save", "--name", "from-cli")
    assert isinstance(saved, dict) and saved["name"] == "from-cli"
    assert saved["global_step"] == client.status().global_step
    assert type(saved["size_bytes"]) is int and saved["save_ms"] > 0
    listed = run_cli(server, "checkpoint", "list")
    assert isinstance(listed, list)
    (from_cli,) = [c for c in listed if c["name"] == "from-cli"]
    assert from_cli == saved  # the save time as the save measured it, not 0
    digest = client.status().param_digest
    client.step(random_rollout(rng, T=3, N=4))
    restored = run_cli(server, "checkpoint", "restore", "from-cli")
    assert isinstance(restored, dict)
    assert restored["param_digest"] == digest == client.status().param_digest
    assert restored["checkpoint"]["name"] == "from-cli"

    missing = trident_cli("checkpoint", "restore", "nope", "--server", server.target)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr
    bad_name = trident_cli("checkpoint", "save", "--name", "../x", "--server", server.target)
    assert bad_name.returncode == 1 and "INVALID_ARGUMENT" in bad_name.stderr
    nowhere = trident_cli("health", "--server", "127.0.0.1:1", "--timeout", "5")
    assert nowhere.returncode == 1 and nowhere.stderr.startswith(
        "trident: error: cannot reach a Trident server at 127.0.0.1:1: connection refused"
    )
    assert "--server HOST[:PORT]" in nowhere.stderr and len(nowhere.stderr.splitlines()) == 1


def test_reflection_and_health(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.target) as channel:
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (reply,) = list(reflection.ServerReflectionInfo(iter([request]), timeout=10))
        services = {s.name for s in reply.list_services_response.service}
        assert "trident.v1.TrainerService" in services
        assert "grpc.health.v1.Health" in services
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "trident.v1.TrainerService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as caught:
            health.Check(health_pb2.HealthCheckRequest(service="no.Such"), timeout=10)
        assert caught.value.code() == Code.NOT_FOUND
        stub = pb_grpc.TrainerServiceStub(channel)
        assert stub.GetStatus(pb.GetStatusRequest(), timeout=10).backend == "numpy"


def test_the_log_and_status_summarise_the_steps(tmp_path: Path, rng: np.random.Generator) -> None:
    """Steps at INFO: a `steps` line every train.log_every Steps (each Step is a DEBUG line),
    the rest said by the drain; `trident status` leads with a summary, the config behind
    --config."""
    with running_server(tmp_path, "train.log_every=3", "checkpoint.every_s=0") as server:
        with TridentClient(server.target) as client:
            for _ in range(7):
                client.step(random_rollout(rng, T=3, N=4))
        shown = trident_cli("status", "--server", server.target)
        with_config = trident_cli("status", "--server", server.target, "--config")
        as_json = run_cli(server, "status", "--json")
        assert server.terminate() == 0, server.stderr()[-3000:]
    assert not server.events("step")  # DEBUG, below the server's INFO
    summaries = server.events("steps")
    assert [(e["global_step"], e["steps"], e["rollouts"]) for e in summaries] == [
        (3, 3, 3), (6, 3, 3), (7, 1, 1)]  # the last one by the drain  # fmt: skip
    assert all(e["env_steps"] == e["steps"] * 12 and e["env_steps_per_s"] > 0
               and set(e["losses"]) >= {"total", "pi", "v"} and e["skipped"] == 0
               for e in summaries), summaries  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"trident status of {server.target}:"
    rows = {line.split()[0]: line.split(None, 1)[1] for line in lines[1:-1]}
    assert list(rows) == ["state", "step", "rate", "clients", "checkpoint", "schedule", "model",
                          "server"]  # fmt: skip
    assert rows["state"].startswith("training (last Step ")
    assert rows["step"] == "7" and rows["rate"].endswith(" env steps/s over the last minute")
    assert float(rows["rate"].split()[0]) > 0
    assert rows["clients"] == "0 Interact streams open; 0 waiting in the Step queue"
    assert rows["checkpoint"] == "none yet"
    assert rows["schedule"].startswith("constant: no train.steps, a run with no end; the next")
    assert "config" not in shown.stdout.lower().split("(--json")[0]  # the config: behind a flag
    assert with_config.stdout.startswith(shown.stdout.split("\n")[0])
    assert '"obs_dim": 6' in with_config.stdout and len(with_config.stdout) > 3 * len(shown.stdout)
    assert isinstance(as_json, dict) and "config" not in as_json
    assert as_json["global_step"] == 7 and as_json["checkpoint_name"] == ""


def test_slow_steps_are_summarised_every_half_minute() -> None:
    """Fewer than train.log_every Steps in SUMMARY_S seconds: the summary comes by time, its
    rate over its own span (a made-up clock stands in for the Steps' time)."""
    now = [0.0]
    summary = StepSummary(lambda: 20, lambda: now[0])
    result = StepResult(losses={"pi": 0.5, "total": 0.5}, global_step=1)
    lines = []
    for step in range(1, 5):
        now[0] = step * (SUMMARY_S / 2)  # a Step every 15 s, 1 s long
        result.global_step = step
        lines.append(summary.add(result, samples=300, rollouts=1, ms=1000.0, lr=1e-3))
    assert [line is not None for line in lines] == [False, False, True, False]
    due = lines[2]  # 31 s after the first Step began (at 14 s)
    assert due is not None and (due["steps"], due["global_step"]) == (3, 3)
    assert due["seconds"] == SUMMARY_S + 1.0 and due["env_steps_per_s"] == round(900 / 31, 1)
    last = summary.flush()  # a drain: the fourth Step, over the 15 s since the summary
    assert last is not None and (last["steps"], last["seconds"]) == (1, SUMMARY_S / 2)
    assert summary.flush() is None  # nothing since the last one
