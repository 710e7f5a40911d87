"""SIGTERM with exactly 8 Steps in flight: health turns NOT_SERVING at once, new calls get
UNAVAILABLE, the 8 Steps finish OK, a final checkpoint is committed holding all 8, and the
process exits 0 within server.shutdown_grace_s + 2 s."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import grpc
import numpy as np
from conftest import random_rollout, running_server, small_config
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serverproc import scrape, value

from service.api.tensors import encode
from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc
from service.checkpoint import list_checkpoints, restore_checkpoint
from service.client.client import TridentClient, step_request
from service.trainer.trainer import Trainer

Code = grpc.StatusCode
IN_FLIGHT = 8
GRACE_S = 10.0
SLOW = "ppo.epochs=96"  # with 16x16 rollouts, Steps of ~0.5 s on the NumPy backend


def test_sigterm_with_eight_steps_in_flight(tmp_path: Path) -> None:
    settings = (f"server.shutdown_grace_s={GRACE_S}", f"server.step_queue_size={IN_FLIGHT}", SLOW)
    server = running_server(tmp_path, *settings)
    rng = np.random.default_rng(3)
    rollouts = [random_rollout(rng, T=16, N=16) for _ in range(IN_FLIGHT)]
    replies: dict[int, tuple[float, int]] = {}  # thread -> (monotonic time answered, global step)
    failures: list[str] = []
    health: list[tuple[float, str]] = []
    watching = threading.Event()

    def send(index: int) -> None:
        with TridentClient(server.target) as client:
            try:
                step = client.step(rollouts[index], timeout_s=60).global_step
                replies[index] = (time.monotonic(), step)
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
                    health.append((time.monotonic(), name))
                    watching.set()
                    if name == "NOT_SERVING":
                        stream.cancel()  # an open stream would hold the drain for the grace
                        return
            except grpc.RpcError as error:
                health.append((time.monotonic(), f"error {error.code().name}"))

    try:
        watcher = threading.Thread(target=watch)
        watcher.start()
        assert watching.wait(10) and health[-1][1] == "SERVING"
        threads = [threading.Thread(target=send, args=(i,)) for i in range(IN_FLIGHT)]
        for thread in threads:
            thread.start()
        # All 8 accepted (one running, seven queued) and none applied yet: 8 in flight.
        deadline = time.monotonic() + 10
        while True:
            samples = scrape(server)
            if value(samples, "trident_step_queue_depth") >= IN_FLIGHT - 1:
                break
            assert time.monotonic() < deadline, "the 8 Steps never queued"
            time.sleep(0.002)
        assert value(samples, "trident_steps_total") == 0, "a Step finished before SIGTERM"

        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        watcher.join(10)
        time.sleep(0.2)  # past the instant between NOT_SERVING and the listener closing
        new_calls = {}
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.TrainerServiceStub(channel)
            act = pb.ActRequest(obs=encode(np.zeros((2, 6), "<f4")), mode=pb.ACT_MODE_SAMPLE)
            for method, request in ((stub.Act, act), (stub.Step, step_request(rollouts[0]))):
                try:
                    method(request, timeout=5)
                    new_calls[method] = "OK"
                except grpc.RpcError as error:
                    new_calls[method] = error.code().name
        returncode = server.proc.wait(GRACE_S + 30)
        took = time.monotonic() - signalled
        for thread in threads:
            thread.join(30)
    finally:
        server.terminate()

    assert returncode == 0, server.stderr()[-3000:]
    assert took <= GRACE_S + 2, took
    assert set(new_calls.values()) == {"UNAVAILABLE"}, new_calls
    # Health: NOT_SERVING within a moment of the signal (well before the Steps drain).
    not_serving = [t for t, name in health if name == "NOT_SERVING"]
    assert not_serving and not_serving[0] - signalled < 1.0, health
    # The 8 finished OK, each answered after the signal, applied once each, in some order.
    assert not failures, failures
    assert len(replies) == IN_FLIGHT
    assert all(answered > signalled for answered, _ in replies.values())
    assert sorted(step for _, step in replies.values()) == list(range(1, IN_FLIGHT + 1))
    # The final checkpoint is committed, holds all 8, and equals replaying them in order.
    events = [e["event"] for e in server.events()]
    assert events[-2:] == ["checkpoint", "final checkpoint"], events[-5:]
    assert events.count("step") == IN_FLIGHT
    (final,) = [c for c in list_checkpoints(server.checkpoint_dir) if c.name.startswith("final-")]
    assert final.global_step == IN_FLIGHT
    restored = Trainer(small_config(*settings))
    restore_checkpoint(restored, server.checkpoint_dir, final.name)
    replayed = Trainer(small_config(*settings))
    for index in sorted(replies, key=lambda i: replies[i][1]):
        replayed.step(rollouts[index])
    assert replayed.param_digest() == restored.param_digest()
