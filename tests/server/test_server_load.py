"""The server under load: concurrent actors, Act batching, backpressure, and SIGTERM mid-stream."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import random_rollout, running_server, small_config, wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.checkpoint import list_checkpoints, read_manifest, restore_checkpoint
from service.client.client import TridentClient
from service.testing.serverproc import scrape, value
from service.trainer.trainer import Trainer
from service.types import ActMode, Rollout

Code = grpc.StatusCode
ACT_ROWS = 4
LOAD_SECONDS = 10.0  # 8 actors: Act batching and backpressure show within seconds


@dataclass
class Actor:
    """What one client thread did."""

    steps: list[tuple[int, Rollout]] = field(default_factory=list)  # (reply global_step, input)
    acts: int = 0
    backpressure: int = 0
    errors: list[str] = field(default_factory=list)


def step_with_backoff(client: TridentClient, rollout: Rollout, actor: Actor) -> int | None:
    """Send until accepted (RESOURCE_EXHAUSTED means: back off, retry); the reply's global step,
    or None after any other error (recorded)."""
    while True:
        try:
            return client.step(rollout).global_step
        except grpc.RpcError as error:
            if error.code() != Code.RESOURCE_EXHAUSTED:
                actor.errors.append(f"Step {error.code().name}: {error.details()}")
                return None
            actor.backpressure += 1
            time.sleep(0.005)


@pytest.mark.slow
def test_eight_actors_for_ten_seconds(tmp_path: Path, seed: int) -> None:
    overrides = ("server.step_queue_size=2", "train.max_policy_lag=1000000")
    with running_server(tmp_path, *overrides) as server:
        before = scrape(server)
        deadline = time.monotonic() + LOAD_SECONDS
        actors = [Actor() for _ in range(8)]

        def run(index: int) -> None:
            actor = actors[index]
            rng = np.random.default_rng([seed, index])
            with TridentClient(server.target) as client:
                version = 0
                while time.monotonic() < deadline:
                    obs = rng.standard_normal((ACT_ROWS, 6)).astype(np.float32)
                    try:
                        acted = client.act(obs, ActMode.SAMPLE)
                    except grpc.RpcError as error:
                        actor.errors.append(f"Act {error.code().name}: {error.details()}")
                        return
                    actions = acted.actions
                    if not (
                        actions.shape == (ACT_ROWS,)
                        and ((actions >= 0) & (actions < 9)).all()
                        and acted.policy_version >= version
                    ):
                        actor.errors.append(f"Act answered {acted} after version {version}")
                        return
                    version = acted.policy_version
                    actor.acts += 1
                    if actor.acts % 3 == 0:
                        rollout = random_rollout(rng, T=4, N=4, policy_version=version)
                        step = step_with_backoff(client, rollout, actor)
                        if step is None:
                            return
                        actor.steps.append((step, rollout))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(actors))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(LOAD_SECONDS + 60)
        assert not any(thread.is_alive() for thread in threads)

        with TridentClient(server.target) as client:
            status = client.status()
        after = scrape(server)

    errors = [error for actor in actors for error in actor.errors]
    assert not errors, errors[:5]
    accepted = sorted(step for actor in actors for step, _ in actor.steps)
    assert accepted, "no Step was accepted"
    assert status.global_step == len(accepted)
    assert accepted == list(range(1, len(accepted) + 1)), "each accepted Step applied once"
    steps_total = value(after, "trident_steps_total") - value(before, "trident_steps_total")
    assert steps_total == len(accepted)
    print(
        f"{len(accepted)} Steps, {sum(a.acts for a in actors)} Acts, "
        f"{sum(a.backpressure for a in actors)} RESOURCE_EXHAUSTED retries"
    )
    # Act batching: forwards served more rows than any one request carried.
    batches = value(after, "trident_act_batch_size_count") - value(
        before, "trident_act_batch_size_count"
    )
    rows = value(after, "trident_act_batch_size_sum") - value(before, "trident_act_batch_size_sum")
    assert rows == ACT_ROWS * sum(actor.acts for actor in actors)
    assert rows / batches > ACT_ROWS, (rows, batches)
    single = value(after, "trident_act_batch_size_bucket", le=f"{float(ACT_ROWS)}")
    assert single < value(after, "trident_act_batch_size_count")


def test_sigterm_under_load_drains_and_writes_a_final_checkpoint(
    tmp_path: Path, seed: int
) -> None:
    grace = 5.0
    slower = "ppo.epochs=8"  # Steps of tens of ms, so that some are in flight at SIGTERM
    server = running_server(tmp_path, f"server.shutdown_grace_s={grace}", slower)
    try:
        stopping = threading.Event()
        actors = [Actor() for _ in range(4)]
        late_codes: Counter[str] = Counter()
        answered_late = Counter[int]()
        health: list[str] = []
        watching = threading.Event()

        def load(index: int) -> None:
            actor = actors[index]
            rng = np.random.default_rng([seed, index])
            with TridentClient(server.target) as client:
                while True:
                    rollout = random_rollout(rng, T=4, N=4)
                    try:
                        actor.steps.append((client.step(rollout).global_step, rollout))
                        if stopping.is_set():
                            answered_late[index] += 1
                    except grpc.RpcError as error:
                        if error.code() == Code.RESOURCE_EXHAUSTED:
                            actor.backpressure += 1
                            time.sleep(0.005)
                        elif stopping.is_set():
                            late_codes[error.code().name] += 1
                            return
                        else:
                            actor.errors.append(f"{error.code().name}: {error.details()}")
                            return

        def watch() -> None:
            with grpc.insecure_channel(server.target) as channel:
                stream = health_pb2_grpc.HealthStub(channel).Watch(
                    health_pb2.HealthCheckRequest(service=""), timeout=60
                )
                try:
                    for reply in stream:
                        health.append(
                            health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                        )
                        watching.set()
                        if health[-1] == "NOT_SERVING":
                            stream.cancel()
                            return
                except grpc.RpcError as error:
                    health.append(f"error {error.code().name}")

        watcher = threading.Thread(target=watch)
        watcher.start()
        assert watching.wait(10)
        threads = [threading.Thread(target=load, args=(i,)) for i in range(len(actors))]
        for thread in threads:
            thread.start()

        def twenty_or_stopped() -> bool:
            return sum(len(a.steps) for a in actors) >= 20 or not all(t.is_alive() for t in threads)

        wait_until(twenty_or_stopped, 60, "20 Steps applied under load")

        stopping.set()
        # Exit 0 within the grace + 4 s: in-flight Steps drained, the final checkpoint written.
        returncode = server.terminate(timeout=grace + 4)
        for thread in [*threads, watcher]:
            thread.join(30)
    finally:
        server.terminate()

    assert returncode == 0, server.stderr()[-3000:]
    assert not [error for actor in actors for error in actor.errors]
    assert health[0] == "SERVING" and "NOT_SERVING" in health, health
    assert set(late_codes) <= {"UNAVAILABLE"}, late_codes
    assert sum(answered_late.values()) >= 1, "no Step was in flight at SIGTERM"
    # The drain's last lines (refusals counted and not yet said are said as it ends, too)
    events = [e["event"] for e in server.events() if e["event"] != "rejected"]
    assert events[-2:] == ["checkpoint", "final checkpoint"], events[-5:]
    assert "draining" in events

    # Every accepted Step was answered, each exactly once, and the final checkpoint holds them all.
    applied = sorted((pair for a in actors for pair in a.steps), key=lambda pair: pair[0])
    steps = [step for step, _ in applied]
    assert steps == list(range(1, len(steps) + 1))
    (final,) = [c for c in list_checkpoints(server.checkpoint_dir) if c.name.startswith("final-")]
    assert final.global_step == len(steps)
    manifest = read_manifest(final.path)

    restored = Trainer(small_config(slower))
    restore_checkpoint(restored, server.checkpoint_dir, final.name)
    assert restored.param_digest() == manifest["param_digest"]
    assert restored.global_step == len(steps)

    # Re-applying the accepted rollouts in the order the server applied them gives the same state.
    replayed = Trainer(small_config(slower))
    for _, rollout in applied:
        replayed.step(rollout)
    assert replayed.param_digest() == restored.param_digest()
