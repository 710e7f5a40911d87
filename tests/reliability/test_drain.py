"""SIGTERM with exactly 8 Steps in flight: health turns NOT_SERVING at once, new calls get
UNAVAILABLE, the 8 Steps finish OK, a final checkpoint is committed holding all 8, and the
process exits 0 within server.shutdown_grace_s + 2 s. A server resumed from it that trains
nothing commits no other when it drains."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import random_rollout, running_server, small_config, wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.api.tensors import encode
from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc
from service.checkpoint import list_checkpoints, restore_checkpoint
from service.client.client import TridentClient, step_request
from service.testing.serverproc import Samples, ServerProcess, scrape, value
from service.trainer.trainer import Trainer

Code = grpc.StatusCode
IN_FLIGHT = 8
GRACE_S = 10.0
SLOW = "ppo.epochs=96"  # with 16x16 rollouts, Steps of ~0.5 s on the NumPy backend


@pytest.mark.slow
def test_sigterm_with_eight_steps_in_flight(tmp_path: Path, rng: np.random.Generator) -> None:
    settings = (f"server.shutdown_grace_s={GRACE_S}", f"server.step_queue_size={IN_FLIGHT}", SLOW,
                "server.log_level=DEBUG")  # every Step's own line  # fmt: skip
    server = running_server(tmp_path, *settings)
    rollouts = [random_rollout(rng, T=16, N=16) for _ in range(IN_FLIGHT)]
    # What happened, in order: ("signal", ""), ("health", status name), ("reply", Step index).
    timeline: list[tuple[str, str]] = []
    steps: dict[int, int] = {}  # Step index -> the global step its reply carried
    failures: list[str] = []
    watching = threading.Event()

    def send(index: int) -> None:
        with TridentClient(server.target) as client:
            try:
                steps[index] = client.step(rollouts[index], timeout_s=60).global_step
                timeline.append(("reply", str(index)))
            except grpc.RpcError as error:
                failures.append(f"Step {index}: {error.code().name} {error.details()}")

    def watch() -> None:
        with grpc.insecure_channel(server.target) as channel:
            stream = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""), timeout=60
            )
            try:
                for reply in stream:
                    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                    timeline.append(("health", name))
                    watching.set()
                    if name == "NOT_SERVING":
                        stream.cancel()  # an open stream would hold the drain for the grace
                        return
            except grpc.RpcError as error:
                timeline.append(("health", f"error {error.code().name}"))

    try:
        watcher = threading.Thread(target=watch)
        watcher.start()
        assert watching.wait(10) and timeline[-1] == ("health", "SERVING")
        threads = [threading.Thread(target=send, args=(i,)) for i in range(IN_FLIGHT)]
        for thread in threads:
            thread.start()
        # All 8 accepted (one running, seven queued) and none applied yet: 8 in flight.
        samples = wait_until(lambda: queued(server), 10, "the 8 Steps queued", interval_s=0.002)
        assert value(samples, "trident_steps_total") == 0, "a Step finished before SIGTERM"

        timeline.append(("signal", ""))
        server.proc.send_signal(signal.SIGTERM)
        watcher.join(10)
        # The listener closes a moment after NOT_SERVING: once a new Act is refused, so is a
        # new Step (sent once: an accepted one would be applied).
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.TrainerServiceStub(channel)
            act = pb.ActRequest(obs=encode(np.zeros((2, 6), "<f4")), mode=pb.ACT_MODE_SAMPLE)
            refused = {"Act": wait_until(lambda: refusal(stub.Act, act), 10, "a new Act refused")}
            refused["Step"] = refusal(stub.Step, step_request(rollouts[0])) or "OK"
        # Exit 0 within the grace and 2 s: the queue drained and the final checkpoint written.
        returncode = server.terminate(timeout=GRACE_S + 2)
        for thread in threads:
            thread.join(30)
    finally:
        server.terminate()

    assert returncode == 0, server.stderr()[-3000:]
    assert set(refused.values()) == {"UNAVAILABLE"}, refused
    # Health: NOT_SERVING before the queued Steps drain.
    signalled = timeline.index(("signal", ""))
    not_serving = timeline.index(("health", "NOT_SERVING"))
    replies = [i for i, (kind, _) in enumerate(timeline) if kind == "reply"]
    assert signalled < not_serving < replies[-1], timeline
    # The 8 finished OK, each answered after the signal, applied once each, in some order.
    assert not failures, failures
    assert len(replies) == IN_FLIGHT and replies[0] > signalled, timeline
    assert sorted(steps.values()) == list(range(1, IN_FLIGHT + 1))
    # The final checkpoint is committed, holds all 8, and equals replaying them in order.
    events = [e["event"] for e in server.events()]
    assert events[-2:] == ["checkpoint", "final checkpoint"], events[-5:]
    assert events.count("step") == IN_FLIGHT
    (final,) = [c for c in list_checkpoints(server.checkpoint_dir) if c.name.startswith("final-")]
    assert final.global_step == IN_FLIGHT
    restored = Trainer(small_config(*settings))
    restore_checkpoint(restored, server.checkpoint_dir, final.name)
    replayed = Trainer(small_config(*settings))
    for index in sorted(steps, key=steps.__getitem__):
        replayed.step(rollouts[index])
    assert replayed.param_digest() == restored.param_digest()
    # Restarted from it, trained nothing, drained again: no second final checkpoint.
    again = running_server(tmp_path, *settings, extra_args=("--resume",))
    assert again.terminate() == 0, again.stderr()[-3000:]
    assert [c.name for c in list_checkpoints(server.checkpoint_dir)] == [final.name]
    (said,) = again.events("final checkpoint")
    assert said["name"] is None and said["newest"] == final.name, said


def queued(server: ServerProcess) -> Samples | None:
    """The server's metrics once 7 Steps wait in its queue (the 8th being applied), else None."""
    samples = scrape(server)
    return samples if value(samples, "trident_step_queue_depth") >= IN_FLIGHT - 1 else None


def refusal(method: grpc.UnaryUnaryMultiCallable, request: object) -> str | None:
    """The status a new call gets, or None while the server still takes it (OK)."""
    try:
        method(request, timeout=5)
    except grpc.RpcError as error:
        return error.code().name
    return None


def test_a_keyed_step_after_the_drain_is_unavailable(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """Once an engine has drained, a keyed Step is refused as UNAVAILABLE (the actor goes and
    waits for the next server), not failed as an internal error by its content digest's pool."""
    from prometheus_client import CollectorRegistry

    from service.errors import Unavailable
    from service.server.engine import Engine
    from service.server.metrics import Metrics
    from service.step_ledger import StepKey

    config = small_config(f"checkpoint.dir={tmp_path}")
    engine = Engine(Trainer(config), Metrics(CollectorRegistry()))
    engine.drain()
    for key in (None, StepKey("late", 0)):
        with pytest.raises(Unavailable, match="draining"):
            engine.submit_step(random_rollout(rng), lambda: True, key)
