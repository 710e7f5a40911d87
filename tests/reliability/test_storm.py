"""Admission under abuse (service/server/admission.py): health checks and control calls are
answered through a storm of 300 abusive Interact clients; a stream past `server.max_streams`
and an InteractStart past `server.max_rollout_mb` are refused naming the setting; a stream whose
client went silent is ended after `server.stream_idle_s`, and a unary call whose request is
trickled after `server.request_receive_s`."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import running_server, wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc
from trickle import trickle

from service.api.tensors import encode
from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc
from service.client.client import TridentClient
from service.client.interact import InteractStream
from service.testing.serverproc import ServerProcess, clean_env, scrape, value
from service.testing.storm import command as storm_command

T, N, D = 4, 3, 6
PROBE_TIMEOUT_S = 10.0  # a probe's deadline: an answer, not a latency, is what is checked


def limited(server: ServerProcess, method: str, limit: str) -> float:
    try:
        return value(scrape(server), "trident_rpcs_limited_total", method=method, limit=limit)
    except KeyError:
        return 0.0


def open_streams(server: ServerProcess) -> float:
    return value(scrape(server), "trident_interact_streams")


def start_stream(
    client: TridentClient, actor: str, rng: np.random.Generator
) -> InteractStream:
    """An Interact stream with its start sent and its first reply read."""
    stream = client.interact(actor, 0, T, [N])
    stream.send(0, rng.standard_normal((N, D)).astype(np.float32), None)
    assert stream.receive() is not None
    return stream


def start_storm(server: ServerProcess, count: int) -> subprocess.Popen[str]:
    return subprocess.Popen(storm_command(server.target, count),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=clean_env())  # fmt: skip


def test_health_and_status_answer_through_a_storm_of_300_abusive_streams(
    tmp_path: Path,
) -> None:
    # stream_idle_s=3: the storm's silent streams are ended within this test, not after 30 s
    with running_server(tmp_path, "server.stream_idle_s=3") as server:
        storm = start_storm(server, 300)
        stormed: list[dict] = []
        reader = threading.Thread(
            target=lambda: stormed.append(json.loads(storm.stdout.readline()))
        )
        reader.start()
        health_codes, status_codes, most_open = [], [], 0.0
        try:
            with grpc.insecure_channel(server.target) as channel:  # fresh: not the storm's
                health = health_pb2_grpc.HealthStub(channel)
                trainer = pb_grpc.TrainerServiceStub(channel)
                while len(health_codes) < 70 or reader.is_alive():
                    reply = health.Check(health_pb2.HealthCheckRequest(), timeout=PROBE_TIMEOUT_S)
                    health_codes.append(health_pb2.HealthCheckResponse.ServingStatus.Name(
                        reply.status))  # fmt: skip
                    try:
                        trainer.GetStatus(pb.GetStatusRequest(), timeout=PROBE_TIMEOUT_S)
                        status_codes.append("OK")
                    except grpc.RpcError as error:
                        status_codes.append(error.code().name)
                    most_open = max(most_open, open_streams(server))
            reader.join(60)
            assert stormed and not stormed[0]["client_errors"], stormed
            refused = limited(server, "Interact", "server.max_streams")
            # the silent streams ended by the server, the vanished ones by their connections
            storm.stdin.close()
            wait_until(lambda: open_streams(server) == 0, 60, "every storm stream ended")
        finally:
            storm.kill()
            storm.wait(10)
        assert set(health_codes) == {"SERVING"} and len(health_codes) >= 70, health_codes
        assert set(status_codes) == {"OK"}, status_codes
        assert most_open <= 64  # server.max_streams
        assert refused > 0
        assert server.events("calls refused")[0]["limit"] == "server.max_streams"
        # still serving actors: a stream of one's own acts
        with TridentClient(server.target) as client:
            start_stream(client, "after-storm", np.random.default_rng(0)).cancel()
        print(f"probes {len(health_codes)} health, {len(status_codes)} GetStatus; most streams "
              f"open {most_open:g}; refused server.max_streams {refused:g}")  # fmt: skip


@pytest.mark.parametrize("front_ends", [0, 2])
def test_a_stream_past_max_streams_is_refused_naming_it(
    tmp_path: Path, rng: np.random.Generator, front_ends: int
) -> None:
    """Also with front-end processes: the bound and the page are the whole server's."""
    settings = ("server.max_streams=2", f"server.front_ends={front_ends}")
    with running_server(tmp_path, *settings) as server, \
            TridentClient(server.target) as client:  # fmt: skip
        held = [start_stream(client, f"held-{i}", rng) for i in range(2)]
        wait_until(lambda: open_streams(server) == 2, 10, "two streams open")
        third = client.interact("third", 0, T, [N])
        third.send(0, rng.standard_normal((N, D)).astype(np.float32), None)
        with pytest.raises(grpc.RpcError) as caught:
            third.receive()
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "server.max_streams = 2" in caught.value.details(), caught.value.details()
        assert limited(server, "Interact", "server.max_streams") == 1
        # health and control calls are not data streams: answered beside the two held
        assert client.health() == "SERVING"
        assert client.status().global_step == 0
        for stream in held:
            stream.cancel()
        wait_until(lambda: open_streams(server) == 0, 10, "the held streams ended")
        start_stream(client, "fourth", rng).cancel()  # a place again once one is free


def test_an_oversized_interact_start_is_refused_naming_the_limit(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    # 2^24 + 1 environments x 4096 steps would be 2.1 TiB of rollout buffers
    start = pb.InteractStart(actor_id="huge", rollout_len=4096, group_envs=[2**24 + 1])
    request = pb.InteractRequest(start=start,
                                 obs=encode(rng.standard_normal((1, D)).astype("<f4")))  # fmt: skip
    with running_server(tmp_path) as server, TridentClient(server.target) as client:
        with pytest.raises(grpc.RpcError) as caught:
            list(client.stub.Interact(iter([request]), timeout=30))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "server.max_rollout_mb = 64" in caught.value.details(), caught.value.details()
        assert client.status().global_step == 0
        start_stream(client, "small", rng).cancel()  # the server still serves streams


def test_a_silent_stream_is_ended_within_stream_idle_s(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    idle_s = 1.0
    with running_server(tmp_path, f"server.stream_idle_s={idle_s}") as server, \
            TridentClient(server.target) as client:  # fmt: skip
        stream = start_stream(client, "silent", rng)  # then sends nothing, closes nothing
        assert open_streams(server) == 1
        # the watcher looks every idle_s / 4: ended within 1.25 x idle_s (deadline: slack for
        # a loaded machine)
        wait_until(lambda: open_streams(server) == 0, 10 + 1.25 * idle_s, "the silent stream ended")
        with pytest.raises(grpc.RpcError) as caught:
            stream.receive()
        assert caught.value.code() == grpc.StatusCode.CANCELLED
        assert limited(server, "Interact", "server.stream_idle_s") == 1
        [ended] = server.events("idle stream ended")
        assert ended["limit"] == "server.stream_idle_s" and ended["method"] == "Interact"
        assert client.health() == "SERVING"


TRICKLED = [  # (the call's path, its name in the metric and log, the setting that ends it)
    ("/trident.v1.TrainerService/Step", "Step", "server.request_receive_s"),
    ("/trident.v1.TrainerService/GetStatus", "GetStatus", "server.request_receive_s"),
    ("/grpc.health.v1.Health/Check", "Check", "server.request_receive_s"),
    ("/trident.v1.TrainerService/Interact", "Interact", "server.stream_idle_s"),
]
ENDED_EVENT = {"server.request_receive_s": "request not received",
               "server.stream_idle_s": "idle stream ended"}  # fmt: skip


@pytest.mark.parametrize(("path", "method", "setting"), TRICKLED)
def test_a_trickled_request_is_ended_within_its_bound(
    tmp_path: Path, path: str, method: str, setting: str
) -> None:
    bound_s = 1.0
    with running_server(tmp_path, f"{setting}={bound_s}") as server, \
            TridentClient(server.target) as client:  # fmt: skip
        # a byte every 0.1 s of a request declared 1,000 bytes long: the connection is live,
        # the request never whole; ended within 1.25 x the bound (deadline: slack for a
        # loaded machine)
        ended = trickle(server.target, path, every_s=0.1, timeout_s=10 + 1.25 * bound_s)
        assert ended in ("reset", f"status {grpc.StatusCode.CANCELLED.value[0]}"), ended
        assert limited(server, method, setting) == 1
        [event] = wait_until(lambda: server.events(ENDED_EVENT[setting]), 10, "the log line")
        assert event["limit"] == setting and event["method"] == method
        assert event["waited_s"] >= bound_s
        assert client.health() == "SERVING"
        assert client.status().global_step == 0  # the call's thread and place are back


def test_a_unary_call_without_its_request_is_refused_invalid_argument(tmp_path: Path) -> None:
    with running_server(tmp_path) as server, grpc.insecure_channel(server.target) as channel:
        call = channel.stream_unary(
            "/trident.v1.TrainerService/GetStatus",
            response_deserializer=pb.GetStatusResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as caught:
            call(iter(()), timeout=PROBE_TIMEOUT_S)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "GetStatus takes one request message" in caught.value.details()
